"""What ``bench`` and ``tune`` print: tables of the report's figures, each ratio named with what
it divides (``DFlash tok/s ÷ autoregressive tok/s``), spreads as ± half the min–max of repeats,
and conclusions only where :mod:`dflash_trt.bench.spread` draws one."""

from __future__ import annotations

from rich import box
from rich.table import Table

from dflash_trt._cli.common import err, out


def show(r: dict) -> None:
    through = f", {r['backend']} backend" if r.get("backend", "torch") != "torch" else ""
    if r.get("graphs"):
        through += f" ({r['graphs']['target']}, {r['graphs']['drafter']})"
    t = Table(title=f"DFlash vs autoregressive — {r['prompts']} prompts, B={r['block_size']}, greedy{through}")
    t.add_column("")
    t.add_column("DFlash", justify="right")
    t.add_column("autoregressive", justify="right")
    d, a = r["dflash"], r["autoregressive"]
    t.add_row("tokens/s", f"{d['tokens_per_second']:.1f}", f"{a['tokens_per_second']:.1f}")
    t.add_row("τ (tokens per target forward)", f"{d['acceptance_length']:.2f}", "1.00")
    t.add_row("target forwards", str(d["target_forwards"]), str(a["target_forwards"]))
    t.add_row("new tokens", str(d["new_tokens"]), str(a["new_tokens"]))
    for key, label in (("ttft_ms", "TTFT median, ms"), ("tpot_ms", "TPOT median, ms")):
        t.add_row(label, _fmt((d.get(key) or {}).get("median"), ".2f"), _fmt((a.get(key) or {}).get("median"), ".2f"))
    out.print(t)
    pp = " ".join(f"{x:.2f}" for x in r["per_position_acceptance"])
    s = r["step"]
    out.print(
        f"speedup {r['speedup']:.2f}x (DFlash tok/s ÷ autoregressive tok/s){_speed_spread(r)}   "
        f"lossless {str(r['lossless']).lower()}"
    )
    out.print(f"per-position acceptance [{pp}]")
    for cat, c in (r.get("categories") or {}).items():
        out.print(
            f"  {cat}: {c['prompts']} prompts, τ {c['acceptance_length']:.2f}, speedup "
            f"{_fmt(c['speedup'], '.2f')}x (DFlash tok/s ÷ autoregressive tok/s)"
        )
    out.print(
        f"step: draft {s['draft_ms']:.2f} ms + verify {s['verify_ms']:.2f} ms = {s['step_cost_ratio']:.2f}x "
        f"the verify forward alone; one autoregressive forward {s['autoregressive_forward_ms']:.2f} ms "
        f"(a DFlash step costs {_ratio(s['draft_ms'] + s['verify_ms'], s['autoregressive_forward_ms'])} "
        "autoregressive forwards)"
    )


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def _speed_spread(r: dict) -> str:
    sp = r.get("spread") or {}
    if r.get("repeats", 1) < 2 or not sp.get("speedup"):
        return "; one repeat: no spread, so no verdict (--repeats 3)"
    iv = sp["speedup"]
    return f", {iv['min']:.2f}–{iv['max']:.2f} over {r['repeats']} repeats: {sp['verdict']}" + (
        " (noisy machine: repeats more than 15% apart)" if sp.get("noisy") else ""
    )


def _fmt(x, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def _pm(iv: dict | None) -> str:
    """Half the min–max range over repeats, relative to the mean: ``±3%``."""
    if not iv or not iv.get("mean") or len(iv.get("values") or []) < 2:
        return "-"
    return f"±{(iv['max'] - iv['min']) / 2 / iv['mean']:.0%}"


LEGEND = (
    "conc: concurrent requests; tok/s: output tokens/s, ± half its min–max",
    "over {repeats} repeats; tok/s per user: decode, TTFT excluded (1/TPOT); TTFT, TPOT,",
    "ITL: medians in ms; ITL per chunk as vLLM prints it, per token beside it;",
    "speedup: DFlash output tok/s ÷ baseline output tok/s (≈: within noise)",
)


COLUMNS = {
    "levels": ("conc", "ok", "tok/s", "±", "tok/s per user", "TTFT", "TPOT", "ITL per chunk", "ITL per token", "τ"),
    "rate_levels": ("rate /s", "sent /s", "ok", "tok/s", "±", "TTFT", "TPOT", "TPOT p99", "ITL per token", "τ"),
}


def _row(lv: dict, kind: str) -> list[str]:
    med = lambda k: (lv.get(k) or {}).get("median")  # noqa: E731
    tps = [_fmt(lv["output_tokens_per_second"], ".0f"), _pm((lv.get("spread") or {}).get("output_tokens_per_second"))]
    if kind == "levels":
        return [
            str(lv["concurrency"]),
            f"{lv['ok']}/{lv['requests']}",
            *tps,
            _fmt(lv["tokens_per_second_per_user"]),
            _fmt(med("ttft_ms"), ".0f"),
            _fmt(med("tpot_ms")),
            _fmt(med("itl_ms")),
            _fmt(med("itl_per_token_ms")),
            _fmt(lv["acceptance_length"], ".2f"),
        ]
    return [
        f"{lv['request_rate']:g}",
        _fmt(lv.get("achieved_request_rate"), ".2f"),
        f"{lv['ok']}/{lv['requests']}",
        *tps,
        _fmt(med("ttft_ms"), ".0f"),
        _fmt(med("tpot_ms")),
        _fmt((lv.get("tpot_ms") or {}).get("p99")),
        _fmt(med("itl_per_token_ms")),
        _fmt(lv["acceptance_length"], ".2f"),
    ]


def _side_table(r: dict, key: str, kind: str, speed: dict) -> None:
    e = r[key]
    # short headers that wrap at spaces and a light box: every column fits 80 columns whole
    t = Table(
        title=f"{key}: {e['url']} ({e['model']}), max {r['max_tokens']} tokens, T={r['temperature']}",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for col in COLUMNS[kind]:
        t.add_column(col, justify="right")
    if key == "endpoint" and speed:
        t.add_column("speedup", justify="right", min_width=7)
    for lv in e[kind]:
        row = _row(lv, kind)
        if key == "endpoint" and speed:
            s = speed.get(lv["concurrency" if kind == "levels" else "request_rate"])
            row.append(
                "-" if s is None else f"{s['speedup']:.2f}x" + ("≈" if s.get("verdict") == "indistinguishable" else "")
            )
        t.add_row(*row)
    out.print(t)
    for lv in e[kind]:
        for msg in lv["errors"]:
            err.print(f"[yellow]{_where(lv)}: {msg}[/yellow]", markup=True)


def _where(lv: dict) -> str:
    return f"concurrency {lv['concurrency']}" if lv.get("concurrency") else f"rate {lv['request_rate']:g}/s"


def show_endpoint(r: dict) -> None:
    cmp = r.get("comparison", {})
    for kind, rows, key in (
        ("levels", cmp.get("speedup", []), "concurrency"),
        ("rate_levels", cmp.get("by_rate", []), "request_rate"),
    ):
        speed = {row[key]: row for row in rows}
        for side in ("endpoint", "mtp", "baseline"):
            if side in r and r[side].get(kind):
                _side_table(r, side, kind, speed)
    for line in LEGEND if cmp else LEGEND[:-1]:
        out.print(line.format(repeats=r.get("repeats", 1)), style="dim")
    if "comparison" in r:
        for line in speedup_lines(r["comparison"]):
            out.print(line)
    _goodput(r)
    _categories(r)
    if r.get("mtp"):
        show_arms(r["arms"])
    for w in r.get("warnings") or []:
        err.print(f"[yellow]warning:[/yellow] {w}")
    if r.get("plot"):
        out.print(f"plot: {r['plot']}")


def _goodput(r: dict) -> None:
    limits = r.get("goodput_limits_ms")
    if not limits:
        return
    said = ", ".join(f"{k} <= {v:g} ms" for k, v in limits.items())
    out.print(f"goodput ({said}): requests/s within all limits (share of sent)")
    for side in ("endpoint", "mtp", "baseline"):
        for lv in [*(r.get(side) or {}).get("levels", []), *(r.get(side) or {}).get("rate_levels", [])]:
            g = lv.get("goodput") or {}
            share = "-" if g.get("good_fraction") is None else f"{g['good_fraction']:.0%}"
            out.print(f"  {side} {_where(lv)}: {_fmt(g.get('goodput'), '.2f')} req/s ({share})")


def _categories(r: dict) -> None:
    """Per prompt category: τ and decode tokens/s per user each side measured, and the speedup
    (DFlash ÷ baseline decode tokens/s per user)."""
    rows = [
        (side, lv)
        for side in ("endpoint", "baseline")
        for lv in (r.get(side) or {}).get("levels", [])
        if lv.get("categories")
    ]
    if not rows:
        return
    compared = r.get("comparison", {}).get("speedup", [])
    ratio = {row["concurrency"]: row.get("category_speedup") or {} for row in compared}
    t = Table(
        title="per category",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        caption="speedup: DFlash ÷ baseline decode tok/s per user",
    )
    for col in ("side", "conc", "category", "requests", "τ", "tok/s per user", "TPOT", "speedup"):
        t.add_column(col, justify="right")
    for side, lv in rows:
        for cat, c in lv["categories"].items():
            sp = ratio.get(lv["concurrency"], {}).get(cat) if side == "endpoint" else None
            t.add_row(
                side,
                str(lv["concurrency"]),
                cat,
                str(c["requests"]),
                _fmt(c["acceptance_length"], ".2f"),
                _fmt(c["tokens_per_second_per_user"]),
                _fmt((c.get("tpot_ms") or {}).get("median")),
                "-" if sp is None else f"{sp:.2f}x",
            )
    out.print(t)


def speedup_lines(comparison: dict) -> list[str]:
    """Where drafting pays, does not, and cannot be told from the baseline beyond the min–max of
    the repeats (speedup: DFlash output tokens/s over the baseline's)."""
    by: dict[str, list[str]] = {}
    for row in comparison["speedup"]:
        by.setdefault(row.get("verdict", "indistinguishable"), []).append(str(row["concurrency"]))
    said = (
        ("pays", "drafting pays"),
        ("does not pay", "drafting does not pay"),
        ("indistinguishable", "within noise of the baseline"),
    )
    lines = [f"{text} at concurrency {', '.join(by[v])}" for v, text in said if by.get(v)]
    rates: dict[str, list[str]] = {}
    for row in comparison.get("by_rate", []):
        rates.setdefault(row["verdict"], []).append(f"{row['request_rate']:g}/s")
    lines += [f"{text} at request rate {', '.join(rates[v])}" for v, text in said if rates.get(v)]
    return lines + ["(DFlash vs baseline output tok/s, beyond the min–max of the repeats)"] if lines else []


def show_arms(rows: list[dict]) -> None:
    """Output tokens/s of DFlash, MTP and autoregressive per concurrency, and the winner."""
    t = Table(title="arms: output tok/s per concurrency")
    for col in ("concurrency", "DFlash", "MTP", "autoregressive", "winner", "margin"):
        t.add_column(col, justify="right")
    for row in rows:
        t.add_row(
            str(row["concurrency"]),
            _fmt(row["dflash"]),
            _fmt(row["mtp"]),
            _fmt(row["autoregressive"]),
            row["winner"],
            "-" if row["margin"] is None else f"+{row['margin']:.0%}",
        )
    t.caption = (
        "mean output tok/s over repeats; winner only where it beats the runner-up beyond their min–max; "
        "margin: leader ÷ runner-up - 1"
    )
    out.print(t)
