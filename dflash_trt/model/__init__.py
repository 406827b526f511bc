"""Model: the DFlash drafter as a torch module (published tensor names), the drafter families, and
the target's view.

The config names (``DrafterConfig``, ``DFLASH2_FIELDS``, ``flatten_rope``) and the drafter families
(``DrafterFamily`` and its registry: ``register_family``, ``family_of``, ``recognise_family``,
``hook_for``; ``family.py`` documents the seam) import no torch; the modules (``Drafter``,
``DFlash2Drafter``, ``Target``, ...) load torch on first use (PEP 562), so reading configs and
planning stay free of it (``tests/plan/test_face.py``).

Other subpackages import from here, never from the modules inside.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from dflash_trt.model.config import DrafterConfig, flatten_rope
from dflash_trt.model.family import FAMILIES as DRAFTER_FAMILIES
from dflash_trt.model.family import (
    DrafterFamily,
    drafter_for,
    family_named,
    family_of,
    graph_kinds,
    hook_for,
    recognise_family,
    register_family,
)
from dflash_trt.model.family_dflash2 import DFLASH2, DFLASH2_FIELDS, DFlash2Family

if TYPE_CHECKING:
    from dflash_trt.model.dflash2 import DFlash2Drafter
    from dflash_trt.model.drafter import Drafter
    from dflash_trt.model.target import Target, load_target

#: name -> the module (torch-backed) that defines it, imported on first access
_LAZY = {"Drafter": "drafter", "DFlash2Drafter": "dflash2", "Target": "target", "load_target": "target"}

__all__ = [
    "DFLASH2",
    "DFLASH2_FIELDS",
    "DRAFTER_FAMILIES",
    "DFlash2Drafter",
    "DFlash2Family",
    "Drafter",
    "DrafterConfig",
    "DrafterFamily",
    "Target",
    "drafter_for",
    "family_named",
    "family_of",
    "flatten_rope",
    "graph_kinds",
    "hook_for",
    "load_target",
    "recognise_family",
    "register_family",
]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f"dflash_trt.model.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dflash_trt.model' has no attribute {name!r}")
