"""One parser for training settings, generated from :class:`~dflash_trt.train.settings.TrainSettings`.

Every field is an option spelled ``--kebab-case`` (``-t``/``-o``/``-b`` for target, out and block
size; ``--thinking/--no-thinking`` for the one tri-state switch), its ``--help`` the field's
description, its minimum the field's. ``--config FILE`` reads a YAML mapping of the same fields and
``--set KEY=VALUE`` sets one (as recipes do); a flag given on the command line wins over both.
``dflash-trt train-drafter`` and ``python -m dflash_trt.train`` both take their options from
:func:`parameters` and their settings from :func:`settings_from`: one set of options, one parser.
"""

from __future__ import annotations

import inspect
import typing
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from pydantic import ValidationError

from dflash_trt.errors import DFlashError, read_text
from dflash_trt.plan import apply_overrides
from dflash_trt.train.settings import TrainSettings

SHORT = {"target": "-t", "out": "-o", "block_size": "-b"}
CONFIG, SET = "config", "set_"


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    """(the type, whether None is allowed) of ``X`` or ``X | None``."""
    args = typing.get_args(tp)
    if type(None) in args and len(args) == 2:
        return next(a for a in args if a is not type(None)), True
    return tp, False


def _option(name: str) -> tuple[Any, Any]:
    """(annotation, default) of the option for field ``name``; every default is the field's own,
    and a value counts as given only when it came from the command line (:func:`settings_from`)."""
    f = TrainSettings.model_fields[name]
    kind, optional = _unwrap_optional(f.annotation)
    extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
    names = [_flag(name)] + ([SHORT[name]] if name in SHORT else [])
    if kind is bool and optional:
        names = [f"{_flag(name)}/--no-{_flag(name)[2:]}"]
    cli_kind = str if kind == list[int] else kind
    kwargs: dict[str, Any] = {"help": f.description}
    if extra.get("min") is not None and cli_kind in (int, float):
        kwargs["min"] = extra["min"]
    default = None if f.is_required() or kind == list[int] else f.default
    annotation = cli_kind | None if default is None and cli_kind is not bool else cli_kind
    return Annotated[annotation, typer.Option(*names, **kwargs)], default


def parameters() -> list[inspect.Parameter]:
    """The command's parameters: the context, every field, ``--config`` and ``--set``."""
    kw = inspect.Parameter.KEYWORD_ONLY
    out = [inspect.Parameter("ctx", kw, annotation=typer.Context)]
    for name in TrainSettings.model_fields:
        annotation, default = _option(name)
        out.append(inspect.Parameter(name, kw, default=default, annotation=annotation))
    out.append(
        inspect.Parameter(
            CONFIG,
            kw,
            default=None,
            annotation=Annotated[
                Path | None,
                typer.Option(
                    "--config", help="YAML file of these settings (field names as keys); flags given here win over it."
                ),
            ],
        )
    )
    out.append(
        inspect.Parameter(
            SET,
            kw,
            default=None,
            annotation=Annotated[
                list[str] | None, typer.Option("--set", help="Set one setting: KEY=VALUE (repeatable), over --config.")
            ],
        )
    )
    return out


def _layer_ids(value: str) -> list[int]:
    try:
        ids = [int(x) for x in value.replace(",", " ").split()]
    except ValueError:
        raise DFlashError(f"--target-layer-ids {value!r}: expected integers like 1,3,5") from None
    if not ids:
        raise DFlashError("--target-layer-ids: give at least one layer id")
    return ids


def _read_config(path: Path) -> dict:
    try:
        data = yaml.safe_load(read_text(path, "--config"))
    except yaml.YAMLError as exc:
        raise DFlashError(f"--config {path}: invalid YAML ({str(exc).splitlines()[0]})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise DFlashError(f"--config {path}: expected a mapping of settings")
    return data


def settings_from(ctx: typer.Context, params: dict[str, Any]) -> TrainSettings:
    """The settings: the fields' defaults, then ``--config``, then ``--set``, then each flag the
    command line gave; one line naming the setting for a bad or missing value."""
    data = _read_config(params[CONFIG]) if params.get(CONFIG) else {}
    data = apply_overrides(data, params.get(SET))
    for name in TrainSettings.model_fields:
        source = ctx.get_parameter_source(name)  # typer vendors click: its enum, compared by name
        if source is not None and source.name == "COMMANDLINE":
            value = params[name]
            data[name] = _layer_ids(value) if name == "target_layer_ids" else value
    if isinstance(data.get("target_layer_ids"), str):
        data["target_layer_ids"] = _layer_ids(data["target_layer_ids"])
    missing = [n for n, f in TrainSettings.model_fields.items() if f.is_required() and data.get(n) is None]
    if missing:
        raise DFlashError(f"missing option {_flag(missing[0])} (or {missing[0]}: in --config)")
    try:
        return TrainSettings.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"]) or "(top level)"
        msg = "unknown setting" if first["type"] == "extra_forbidden" else first["msg"]
        raise DFlashError(f"{key}: {msg}") from None
