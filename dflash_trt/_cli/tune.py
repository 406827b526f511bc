"""dflash-trt tune: measure a bundle per concurrency and draft length, write the measured-best schedule.

The command only parses: its options become one :class:`TuneOptions`, handed whole to the body that
runs under the bundle's lock (``_tune``), which measures a running server (``--endpoint``) or sweeps
the bundle itself, then writes or prints what was measured. ``_tune`` imports ``bench.tune`` (``T``)
and hands it down to its steps: it brings asyncio and ssl, which every other command's start is spared.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from dflash_trt._cli.bench_show import _pm, show_arms
from dflash_trt._cli.common import JsonOpt, check_refs, err, out, print_json, save_then_plot, steps
from dflash_trt._cli.load_options import (
    MAX_REQUESTS,
    DatasetFormatOpt,
    InputLenOpt,
    MaxTokensOpt,
    OutputLenOpt,
    PromptsOpt,
    RepeatsOpt,
    SeedOpt,
    WarmupOpt,
    dataset,
)
from dflash_trt.bench import plots
from dflash_trt.errors import DFlashError
from dflash_trt.plan import batch_grid, get_gpu, stack_for

BundleArg = Annotated[Path, typer.Argument(help="Bundle directory written by 'dflash-trt build'.")]
EndpointOpt = Annotated[
    str | None,
    typer.Option(
        "--endpoint",
        help="Measure this running server (one it did not start) and refit the calibration; the bundle is not changed.",
    ),
]
ModelOpt = Annotated[str | None, typer.Option("--model", help="With --endpoint: model id to request.")]
BaselineOpt = Annotated[
    str | None,
    typer.Option("--baseline", help="With --endpoint: the same target without drafting (the autoregressive arm)."),
]
MtpEndpointOpt = Annotated[
    str | None,
    typer.Option(
        "--mtp-endpoint",
        help="The same target drafting with its own MTP layers (serve.sh --config "
        "./trtllm/config.mtp.yaml): DFlash, MTP and autoregressive are compared per "
        "concurrency and the manifest records which arm won where (plan.arms).",
    ),
]
DraftLensOpt = Annotated[
    str | None,
    typer.Option(
        "--draft-lens",
        help="Draft lengths to sweep, comma-separated (default: max_draft_len, about half, 1; off always).",
    ),
]
ConcurrencyOpt = Annotated[
    str | None, typer.Option("--concurrency", help="Concurrency levels (default: 1, 2, 4, ... max_batch_size).")
]
RequestsOpt = Annotated[
    int | None,
    typer.Option(
        "--requests", min=1, max=MAX_REQUESTS, help="Requests per level (default: max(prompts, 2 x concurrency))."
    ),
]
ThreadsOpt = Annotated[int | None, typer.Option(min=1, help="Embedded server: torch threads.")]
PlotOpt = Annotated[
    Path | None,
    typer.Option(
        "--plot",
        help="Write the tuned and the baseline curves (throughput per GPU vs tokens/s per user, TTFT, ITL) "
        "with the planner's to this PNG.",
    ),
]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Measure and print; write nothing.")]


@dataclass(frozen=True)
class TuneOptions:
    """``tune``'s options as typer parsed them (one field per parameter of :func:`tune`, same name,
    same type: tests/test_cli_conventions.py holds that), handed whole to the locked body."""

    bundle: Path
    endpoint: str | None
    model: str | None
    baseline: str | None
    mtp_endpoint: str | None
    draft_lens: str | None
    concurrency: str | None
    requests: int | None
    max_tokens: int
    prompts: str | None
    dataset_format: str
    input_len: int | None
    output_len: int | None
    seed: int | None
    threads: int | None
    repeats: int | None
    warmup: int | None
    plot: Path | None
    dry_run: bool
    as_json: bool

    @property
    def writes(self) -> bool:
        """Whether this run writes the bundle (a sweep, or --endpoint with --mtp-endpoint; never --dry-run)."""
        return not self.dry_run and (self.endpoint is None or self.mtp_endpoint is not None)

    @property
    def passes(self) -> int:
        """Measured passes per level (--repeats, default 3)."""
        return self.repeats or 3


def _ints(text: str | None, flag: str) -> list[int] | None:
    if text is None:
        return None
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise DFlashError(f"{flag} {text!r}: expected comma-separated integers, e.g. 1,4,16") from None
    if not vals or min(vals) < 1:
        raise DFlashError(f"{flag} needs positive integers")
    return vals


def tune(
    bundle: BundleArg,
    endpoint: EndpointOpt = None,
    model: ModelOpt = None,
    baseline: BaselineOpt = None,
    mtp_endpoint: MtpEndpointOpt = None,
    draft_lens: DraftLensOpt = None,
    concurrency: ConcurrencyOpt = None,
    requests: RequestsOpt = None,
    max_tokens: MaxTokensOpt = 64,
    prompts: PromptsOpt = None,
    dataset_format: DatasetFormatOpt = "auto",
    input_len: InputLenOpt = None,
    output_len: OutputLenOpt = None,
    seed: SeedOpt = None,
    threads: ThreadsOpt = None,
    repeats: RepeatsOpt = None,
    warmup: WarmupOpt = None,
    plot: PlotOpt = None,
    dry_run: DryRunOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Measure instead of predicting: serve the bundle with drafting off and at a few draft lengths, sweep concurrency
    1..max_batch_size (each level warmed up and repeated), write the draft_len_schedule measured beyond noise into its
    config and manifest (the previous ones kept as *.prev), and print predicted against measured. A length steps down
    only where a shorter one is faster beyond the min–max of the repeats; otherwise the level before's is kept, so
    lengths never rise with concurrency. Ctrl-C leaves the bundle as it was; a build --force of the same
    bundle meanwhile refuses (tune holds its lock from the first measurement to the last write)."""
    opts = TuneOptions(**locals())  # first statement: locals() is exactly the parameters
    check_refs(bundle=bundle)  # a bad path is one line before the runtime (torch) loads
    from dflash_trt import deploy  # start-up: the pipeline (~0.1 s), loaded by the commands that use it

    # a writer holds the bundle's lock from before its first measurement to its last write
    with deploy.lock(bundle) if opts.writes else contextlib.nullcontext():
        note = deploy.recover(bundle) if opts.writes else None
        if note:
            err.print(f"[yellow]warning:[/yellow] {escape(note)}")
        _tune(opts)


def _tune(opts: TuneOptions) -> None:
    """The measuring under the lock: the server at --endpoint refitted, else the bundle swept."""
    from dflash_trt.bench import tune as T  # start-up: asyncio and ssl (the load generator, ~0.1 s)

    t = T.read(opts.bundle)
    levels = _ints(opts.concurrency, "--concurrency") or batch_grid(t.max_batch_size)
    texts = dataset(opts.prompts, opts.dataset_format, opts.input_len, opts.output_len, opts.seed)
    if opts.baseline is not None and opts.endpoint is None:
        raise DFlashError("--baseline goes with --endpoint URL (the sweep measures drafting off itself)")
    if opts.endpoint is not None:
        _tune_endpoint(T, opts, opts.endpoint, t, levels, texts)
    else:
        _tune_sweep(T, opts, t, levels, texts)


def _tune_endpoint(T, opts: TuneOptions, endpoint: str, t, levels: list[int], texts) -> None:
    """--endpoint: measure the running server and refit the calibration to it; with --mtp-endpoint
    the manifest records which arm won where (nothing else changes)."""
    mtp = opts.mtp_endpoint
    with steps("measuring", len(levels) * (1 + bool(opts.baseline) + bool(mtp))) as step:
        report = T.measure_endpoint(
            endpoint,
            levels,
            requests=opts.requests,
            max_tokens=opts.max_tokens,
            prompts=texts,
            model=opts.model,
            progress=lambda _L, c: step(desc=f"concurrency {c}"),
            baseline=opts.baseline,
            mtp=mtp,
            repeats=opts.passes,
            warmup=opts.warmup,
        )
    cal, rows = T.fit(t, report)
    written = bool(mtp) and not opts.dry_run  # the manifest records the arms; nothing else changes
    left: list[str] = []
    if written:
        T.commit(t.root, T.arms_files(t, report["arms"], f"tune --endpoint {endpoint} --mtp-endpoint {mtp}"), left)
    for w in left:
        err.print(f"[yellow]warning:[/yellow] {escape(w)}")
    if opts.as_json:
        print_json({**report, "calibration": cal.as_dict(), "predicted_vs_measured": rows, "arms_written": written})
        return
    _show_fit(rows, cal, t)
    if report.get("arms"):
        show_arms(report["arms"])
    out.print(
        f"{cal.describe(build_stack(t))}; {t.root} " + ("manifest: plan.arms recorded" if written else "unchanged"),
        markup=False,
    )


def _tune_sweep(T, opts: TuneOptions, t, levels: list[int], texts) -> None:
    """The bundle served embedded, drafting off and at a few lengths, per level (and the MTP arm at
    --mtp-endpoint); the measured-best schedule written (:func:`_finish`)."""
    sweep = T.settings(t.max_draft_len, _ints(opts.draft_lens, "--draft-lens"))
    with steps("measuring", len(sweep) * len(levels) * opts.passes) as step:
        measured = T.measure_embedded(
            t,
            sweep,
            levels,
            requests=opts.requests,
            max_tokens=opts.max_tokens,
            prompts=texts,
            threads=opts.threads,
            repeats=opts.passes,
            warmup=opts.warmup,
            progress=lambda L, c: step(desc=f"draft {L or 'off'}, concurrency {c}"),
        )
    mtp_levels = None
    if opts.mtp_endpoint is not None:
        with steps("measuring the MTP arm", len(levels)) as step:
            mtp_report = T.measure_endpoint(
                opts.mtp_endpoint,
                levels,
                requests=opts.requests,
                max_tokens=opts.max_tokens,
                prompts=texts,
                progress=lambda _L, c: step(desc=f"MTP, concurrency {c}"),
                repeats=opts.passes,
                warmup=opts.warmup,
            )
        mtp_levels = mtp_report["endpoint"]["levels"]
    _finish(T, opts, t, measured, mtp_levels)


def build_stack(t) -> str:
    return stack_for(get_gpu(t.manifest.gpu.name)) if t.manifest.gpu else "reference"


def _finish(T, opts: TuneOptions, t, measured: dict, mtp_levels: list[dict] | None = None) -> None:
    """The sweep's winners into a schedule: written (unless --dry-run), plotted, printed."""
    noisy = [f"{L or 'off'}@{lv['concurrency']}" for L, rows in measured.items() for lv in rows if lv.get("noisy")]
    warnings: list[str] = (
        [
            f"the machine was noisy: repeats differed by more than 15% in output tokens/s at "
            f"{len(noisy)} of {sum(map(len, measured.values()))} levels (draft@concurrency: "
            f"{', '.join(noisy)}); more --repeats or a quieter machine"
        ]
        if noisy
        else []
    )
    wins = T.winners(measured, warnings, shortest=T.shortest_length(t))
    arms = T.sweep_arms(measured, wins, mtp_levels) if mtp_levels else None
    lengths = T.lengths_for(wins, t.max_batch_size)
    max_len, sched, drafted = T.schedule(t, lengths)
    cal, rows = T.fit(t, T.as_report(measured, opts.max_tokens))
    files = T.new_files(t, max_len, sched, drafted, T.tuned_record(measured, wins, cal.source, arms))
    prevs = [] if opts.dry_run else T.commit(t.root, files, warnings)
    result = {
        "bundle": str(t.root),
        "measured": {str(k): v for k, v in measured.items()},
        "winners": wins,
        "max_draft_len": max_len,
        "draft_len_schedule": sched,
        "written": not opts.dry_run,
        "calibration": cal.as_dict(),
        "predicted_vs_measured": rows,
        "warnings": warnings,
        "arms": arms,
    }
    plot, refused = opts.plot, None
    if plot is not None:  # measured results saved (PLOT.json) before the figure is drawn
        refused = save_then_plot(result, plot, lambda p: _plot(T, t, measured, wins, cal, drafted, p))
    if opts.as_json:
        print_json({**result, "plot": str(plot) if plot is not None and not refused else None})
        _refused(refused)
        return
    _show_sweep(measured, wins)
    _show_fit(rows, cal, t)
    if arms:
        show_arms(arms)
    for w in warnings:
        err.print(f"[yellow]warning:[/yellow] {escape(w)}")
    if plot is not None and not refused:
        out.print(f"plot: {plot}")
    what = f"max_draft_len {max_len}, draft_len_schedule {sched}"
    if opts.dry_run:
        out.print(f"dry run: would write {what}; nothing written")
    else:
        out.print(f"wrote {what} into {t.root} (previous: {', '.join(p.name for p in prevs)})")
    _refused(refused)


def _refused(message: str | None) -> None:
    if message:
        raise DFlashError(message)


def _show_sweep(measured: dict, wins: dict) -> None:
    tab = Table(title="output tokens/s per concurrency (ignore_eos; ± half the min–max of repeats), chosen in bold")
    tab.add_column("concurrency", justify="right")
    settings = sorted(measured)
    for L in settings:
        tab.add_column("off" if L == 0 else f"draft {L}", justify="right")
    by = {L: {lv["concurrency"]: lv for lv in measured[L]} for L in settings}
    for c, best in wins.items():
        cells = []
        for L in settings:
            lv = by[L].get(c, {})
            v = lv.get("output_tokens_per_second")
            text = "-" if v is None else f"{v:.1f} {_pm((lv.get('spread') or {}).get('output_tokens_per_second'))}"
            cells.append(f"[bold]{text}[/bold]" if L == best else text)
        tab.add_row(str(c), *cells)
    out.print(tab)


def _show_fit(rows: list[dict], cal, t) -> None:
    tab = Table(title=f"predicted vs measured tokens/s per user ({cal.source})")
    for col in ("concurrency", "draft len", "measured", "predicted", "predicted ÷ measured − 1"):
        tab.add_column(col, justify="right")
    for r in rows:
        m, p = r["measured_tokens_per_second_per_user"], r["predicted_tokens_per_second_per_user"]
        tab.add_row(str(r["concurrency"]), str(r["draft_len"] or "off"), f"{m:.1f}", f"{p:.1f}", f"{p / m - 1:+.0%}")
    out.print(tab)


def _plot(T, t, measured, wins, cal, drafted, path) -> None:
    from dflash_trt.bench import endpoint as loadgen  # start-up: asyncio and ssl (the load generator)

    tuned = [next(lv for lv in measured[L] if lv["concurrency"] == c) for c, L in wins.items()]
    report = {"endpoint": {"model": f"{t.name}, tuned", "levels": tuned}}
    if 0 in measured:
        report["baseline"] = {"model": t.name, "levels": measured[0]}
        report["comparison"] = loadgen.compare(report["endpoint"], report["baseline"])
    device = t.manifest.plan.gpu if t.manifest.plan else None
    plots.plot(report, path, predicted=T.predicted_curve(t, cal, drafted), device=device, name=t.name)


def register(app: typer.Typer) -> None:
    app.command("tune")(tune)
