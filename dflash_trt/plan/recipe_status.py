"""What the project can do with a recipe, derived from its files (never typed into it).

In order, the first that applies (a drafter ``ingest.refused_id`` names, GGUF-only or of a refused
format, is ``unsupported`` before all):

* ``id-unconfirmed``: nothing published confirms the drafter's repository id (no config field
  and no revision recorded under ``recipes/configs/``): the recipe names the drafter a source
  announced, and waits for its id.
* ``unsupported``: the target's ``model_type`` is not a family of ``ingest.TARGET_FAMILIES`` (the
  runtime's registry of families proven lossless); the reason names it. The target-family issues
  add families; the recipe turns ``hub-only`` or ``ready`` by itself when they land.
* ``hub-only``: the shipped configs lack fields the planner needs (:func:`published.lacking`):
  ``plan``/``build`` read them from the hub or the local Hugging Face cache at the pinned
  revision, and refuse offline in one line when neither has them.
* ``ready``: plans offline from the shipped configs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from dflash_trt import ingest
from dflash_trt.plan import published

Kind = Literal["ready", "hub-only", "id-unconfirmed", "unsupported"]
KINDS: tuple[Kind, ...] = ("ready", "hub-only", "id-unconfirmed", "unsupported")


@dataclass(frozen=True)
class Status:
    kind: Kind
    reason: str = ""


def _family(model_type: str | None) -> str | None:
    for name, fam in ingest.TARGET_FAMILIES.items():
        if model_type in fam.model_types:
            return name
    return None


def _model_type(recipe) -> str | None:
    ref = recipe.target
    path = recipe.resolve_path(ref.config) if ref.config else None
    if path is None and ref.id.startswith(ingest.EMBEDDED_PREFIX):
        path = ingest.embedded_dir(ref.id[len(ingest.EMBEDDED_PREFIX) :])
    elif path is None and Path(ref.id).expanduser().is_dir():
        path = Path(ref.id).expanduser()
    cfg, _ = published.read_any(path) if path is not None and path.is_dir() else (None, False)
    if cfg is None:
        return None
    text: dict = cfg["text_config"] if isinstance(cfg.get("text_config"), dict) else {}
    return cfg.get("model_type") or text.get("model_type")


def _drafter_confirmed(recipe) -> bool:
    ref = recipe.drafter
    if ref.revision or ref.seen or "/" not in ref.id or ref.id.startswith(("embedded:", "/", ".", "~")):
        return True
    path = recipe.resolve_path(ref.config) if ref.config else None
    return path is not None and published.read_any(path)[0] is not None


def _refused_format(recipe) -> str | None:
    """A drafter format ``ingest.formats`` refuses, as far as the recorded config shows it."""
    ref = recipe.drafter
    path = recipe.resolve_path(ref.config) if ref.config else None
    cfg = published.read_any(path)[0] if path is not None and path.is_dir() else None
    cfg = cfg or {}
    if cfg.get("speculators_model_type") == "dflash2":
        return "speculators-format DFlash2 is refused by ingest.formats (use the z-lab-format DFlash2 drafter)"
    if cfg.get("attention_sink_bias") or (cfg.get("dflash_config") or {}).get("attention_sink_bias"):
        return "drafter attention sinks (attention_sink_bias) are refused by ingest.formats"
    return None


def recipe_status(recipe) -> Status:
    """The recipe's :class:`Status` (see the module doc for the order)."""
    by_name = ingest.refused_id(recipe.drafter.id)
    if by_name is not None:  # refused by name whatever else is recorded (ingest.format_guards)
        return Status("unsupported", by_name)
    if not _drafter_confirmed(recipe):
        return Status("id-unconfirmed", f"no published config or revision confirms {recipe.drafter.id}")
    refused = _refused_format(recipe)
    if refused:
        return Status("unsupported", refused)
    model_type = _model_type(recipe)
    lacking = published.lacking(recipe, "target") + published.lacking(recipe, "drafter")
    if model_type is None:
        return Status("hub-only", "target family read from the hub (no model_type recorded here)")
    family = _family(model_type)
    if family is None:
        return Status("unsupported", f"target family {model_type} is not in ingest.TARGET_FAMILIES yet")
    if lacking:
        return Status("hub-only", "shipped configs lack " + ", ".join(lacking))
    return Status("ready")


def unpinned_drafter(recipe) -> str | None:
    """The warning ``build`` gives for a drafter named by hub id without a revision: a drafter retrained
    under the same id changed acceptance several-fold for its users (z-lab/dflash issue #152)."""
    ref = recipe.drafter
    local = ref.id.startswith((ingest.EMBEDDED_PREFIX, "/", ".", "~")) or Path(ref.id).expanduser().is_dir()
    if ref.revision or "@" in ref.id or local or "/" not in ref.id:
        return None
    return (
        f"drafter {ref.id} is a hub id without a revision: a drafter retrained under the same id changed "
        "acceptance several-fold for its users (z-lab/dflash issue #152); pin it (drafter.revision, or "
        f"{ref.id}@<commit>)"
    )
