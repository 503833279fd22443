"""`python-dataset`: tf.data's from_generator over the same Python puller, prefetched."""

from __future__ import annotations

from tensorpack.dataflow import DataFlowTerminated
from tensorpack.input_source import InputSource, TFDatasetInput

from consumers.python_dataset.path import PATH
from consumers.tf_pull import PythonPull
from core.registry import register
from frameworks.tf_env import import_tf

tf = import_tf()

PREFETCH = 2


@register
class PythonDataset(PythonPull):
    declaration = PATH
    input_op_types = frozenset({"IteratorGetNext"})

    def input_source(self, specs: list, has_gpu: bool) -> InputSource:
        flow = self.dataflow(specs)

        def gen():
            try:
                for arrays in flow:
                    yield tuple(arrays)
            except DataFlowTerminated:
                if flow.error:  # the run reports it, from the error tf.data wraps this in
                    raise
                # interrupted: the producers failed, and the run says how

        ds = tf.data.Dataset.from_generator(
            gen, output_types=tuple(s.dtype for s in specs), output_shapes=tuple(s.shape for s in specs)
        )
        return TFDatasetInput(ds.prefetch(PREFETCH))
