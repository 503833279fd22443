"""Every TensorFlow half of an input path (`consumers/<path>/tf.py`); importing this module registers them all.

`core.registry.load("tf")` imports it. A new path is a new folder in
`consumers/` whose `tf.py` holds a `@register`-ed subclass of
`consumers.tf_half.TFInputPath`, and nothing else.
"""

import importlib

import frameworks.tf_env  # noqa: F401  (TensorFlow's environment, before tensorpack imports it)
from consumers.declared import half_modules

for _module in half_modules("tf"):
    importlib.import_module(_module)
