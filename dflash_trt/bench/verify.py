"""``dflash-trt verify``: a bundle checked offline, and a running deployment measured against its plan.

Offline (``verify BUNDLE``):

- *files*: every file the bundle holds against the sha256 its manifest records (bundle format 3;
  an older bundle is told to rebuild, in one line, exit 2);
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

Online (``verify BUNDLE --endpoint URL``), the deployment's acceptance test, on the GPU machine:

- *lossless* (:mod:`verify_lossless`): greedy completions agree with a baseline;
- *acceptance*: τ (tokens per sequence per target forward) and per-position acceptance over the
  load levels (:mod:`verify_server`), against the plan's τ at the draft lengths in force,
  ``expected_tau(alpha, L)``. Measured τ with ``τ - 1 < COLLAPSE x (τ_plan - 1)`` is a collapse,
  named with its likely causes;
- *schedule*: per tested concurrency, the draft length the server ran at each live batch size
  against the plan's ``draft_lengths`` (TensorRT-LLM's lookup, ``plan.schedule``);
- *trap* (:mod:`verify_trap`): after a load above the schedule's top, τ at low concurrency must
  recover to the plan's; a collapse names the zero-draft trap (TensorRT-LLM PR #16888);
- *memory*: the largest GPU memory in use the server reported against the plan's, with the KV
  pool TensorRT-LLM grows to ``kv_cache_config.free_gpu_memory_fraction`` of what is left free
  (``KvCacheConfig``): ``expected = rest + max(kv_planned, fraction x (capacity - rest))``; more
  than ``MEMORY_SLACK`` over it fails.

A check the server gives no figure for is "not measured", never failed. The report is the JSON of
``bench --endpoint --json`` (load levels, τ, with ``draft_len`` where measured), so ``dflash-trt plan
--calibration REPORT`` reads it, plus ``bundle``, ``stack``, ``checks`` and ``ok``.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from dflash_trt import deploy, ingest
from dflash_trt import plan as planner
from dflash_trt.bench import verify_lossless, verify_server, verify_trap
from dflash_trt.errors import DFlashError

COLLAPSE = 0.5  # a measured gain τ - 1 under half the plan's is a collapse
MEMORY_SLACK = 0.10
REFERENCE_MAX_BYTES = 4 << 30  # targets up to this run on the reference runtime (baseline, margins)
PROMPTS = Path(__file__).resolve().parents[1] / "assets" / "verify" / "prompts.jsonl"
STACKS = {"embedded": "reference", "trtllm": "trtllm"}  # what the scrapes looked like -> the report's stack


def _check(name: str, problems: list[str], ok: str, details: dict | None = None) -> dict:
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
    ingest.check_format(bundle.manifest_path, bundle.manifest.format, ingest.HASHED_FORMATS)
    if bundle.manifest.plan is None:
        raise DFlashError(f"{path}: the manifest has no plan; rebuild the bundle with 'dflash-trt build'")
    return bundle


def check_file_hashes(bundle: ingest.Bundle) -> dict:
    problems = ingest.check_files(bundle)
    return _check("files", problems, f"{len(bundle.manifest.files)} files match the manifest's sha256")


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
    release = bundle.manifest.trtllm.release if bundle.manifest.trtllm else None
    try:
        deploy.check_trtllm_bundle(bundle.root)  # layout, drafter, the config against the release's schema
        cfg = yaml.safe_load(bundle.trtllm_config.read_text()) or {}
        problems = _plan_rules(bundle, cfg)
    except DFlashError as exc:
        problems = [str(exc)]
    return _check(
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
    return _check(
        "manifest", problems, "the manifest's settings agree with trtllm/config.yaml, serve.sh and the bundle's files"
    )


def offline(path: str | Path) -> tuple[ingest.Bundle, list[dict]]:
    bundle = open_verifiable(path)
    return bundle, [check_file_hashes(bundle), check_manifest(bundle), check_config(bundle)]


# ---- online ---------------------------------------------------------------------------------
def likely_causes(m: ingest.Manifest, config: dict) -> list[str]:
    """Why acceptance collapses, most likely first, each with what this bundle records."""
    d, inputs, s = m.drafter, m.inputs, m.serve
    causes = []
    if d is not None:
        src = d.source_target_layer_ids
        moved = f" (re-sorted from {src})" if src != d.target_layer_ids else ""
        causes.append(
            f"layer-id convention: the drafter reads target layers {d.target_layer_ids}{moved}; a drafter "
            "trained with ids counted from the embedding output (or 1-based) reads the wrong hidden states"
        )
    if inputs is not None:
        causes.append(
            f"a drafter trained for another target or chat template: drafter {inputs.drafter.id} serves "
            f"target {inputs.target.id}"
        )
    causes.append(
        "a quantized drafter: TensorRT-LLM must run the drafter as shipped in BF16 "
        f"({'bundle drafter: ' + d.dtype if d else 'drafter/'}); do not quantize it"
    )
    causes.append(
        "disaggregated serving: with context and generation on different servers TensorRT-LLM's DFlash "
        "drafter loses the prompt's hidden states (PR #19352 only warns)"
    )
    if s.thinking_switch:
        trained = (s.drafter_chat or {}).get("enable_thinking")
        causes.append(
            f"thinking-mode mismatch: the deployment serves enable_thinking={s.enable_thinking}, the "
            f"drafter was trained with {trained if trained is not None else 'an unrecorded setting'}"
        )
    return causes


def check_acceptance(w: verify_server.Window, m: ingest.Manifest, config: dict, source: str) -> dict:
    if w.tau is None:
        summary = (
            "the server reports no speculative counters (embedded server metrics, trtllm-serve "
            "iteration stats with enable_iter_perf_stats, or --accept-stats DIR)"
        )
        if config and not config.get("enable_iter_perf_stats"):
            summary += (
                "; this bundle's config.yaml leaves enable_iter_perf_stats off (recipe "
                "serving.iter_perf_stats): rebuild with it on, or pass --accept-stats DIR"
            )
        return {"name": "acceptance", "status": "not measured", "summary": summary}
    plan = m.plan
    assert plan is not None  # open_verifiable refuses a manifest without one
    alpha = plan.alpha
    runs = w.draft_rounds or {(0, plan.max_draft_len): 1}
    expected = sum(n * planner.expected_tau(alpha, L) for (_, L), n in runs.items()) / sum(runs.values())
    details = {
        "source": source,
        "acceptance_length": w.tau,
        "per_position_acceptance": w.per_position,
        "expected_acceptance_length": round(expected, 3),
        "rounds": w.rounds,
        # the plan's geometric model: P(position k accepted) = alpha^k
        "expected_per_position_acceptance": [round(alpha**k, 4) for k in range(1, len(w.per_position or []) + 1)],
    }
    if w.tau - 1 < COLLAPSE * (expected - 1):
        causes = likely_causes(m, config)
        return {
            "name": "acceptance",
            "status": "fail",
            "details": {**details, "likely_causes": causes},
            "summary": f"acceptance collapsed: τ {w.tau:.2f} against the plan's {expected:.2f} ({source}); "
            f"likely causes: {'; '.join(c.split(':')[0] for c in causes)}",
        }
    return {
        "name": "acceptance",
        "status": "pass",
        "details": details,
        "summary": f"τ {w.tau:.2f} against the plan's {expected:.2f} ({source})",
    }


def check_served_schedule(levels: list[dict], wins: list[verify_server.Window], plan: ingest.Plan) -> dict:
    rows, problems = [], []
    for lv, w in zip(levels, wins, strict=False):
        for (b, L), n in sorted(w.draft_rounds.items()):
            want = plan.draft_len_at(b)
            rows.append(
                {"concurrency": lv["concurrency"], "batch_size": b, "draft_len": L, "planned": want, "rounds": n}
            )
            if L != want:
                problems.append(
                    f"at concurrency {lv['concurrency']} the server drafts {L} tokens with {b} live "
                    f"rows; the plan says {want}"
                )
    if not rows:
        return {
            "name": "schedule",
            "status": "not measured",
            "summary": "the server reports no draft length per batch size",
        }
    return _check(
        "schedule",
        problems,
        "the draft length in force matches the plan at every batch size run: "
        + ", ".join(sorted({f"{r['batch_size']}:{r['draft_len']}" for r in rows})),
        {"rows": rows},
    )


def check_memory(w: verify_server.Window, plan: ingest.Plan, config: dict) -> dict:
    if w.gpu_memory is None:
        return {"name": "memory", "status": "not measured", "summary": "the server reports no GPU memory in use"}
    mem = plan.memory
    rest = mem.total - mem.kv_cache
    fraction = (config.get("kv_cache_config") or {}).get("free_gpu_memory_fraction") or 0.9  # KvCacheConfig default
    expected = rest + max(mem.kv_cache, int(fraction * max(0, mem.capacity - rest)))
    gib = lambda n: f"{n / (1 << 30):.1f} GiB"  # noqa: E731
    details = {
        "gpu_memory": w.gpu_memory,
        "planned_total": mem.total,
        "expected_with_kv_pool": expected,
        "capacity": mem.capacity,
    }
    problems = []
    if w.gpu_memory > expected * (1 + MEMORY_SLACK):
        problems.append(
            f"GPU memory in use {gib(w.gpu_memory)} exceeds the plan's {gib(expected)} (weights, drafter, "
            f"activations and a KV pool of {fraction:g} of what is free) by more than "
            f"{MEMORY_SLACK:.0%}: the plan under-counts this deployment"
        )
    return _check(
        "memory",
        problems,
        f"GPU memory in use {gib(w.gpu_memory)}, planned {gib(expected)} of {gib(mem.capacity)}",
        details,
    )


def _reference(bundle: ingest.Bundle, use: bool | None):
    """The reference runtime on the bundle's weights: when asked, or by default for small targets."""
    size = sum(f.stat().st_size for f in bundle.target.glob("*.safetensors"))
    if use is False or (use is None and size > REFERENCE_MAX_BYTES):
        return None
    from dflash_trt.runtime import load_bundle

    return verify_lossless.ReferenceSide(load_bundle(bundle.root, dtype="float32"))


def online(
    bundle: ingest.Bundle,
    url: str,
    *,
    baseline: str | None = None,
    model: str | None = None,
    baseline_model: str | None = None,
    prompts: str | Path | None = None,
    max_tokens: int = 64,
    concurrency: list[int] = (1, 4),
    requests: int | None = None,
    accept_stats: str | Path | None = None,
    reference: bool | None = None,
    repeats: int = 1,
    trap_probe: bool = True,
    progress=None,
) -> tuple[dict, list[dict]]:
    """Measure the deployment at ``url``: (the bench report of its load levels, the four checks and,
    with ``trap_probe``, the zero-draft probe, :mod:`verify_trap`).
    The checks read counters (τ, draft lengths, memory), not timings, so one repeat per level by
    default; the report's latency figures are ``bench --endpoint``'s."""
    from dflash_trt.bench import endpoint
    from dflash_trt.runtime import load_tokenizer

    say = progress or (lambda msg: None)
    m, config = bundle.manifest, yaml.safe_load(bundle.trtllm_config.read_text()) or {}
    gate = deploy.speculation_gate(config)
    if gate:
        raise DFlashError(f"{bundle.trtllm_config}: {gate}")
    tokenizer = load_tokenizer(bundle.target)
    rows = verify_lossless.read_prompts(prompts or PROMPTS, tokenizer, m.serve.enable_thinking)
    ref = _reference(bundle, reference)  # the baseline without --baseline; margins where logprobs lack
    say("lossless: greedy completions against the baseline")
    lossless = verify_lossless.check(
        rows,
        url,
        model,
        baseline=baseline,
        baseline_model=baseline_model,
        reference=ref,
        tokenizer=tokenizer,
        max_tokens=max_tokens,
    )
    hist0 = verify_server.accept_files(accept_stats) if accept_stats else None
    bodies: list[str | None] = []
    say(f"load: concurrency {', '.join(map(str, concurrency))}")
    report = endpoint.run(
        url,
        model=model,
        baseline=baseline,
        baseline_model=baseline_model,
        prompts=[tokenizer.decode(r.ids, skip_special_tokens=True) for r in rows],
        concurrency=list(concurrency),
        requests=requests,
        max_tokens=max_tokens,
        temperature=0.0,
        repeats=repeats,
        on_scrape=bodies.append,
    )
    wins = verify_server.windows(bodies)
    levels = report["endpoint"]["levels"]
    for lv, w in zip(levels, wins, strict=False):
        if w.draft_rounds:  # what the server drafted at the level's fullest batch (plan --calibration reads it)
            lv["draft_len"] = max(w.draft_rounds, key=lambda bl: (bl[0], w.draft_rounds[bl]))[1]
    total = sum(wins, verify_server.Window())
    acc, source = total, f"{total.stack} server metrics"
    if accept_stats:
        acc, source = verify_server.hist_window(hist0, verify_server.accept_files(accept_stats)), "acceptance files"
        acc.draft_rounds = total.draft_rounds
    report["stack"] = STACKS.get(total.stack)  # the serving software the levels came from
    checks = [
        lossless,
        check_acceptance(acc, m, config, source),
        check_served_schedule(levels, wins, m.plan),
        check_memory(total, m.plan, config),
    ]
    if trap_probe:
        say("trap: a load above the schedule's top, then low concurrency")
        checks.append(
            verify_trap.probe(
                url,
                m.plan,
                config,
                model=model,
                max_tokens=max_tokens,
                prompts=[tokenizer.decode(r.ids, skip_special_tokens=True) for r in rows],
                collapsed=checks[1]["status"] == "fail",
            )
        )
    return report, checks


def run(path: str | Path, endpoint_url: str | None = None, progress=None, **kw) -> dict:
    """The whole verification: offline checks, and with ``endpoint_url`` the online ones. The
    report's ``ok`` is False when any check failed; "not measured" checks do not fail."""
    bundle, checks = offline(path)
    report: dict = {}
    if endpoint_url is not None:
        report, more = online(bundle, endpoint_url, progress=progress, **kw)
        checks += more
    return {
        **report,
        "bundle": str(bundle.root),
        "format": bundle.manifest.format,
        "checks": checks,
        "failed": [c["name"] for c in checks if c["status"] == "fail"],
        "ok": all(c["status"] != "fail" for c in checks),
    }
