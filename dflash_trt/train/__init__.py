"""Train: the DFlash drafter's training objective, data regeneration and loop, on one rank or many.

Modules: ``settings`` (what a run takes and returns), ``objective`` (the block inputs and
loss, each family's objective), ``forward`` (the training mask and forward), ``data`` (prompts,
chat formatting, anchors), ``regen`` (regeneration by the reference runtime or an
OpenAI-compatible server, journalled), ``features`` (target features online or written into
the feature folder), ``feature_folder`` (the folder's on-disk contract, which engines' captures
convert into: its checks and its reading), ``dist`` (ranks: torchrun's process group; torch's
engine, FSDP2 or DDP, over the drafter and the frozen target), ``checkpoint`` (torch's
distributed checkpoint in safetensors, the z-lab drafter, training metadata), ``checks`` (OUT,
the numbers and the data, before any work), ``loop`` (optimiser, evaluation, resume),
``heldout`` (held-out τ through the reference runtime), ``launcher`` (``python -m
dflash_trt.train`` under torchrun; ``--nproc``), ``options`` (the one parser both commands take
their options from, generated from ``TrainSettings``: YAML ``--config``, ``--set``, flags).
"""

from __future__ import annotations

import importlib
from typing import Any

from dflash_trt.train.options import parameters, settings_from
from dflash_trt.train.settings import Progress, Result, TrainSettings

# The CLI builds train-drafter's options from TrainSettings at start-up: the names that import
# torch (the loop and the launcher) load on first use (start-up cost).
_LAZY = {"launch": "dflash_trt.train.launcher", "train_drafter": "dflash_trt.train.loop"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dflash_trt.train' has no attribute {name!r}")


__all__ = [
    "Progress",
    "Result",
    "TrainSettings",
    "launch",
    "parameters",
    "settings_from",
    "train_drafter",
]
