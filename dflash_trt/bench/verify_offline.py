"""``dflash-trt verify BUNDLE``, offline: a bundle checked against its own manifest and plan, no server.

- *files*: every file the bundle holds against the sha256 its manifest records (bundle formats 3
  and 4: ``ingest.HASHED_FORMATS``; an older bundle is told to rebuild, in one line, exit 2);
- *manifest*: the manifest's own fields against the files they describe (its paths inside the
  bundle, checked when any command opens it; the release, GPU, parallelism, context length, KV
  cache, drafter layers and chat template equal to what ``trtllm/config.yaml``, ``serve.sh`` and
  the target say): the manifest is checked against its files, not sealed with its own digest;
- *config*: ``trtllm/config.yaml`` against the targeted release's schema and keys
  (``deploy.validate_trtllm_config``, through ``deploy.check_bundle``) and against the plan it was
  written from: tensor parallelism, draft length, draft attention backend, schedule, KV-cache
  dtype, TensorRT-LLM's token budget (``tensorrt_llm/_torch/speculative/dflash.py::
  validate_dflash_ctx_buffer_budget``: ``max_batch_size x (1 + max_draft_len) <= max_num_tokens``)
  and the drafter's target layers.

Invariant: a bundle that cannot be verified (no hashes, no plan) is refused in one line; past
that, every problem is a line in a failed check's ``problems``, never an exception. Each check is
the dict :func:`checked` builds, the shape the online checks (:mod:`~dflash_trt.bench.verify`)
share.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from dflash_trt import deploy, ingest
from dflash_trt import plan as planner
from dflash_trt.errors import DFlashError


def checked(name: str, problems: list[str], ok: str, details: dict | None = None) -> dict:
    """A check's report: failed with its first problem as summary (and how many more), else passed with ``ok``."""
    summary = problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "") if problems else ok
    return {
        "name": name,
        "status": "fail" if problems else "pass",
        "summary": summary,
        "details": {"problems": problems, **(details or {})},
    }


def open_verifiable(path: str | Path) -> ingest.Bundle:
    """The bundle, refused in one line unless it records its files' hashes (format 3 on)."""
    bundle = ingest.open_bundle(path)
    ingest.check_format(bundle.manifest_path, bundle.built.format, ingest.HASHED_FORMATS)
    if bundle.built.plan is None:
        raise DFlashError(f"{path}: the manifest has no plan; rebuild the bundle with 'dflash-trt build'")
    return bundle


def check_file_hashes(bundle: ingest.Bundle) -> dict:
    """Every file the bundle holds against the sha256 its manifest records."""
    problems = ingest.check_files(bundle)
    return checked("files", problems, f"{len(bundle.built.files or {})} files match the manifest's sha256")


def _plan_rules(bundle: ingest.Bundle, cfg: dict) -> list[str]:
    """Where the config says other than the plan it was written from (one line each)."""
    p, spec = bundle.built.plan, cfg.get("speculative_config") or {}
    if p is None:  # open_verifiable refuses it; a plan's every field is typed (ingest.Plan)
        return ["the manifest has no plan; rebuild the bundle with 'dflash-trt build'"]
    out = []
    want = {
        "tensor_parallel_size": (cfg.get("tensor_parallel_size", 1), p.tp),
        "speculative_config.max_draft_len": (spec.get("max_draft_len"), p.max_draft_len),
        "speculative_config.attention_backend": (spec.get("attention_backend", "VANILLA"), p.attention_backend),
        "kv_cache_config.dtype": ((cfg.get("kv_cache_config") or {}).get("dtype", "auto"), p.kv_cache),
    }
    if p.schedule == "max_concurrency":
        want["speculative_config.max_concurrency"] = (spec.get("max_concurrency"), p.max_concurrency)
    elif p.schedule == "draft_len_schedule":
        got = {int(k): int(v) for k, v in (spec.get("draft_len_schedule") or {}).items()}
        want["speculative_config.draft_len_schedule"] = (got, dict(p.draft_len_schedule or {}))
    out += [f"{k} is {got!r}, the plan says {planned!r}" for k, (got, planned) in want.items() if got != planned]
    batch, tokens, L = cfg.get("max_batch_size", 0), cfg.get("max_num_tokens", 0), spec.get("max_draft_len") or 0
    if batch * (1 + L) > tokens:  # dflash.py::validate_dflash_ctx_buffer_budget
        out.append(
            f"TensorRT-LLM's DFlash token budget max_batch_size x (1 + max_draft_len) = {batch * (1 + L)} "
            f"exceeds max_num_tokens {tokens}"
        )
    drafter = planner.DraftShape.from_dir(bundle.drafter)
    layers = planner.TargetShape.from_dir(bundle.target).layers
    ids = spec.get("target_layer_ids")
    if ids is not None and sorted(ids) != sorted(drafter.target_layer_ids):
        out.append(
            f"speculative_config.target_layer_ids {ids} differ from the drafter's {list(drafter.target_layer_ids)}"
        )
    if any(i < 0 or i >= layers for i in drafter.target_layer_ids):
        out.append(f"the drafter reads target layers {list(drafter.target_layer_ids)}; the target has {layers}")
    return out


def check_config(bundle: ingest.Bundle) -> dict:
    """``trtllm/config.yaml`` against the release's schema and against the plan it was written from."""
    release = bundle.built.trtllm.release if bundle.built.trtllm else None
    try:
        deploy.check_trtllm_bundle(bundle.root)  # layout, drafter, the config against the release's schema
        cfg = yaml.safe_load(bundle.trtllm_config.read_text()) or {}
        problems = _plan_rules(bundle, cfg)
    except DFlashError as exc:
        problems = [str(exc)]
    return checked(
        "config",
        problems,
        f"trtllm/config.yaml holds TensorRT-LLM {release}'s rules and the plan's settings",
        {"release": release},
    )


def check_manifest(bundle: ingest.Bundle) -> dict:
    """The manifest's own fields against the files they describe (``ingest.check_fields``)."""
    try:
        cfg = yaml.safe_load(bundle.trtllm_config.read_text()) or {}
        problems = ingest.check_fields(bundle, cfg if isinstance(cfg, dict) else {})
    except (OSError, yaml.YAMLError, DFlashError) as exc:
        problems = [str(exc).splitlines()[0]]
    return checked(
        "manifest", problems, "the manifest's settings agree with trtllm/config.yaml, serve.sh and the bundle's files"
    )


def offline(path: str | Path) -> tuple[ingest.Bundle, list[dict]]:
    """The bundle at ``path`` and its three offline checks: files, manifest, config."""
    bundle = open_verifiable(path)
    return bundle, [check_file_hashes(bundle), check_manifest(bundle), check_config(bundle)]
