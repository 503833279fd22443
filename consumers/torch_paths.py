"""Every PyTorch half of an input path (`consumers/<path>/torch.py`); importing this module registers them all.

`core.registry.load("torch")` imports it. A new path is a new folder in
`consumers/` whose `torch.py` holds a `@register`-ed subclass of
`consumers.torch_half.TorchInputPath`, and nothing else.
"""

import importlib

from consumers.declared import half_modules

for _module in half_modules("torch"):
    importlib.import_module(_module)
