"""The installed TensorRT-LLM judges a bundle's ``trtllm/config.yaml`` before it is served.

Invariant: a bundle is served by the TensorRT-LLM that is installed when, and only when, that
release's own LLM-API argument classes accept the bundle's config and the release is not older
than the one the plan was made for. A release newer than the plan's is served after that
check, with one line naming the release the plan was made for; a key the installed release
rejects is one line naming the key (exit 2).

How ``trtllm-serve`` itself reads ``--config`` (``tensorrt_llm/commands/serve.py::serve``): the
YAML dict goes through ``update_llm_args_with_extra_dict`` (``tensorrt_llm/llmapi/llm_utils.py``;
``llm_args.py`` in older releases), which builds ``speculative_config`` with
``DecodingBaseConfig.from_dict`` (dispatching on ``decoding_type`` to ``DFlashDecodingConfig``) and
the other sections (``kv_cache_config``, ...) with their classes; ``launch_server`` then calls
``LLM(**llm_args)``, which validates everything as ``TorchLlmArgs`` (``TorchLlmArgs.from_kwargs``).
Those classes are ``StrictBaseModel`` (pydantic, ``extra="forbid"``), so an unknown key is a
``ValidationError`` whose location names it. :func:`judge` runs exactly that path.

This file is self-contained (the standard library; PyYAML, which TensorRT-LLM requires, to read
the YAML; ``tensorrt_llm`` imported lazily, in :func:`llm_api` only): ``deploy.trtllm_config.write``
copies it verbatim into every bundle as ``trtllm/judge.py``, which ``serve.sh`` runs on the GPU
machine, where dflash-trt need not be installed; ``dflash-trt serve --check`` imports it.

Features by field: no release after 1.4.0rc1 could be established and the docs' "latest" page
lags, so what a release can do is read from its classes (:func:`installed_features`: the fields
of ``DecodingBaseConfig`` / ``DFlashDecodingConfig`` and the values ``attention_backend`` takes),
not inferred from the version string; :func:`feature_lines` reports each feature the installed
classes have, and ``dflash_trt.deploy.trtllm_installed`` plans with those the table lacks.

What it checked against is printed (version and commit: ``version.py``'s commit variable, else
the distribution's ``direct_url.json``, else "not recorded") and appended to a JSON-lines log
OUTSIDE the bundle (``$DFLASH_SERVE_LOG``, default ``$XDG_STATE_HOME/dflash-trt/serve-checks.jsonl``),
so the files the manifest hashes stay as built.

Not judged here, by design: what needs the GPU or the weights (kernels, memory), and what the
release's validators only check when the model is built (``LLM.__init__`` past the arguments).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import importlib.util
import json
import logging
import os
import re
import sys
import time
import typing
from importlib import metadata
from pathlib import Path

logger = logging.getLogger(__name__)

CONFIG = "trtllm/config.yaml"
INDEX_URL = "https://pypi.nvidia.com"
IMAGE = "nvcr.io/nvidia/tensorrt-llm/release"
_STAGES = {"a": 0, "b": 1, "rc": 2, None: 3}


def installed_trtllm() -> str | None:
    """The installed ``tensorrt_llm`` version, read WITHOUT importing it (importing initialises
    CUDA): its ``version.py`` (``__version__``), else the distribution's metadata; None if absent."""
    spec = importlib.util.find_spec("tensorrt_llm")
    if spec is None:
        return None
    for loc in spec.submodule_search_locations or []:
        f = Path(loc, "version.py")
        m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", f.read_text()) if f.is_file() else None
        if m:
            return m.group(1)

    try:
        return metadata.version("tensorrt_llm")
    except metadata.PackageNotFoundError:
        return None


def installed_commit() -> str | None:
    """The installed ``tensorrt_llm``'s source commit, read WITHOUT importing it: a commit variable in
    its ``version.py``, else the distribution's ``direct_url.json`` (``vcs_info.commit_id``); None if neither."""
    spec = importlib.util.find_spec("tensorrt_llm")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        f = Path(loc, "version.py")
        m = (
            re.search(
                r"(?:__git_commit__|git_commit|__commit__|git_version)\s*=\s*['\"]([0-9a-fA-F]{7,40})", f.read_text()
            )
            if f.is_file()
            else None
        )
        if m:
            return m.group(1)

    try:
        direct = metadata.distribution("tensorrt_llm").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    return (json.loads(direct).get("vcs_info") or {}).get("commit_id") if direct else None


# (feature, class, field, a value the field must admit or None): what a DFlash bundle can use
FEATURES = (
    ("FA4 draft attention", "DFlashDecodingConfig", "attention_backend", "FA4"),
    ("context_recompute_tail", "DFlashDecodingConfig", "context_recompute_tail", None),
    ("draft-length floor min_runtime_draft_len (PR #16888)", "DecodingBaseConfig", "min_runtime_draft_len", None),
    ("skip_ctx_buffer_budget_check", "DFlashDecodingConfig", "skip_ctx_buffer_budget_check", None),
)


def _literal_values(annotation) -> list[str]:
    """The string values a ``Literal[...]`` annotation (possibly inside Optional) admits."""
    if typing.get_origin(annotation) is typing.Literal:
        return [a for a in typing.get_args(annotation) if isinstance(a, str)]
    return [v for a in typing.get_args(annotation) for v in _literal_values(a)]


def installed_features() -> dict:
    """The installed release's decoding classes, read by field (imports ``tensorrt_llm.llmapi``):
    ``{"fields": {class: [field, ...]}, "attention_backends": [...], "defaults": {field: default},
    "features": [feature, ...]}``."""
    from tensorrt_llm.llmapi import llm_args  # optional: tensorrt_llm

    fields: dict[str, dict] = {}
    for name in ("DecodingBaseConfig", "DFlashDecodingConfig"):
        cls = getattr(llm_args, name, None)
        fields[name] = dict(getattr(cls, "model_fields", None) or {})
    dflash = fields["DFlashDecodingConfig"]
    backend = dflash.get("attention_backend")
    backends = _literal_values(backend.annotation) if backend is not None else []
    have = []
    for feature, cls, field, value in FEATURES:
        found = fields[cls].get(field) or dflash.get(field)  # DFlash inherits the base's fields
        if found is not None and (value is None or value in backends):
            have.append(feature)
    defaults = {
        k: f.default
        for cls in fields.values()
        for k, f in cls.items()
        if isinstance(getattr(f, "default", None), int | float | str | bool)
    }
    return {
        "fields": {k: sorted(v) for k, v in fields.items()},
        "attention_backends": backends,
        "defaults": defaults,
        "features": have,
    }


def feature_lines(feats: dict, version: str, data: dict) -> list[str]:
    """What the installed classes offer: the features by field (one clause), plus one line per
    behaviour that differs from what the config's plan assumed (the draft-length floor)."""
    lines = ["by field it has " + (", ".join(feats["features"]) or "none of " + ", ".join(f[0] for f in FEATURES))]
    spec = data.get("speculative_config") or {}
    floor = feats["defaults"].get("min_runtime_draft_len")
    if floor and (spec.get("draft_len_schedule") or spec.get("max_concurrency")):
        lines.append(
            f"TensorRT-LLM {version} floors the draft length at min_runtime_draft_len={floor}: above the "
            "config's largest schedule key it keeps drafting instead of stopping (PR #16888)"
        )
    return lines


def record(bundle: Path, planned: str, have: str, commit: str | None) -> Path | None:
    """Append what was checked to the log outside the bundle (module docstring); None if it cannot be written."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    log = Path(os.environ.get("DFLASH_SERVE_LOG") or Path(state, "dflash-trt", "serve-checks.jsonl"))
    manifest = bundle / "manifest.json"
    entry = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "bundle": str(bundle.resolve()),
        "manifest_sha256": hashlib.sha256(manifest.read_bytes()).hexdigest() if manifest.is_file() else None,
        "planned": planned,
        "installed": have,
        "commit": commit,
    }
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as f:
            f.write(json.dumps(entry) + "\n")
    except OSError:
        return None
    return log


def version_key(v: str) -> tuple[int, ...]:
    """``1.4.0rc1`` -> (1, 4, 0, 2, 1, 0): release, stage (a < b < rc < final), its number, post;
    a local suffix (``+cu130``) is ignored. Unparseable: a ValueError."""
    m = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?(?:(a|b|rc)(\d+))?(?:\.post(\d+))?", v.split("+")[0].strip())
    if not m:
        raise ValueError(f"cannot read TensorRT-LLM version {v!r}")
    major, minor, patch, stage, n, post = m.groups()
    return int(major), int(minor), int(patch or 0), _STAGES[stage], int(n or 0), int(post or 0)


def llm_api():
    """``(TorchLlmArgs, update_llm_args_with_extra_dict)`` of the installed release (imports it)."""
    from tensorrt_llm.llmapi import llm_args  # optional: tensorrt_llm

    try:
        from tensorrt_llm.llmapi.llm_utils import update_llm_args_with_extra_dict as update  # optional: tensorrt_llm
    except ImportError:
        update = llm_args.update_llm_args_with_extra_dict
    return llm_args.TorchLlmArgs, update


def _first_error(exc: Exception, section: str | None) -> tuple[str, str]:
    """(dotted key, why) from a pydantic ValidationError (duck-typed: ``errors()``), else the message."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            e = errors()[0]
        except Exception:  # an errors() of another contract: fall back to the message
            e = None
        if e is not None:
            loc = [str(x) for x in e.get("loc", ())]
            if section and (not loc or loc[0] != section):
                loc = [section, *loc]
            why = "no such key" if e.get("type") == "extra_forbidden" else e.get("msg", "invalid")
            return ".".join(loc) or (section or "config"), why
    return section or "config", (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def refuse_disaggregated(data: dict) -> str | None:
    """One line when the config asks for disaggregated serving (its KV transceiver): DFlash there
    drafts without the prompt and acceptance collapses; TensorRT-LLM only warns (PR #19352)."""
    if isinstance(data, dict) and data.get("cache_transceiver_config") is not None:
        return (
            "cache_transceiver_config: DFlash with disaggregated serving drafts without the prompt (the "
            "generation server gets the target's KV cache, not the drafter's context), so acceptance collapses; "
            "TensorRT-LLM only warns (PR #19352): serve aggregated"
        )
    return None


def refuse_flashinfer(data: dict) -> str | None:
    """One line when a DFlash config asks for the FlashInfer target attention: it cannot take the
    K + 1 tokens per sequence a verify step feeds it (PR #19466 rejects it for DFlash)."""
    spec = data.get("speculative_config") if isinstance(data, dict) else None
    if isinstance(spec, dict) and spec.get("decoding_type") == "DFlash" and data.get("attn_backend") == "FLASHINFER":
        return (
            "attn_backend: FLASHINFER cannot verify K + 1 tokens per sequence, so DFlash cannot run on it "
            "(TensorRT-LLM PR #19466 rejects it): use TRTLLM"
        )
    return None


def judge(data: dict, release: str, model: str = "./target") -> str | None:
    """None when the installed release's LLM-API classes accept ``data`` (the config dict) the way
    ``trtllm-serve --config`` reads it; else one line naming the first key they reject (a section
    that fails to convert is found by converting each alone, so a nested error names it)."""
    if not isinstance(data, dict):
        return f"{CONFIG} is not a mapping of LLM-API keys"
    TorchLlmArgs, update = llm_api()
    try:
        merged = update({"model": model}, copy.deepcopy(data), CONFIG)
    except Exception as exc:
        for key, value in data.items():  # which section: convert each alone
            try:
                update({}, {key: copy.deepcopy(value)}, CONFIG)
            except Exception as one:
                return _line(one, key, release)
        return _line(exc, None, release)
    try:
        build = getattr(TorchLlmArgs, "from_kwargs", None) or TorchLlmArgs
        build(**merged)
    except Exception as exc:
        return _line(exc, None, release)
    return None


def _line(exc: Exception, section: str | None, release: str) -> str:
    logger.debug("the installed release refused the config", exc_info=exc)  # the line keeps its message only
    key, why = _first_error(exc, section)
    return f"{CONFIG}: {key}: TensorRT-LLM {release} rejects it ({why})"


def refuse_causal_drafter(bundle: Path | str) -> str | None:
    """One line when the bundle's drafter declares in-block causal attention (JetSpec,
    ``dflash_config.causal: true``): TensorRT-LLM's DFlash loader does not read ``causal`` and would
    run the block bidirectionally (``dflash_trt.ingest.format_guards``)."""
    try:
        cfg = json.loads((Path(bundle) / "drafter" / "config.json").read_text())
    except (OSError, ValueError):
        return None  # the drafter is TensorRT-LLM's to read
    if isinstance(cfg, dict) and True in ((cfg.get("dflash_config") or {}).get("causal"), cfg.get("causal")):
        return (
            "drafter/config.json: a JetSpec drafter (dflash_config.causal: true); TensorRT-LLM does not read "
            "causal and would run its block bidirectionally: serve this bundle with dflash-trt (its graphs or "
            "the reference runtime), not trtllm-serve"
        )
    return None


def judge_trtllm_config(planned: str, bundle: Path | str = ".", skip_config: bool = False) -> tuple[int, list[str]]:
    """(exit code, lines to print) for serving ``bundle`` with the installed TensorRT-LLM:
    2 with one line when it cannot be served; else 0, with a line when the release is newer."""
    causal = refuse_causal_drafter(bundle)
    if causal:
        return 2, [causal]
    have = installed_trtllm()
    if have is None:
        return 2, [
            f"tensorrt_llm is not installed; this bundle needs TensorRT-LLM {planned} (pip install "
            f"tensorrt-llm=={planned} --extra-index-url {INDEX_URL}, or the {IMAGE}:{planned} container)"
        ]
    try:
        newer = version_key(have) > version_key(planned)
        older = version_key(have) < version_key(planned)
    except ValueError as exc:
        return 2, [str(exc)]
    if older:
        return 2, [
            f"TensorRT-LLM {have} is installed; this bundle was planned for TensorRT-LLM {planned}, which is "
            f"newer: install tensorrt-llm=={planned}, or rebuild with --set trtllm.release=<a release "
            "dflash-trt knows>"
        ]
    import yaml  # optional: yaml (TensorRT-LLM requires PyYAML; judge.py runs alone)

    root = Path(bundle)
    data = yaml.safe_load((root / CONFIG).read_text())
    bad = refuse_disaggregated(data) or refuse_flashinfer(data)
    if bad:
        return 2, [bad]
    lines: list[str] = []
    commit = installed_commit()
    if not skip_config:
        bad, lines = _judge_in(root, data, have)
        if bad:
            return 2, [bad]
    loaded = not skip_config and not any("could not load" in x for x in lines)
    checked = "accepted by its LLM-API classes" if loaded else "not checked against its classes"
    fields = [lines.pop(0)] if loaded and lines and lines[0].startswith("by field") else []
    log = record(root, planned, have, commit)
    sha = commit or "not recorded by the package"
    head = f"checked against TensorRT-LLM {have} (commit {sha}): the config is {checked}"
    lines.insert(0, "; ".join([head, *fields] + ([f"recorded in {log}"] if log else [])))
    if newer:
        lines.append(
            f"TensorRT-LLM {have} is newer than {planned}, the release this bundle's plan was made for; "
            f"the config is {checked}, draft lengths and memory are as planned for {planned}"
        )
    return 0, lines


def _judge_in(root: Path, data: dict, have: str) -> tuple[str | None, list[str]]:
    """(refusal, lines): the config judged by the installed LLM-API classes from inside the bundle
    (its paths, ./drafter, are relative to it); a line, not a refusal, when those classes do not load."""
    lines: list[str] = []
    bad = None
    cwd = os.getcwd()
    os.chdir(root)
    try:
        bad = judge(data, have)
        if not bad:
            lines += feature_lines(installed_features(), have, data)
    except ImportError as exc:
        lines.append(
            f"could not load TensorRT-LLM {have}'s LLM-API classes ({exc}); serving without "
            "checking the config against them"
        )
    finally:
        os.chdir(cwd)
    return bad, lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Judge a dflash-trt bundle's TensorRT-LLM config with the installed "
        "release's own LLM-API classes (run from the bundle directory)."
    )
    ap.add_argument("--planned", required=True, help="The TensorRT-LLM release the bundle was planned for.")
    ap.add_argument("--prefix", default="serve.sh", help="What each printed line starts with.")
    args = ap.parse_args(argv)
    code, lines = judge_trtllm_config(args.planned, ".", skip_config=os.environ.get("DFLASH_SKIP_CONFIG_CHECK") == "1")
    for line in lines:
        print(f"{args.prefix}: {line}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
