"""`cpu`: random images made by the framework on the host every step, then copied to the device."""

from __future__ import annotations

from core.registry import Declaration

PATH = Declaration(
    name="cpu",
    summary={
        "tf": "synthetic images made by TensorFlow on the CPU each step, staged onto the device",
        "torch": "random images made by PyTorch on the CPU every step, copied to the device",
    },
    order=10,
    advice={"torch": "generate on the device, or feed from producers"},
    input_advice={"tf": "generate on the device, or feed from producers"},
    delivers_words={"tf": "random images made on the CPU every step deliver"},
)
