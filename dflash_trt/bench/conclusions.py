"""What a benchmark report concludes: a conclusion is drawn only beyond the spread.

Invariant: every verdict here compares intervals over repeats (:mod:`~dflash_trt.bench.spread`),
never two single figures. ``compare`` says where drafting pays, does not, or is
indistinguishable; ``arms`` names a winner only where it beats the runner-up beyond noise;
``noise_warnings`` names the levels whose repeats disagreed beyond ``spread.NOISY``. Pure
functions of the report dicts :mod:`~dflash_trt.bench.endpoint` writes; nothing is measured here.
"""

from __future__ import annotations

from dflash_trt.bench import spread


def noise_warnings(report: dict) -> list[str]:
    """One line per side whose repeats disagreed beyond ``spread.NOISY`` at some level."""
    out = []
    for side in ("endpoint", "baseline", "mtp"):
        noisy = [lv["concurrency"] for lv in (report.get(side) or {}).get("levels", []) if lv.get("noisy")]
        if noisy:
            out.append(
                f"{side}: repeats at concurrency {', '.join(map(str, noisy))} differ by more than "
                f"{spread.NOISY:.0%} in output tokens/s; the machine was noisy (more --repeats, or a "
                "quieter machine)"
            )
    return out


ARMS = (("dflash", "endpoint"), ("mtp", "mtp"), ("autoregressive", "baseline"))


def throughput_interval(lv: dict) -> dict | None:
    """A level's output tokens/s: its interval over repeats with ``mean`` set to the level's own
    figure (all its tokens over all its repeats' time; a level without repeats: that one figure)."""
    if not lv.get("output_tokens_per_second"):
        return None
    iv = (lv.get("spread") or {}).get("output_tokens_per_second") or spread.interval([lv["output_tokens_per_second"]])
    assert iv is not None  # the interval of one figure is never empty
    return {**iv, "mean": lv["output_tokens_per_second"]}


def arms(report: dict) -> list[dict]:
    """Per concurrency: each measured arm's output tokens/s (DFlash: ``endpoint``, MTP: ``mtp``,
    autoregressive: ``baseline``; over all repeats), the winner (the most tokens/s, named only
    where it beats the runner-up beyond their spread, else "indistinguishable") and its margin over
    the runner-up (winner mean / runner-up mean - 1)."""
    rates: dict[int, dict[str, dict]] = {}
    for arm, key in ARMS:
        for lv in (report.get(key) or {}).get("levels", []):
            if (iv := throughput_interval(lv)) is not None:
                rates.setdefault(int(lv["concurrency"]), {})[arm] = iv
    rows = []
    for c in sorted(rates):
        r = rates[c]
        order = sorted(r, key=lambda a: r[a]["mean"], reverse=True)
        second = r[order[1]] if len(order) > 1 else None
        margin = r[order[0]]["mean"] / second["mean"] - 1 if second and second["mean"] else None
        winner = order[0] if second is None or spread.beyond(r[order[0]], second) else "indistinguishable"
        rows.append(
            {
                "concurrency": c,
                **{a: round(r[a]["mean"], 2) if a in r else None for a, _ in ARMS},
                "winner": winner,
                "leader": order[0],
                "margin": None if margin is None else round(margin, 4),
            }
        )
    return rows


def compare(ep: dict, base: dict) -> dict:
    """Speedup per concurrency (endpoint output tokens/s over the baseline's, with its interval
    over repeats) and a verdict each: "pays", "does not pay" or "indistinguishable"; the first
    concurrency where drafting does not pay beyond noise (``stops_paying_at``). Per request rate
    the same (``by_rate``: at a rate both sides serve alike, the speedup is read in the latency,
    ``tpot_ratio``), and per prompt category the ratio of decode tokens/s per user."""
    rows = _compare_rows(ep["levels"], base["levels"], "concurrency")
    stops = next((r["concurrency"] for r in rows if r["verdict"] == "does not pay"), None)
    out = {"speedup": rows, "stops_paying_at": stops}
    if ep.get("rate_levels") and base.get("rate_levels"):
        out["by_rate"] = _compare_rows(ep["rate_levels"], base["rate_levels"], "request_rate")
    return out


def _compare_rows(mine: list[dict], theirs: list[dict], key: str) -> list[dict]:
    b = {lv[key]: lv for lv in theirs}
    rows = []
    for lv in mine:
        other = b.get(lv[key])
        a_iv, b_iv = throughput_interval(lv), throughput_interval(other) if other else None
        if other is None or a_iv is None or b_iv is None or not b_iv["mean"]:
            continue
        v = spread.verdict(a_iv, b_iv)
        row = {
            key: lv[key],
            "speedup": round(a_iv["mean"] / b_iv["mean"], 4),
            "interval": spread.ratio(a_iv, b_iv),
            "verdict": {"higher": "pays", "lower": "does not pay"}.get(v, "indistinguishable"),
        }
        mt, bt = (lv.get("tpot_ms") or {}).get("median"), (other.get("tpot_ms") or {}).get("median")
        row["tpot_ratio"] = round(mt / bt, 4) if mt and bt else None  # DFlash TPOT / baseline TPOT
        cats, other_cats = lv.get("categories") or {}, other.get("categories") or {}
        per = {
            c: _ratio(x.get("tokens_per_second_per_user"), other_cats[c].get("tokens_per_second_per_user"))
            for c, x in cats.items()
            if c in other_cats
        }
        if per:
            row["category_speedup"] = per
        rows.append(row)
    return rows


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a and b else None
