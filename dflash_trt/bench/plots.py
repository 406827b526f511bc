"""The charts deployments are compared by, drawn from a ``bench --endpoint`` report (or tune's).

Every figure on them is one the report holds, defined once in :mod:`dflash_trt.bench.latency`:
throughput against decode tokens/s per user (TTFT left out), time to first token, time per
output token (TPOT: per token, so a speculating server's several tokens per chunk do not read as
slower; the per-chunk ITL stays in the report) and the speedup with its min–max interval over
repeats (:mod:`dflash_trt.bench.spread`).
"""

from __future__ import annotations

import math

from dflash_trt.errors import require


def throughput_unit(device: str | None) -> str:
    """What the throughput axis is divided by: a GPU only where the bundle's plan says the server
    runs on GPUs; a CPU run is one process; without a bundle the device is unknown (per server)."""
    if device is None:
        return "server"
    return "process (CPU)" if device.lower() == "cpu" else "GPU"


def plot(
    report: dict,
    path,
    predicted: list[dict] | None = None,
    gpus: int = 1,
    device: str | None = None,
    name: str | None = None,
) -> None:
    """In one PNG:

    * throughput per GPU (output tokens/s / ``gpus``) against decode tokens/s per user, one point
      per concurrency, for the endpoint (DFlash) and the baseline on one chart: the curve NVIDIA
      quotes DFlash results on; with ``predicted`` (a plan's ``predicted`` rows) the planner's
      curves dashed beside them;
    * time to first token and time per output token (median, p99 dotted) against concurrency;
    * with a baseline, the speedup (DFlash output tokens/s over the baseline's) against
      concurrency, its min–max over repeats as error bars (without one, three panels, none blank).

    Titled with ``name`` (the bundle, else the served model), max tokens and temperature; the
    throughput unit follows ``device`` (:func:`throughput_unit`).
    """
    mpl = require("matplotlib", "bench", "--plot")
    mpl.use("Agg")
    import matplotlib.pyplot as plt  # optional: matplotlib (the bench extra; require() above names it)

    has_base = "baseline" in report
    fig, grid = plt.subplots(2, 2, figsize=(11, 8.4)) if has_base else plt.subplots(1, 3, figsize=(15, 4.6))
    axes = grid if has_base else [[grid[0], grid[1]], [grid[2], None]]
    run = [
        f"max {report['max_tokens']} tokens" if "max_tokens" in report else "",
        f"temperature {report['temperature']}" if "temperature" in report else "",
    ]
    fig.suptitle(", ".join([name or report["endpoint"]["model"], *filter(None, run)]))
    styles = (
        ("endpoint", "DFlash" if has_base else "endpoint", "o-", "tab:blue"),
        ("baseline", "baseline", "s-", "tab:gray"),
    )
    _frontier(axes[0][0], report, styles, predicted, max(1, gpus), throughput_unit(device))
    for ax, key, title in (
        (axes[0][1], "ttft_ms", "time to first token"),
        (axes[1][0], "tpot_ms", "time per output token (TPOT)"),
    ):
        _latency(ax, report, styles, key)
        _axes(ax, "concurrency", "ms", title)
    if has_base:
        _speedup(axes[1][1], report["comparison"]["speedup"], predicted)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)


def _latency(ax, report: dict, styles, key: str) -> None:
    for side, label, style, color in styles:
        if side in report:
            lv = report[side]["levels"]
            c = [x["concurrency"] for x in lv]
            ax.plot(
                c, [_nan((x.get(key) or {}).get("median")) for x in lv], style, color=color, label=f"{label} median"
            )
            ax.plot(c, [_nan((x.get(key) or {}).get("p99")) for x in lv], ":", color=color, label=f"{label} p99")


def _speedup(ax, rows: list[dict], predicted: list[dict] | None) -> None:
    c = [r["concurrency"] for r in rows]
    s = [r["speedup"] for r in rows]
    lo = [r["speedup"] - (r.get("interval") or {}).get("min", r["speedup"]) for r in rows]
    hi = [(r.get("interval") or {}).get("max", r["speedup"]) - r["speedup"] for r in rows]
    ax.errorbar(c, s, yerr=[lo, hi], fmt="o-", color="tab:green", capsize=3, label="measured (min–max of repeats)")
    if predicted:
        ax.plot(
            [r["batch"] for r in predicted], [r["speedup"] for r in predicted], "--", color="tab:green", label="planner"
        )
    ax.axhline(1.0, color="gray", linestyle=":")
    _axes(ax, "concurrency", "DFlash tok/s ÷ baseline tok/s", "speedup")


def _frontier(ax, report: dict, styles, predicted: list[dict] | None, gpus: int, unit: str = "GPU") -> None:
    """Throughput per ``unit`` against tokens/s per user, each point labelled with its concurrency."""
    for side, label, style, color in styles:
        if side not in report:
            continue
        lv = [
            x
            for x in report[side]["levels"]
            if x.get("tokens_per_second_per_user") and x.get("output_tokens_per_second")
        ]
        xs, ys = [x["tokens_per_second_per_user"] for x in lv], [x["output_tokens_per_second"] / gpus for x in lv]
        ax.plot(xs, ys, style, color=color, label=f"{label} ({report[side].get('model')})")
        for x, y, v in zip(xs, ys, lv, strict=True):
            ax.annotate(str(v["concurrency"]), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    if predicted:
        ax.plot(
            [r["tokens_per_second_per_user"] for r in predicted],
            [r["output_tokens_per_second_per_gpu"] for r in predicted],
            "--",
            color="tab:blue",
            label="planner: DFlash",
        )
        ax.plot(
            [r["baseline_tokens_per_second_per_user"] for r in predicted],
            [r["baseline_output_tokens_per_second_per_gpu"] for r in predicted],
            "--",
            color="tab:gray",
            label="planner: baseline",
        )
    _axes(
        ax,
        "decode tokens/s per user (TTFT excluded)",
        f"output tokens/s per {unit}",
        f"throughput per {unit} vs tokens/s per user",
        log=False,
    )


def _nan(x: float | None) -> float:
    return math.nan if x is None else x


def _axes(ax, xlabel: str, ylabel: str, title: str, log: bool = True) -> None:
    if log:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
