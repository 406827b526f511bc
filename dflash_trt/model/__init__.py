"""Model: the DFlash drafter as a torch module (published tensor names) and the target's view.

Other subpackages import from here, never from the modules inside.
"""
from __future__ import annotations

from dflash_trt.model.config import DrafterConfig, flatten_rope
from dflash_trt.model.drafter import Drafter
from dflash_trt.model.target import Target, load_target

__all__ = [
    "Drafter",
    "DrafterConfig",
    "Target",
    "flatten_rope",
    "load_target",
]
