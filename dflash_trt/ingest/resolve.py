"""Model references to local directories: ``embedded:NAME``, a local directory, or a hub id.

``resolve`` is the one entry point; ``read_json`` and ``open_dir`` are the first checks every
reader runs (a missing or malformed file is one line naming it).
"""

from __future__ import annotations

import functools
import json
import math
from importlib import resources
from pathlib import Path

from dflash_trt.errors import CheckpointError
from dflash_trt.ingest import files, hub

EMBEDDED_PREFIX = "embedded:"


def embedded_dir(name: str) -> Path:
    """Where ``embedded:NAME`` lives: ``dflash_trt/assets/NAME`` inside the package."""
    return Path(str(resources.files("dflash_trt") / "assets" / name))


@functools.cache
def transformers_names() -> frozenset[str]:
    """The names the installed transformers exports (its lazy ``__all__``): an architecture is
    known without importing its modeling code (torch), and without ``dir()``'s 0.2 s per call."""
    import transformers  # start-up: transformers

    return frozenset(transformers.__all__)  # type: ignore[attr-defined]  # the _LazyModule sets it


def embedded_names() -> list[str]:
    """The valid ``embedded:NAME`` names: every packaged asset directory holding a config.json."""
    root = embedded_dir("")
    return sorted(str(p.parent.relative_to(root)) for p in root.glob("**/config.json"))


def resolve(
    ref: str,
    role: str = "model",
    revision: str | None = None,
    expected_bytes: int | None = None,
    configs_only: bool = False,
    hub_only: bool = False,
) -> Path:
    """A local directory for a model reference.

    ``embedded:NAME`` -> the packaged asset; an existing directory -> itself;
    ``org/name[@revision]`` -> a Hugging Face snapshot (configs, tokenizer, safetensors only),
    after checking ``expected_bytes`` (its size, when known) against the free disk space;
    ``configs_only``: configs and tokenizer only (what planning reads). A short commit prefix as
    ``revision`` is resolved (``hub.expand_revision``).
    ``hub_only``: never a local directory (a recipe's id by its path rule, ``plan.PATH_RULE``).
    """
    ref = str(ref)
    if ref.startswith(EMBEDDED_PREFIX):
        path = embedded_dir(ref[len(EMBEDDED_PREFIX) :])
        if not (path / "config.json").exists():
            names = ", ".join(EMBEDDED_PREFIX + n for n in embedded_names())
            raise CheckpointError(f"{role} {ref!r}: no such embedded model; this installation has {names}")
        return path
    if hub_only:  # a recipe's id that is not a local path by the recipe path rule
        hub_id = hub.parse_hub_id(ref)
        if hub_id is None:
            raise CheckpointError(
                f"{role} {ref!r}: not a hub id org/name[@revision]; a local directory starts with ./, ../ or /"
            )
        return hub.download(hub_id[0], revision or hub_id[1], role, expected_bytes, configs_only=configs_only)
    try:
        path = Path(ref).expanduser()
    except RuntimeError:  # "~nosuchuser/x": no such user's home
        raise CheckpointError(f"{role} {ref!r}: no such directory (cannot expand {ref.split('/')[0]!r})") from None
    if path.is_dir():
        files.refuse_special(path, role)
        return path
    if path.exists():
        raise CheckpointError(f"{role} {ref!r}: is a file; pass the model's directory")

    hub_id = hub.parse_hub_id(ref)
    if hub_id is None:
        raise CheckpointError(f"{role} {ref!r}: no such directory (nor a hub id org/name[@revision])")
    org = hub_id[0].split("/")[0]
    if Path(org).is_dir():  # "out/drafter" whose parent exists is a mistyped local path, not a hub id
        raise CheckpointError(
            f"{role} {ref!r}: no such directory (read as a local path because ./{org} exists; "
            f"use an absolute path, or run elsewhere for the hub id)"
        )
    repo_id, rev = hub_id
    return hub.download(repo_id, revision or rev, role, expected_bytes, configs_only=configs_only)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} overflows to {value}")
    return value


def loads_strict(text: str | bytes):
    """``json.loads`` refusing NaN, Infinity and numbers that overflow a float (ValueError)."""
    return json.loads(text, parse_constant=_no_constant, parse_float=_finite)


def read_json(path: Path) -> dict:
    files.check_regular(path)
    try:
        data = loads_strict(path.read_text())
    except FileNotFoundError as exc:
        raise CheckpointError(f"{path}: missing") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc}); download it again") from exc
    except RecursionError:
        raise CheckpointError(f"{path}: JSON nested too deeply to be a model config") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    archs, model_type = data.get("architectures"), data.get("model_type")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise CheckpointError(f"{path}: architectures is {archs!r}; it must be a list of class names")
    if model_type is not None and not isinstance(model_type, str):
        raise CheckpointError(f"{path}: model_type is {model_type!r}; it must be a string")
    return data


def positive_int(cfg: dict, key: str, where, default: int | None = None) -> int:
    """``cfg[key]`` as a positive integer (``default`` when absent or null), else one line naming it."""
    value = cfg.get(key)
    if value is None and default is not None:
        return default
    if value is None:
        raise CheckpointError(f"{where}: {key} is missing; a model config needs it")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise CheckpointError(f"{where}: {key} is {value!r}; it must be a positive integer")
    return value


def open_dir(path: str | Path, what: str) -> Path:
    """A directory that exists, is not empty and has a config.json (else a one-line error)."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such directory")
    entries = [p for p in path.iterdir() if not p.name.startswith(".")]
    if not entries:
        raise CheckpointError(f"{path}: empty directory; expected a {what} (config.json + *.safetensors)")
    if not (path / "config.json").exists():
        pickled = [p.name for p in entries if p.suffix in files.PICKLED_SUFFIXES]
        hint = f" (found only {pickled[0]}: pickled weights are never loaded)" if pickled else ""
        raise CheckpointError(f"{path}: no config.json{hint}; is this a {what} directory?")
    return path
