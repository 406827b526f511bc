"""A loaded (target, drafter, tokenizer) ready for the reference runtime.

``load_pair`` is the one place the commands that run models (generate, bench, serve) get
their models from, whatever the user named: local directories, hub ids, a bundle
directory, or the embedded default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from dflash_trt.errors import CheckpointError, DFlashError
from dflash_trt.model import Drafter, Target, load_target

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float64": torch.float64}


@dataclass
class Pair:
    target: Target
    drafter: Drafter | None
    tokenizer: object
    stop_token_ids: list[int] = field(default_factory=list)
    name: str = "model"

    def encode(self, text: str, chat: bool = False) -> list[int]:
        tok = self.tokenizer
        if chat:
            if not getattr(tok, "chat_template", None):
                raise DFlashError(f"{self.name}: the tokenizer has no chat template; drop --chat")
            ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                          tokenize=True)
            return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        return tok(text, add_special_tokens=True)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def parse_dtype(name: str, device: str = "cpu") -> torch.dtype:
    if name == "auto":
        return torch.float32 if device == "cpu" else torch.bfloat16
    if name not in DTYPES:
        raise DFlashError(f"unknown dtype {name!r}; choose auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    if not any((path / f).exists() for f in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")):
        raise CheckpointError(f"{path}: no tokenizer files (tokenizer.json / tokenizer_config.json)")
    try:
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except (ValueError, OSError) as exc:
        raise CheckpointError(f"{path}: cannot load tokenizer: {str(exc).splitlines()[0]}") from exc


def stop_ids(model, tokenizer) -> list[int]:
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config):
        eos = getattr(src, "eos_token_id", None) if src is not None else None
        if eos is not None:
            ids.update(eos if isinstance(eos, (list, tuple)) else [eos])
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(tokenizer.eos_token_id)
    return sorted(ids)


def load_pair(target: str | Path, drafter: str | Path | None, *, dtype: str = "auto",
              device: str = "cpu") -> Pair:
    """Load a target directory and (optionally) a z-lab drafter directory."""
    from dflash_trt import checkpoint

    tdir = checkpoint.resolve(str(target), role="target")
    ddir = checkpoint.resolve(str(drafter), role="drafter") if drafter is not None else None
    torch_dtype = parse_dtype(dtype, device)
    model = load_target(tdir, dtype=torch_dtype, device=device)
    tokenizer = load_tokenizer(tdir)
    d = None
    if ddir is not None:
        d = checkpoint.load_drafter(ddir, dtype=torch_dtype).to(device)
        checkpoint.check_pair_runtime(model, d, where=str(ddir))
    layer_ids = d.cfg.target_layer_ids if d is not None else None
    return Pair(Target(model, layer_ids), d, tokenizer, stop_ids(model, tokenizer), name=tdir.name)


# --- minimal stand-in; the build branch replaces this ---
def load_bundle(path: str | Path, dtype: str = "auto", device: str = "cpu") -> Pair:
    """Load a built bundle (``OUT/target`` + ``OUT/drafter``) for the reference runtime."""
    root = Path(path)
    if not (root / "target").is_dir() or not (root / "drafter").is_dir():
        raise CheckpointError(f"{root}: not a dflash-trt bundle (needs target/ and drafter/; build one with "
                              "'dflash-trt build -o DIR')")
    pair = load_pair(root / "target", root / "drafter", dtype=dtype, device=device)
    pair.name = root.name
    return pair
