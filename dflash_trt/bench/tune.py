"""``dflash-trt tune``: measure a bundle instead of predicting it, and write the measured-best schedule.

1. **Sweep.** The bundle is served by the embedded server (``serve.create_app`` behind
   ``serve.ServerThread``, a fresh app per setting) with drafting off and at a few draft lengths
   ``<= max_draft_len`` (where ``trtllm-serve`` is installed tune asks for ``endpoint=URL``
   instead: restarting TensorRT-LLM per setting is not automated yet); at each setting the load
   generator (:mod:`dflash_trt.bench.endpoint`) drives concurrency 1, 2, 4, ... ``max_batch_size``
   with ``ignore_eos`` (every request decodes ``max_tokens``). Each setting fixes the draft length
   (the bundle's own schedule is put aside).
2. **Choose** (:func:`winners`). At each measured concurrency the setting with the most output
   tokens/s wins, among those a schedule can express: TensorRT-LLM requires the smallest key to
   map to ``max_draft_len`` and no length above it, so the length at concurrency 1 bounds the
   rest, and it is chosen to lose least over all levels. A batch size between two measured ones
   takes the next measured one's length (what a ``draft_len_schedule`` key means: TensorRT-LLM's
   ``tensorrt_llm/_torch/speculative/utils.py::get_draft_len_for_batch_size`` applies the FIRST
   key >= the batch size, and 0 above the largest). ``plan.choose_schedule`` writes the keys for
   the bundle's release and checks they read back as chosen.
3. **Fit.** The measurements refit the step model's constants for this deployment
   (``plan.refit``), and tune prints predicted against measured per concurrency.
4. **Write.** ``trtllm/config.yaml`` (validated against the release's schema) and
   ``manifest.json`` (``plan``: the new lengths, and ``plan.tuned``: what was measured) are
   written to temporary files first; then each current file is copied to ``NAME.prev`` and the
   new one renamed over it, with Ctrl-C held off until both are in place. An interrupt during
   the sweep leaves the bundle as it was.

With ``endpoint=URL`` (a server tune did not start) nothing is served or written: the levels
are measured once, at what that server runs, and the calibration is refitted.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import shutil
import signal
import threading
from dataclasses import dataclass
from pathlib import Path

import yaml

from dflash_trt import deploy, ingest
from dflash_trt import plan as planner
from dflash_trt.bench import endpoint as loadgen
from dflash_trt.errors import DFlashError


@dataclass
class Tunable:
    """What tune reads of a bundle."""

    root: Path
    manifest: ingest.Manifest
    config: dict                 # trtllm/config.yaml
    max_batch_size: int
    max_draft_len: int
    release: str

    @property
    def name(self) -> str:
        return self.manifest.name or self.root.name


def read(bundle: Path) -> Tunable:
    b = ingest.check_bundle(bundle)
    try:
        cfg = yaml.safe_load(b.trtllm_config.read_text()) or {}
    except yaml.YAMLError as exc:
        raise DFlashError(f"{b.trtllm_config}: invalid YAML ({exc})") from None
    spec = cfg.get("speculative_config") or {}
    if not spec.get("max_draft_len"):
        raise DFlashError(f"{b.trtllm_config}: no speculative_config.max_draft_len; nothing to tune")
    if b.built.plan is None:
        raise DFlashError(f"{b.root}: the manifest has no plan; rebuild the bundle with 'dflash-trt build'")
    release = b.built.plan.trtllm_release
    return Tunable(b.root, b.manifest, cfg, int(cfg.get("max_batch_size") or 8), int(spec["max_draft_len"]),
                   release)


def settings(max_draft_len: int, draft_lens: list[int] | None = None) -> list[int]:
    """Off (0), then ``draft_lens`` or the full length, about half and 1 (longest first)."""
    if draft_lens:
        bad = [n for n in draft_lens if not 1 <= n <= max_draft_len]
        if bad:
            raise DFlashError(f"--draft-lens {bad[0]}: must be between 1 and the bundle's max_draft_len "
                              f"({max_draft_len})")
        return [0] + sorted(set(draft_lens), reverse=True)
    return [0] + sorted({max_draft_len, math.ceil(max_draft_len / 2), 1}, reverse=True)


# --- measuring --------------------------------------------------------------------------


def measure_embedded(t: Tunable, setting_list: list[int], levels: list[int], *, requests: int | None,
                     max_tokens: int, prompts: list[str] | None, threads: int | None = None,
                     progress=None) -> dict[int, list[dict]]:
    """{draft length (0: off): the load generator's levels}, one embedded server per setting."""
    from dflash_trt import runtime, serve
    from dflash_trt.serve import launch

    if launch.find_trtllm_serve() is not None:
        raise DFlashError("trtllm-serve is installed here: tune drives the embedded server only; start trtllm-serve "
                          "at each setting and measure it with 'dflash-trt tune BUNDLE --endpoint URL'")
    serve.check_fits_cpu(t.name, [t.root / ingest.Layout.TARGET, t.root / ingest.Layout.DRAFTER], 2)
    # each setting drafts one fixed length: no schedule (a changed pair is a new one)
    pair = dataclasses.replace(runtime.load_bundle(t.root), draft_len_schedule=None)
    out: dict[int, list[dict]] = {}
    for L in setting_list:
        app = serve.create_app(pair, t.name, block_size=L + 1 if L else 1, max_batch=t.max_batch_size,
                               max_queue=max(64, 4 * max(levels)), torch_threads=threads,
                               max_model_len=int(t.config.get("max_seq_len") or 0) or None)
        with serve.ServerThread(app) as srv:
            rep = loadgen.run(srv.url, concurrency=levels, requests=requests, max_tokens=max_tokens, prompts=prompts,
                              ignore_eos=True, progress=(lambda url, c, L=L: progress(L, c)) if progress else None)
        out[L] = [{**lv, "draft_len": L} for lv in rep["endpoint"]["levels"]]
    return out


def measure_endpoint(url: str, levels: list[int], *, requests: int | None, max_tokens: int,
                     prompts: list[str] | None, model: str | None = None, progress=None,
                     baseline: str | None = None, mtp: str | None = None) -> dict:
    """The load generator's report for a server tune did not start (and, given, the same target
    without drafting and with its MTP layers: the report's ``arms``)."""
    return loadgen.run(url, model=model, baseline=baseline, mtp=mtp, concurrency=levels, requests=requests,
                       max_tokens=max_tokens, prompts=prompts, ignore_eos=True,
                       progress=(lambda u, c: progress(None, c)) if progress else None)


# --- the arms: DFlash against MTP and autoregressive -------------------------------------


def sweep_arms(measured: dict[int, list[dict]], wins: dict[int, int], mtp_levels: list[dict] | None) -> list[dict]:
    """Per concurrency: the tuned DFlash (the winning length's level), MTP (``mtp_levels``, a
    server running the bundle's ``trtllm/config.mtp.yaml``) and autoregressive (the sweep's
    drafting-off levels), and the winner (:func:`loadgen.arms`)."""
    by = {L: {lv["concurrency"]: lv for lv in rows} for L, rows in measured.items()}
    report = {"endpoint": {"levels": [by[L][c] for c, L in sorted(wins.items()) if c in by.get(L, {})]}}
    if 0 in measured:
        report["baseline"] = {"levels": measured[0]}
    if mtp_levels:
        report["mtp"] = {"levels": mtp_levels}
    return loadgen.arms(report)


def arms_files(t: Tunable, rows: list[dict], source: str) -> dict[Path, str]:
    """The manifest with ``plan.arms`` (which arm won where, measured) set, by path."""
    import hashlib

    manifest = t.manifest.model_copy(deep=True)
    assert manifest.plan is not None   # read() refuses a manifest without one
    manifest.plan.arms = ingest.Arms(date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                                     source=source, measured=rows)
    m = manifest.to_json()
    if m.get("files") is not None:   # the .prev copy, so verify still holds
        rel = ingest.Layout.MANIFEST
        m["files"] = {**m["files"], f"{rel}.prev": hashlib.sha256((t.root / rel).read_bytes()).hexdigest()}
    ingest.Manifest.model_validate(m)
    return {t.root / ingest.Layout.MANIFEST: json.dumps(m, indent=2) + "\n"}


# --- choosing ---------------------------------------------------------------------------


def winners(measured: dict[int, list[dict]], warnings: list[str] | None = None) -> dict[int, int]:
    """{concurrency: draft length}: the measured best that TensorRT-LLM can be told.

    Its schedule maps the smallest batch size to ``max_draft_len`` and no key above it, so
    every length is at most the one at concurrency 1. Among the swept lengths ``M`` for
    concurrency 1, the one whose best choices (each the setting with the most output tokens/s
    among those ``<= M``) lose least against each level's unconstrained best wins.
    """
    tps = {L: {lv["concurrency"]: lv["output_tokens_per_second"] or 0.0 for lv in rows}
           for L, rows in measured.items()}
    levels = sorted({c for row in tps.values() for c in row})
    top = {c: max(row.get(c, 0.0) for row in tps.values()) or 1.0 for c in levels}

    def choice(M: int) -> dict[int, int]:   # the smallest batch size drafts max_draft_len itself
        return {c: M if c == levels[0] else max((L for L in tps if L <= M), key=lambda L: tps[L].get(c, 0.0))
                for c in levels}

    def score(M: int) -> float:
        return sum(tps[L].get(c, 0.0) / top[c] for c, L in choice(M).items())

    drafting = [L for L in tps if L > 0]
    if not drafting:
        raise DFlashError("tune needs at least one draft length to sweep")
    best = max(sorted(drafting), key=score)
    wins = choice(best)
    if warnings is not None:
        free = {c: max(tps, key=lambda L: tps[L].get(c, 0.0)) for c in levels}
        lost = [c for c in levels if free[c] != wins[c]]
        if lost:
            warnings.append(f"at concurrency {', '.join(map(str, lost))} the fastest length measured is not what a "
                            f"schedule with max_draft_len {best} allows; the best it allows is kept")
    return wins


def lengths_for(wins: dict[int, int], max_batch_size: int) -> list[int]:
    """The draft length at every batch size 1..max_batch_size: a batch size between two measured
    concurrencies takes the next one's (beyond the last measured, the last)."""
    keys = sorted(wins)
    return [wins[next((k for k in keys if k >= b), keys[-1])] for b in range(1, max_batch_size + 1)]


def schedule(t: Tunable, lengths: list[int]) -> tuple[int, dict[int, int], list[int]]:
    """(max_draft_len, draft_len_schedule, what the release then drafts at each batch size)."""
    release = planner.get_release(t.release)
    spec = planner.SpeculativeSpec(schedule="draft_len_schedule")
    _, _, sched, drafted = planner.choose_schedule(lengths, spec, lengths[0], release)
    return lengths[0], dict(sched), drafted


# --- writing ----------------------------------------------------------------------------


def new_files(t: Tunable, max_draft_len: int, sched: dict[int, int], drafted: list[int],
              tuned: dict) -> dict[Path, str]:
    """The new ``config.yaml`` and ``manifest.json`` texts (validated), by path."""
    cfg = json.loads(json.dumps(t.config))
    spec = cfg["speculative_config"]
    spec.pop("max_concurrency", None)
    spec.update(max_draft_len=max_draft_len, draft_len_schedule=dict(sched))
    text = deploy.trtllm_yaml(deploy.validate_trtllm_config(cfg, t.release), t.release)
    manifest = t.manifest.model_copy(deep=True)
    assert manifest.plan is not None   # read() refuses a manifest without one
    runs = [ingest.DraftRun(batch_from=r.first, batch_to=r.last, draft_len=r.draft_len)
            for r in planner.schedule_runs(drafted)]
    plan = manifest.plan   # each assignment validated (ingest.Plan)
    plan.max_draft_len, plan.schedule, plan.max_concurrency = max_draft_len, "draft_len_schedule", None
    plan.draft_len_schedule, plan.draft_lengths, plan.tuned = dict(sched), runs, ingest.Tuned.model_validate(tuned)
    m = manifest.to_json()
    if m.get("files") is not None:    # the new config and the two .prev copies, so verify still holds
        import hashlib

        L = ingest.Layout
        m["files"] = {**m["files"], L.TRTLLM_CONFIG: hashlib.sha256(text.encode()).hexdigest(),
                      **{f"{rel}.prev": hashlib.sha256((t.root / rel).read_bytes()).hexdigest()
                         for rel in (L.TRTLLM_CONFIG, L.MANIFEST)}}
    ingest.Manifest.model_validate(m)
    return {t.root / ingest.Layout.TRTLLM_CONFIG: text, t.root / ingest.Layout.MANIFEST: json.dumps(m, indent=2) + "\n"}


def commit(files: dict[Path, str]) -> list[Path]:
    """Write every file atomically, the previous one kept as ``NAME.prev``; Ctrl-C waits until
    all are in place (then is raised). Returns the ``.prev`` paths."""
    tmps = {}
    try:
        for path, text in files.items():
            tmp = path.with_name(f".{path.name}.tune-{os.getpid()}")
            with open(tmp, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            tmps[path] = tmp
        with _sigint_held():
            prevs = []
            for path, tmp in tmps.items():
                prev = path.with_name(path.name + ".prev")
                shutil.copy2(path, prev)
                os.replace(tmp, path)
                prevs.append(prev)
        return prevs
    finally:
        for tmp in tmps.values():
            tmp.unlink(missing_ok=True)


class _sigint_held:
    """Defer SIGINT (main thread only) for the few renames that must happen together."""

    def __enter__(self):
        self.hit, self.old = False, None
        if threading.current_thread() is threading.main_thread():
            self.old = signal.signal(signal.SIGINT, lambda *_: setattr(self, "hit", True))
        return self

    def __exit__(self, *exc):
        if self.old is not None:
            signal.signal(signal.SIGINT, self.old)
        if self.hit and exc[0] is None:
            raise KeyboardInterrupt


def tuned_record(measured: dict[int, list[dict]], wins: dict[int, int], calibration: str,
                 arms: list[dict] | None = None) -> dict:
    return {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "winners": wins,
            "calibration": calibration, **({"arms": arms} if arms else {}),
            "measured": {str(L): [{"concurrency": lv["concurrency"], "output_tokens_per_second":
                                   lv["output_tokens_per_second"], "acceptance_length": lv["acceptance_length"]}
                                  for lv in levels] for L, levels in measured.items()}}


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
    cases = planner.cases_from_bench(report, stack=stack, target=dep.target, drafter=dep.drafter, gpu=dep.gpu,
                                     precision=dep.precision, kv_cache=dep.kv_cache, tp=tp,
                                     draft_len_at=lambda c: lengths[min(c, len(lengths)) - 1], tau_at=acc.tau)
    cal = planner.refit(planner.shipped_calibration(), stack, cases, source=f"tune of {t.name}, {len(cases)} levels")
    rows = []
    for c in cases:
        pred = c.predict(cal.constants(stack), cal.shared)
        key = "tokens_per_s" if c.row.draft_len else "baseline_tokens_per_s"
        rows.append({"concurrency": c.row.concurrency, "draft_len": c.row.draft_len,
                     "measured_tokens_per_second_per_user": round(getattr(c.row, key), 3),
                     "predicted_tokens_per_second_per_user": round(pred[key], 3)})
    return cal, rows


def predicted_curve(t: Tunable, cal, drafted: list[int]) -> list[dict]:
    """The planner's curve (``plan.predicted``) for the tuned lengths, with the refitted constants."""
    dep, tp, plan = planner.bundle_deployment(t.root, t.manifest)
    ctx = max(1, min(int(t.config.get("max_seq_len") or 2048) // 2, planner.PLANNING_CONTEXT))
    model = planner.step_model(dep, tp, ctx, cal)
    rows = planner.predicted(model, drafted, planner.Acceptance(alpha=plan.alpha or 0.7), tp)
    return [r.model_dump(mode="json", exclude_unset=True) for r in rows]   # the plot reads JSON rows
