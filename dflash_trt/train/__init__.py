"""Train: the DFlash drafter's training objective, data regeneration and loop, on one rank or many.

Modules: ``settings`` (what a run takes and returns), ``objective`` (the block mask, inputs
and loss), ``data`` (prompts, chat formatting, anchors), ``regen`` (regeneration by the
reference runtime or an OpenAI-compatible server, journalled), ``features`` (target features
online or from the feature folder, the on-disk contract engines' captures convert into),
``dist`` (ranks: torchrun's process group; torch's engine, FSDP2 or DDP, over the drafter and the
frozen target), ``checkpoint`` (torch's distributed checkpoint in safetensors, the z-lab drafter,
training metadata), ``loop`` (optimiser, evaluation, resume), ``launcher`` (``python -m
dflash_trt.train`` under torchrun; ``--nproc``).
"""
from __future__ import annotations

from dflash_trt.train.launcher import launch
from dflash_trt.train.loop import train_drafter
from dflash_trt.train.settings import Progress, Result, TrainSettings

__all__ = [
    "Progress",
    "Result",
    "TrainSettings",
    "launch",
    "train_drafter",
]
