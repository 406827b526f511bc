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


# --- minimal stand-ins; the ingest branch replaces these ---
# z-lab format only, config-level checks; exactly the names/semantics agreed in HELPER_COMMON.md.


class DrafterSpec:
    def __init__(self, config, format: str, path: Path):
        self.config, self.format, self.path = config, format, path


class PairReport:
    def __init__(self, warnings: list[str]):
        self.warnings = warnings


def _json(path: Path) -> dict:
    import json

    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path.parent}: no {path.name}") from None


def read_drafter(path: Path) -> DrafterSpec:
    from dflash_trt.model import DrafterConfig

    cfg = _json(Path(path) / "config.json")
    if "DFlashDraftModel" not in (cfg.get("architectures") or []):
        raise CheckpointError(f"{path}: not a z-lab DFlash drafter (architectures {cfg.get('architectures')})")
    return DrafterSpec(DrafterConfig.from_zlab(cfg), "zlab", Path(path))


def write_zlab(drafter_dir: Path, out_dir: Path) -> None:
    import shutil

    read_drafter(drafter_dir)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for f in Path(drafter_dir).iterdir():
        if f.is_file() and (f.suffix in (".safetensors", ".json") or f.name.endswith(".index.json")):
            shutil.copy2(f, out_dir / f.name)


def validate_pair(target_dir: Path, drafter_dir: Path) -> PairReport:
    t = _json(Path(target_dir) / "config.json")
    t = t.get("text_config", t)
    d = _json(Path(drafter_dir) / "config.json")
    dcfg = d.get("dflash_config") or {}
    if d.get("hidden_size") != t.get("hidden_size"):
        raise CompatibilityError(f"drafter hidden_size {d.get('hidden_size')} != target hidden_size {t.get('hidden_size')}")
    ids = dcfg.get("target_layer_ids") or d.get("target_layer_ids") or []
    bad = [i for i in ids if not 0 <= i < t["num_hidden_layers"]]
    if bad:
        raise CompatibilityError(f"target_layer_ids {bad} out of range for a {t['num_hidden_layers']}-layer target")
    mask = dcfg.get("mask_token_id", d.get("mask_token_id"))
    if mask is not None and mask >= t["vocab_size"]:
        raise CompatibilityError(f"mask_token_id {mask} has no row in the target's {t['vocab_size']}-row embedding")
    return PairReport([])


def sha256_files(directory: Path) -> dict[str, str]:
    import hashlib

    out = {}
    for f in sorted(p for p in Path(directory).rglob("*") if p.is_file()):
        h = hashlib.sha256()
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        out[str(f.relative_to(directory))] = h.hexdigest()
    return out


def target_quantization(target_dir: Path) -> dict | None:
    import json

    hf = Path(target_dir) / "hf_quant_config.json"
    if hf.exists():
        q = json.loads(hf.read_text()).get("quantization") or {}
        return q or None
    cfg = Path(target_dir) / "config.json"
    if cfg.exists():
        q = json.loads(cfg.read_text()).get("quantization_config")
        return q or None
    return None
