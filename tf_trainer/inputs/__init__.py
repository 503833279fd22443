"""The TensorFlow input paths, one module per path; importing this package registers every one.

`core.registry.load("tf")` imports it. A new path is a new module here with
a `@register`-ed subclass of `base.TFInputPath`, and nothing else.
"""

import importlib
import pkgutil

import frameworks.tf_env  # noqa: F401  (TensorFlow's environment, before tensorpack imports it)

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
