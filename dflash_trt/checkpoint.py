"""Resolve checkpoints, detect drafter formats, normalise, and validate pairs.

This first version knows local directories and the z-lab drafter format; hub
resolution and the other published formats build on the same three entry points:
``resolve``, ``load_drafter`` and the pair checks.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dflash_trt.errors import CheckpointError, CompatibilityError
from dflash_trt.model import Drafter


EMBEDDED_PREFIX = "embedded:"


def embedded_dir(name: str) -> Path:
    """Where ``embedded:NAME`` lives: ``dflash_trt/assets/NAME`` inside the package."""
    from importlib import resources

    return Path(str(resources.files("dflash_trt") / "assets" / name))


def resolve(ref: str, role: str = "model") -> Path:
    """A local directory for a model reference (a directory, or ``embedded:NAME``)."""
    if ref.startswith(EMBEDDED_PREFIX):
        path = embedded_dir(ref[len(EMBEDDED_PREFIX):])
        if not (path / "config.json").exists():
            raise CheckpointError(f"{role} {ref!r}: no such embedded model in this installation")
        return path
    path = Path(ref).expanduser()
    if path.is_dir():
        return path
    raise CheckpointError(f"{role} {ref!r}: no such directory")


def load_drafter(path: Path, dtype: torch.dtype | None = None) -> Drafter:
    return Drafter.load(path, dtype=dtype)


def check_pair_runtime(target_model, drafter: Drafter, where: str = "drafter") -> None:
    """The checks without which the runtime would crash or silently draft garbage."""
    tcfg = target_model.config
    tcfg = tcfg.get_text_config() if hasattr(tcfg, "get_text_config") else tcfg
    d = drafter.cfg
    if d.hidden_size != tcfg.hidden_size:
        raise CompatibilityError(
            f"{where}: drafter hidden_size {d.hidden_size} != target hidden_size {tcfg.hidden_size}; "
            "this drafter was trained for another target"
        )
    depth = tcfg.num_hidden_layers
    bad = [i for i in d.target_layer_ids if not 0 <= i < depth]
    if bad:
        raise CompatibilityError(
            f"{where}: target_layer_ids {bad} out of range for a {depth}-layer target "
            "(z-lab ids count decoder layers from 0)"
        )
    vocab = target_model.get_input_embeddings().weight.shape[0]
    if d.mask_token_id >= vocab:
        raise CompatibilityError(
            f"{where}: mask_token_id {d.mask_token_id} has no row in the target's {vocab}-row embedding"
        )
