"""`loader`: the user's own loader (--loader MODULE:CALLABLE) inside the trainer's process, no producers.

A callable that returns a `tf.data.Dataset` is called while the graph is
built, so its pipeline runs inside the TensorFlow graph (tf.data's own
threads), as a TensorFlow training script runs it; its elements are checked
against the model's signature when the graph is built. Any other loader (a
torch DataLoader or Dataset, a DataFlow, an iterable) is read through
`from_generator`, checked batch by batch in Python.
"""

from __future__ import annotations

from tensorpack.input_source import InputSource, TFDatasetInput

from consumers.loader.path import PATH
from consumers.tf_half import TFInputPath
from consumers.tf_loader import fitted
from core import loader_processes
from core.loader_spec import LoaderError, LoaderSpec, batches, kind_of
from core.registry import register
from frameworks.tf_env import import_tf

tf = import_tf()

PREFETCH = 2


@register
class UserLoader(TFInputPath):
    declaration = PATH
    input_op_types = frozenset({"IteratorGetNext"})

    def input_source(self, specs: list, has_gpu: bool) -> InputSource:
        cfg = self.cfg
        spec = LoaderSpec.parse(cfg.loader, cfg.loader_arg)
        images_spec, labels_spec = specs[0], specs[1]
        batch, size = int(images_spec.shape[0]), int(images_spec.shape[1])
        offer = {"batch_size": batch, "image_size": size}
        graph = tf.compat.v1.get_default_graph()  # the helper thread builds the dataset into the model's graph
        obj = spec.build(0, 0, 1, offer, timeout=cfg.loader_timeout, context=graph.as_default)
        if kind_of(obj) == "tf.data":
            return TFDatasetInput(self._in_graph(spec, obj, images_spec, labels_spec).prefetch(PREFETCH))
        del obj  # the generator builds its own copy when tf.data first asks for a batch

        def gen():
            try:
                for images, labels in batches(spec, batch, batch, size, timeout=cfg.loader_timeout):
                    yield images, labels.astype(labels_spec.dtype.as_numpy_dtype, copy=False)
            except LoaderError as e:  # tf.data wraps it in an op error; the run reports this line instead
                self._failure = str(e)
                raise

        ds = tf.data.Dataset.from_generator(
            gen,
            output_types=(images_spec.dtype, labels_spec.dtype),
            output_shapes=(images_spec.shape, labels_spec.shape),
        )
        return TFDatasetInput(ds.prefetch(PREFETCH))

    _failure: str | None = None

    def failure(self) -> str | None:
        return self._failure

    def close(self) -> None:
        # What the callable started (a cache server) is stopped with the path and named, as in every mode.
        loader_processes.say_left(self.cfg.loader, loader_processes.stop_started())

    @staticmethod
    def _in_graph(spec: LoaderSpec, ds, images_spec, labels_spec):
        """The user's dataset, checked against the model's signature; labels cast to the model's dtype."""
        # tensorpack's TFDatasetInput reads the graph-mode (v1) dataset API: wrap the user's dataset in one.
        # Pass after pass, as the other loaders are read: a finite dataset does not end the run mid-way.
        v1 = tf.compat.v1.data.Dataset.zip((fitted(spec, ds, images_spec, labels_spec),))
        return v1.map(tf.autograph.experimental.do_not_convert(lambda element: element)).repeat()
