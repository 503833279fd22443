"""`tf-data-service`: the tf.data service's workers make the batches; the trainer reads them over gRPC."""
