"""What a training run is set up with before its first step: the frozen target (in its
``--target-dtype``, no gradients), the drafter's config for it (the shape fields of the settings
filled in with what was chosen: block, layers, tapped layers, mask row, the family's sizes) and
the optimiser. Everything here refuses a bad setting in one line (``DFlashError``)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dflash_trt import ingest
from dflash_trt.errors import DFlashError
from dflash_trt.model import DRAFTER_FAMILIES, Drafter, load_target
from dflash_trt.runtime import load_tokenizer, stop_ids
from dflash_trt.train import objective
from dflash_trt.train.settings import TrainSettings


def pick_mask_token(tokenizer, vocab_rows: int) -> int:
    mid = getattr(tokenizer, "mask_token_id", None)
    if mid is not None and mid < vocab_rows:
        return int(mid)
    if vocab_rows > len(tokenizer):
        return len(tokenizer)  # first embedding row no token uses (Qwen3 pads its vocab)
    raise DFlashError("the tokenizer has no mask token and the embedding no spare row: pass --mask-token-id")


TARGET_DTYPES = ("auto", "bfloat16", "float16", "float32")


def target_dtype(s: TrainSettings, tdir) -> torch.dtype:
    """``--target-dtype``: auto = the precision the target ships in (its config's dtype), bfloat16
    when it names none."""
    if s.target_dtype not in TARGET_DTYPES:
        raise DFlashError(f"--target-dtype {s.target_dtype!r}: choose one of {', '.join(TARGET_DTYPES)}")
    if s.target_dtype != "auto":
        return getattr(torch, s.target_dtype)
    cfg = json.loads((Path(tdir) / "config.json").read_text())
    shipped = cfg.get("dtype") or cfg.get("torch_dtype") or (cfg.get("text_config") or {}).get("dtype")
    return getattr(torch, shipped) if shipped in TARGET_DTYPES[1:] else torch.bfloat16


def frozen_target(s: TrainSettings, device: torch.device):
    """(target model in its --target-dtype without gradients, its tokenizer, its stop token ids)."""
    tdir = ingest.resolve(s.target, role="target")
    model = load_target(tdir, dtype=target_dtype(s, tdir), device=str(device))
    for p in model.parameters():
        p.requires_grad_(False)
    tokenizer = load_tokenizer(tdir)
    return model, tokenizer, stop_ids(model, tokenizer)


def drafter_setup(s: TrainSettings, model, tokenizer):
    """The drafter's config for this target; fills the shape fields of ``s`` with what was chosen."""
    B = s.block_size or 8
    if B < 2:
        raise DFlashError("--block-size must be >= 2 (the anchor and at least one draft position)")
    mask_id = (
        s.mask_token_id
        if s.mask_token_id is not None
        else pick_mask_token(tokenizer, model.get_input_embeddings().weight.shape[0])
    )
    family, sizes = family_sizes(s)
    cfg = objective.drafter_config_for(
        model,
        block_size=B,
        layers=s.layers or 1,
        target_layer_ids=s.target_layer_ids,
        mask_token_id=mask_id,
        family=family,
        sizes=sizes,
    )
    s.block_size, s.layers = B, cfg.num_hidden_layers
    s.target_layer_ids, s.mask_token_id = cfg.target_layer_ids, mask_id
    s.arch = family
    for name, value in sizes.items():
        if hasattr(s, name):
            setattr(s, name, value)
    return cfg


def family_sizes(s: TrainSettings) -> tuple[str, dict]:
    """(the ``--arch`` family, its sizes: unset ones from its objective's defaults); sizes of another
    family are refused in one line naming the ``--arch`` they need."""
    arch = s.arch or "dflash"
    if arch not in DRAFTER_FAMILIES:
        raise DFlashError(f"--arch {arch!r}: choose one of {', '.join(DRAFTER_FAMILIES)}")
    family = DRAFTER_FAMILIES[arch]
    for other in DRAFTER_FAMILIES.values():
        stray = [k for k in other.fields if k not in family.fields and getattr(s, k, None) is not None]
        if stray:
            flags = ", ".join(f"--{k.replace('_', '-')}" for k in stray)
            raise DFlashError(f"{flags} size a {other.display} drafter: add --arch {other.name}")
    defaults = objective.objective_for(family).defaults
    sizes = {k: getattr(s, k, None) if getattr(s, k, None) is not None else defaults.get(k) for k in family.fields}
    bad = [k for k, v in sizes.items() if v is None or v < 1]
    if bad:
        raise DFlashError(f"--{bad[0].replace('_', '-')} must be >= 1")
    return arch, sizes


def optimizer(drafter: Drafter, s: TrainSettings) -> torch.optim.AdamW:
    """AdamW with weight decay on the matrices only (not norms and biases)."""
    # Matrices decay (linear weights, DFlash2's codebooks); norms, biases and DFlash2's base
    # convolution kernels [2, K, H] (identity at init, not a weight to pull to zero) do not.
    decay = [p for n, p in drafter.named_parameters() if p.dim() == 2]
    rest = [p for n, p in drafter.named_parameters() if p.dim() != 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": s.weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=s.lr,
        betas=(0.9, 0.95),
    )
