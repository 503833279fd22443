"""`ray-data`: a Ray Data pipeline on a Ray cluster makes the batches; each rank iterates its streaming split."""
