"""``dflash-trt tune``: measure a bundle instead of predicting it, and write the measured-best schedule.

1. **Sweep.** The bundle is served by the embedded server (``serve.create_app`` behind
   ``serve.ServerThread``, a fresh app per setting) with drafting off and at a few draft lengths
   ``<= max_draft_len`` (where ``trtllm-serve`` is installed tune asks for ``endpoint=URL``
   instead: restarting TensorRT-LLM per setting is not automated yet); at each setting the load
   generator (:mod:`dflash_trt.bench.endpoint`) drives concurrency 1, 2, 4, ... ``max_batch_size``
   with ``ignore_eos`` (every request decodes ``max_tokens``), each level after a warm-up and
   ``repeats`` times. Each setting fixes the draft length (the bundle's own schedule is put aside).
2. **Choose** (:func:`winners`): a length steps down at a concurrency only where a shorter one
   beats it beyond the min–max of their repeats; otherwise the length of the level before is kept.
   Lengths never rise with the batch size, the first level's is ``max_draft_len`` (the smallest
   key's), and none is below :func:`shortest_length` (no 0 on a release without the draft-length
   floor). A batch size between two measured ones takes the next measured one's length (what a
   ``draft_len_schedule`` key means: TensorRT-LLM's
   ``tensorrt_llm/_torch/speculative/utils.py::get_draft_len_for_batch_size`` applies the FIRST
   key >= the batch size). ``plan.choose_schedule`` writes the keys for the bundle's release and
   checks they read back as chosen. The drafting-off setting is still measured: it is the
   autoregressive baseline of the speedups and of the refit.
3. **Fit.** The measurements refit the step model's constants for this deployment
   (``plan.refit``), and tune prints predicted against measured per concurrency.
4. **Write** (:mod:`~dflash_trt.bench.tune_bundle`). ``trtllm/config.yaml`` (validated against
   the release's schema) and ``manifest.json`` (``plan``: the new lengths, and ``plan.tuned``:
   what was measured), with each current file as ``NAME.prev``, are written into a partial
   directory and swapped in through the journaled swap ``build --force`` uses (``commit``), with
   Ctrl-C held off until it is done. The CLI holds the bundle's write lock (``deploy.output.lock``) from before
   the first measurement to the last write, so ``build --force`` of the same bundle meanwhile
   refuses. An interrupt during the sweep leaves the bundle as it was; a kill during the swap
   leaves a journal the next ``tune`` or ``build`` finishes or rolls back.

With ``endpoint=URL`` (a server tune did not start) nothing is served or written: the levels
are measured (with repeats) at what that server runs, and the calibration is refitted.
"""

from __future__ import annotations

import dataclasses
import math

from dflash_trt import ingest
from dflash_trt import plan as planner
from dflash_trt.bench import endpoint as loadgen
from dflash_trt.bench import spread
from dflash_trt.bench.conclusions import arms, throughput_interval
from dflash_trt.bench.tune_bundle import Tunable, arms_files, commit, new_files, read, tuned_record
from dflash_trt.errors import DFlashError

__all__ = [  # what the CLI calls; Tunable, read, tuned_record, new_files, arms_files, commit: tune_bundle's
    "Tunable",
    "read",
    "settings",
    "measure_embedded",
    "measure_endpoint",
    "winners",
    "shortest_length",
    "lengths_for",
    "schedule",
    "sweep_arms",
    "as_report",
    "fit",
    "predicted_curve",
    "tuned_record",
    "new_files",
    "arms_files",
    "commit",
]


def settings(max_draft_len: int, draft_lens: list[int] | None = None) -> list[int]:
    """Off (0), then ``draft_lens`` or the full length, about half and 1 (longest first)."""
    if draft_lens:
        bad = [n for n in draft_lens if not 1 <= n <= max_draft_len]
        if bad:
            raise DFlashError(
                f"--draft-lens {bad[0]}: must be between 1 and the bundle's max_draft_len ({max_draft_len})"
            )
        return [0] + sorted(set(draft_lens), reverse=True)
    return [0] + sorted({max_draft_len, math.ceil(max_draft_len / 2), 1}, reverse=True)


# --- measuring --------------------------------------------------------------------------


def measure_embedded(
    t: Tunable,
    setting_list: list[int],
    levels: list[int],
    *,
    requests: int | None,
    max_tokens: int,
    prompts: list[str] | None,
    threads: int | None = None,
    repeats: int = loadgen.REPEATS,
    warmup: int | None = None,
    progress=None,
) -> dict[int, list[dict]]:
    """{draft length (0: off): the load generator's levels}, one embedded server per setting and
    repeat, the repeats of one level merged (:func:`loadgen.merge_levels`)."""
    from dflash_trt import runtime, serve  # start-up: torch (runtime and serve load it; read() refuses first)
    from dflash_trt.serve import launch  # start-up: torch (the serve package)

    if launch.find_trtllm_serve() is not None:
        raise DFlashError(
            "trtllm-serve is installed here: tune drives the embedded server only; start trtllm-serve "
            "at each setting and measure it with 'dflash-trt tune BUNDLE --endpoint URL'"
        )
    serve.check_fits_cpu(t.name, [t.root / ingest.Layout.TARGET, t.root / ingest.Layout.DRAFTER], 2)
    # each setting drafts one fixed length: no schedule (a changed pair is a new one)
    pair = dataclasses.replace(runtime.load_bundle(t.root), draft_len_schedule=None)
    passes: dict[int, list[list[dict]]] = {L: [] for L in setting_list}
    for k in range(repeats):
        # repeats interleave the settings (each pass in another order), so a quiet or a busy minute
        # of the machine lands on every setting alike and shows as spread, not as a difference
        for L in setting_list[k % len(setting_list) :] + setting_list[: k % len(setting_list)]:
            app = serve.create_app(
                pair,
                t.name,
                block_size=L + 1 if L else 1,
                max_batch=t.max_batch_size,
                max_queue=max(64, 4 * max(levels)),
                torch_threads=threads,
                max_model_len=int(t.config.get("max_seq_len") or 0) or None,
            )
            with serve.ServerThread(app) as srv:
                rep = loadgen.run(
                    srv.url,
                    concurrency=levels,
                    requests=requests,
                    max_tokens=max_tokens,
                    prompts=prompts,
                    ignore_eos=True,
                    repeats=1,
                    warmup=warmup,
                    records=True,
                    progress=(lambda url, c, L=L: progress(L, c)) if progress else None,
                )
            passes[L].append(rep["endpoint"]["levels"])
    return {
        L: [{**loadgen.merge_levels([run[i] for run in runs]), "draft_len": L} for i in range(len(levels))]
        for L, runs in passes.items()
    }


def measure_endpoint(
    url: str,
    levels: list[int],
    *,
    requests: int | None,
    max_tokens: int,
    prompts: list[str] | None,
    model: str | None = None,
    progress=None,
    baseline: str | None = None,
    mtp: str | None = None,
    repeats: int = loadgen.REPEATS,
    warmup: int | None = None,
) -> dict:
    """The load generator's report for a server tune did not start (and, given, the same target
    without drafting and with its MTP layers: the report's ``arms``)."""
    return loadgen.run(
        url,
        model=model,
        baseline=baseline,
        mtp=mtp,
        concurrency=levels,
        requests=requests,
        max_tokens=max_tokens,
        prompts=prompts,
        ignore_eos=True,
        repeats=repeats,
        warmup=warmup,
        progress=(lambda u, c: progress(None, c)) if progress else None,
    )


# --- the arms: DFlash against MTP and autoregressive -------------------------------------


def sweep_arms(measured: dict[int, list[dict]], wins: dict[int, int], mtp_levels: list[dict] | None) -> list[dict]:
    """Per concurrency: the tuned DFlash (the winning length's level), MTP (``mtp_levels``, a
    server running the bundle's ``trtllm/config.mtp.yaml``) and autoregressive (the sweep's
    drafting-off levels), and the winner (:func:`~dflash_trt.bench.conclusions.arms`)."""
    by = {L: {lv["concurrency"]: lv for lv in rows} for L, rows in measured.items()}
    report = {"endpoint": {"levels": [by[L][c] for c, L in sorted(wins.items()) if c in by.get(L, {})]}}
    if 0 in measured:
        report["baseline"] = {"levels": measured[0]}
    if mtp_levels:
        report["mtp"] = {"levels": mtp_levels}
    return arms(report)


# --- choosing ---------------------------------------------------------------------------


def shortest_length(t: Tunable) -> int:
    """The shortest draft length tune may write at any batch size up to ``max_batch_size``: the
    zero-draft rule's (``plan.zero_draft_rule``), so no 0 on a release without the draft-length
    floor (TensorRT-LLM PR #16888; above a zero the drafter's context rows go unwritten and
    acceptance collapses once drafting resumes, FACTS §15)."""
    return planner.zero_draft_rule(planner.get_release(t.release)).shortest


def winners(measured: dict[int, list[dict]], warnings: list[str] | None = None, shortest: int = 1) -> dict[int, int]:
    """{concurrency: draft length}: what was measured beyond noise, non-increasing.

    Starting from the longest length swept, at each concurrency (ascending) the length steps
    down to a shorter one (never below ``shortest``) only where that one's output tokens/s beats
    the current length's beyond their min–max over repeats (:func:`spread.beyond`) and neither's
    repeats are noisy (:func:`spread.noisy`: a step decided on repeats that disagree would not
    repeat on the next run). Among lengths that beat it, the fastest; among those
    indistinguishable from the fastest, the longest (the smallest step). Otherwise the fixed
    rule: keep the length of the level before.
    So lengths never rise with the batch size (TensorRT-LLM's validator would read a rising
    schedule literally), the first level's length is the schedule's ``max_draft_len``, and two
    runs whose differences are all either beyond noise or within it write the same schedule.
    """
    tps = {L: {lv["concurrency"]: throughput_interval(lv) for lv in rows} for L, rows in measured.items()}
    lengths = sorted((L for L in tps if L >= max(shortest, 1) or (L == 0 and shortest == 0)), reverse=True)
    if not [L for L in lengths if L > 0]:
        raise DFlashError("tune needs at least one draft length to sweep")
    levels = sorted({c for row in tps.values() for c in row})
    current, wins, held, noisy = lengths[0], {}, [], []
    for c in levels:
        here = tps[current].get(c)
        beat = [
            L
            for L in lengths
            if L < current
            and (L or c != levels[0])  # the smallest key drafts
            and spread.beyond(tps[L].get(c), here)
        ]
        if beat and (spread.noisy(here) or any(spread.noisy(tps[L][c]) for L in beat)):
            noisy.append(c)  # a step on repeats that disagree would not repeat on the next run
            beat = []
        if beat:
            # each length in beat was measured at c (spread.beyond holds only between two intervals)
            means = {L: iv["mean"] for L in beat if (iv := tps[L][c]) is not None}
            top = max(beat, key=lambda L: means[L])
            current = max(L for L in beat if not spread.beyond(tps[top][c], tps[L][c]))
        longer = [L for L in lengths if L > current and spread.beyond(tps[L].get(c), tps[current].get(c))]
        if longer:
            held.append(c)
        wins[c] = current
    if warnings is not None and held:
        warnings.append(
            f"at concurrency {', '.join(map(str, held))} a longer draft measured faster beyond noise; "
            "lengths never rise with the batch size, so the shorter one of the level before is kept"
        )
    if warnings is not None and noisy:
        warnings.append(
            f"at concurrency {', '.join(map(str, noisy))} a shorter draft measured faster, but on repeats "
            f"more than {spread.NOISY:.0%} apart: no step taken (the level before's length kept); "
            "rerun on a quieter machine or with more --repeats"
        )
    return wins


def lengths_for(wins: dict[int, int], max_batch_size: int) -> list[int]:
    """The draft length at every batch size 1..max_batch_size: a batch size between two measured
    concurrencies takes the next one's (beyond the last measured, the last)."""
    keys = sorted(wins)
    return [wins[next((k for k in keys if k >= b), keys[-1])] for b in range(1, max_batch_size + 1)]


def schedule(t: Tunable, lengths: list[int]) -> tuple[int, dict[int, int], list[int]]:
    """(max_draft_len, draft_len_schedule, what the release then drafts at each batch size)."""
    release = planner.get_release(t.release)
    lengths = planner.zero_draft_rule(release).floor(lengths)  # never 0 where the release has no floor
    spec = planner.SpeculativeSpec(schedule="draft_len_schedule")
    _, _, sched, drafted = planner.choose_schedule(lengths, spec, lengths[0], release)
    assert sched is not None  # a draft_len_schedule back-off always writes its keys
    return lengths[0], dict(sched), drafted


# --- fitting ----------------------------------------------------------------------------


def as_report(measured: dict[int, list[dict]], max_tokens: int) -> dict:
    """The sweep as one ``bench --endpoint`` report: drafting settings, and the baseline (off)."""
    drafting = [lv for L, levels in measured.items() if L for lv in levels]
    rep = {"max_tokens": max_tokens, "endpoint": {"url": "tune", "levels": drafting}}
    if 0 in measured:
        rep["baseline"] = {"url": "tune (drafting off)", "levels": measured[0]}
    return rep


def fit(t: Tunable, report: dict) -> tuple[object, list[dict]]:
    """The calibration refitted on ``report`` for this bundle's deployment, and per measured level
    the predicted and measured tokens/s per user."""
    dep, tp, plan = planner.bundle_deployment(t.root, t.manifest)
    stack = planner.stack_for(dep.gpu)
    acc = planner.Acceptance(alpha=plan.alpha or 0.7)
    lengths = plan.lengths() or [t.max_draft_len]
    cases = planner.cases_from_bench(
        report,
        stack=stack,
        target=dep.target,
        drafter=dep.drafter,
        gpu=dep.gpu,
        precision=dep.precision,
        kv_cache=dep.kv_cache,
        tp=tp,
        draft_len_at=lambda c: lengths[min(c, len(lengths)) - 1],
        tau_at=acc.tau,
    )
    cal = planner.refit(planner.shipped_calibration(), stack, cases, source=f"tune of {t.name}, {len(cases)} levels")
    rows = []
    for c in cases:
        pred = c.predict(cal.constants(stack), cal.shared)
        key = "tokens_per_s" if c.row.draft_len else "baseline_tokens_per_s"
        rows.append(
            {
                "concurrency": c.row.concurrency,
                "draft_len": c.row.draft_len,
                "measured_tokens_per_second_per_user": round(getattr(c.row, key), 3),
                "predicted_tokens_per_second_per_user": round(pred[key], 3),
            }
        )
    return cal, rows


def predicted_curve(t: Tunable, cal, drafted: list[int]) -> list[dict]:
    """The planner's curve (``plan.predicted``) for the tuned lengths, with the refitted constants."""
    dep, tp, plan = planner.bundle_deployment(t.root, t.manifest)
    ctx = max(1, min(int(t.config.get("max_seq_len") or 2048) // 2, planner.PLANNING_CONTEXT))
    model = planner.step_model(dep, tp, ctx, cal)
    rows = planner.predicted(model, drafted, planner.Acceptance(alpha=plan.alpha or 0.7), tp)
    return [r.model_dump(mode="json", exclude_unset=True) for r in rows]  # the plot reads JSON rows
