"""Model: the DFlash drafter as a torch module (published tensor names) and the target's view.

Other subpackages import from here, never from the modules inside.
"""
from __future__ import annotations

from dflash_trt.model.config import DFLASH2_FIELDS, DrafterConfig
from dflash_trt.model.drafter import Drafter
from dflash_trt.model.dflash2 import DFlash2Drafter, drafter_for
from dflash_trt.model.target import Target, load_target

__all__ = [
    "DFLASH2_FIELDS",
    "DFlash2Drafter",
    "Drafter",
    "DrafterConfig",
    "Target",
    "drafter_for",
    "load_target",
]
