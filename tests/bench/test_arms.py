"""DFlash against MTP and autoregressive per concurrency, from recorded endpoint results."""

from __future__ import annotations

from dflash_trt.bench import endpoint as loadgen
from dflash_trt.bench import tune as T


def _side(rates: dict[int, float | None], rel: float = 0.005) -> dict:
    """Levels measured three times within ±``rel`` of each rate."""
    from dflash_trt.bench.spread import interval

    return {
        "url": "x",
        "levels": [
            {
                "concurrency": c,
                "output_tokens_per_second": r,
                "spread": {"output_tokens_per_second": interval([r * (1 - rel), r, r * (1 + rel)]) if r else None},
            }
            for c, r in rates.items()
        ],
    }


# The shape LMSYS measured at c1 on Qwen3.5-397B (DFlash 875, MTP 558, baseline 203 tok/s), then
# DFlash's verify growing expensive with concurrency, MTP's cheaper one overtaking it, and at
# the top neither paying.
REPORT = {
    "endpoint": _side({1: 875.0, 8: 4000.0, 32: 9000.0, 64: 11000.0}),
    "mtp": _side({1: 558.0, 8: 3000.0, 32: 9800.0, 64: 11500.0}),
    "baseline": _side({1: 203.0, 8: 1500.0, 32: 6000.0, 64: 12500.0}),
}


def test_winner_per_concurrency():
    rows = {r["concurrency"]: r for r in loadgen.arms(REPORT)}
    assert [rows[c]["winner"] for c in (1, 8, 32, 64)] == ["dflash", "dflash", "mtp", "autoregressive"]
    assert rows[1]["margin"] == round(875 / 558 - 1, 4)  # over the runner-up, MTP
    assert rows[32]["margin"] == round(9800 / 9000 - 1, 4)
    assert (rows[1]["dflash"], rows[1]["mtp"], rows[1]["autoregressive"]) == (875.0, 558.0, 203.0)


def test_a_winner_within_the_spread_is_not_named():
    rep = {"endpoint": _side({1: 100.0}, rel=0.05), "mtp": _side({1: 103.0}, rel=0.05)}
    row = loadgen.arms(rep)[0]
    assert row["winner"] == "indistinguishable" and row["leader"] == "mtp" and row["margin"] == 0.03


def test_only_measured_arms_compete():
    rep = {"endpoint": _side({1: 100.0, 4: 300.0}), "mtp": _side({1: 120.0, 4: None})}
    rows = {r["concurrency"]: r for r in loadgen.arms(rep)}
    assert rows[1]["winner"] == "mtp" and rows[1]["autoregressive"] is None
    assert rows[4]["winner"] == "dflash" and rows[4]["mtp"] is None and rows[4]["margin"] is None


def test_tune_sweep_compares_the_tuned_lengths():
    """tune's DFlash arm at each concurrency is the winning draft length's level, its autoregressive
    arm the sweep's drafting-off level."""
    measured = {
        0: _side({1: 50.0, 4: 180.0})["levels"],
        3: _side({1: 120.0, 4: 170.0})["levels"],
        1: _side({1: 90.0, 4: 200.0})["levels"],
    }
    wins = T.winners(measured)
    rows = {r["concurrency"]: r for r in T.sweep_arms(measured, wins, _side({1: 100.0, 4: 230.0})["levels"])}
    assert rows[1]["dflash"] == measured[wins[1]][0]["output_tokens_per_second"]
    at4 = next(lv for lv in measured[wins[4]] if lv["concurrency"] == 4)
    assert rows[4]["dflash"] == at4["output_tokens_per_second"]
    assert rows[1]["autoregressive"] == 50.0 and rows[4]["winner"] == "mtp"
