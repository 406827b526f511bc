"""What a recipe's shipped configs give the planner, and what they leave out.

Many published checkpoints are known only in part: a config copied from a model card or a
converter test, a gated repository nobody could read (``config.partial.json``, or only a
``NOT_FOUND.md``, in ``recipes/configs/``). A recipe built on such configs is marked
``incomplete`` (``recipe.Recipe.incomplete``): ``plan`` and ``build`` refuse it in one line
naming the missing fields rather than guess them (``pipeline.resolve``). :func:`missing`
recomputes that list from the configs, so the tests check every mark against the files
(``tests/plan/test_published.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

from dflash_trt.plan.family_shapes import required_target_fields

# What DraftShape reads (block_size: top level or in dflash_config; the ids in dflash_config).
# head_dim is not among them: a z-lab drafter without it has Qwen3Config's default, as its
# loaders read it (model_shapes.QWEN3_HEAD_DIM).
DRAFTER_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size")
DFLASH_FIELDS = ("block_size", "mask_token_id", "target_layer_ids")


def read_any(path: Path) -> tuple[dict | None, bool]:
    """(config, complete): ``config.json`` when shipped whole, else ``config.partial.json``, else None."""
    for name, whole in (("config.json", True), ("config.partial.json", False)):
        f = Path(path) / name
        if f.is_file():
            return json.loads(f.read_text()), whole
    return None, False


def _text(cfg: dict) -> dict:
    if "num_hidden_layers" in cfg or not isinstance(cfg.get("text_config"), dict):
        return cfg
    text = dict(cfg["text_config"])
    text.setdefault("model_type", cfg.get("model_type"))
    return text


def missing_target(path: Path) -> list[str]:
    cfg, _ = read_any(path)
    if cfg is None:
        return ["target.config (no field published)"]
    text = _text(cfg)
    return [f"target.{f}" for f in required_target_fields(text) if text.get(f) is None]


def missing_drafter(path: Path) -> list[str]:
    cfg, _ = read_any(path)
    if cfg is None:
        return ["drafter.config (no field published)"]
    d = cfg.get("dflash_config") or {}
    out = [f"drafter.{f}" for f in DRAFTER_FIELDS if cfg.get(f) is None]
    for f in DFLASH_FIELDS:
        if d.get(f) is None and cfg.get(f) is None:
            out.append(f"drafter.dflash_config.{f}")
    return out


def missing(recipe) -> list[str]:
    """The fields the recipe's configs lack for planning, plus what its comments say is
    unknown beyond configs (``incomplete`` entries not naming a config field are kept)."""
    found = []
    for role, fn in (("target", missing_target), ("drafter", missing_drafter)):
        ref = getattr(recipe, role)
        path = recipe.resolve_path(ref.config) if ref.config else None
        if path is None:
            continue
        found += fn(path)
    return found


def _hub_id(ref: str) -> bool:
    return "/" in ref and not ref.startswith(("embedded:", "/", ".", "~")) and not Path(ref).expanduser().exists()


def lacking(recipe, role: str) -> list[str]:
    """What stops planning ``role`` from the recipe's shipped configs: the fields they lack
    (:func:`missing`) and the recipe's ``incomplete`` entries for that role. An unknown revision
    alone does not: planning reads configs, and the build records the revision it fetched."""
    ref = getattr(recipe, role)
    path = recipe.resolve_path(ref.config) if ref.config else None
    found = (missing_target if role == "target" else missing_drafter)(path) if path is not None else []
    if path is None and recipe.source is not None and _hub_id(ref.id):  # published, configs not shipped here
        found.append(f"{role}.config (not shipped)")
    found += [f for f in recipe.incomplete if f.startswith(f"{role}.") and not f.startswith(f"{role}.revision")]
    if path is not None and not (path / "config.json").is_file() and not found:
        found.append(f"{role}.config (only partly published)")
    return list(dict.fromkeys(found))
