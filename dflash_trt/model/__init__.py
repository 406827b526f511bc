"""Model: the DFlash drafter as a torch module (published tensor names) and the target's view.

The config names (``DrafterConfig``, ``DFLASH2_FIELDS``, ``flatten_rope``) import no torch; the
modules (``Drafter``, ``DFlash2Drafter``, ``Target``, ...) load torch on first use (PEP 562), so
reading configs and planning stay free of it (``tests/plan/test_face.py``).

Other subpackages import from here, never from the modules inside.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from dflash_trt.model.config import DFLASH2_FIELDS, DrafterConfig, flatten_rope

if TYPE_CHECKING:
    from dflash_trt.model.dflash2 import DFlash2Drafter, drafter_for
    from dflash_trt.model.drafter import Drafter
    from dflash_trt.model.target import Target, load_target

#: name -> the module (torch-backed) that defines it, imported on first access
_LAZY = {"Drafter": "drafter", "DFlash2Drafter": "dflash2", "drafter_for": "dflash2", "Target": "target",
         "load_target": "target"}

__all__ = [
    "DFLASH2_FIELDS",
    "DFlash2Drafter",
    "Drafter",
    "DrafterConfig",
    "Target",
    "drafter_for",
    "flatten_rope",
    "load_target",
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f"dflash_trt.model.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dflash_trt.model' has no attribute {name!r}")
