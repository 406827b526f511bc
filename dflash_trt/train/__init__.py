"""Train: the DFlash drafter's training objective, data regeneration and loop.

Modules: ``objective`` (the block mask, inputs and loss), ``data`` (prompts and target
regeneration), ``loop`` (optimiser, evaluation, checkpoints, resume).
"""
from __future__ import annotations

from dflash_trt.train.loop import Progress, Result, TrainSettings, train_drafter

__all__ = [
    "Progress",
    "Result",
    "TrainSettings",
    "train_drafter",
]
