"""Recipes: one YAML file per (model pair, GPU, precision), validated before any work.

A recipe is a user-editable YAML file (copy a bundled one with ``dflash-trt recipes
copy``). Every field is documented in :mod:`dflash_trt.plan.recipe_model`; the pydantic model
rejects unknown keys and bad values with the file and key path. ``--set a.b=value`` overrides any
field (the value is parsed as YAML, so ``--set serving.max_batch_size=32`` gives an int). A
command-line flag such as ``--precision`` sets its field as a Python value (:class:`FieldValue`):
no YAML in between, validated by the same model, and an error names the flag.

Invariant: this module is the one reader of recipe text (files, ``--set``, flags) and the one
place the path rule (:data:`PATH_RULE`) is applied, so every :class:`Recipe` it returns has
absolute local paths. The models are re-exported here (``plan.recipe.Recipe``, ...) for the
modules and tests that import them from their old home.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from dflash_trt.errors import RecipeError, read_text
from dflash_trt.plan.recipe_model import (
    MAX_BATCH,
    MAX_BLOCK,
    MAX_GPUS,
    MAX_TOKENS,
    GpuSpec,
    ModelRef,
    ParallelSpec,
    PrecisionSpec,
    Recipe,
    ServingSpec,
    SpeculativeSpec,
    TrtllmSpec,
    any_case,
)

__all__ = [
    "MAX_BATCH",
    "MAX_BLOCK",
    "MAX_GPUS",
    "MAX_TOKENS",
    "FieldValue",
    "GpuSpec",
    "ID_KEYS",
    "LOCAL_PREFIXES",
    "ModelRef",
    "PATH_KEYS",
    "PATH_RULE",
    "ParallelSpec",
    "PrecisionSpec",
    "Recipe",
    "ServingSpec",
    "SpeculativeSpec",
    "TrtllmSpec",
    "any_case",
    "apply_overrides",
    "bundled_recipes",
    "load_recipe",
    "parse_override",
    "recipe_from_dict",
]


def _bundled_dir() -> Path:
    return Path(str(resources.files("dflash_trt") / "recipes"))


def bundled_recipes() -> dict[str, Path]:
    """Bundled recipe names -> files."""
    return {p.stem: p for p in sorted(_bundled_dir().glob("*.yaml"))}


@dataclass(frozen=True)
class FieldValue:
    """One recipe field set to a Python value (a command-line flag), never parsed as YAML.

    ``path`` is the field's key path (``"precision.weights"``); ``origin`` is what the user
    typed (``"--precision"``), named in the error when pydantic rejects ``value``.
    """

    path: str
    value: Any
    origin: str

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(self.path.split("."))


def parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise RecipeError(f"--set {item!r}: expected KEY=VALUE, e.g. --set serving.max_batch_size=32")
    key, raw = item.split("=", 1)
    path = [k for k in key.strip().split(".") if k]
    if not path:
        raise RecipeError(f"--set {item!r}: empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return path, value


def _put(data: dict, path: list[str] | tuple[str, ...], value: Any, what: str) -> None:
    """``data[path[0]]...[path[-1]] = value``, creating missing sections."""
    node = data
    for k in path[:-1]:
        nxt = node.get(k)
        if nxt is None:
            nxt = node[k] = {}
        if not isinstance(nxt, dict):
            raise RecipeError(f"{what}: '{k}' is not a section")
        node = nxt
    node[path[-1]] = value


def apply_overrides(data: dict, overrides: list[str] | None) -> dict:
    for item in overrides or []:
        path, value = parse_override(item)
        _put(data, path, value, f"--set {item}")
    return data


_UNION_TAG = re.compile(r"(constrained-)?(int|float|str|bool|dict|list)|[\w-]+\[.*\]")


def _format_validation(err: ValidationError, where: str, fields: Sequence[FieldValue] = ()) -> str:
    first = err.errors()[0]
    # a union's member tags (``int``, ``constrained-int``, ``literal['auto']``) are not keys
    loc = tuple(str(x) for x in first["loc"] if not _UNION_TAG.fullmatch(str(x)))
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
    elif first["type"] == "missing":
        msg = "required key is missing"
    more = f" (and {len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    flag = next((f for f in fields if loc[: len(f.keys)] == f.keys), None)
    if flag is not None:
        return f"{flag.origin} {flag.value!r}: {msg}{more}"
    return f"{where}: {'.'.join(loc) or '(top level)'}: {msg}{more}"


def _overlaps(a: tuple[str, ...], b: list[str]) -> bool:
    n = min(len(a), len(b))
    return tuple(a[:n]) == tuple(b[:n])


def recipe_from_dict(
    data: dict,
    where: str = "recipe",
    source: Path | None = None,
    overrides: list[str] | None = None,
    fields: Sequence[FieldValue] = (),
) -> Recipe:
    """Validate ``data`` after setting ``fields`` (typed values), then ``overrides`` (``--set``)."""
    if not isinstance(data, dict):
        raise RecipeError(f"{where}: expected a mapping of keys at the top level")
    data = copy.deepcopy(data)
    for f in fields:
        _put(data, f.keys, f.value, f.origin)
    data = apply_overrides(data, overrides)
    # A --set given after a flag on the same key wins, and so owns any error on it.
    set_keys = [parse_override(item)[0] for item in overrides or []]
    owned = [f for f in fields if not any(_overlaps(f.keys, k) for k in set_keys)]
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(_format_validation(exc, where, owned)) from None
    recipe.source = source
    _anchor_paths(recipe, source, [f.keys for f in fields] + [tuple(k) for k in set_keys])
    return recipe


# The one path rule. A value typed on the command line (a flag, --set) is relative to the working
# directory; a value written in a recipe file is relative to that file. A model `id` is a local
# path only when it starts with ./, ../, / or ~ (or, typed on the command line, names an existing
# directory); otherwise it is a hub id (org/name[@rev]) or embedded:NAME. After loading, every
# local path in a Recipe is absolute, so no later reader has to know where it came from.
PATH_KEYS = (("target", "config"), ("drafter", "config"), ("precision", "calib"))
ID_KEYS = (("target", "id"), ("drafter", "id"))
LOCAL_PREFIXES = ("./", "../", "/", "~")
PATH_RULE = (
    "Paths: a value given on the command line (a flag or --set) is relative to the working directory; "
    "one written in a recipe file is relative to that file. A model id is a local directory when it "
    "starts with ./, ../, / or ~ (on the command line also when it names an existing directory), else a "
    "hub id org/name[@revision]."
)


def _anchor_paths(recipe: Recipe, source: Path | None, typed: list[tuple[str, ...]]) -> None:
    """Make the recipe's local paths absolute by :data:`PATH_RULE` (``typed``: key paths set on
    the command line; a key is typed when it or a section holding it is)."""
    base = source.parent if source is not None else Path.cwd()
    for keys in PATH_KEYS + ID_KEYS:
        section = getattr(recipe, keys[0])
        value = getattr(section, keys[1])
        if value is None:
            continue
        on_cli = any(keys[: len(k)] == k for k in typed)
        is_id = keys[1] == "id"
        local = str(value).startswith(LOCAL_PREFIXES) or (on_cli and is_id and _is_dir(value))
        if is_id and not local:
            continue
        try:
            path = Path(value).expanduser()
        except RuntimeError:  # ~nosuchuser: left for the reader's one-line error
            continue
        if not path.is_absolute():
            path = (Path.cwd() if on_cli else base) / path
        setattr(section, keys[1], str(path))


def _is_dir(value: str) -> bool:
    try:
        return Path(value).expanduser().is_dir()
    except (RuntimeError, OSError):
        return False


def load_recipe(
    name_or_path: str | Path, overrides: list[str] | None = None, fields: Sequence[FieldValue] = ()
) -> Recipe:
    """Load a bundled recipe by name, or a YAML file by path, then set ``fields`` and ``--set`` overrides."""
    path = Path(name_or_path)
    if not path.is_file() and str(name_or_path) in bundled_recipes():  # names may contain dots (llama3.1-...)
        path = bundled_recipes()[str(name_or_path)]
    if not path.is_file():
        names = ", ".join(bundled_recipes()) or "none"
        raise RecipeError(f"no recipe {str(name_or_path)!r}: not a file, nor a bundled recipe ({names})")
    try:
        data = yaml.safe_load(read_text(path, "recipe")) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" line {mark.line + 1}" if mark else ""
        raise RecipeError(f"{path}:{at} invalid YAML: {getattr(exc, 'problem', exc)}") from None
    return recipe_from_dict(data, where=str(path), source=path.resolve(), overrides=overrides, fields=fields)
