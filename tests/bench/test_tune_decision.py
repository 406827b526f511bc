"""tune's decision on synthetic measurements with injected noise: lengths never rise with the
batch size, none below the shortest allowed, a step only beyond the repeats' spread, and two
noisy runs of one machine write the same schedule."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dflash_trt.bench import tune as T
from dflash_trt.bench.spread import interval

LENGTHS = (0, 1, 4, 7)
LEVELS = (1, 2, 4, 8)
NOISE = 0.02  # each repeat within ±2% of the true figure: tied means stay under spread.MIN_DIFFERENCE apart
STEP = 1.25  # true figures on a grid 25% apart: apart beyond the noise, or tied


def _measured(true: dict[int, dict[int, float]], noise: list[float], repeats: int = 3) -> dict[int, list[dict]]:
    """Levels as the load generator reports them: the mean over repeats and their interval."""
    it = iter(noise)
    out = {}
    for L, row in true.items():
        out[L] = []
        for c, v in row.items():
            values = [v * (1 + next(it)) for _ in range(repeats)]
            out[L].append(
                {
                    "concurrency": c,
                    "output_tokens_per_second": sum(values) / repeats,
                    "spread": {"output_tokens_per_second": interval(values)},
                }
            )
    return out


grid = st.dictionaries(
    st.sampled_from(LENGTHS), st.lists(st.integers(0, 4), min_size=len(LEVELS), max_size=len(LEVELS)), min_size=2
)
noise = st.lists(
    st.floats(-NOISE, NOISE), min_size=len(LENGTHS) * len(LEVELS) * 3, max_size=len(LENGTHS) * len(LEVELS) * 3
)


def _true(ks: dict[int, list[int]]) -> dict[int, dict[int, float]]:
    return {L: {c: 100 * c * STEP**k for c, k in zip(LEVELS, row, strict=True)} for L, row in ks.items()}


@given(grid, noise, noise, st.sampled_from([0, 1]))
def test_two_noisy_runs_write_the_same_non_increasing_schedule(ks, noise_a, noise_b, shortest):
    if not any(L >= max(shortest, 1) for L in ks):
        return
    true = _true(ks)
    a = T.winners(_measured(true, noise_a), shortest=shortest)
    b = T.winners(_measured(true, noise_b), shortest=shortest)
    assert a == b
    lengths = [a[c] for c in LEVELS]
    assert lengths == sorted(lengths, reverse=True)  # never rises with the batch size
    assert min(lengths) >= shortest and lengths[0] > 0  # no zero below the floor; drafting at the smallest key
    sched_lengths = T.lengths_for(a, 8)
    assert sched_lengths[0] == a[1] and sched_lengths == sorted(sched_lengths, reverse=True)


@given(grid, noise)
def test_a_step_is_taken_only_beyond_noise(ks, noise_a):
    measured = _measured(_true(ks), noise_a)
    wins = T.winners(measured, shortest=1)
    by = {
        L: {lv["concurrency"]: lv["spread"]["output_tokens_per_second"] for lv in rows} for L, rows in measured.items()
    }
    prev = max(L for L in ks if L >= 1)
    for c in LEVELS:
        if wins[c] != prev:  # stepped down: the new length beat the old one beyond their min–max
            assert wins[c] < prev and by[wins[c]][c]["min"] > by[prev][c]["max"]
        prev = wins[c]


def _level(c: int, vals: list[float]) -> dict:
    """A measured level at concurrency ``c``: its mean over repeats ``vals`` and their spread."""
    return {
        "concurrency": c,
        "output_tokens_per_second": sum(vals) / len(vals),
        "spread": {"output_tokens_per_second": interval(vals)},
    }


def test_indistinguishable_levels_keep_the_length_of_the_level_before():
    # 4 looks 3% faster than 7 at concurrency 2, intervals overlapping: no step; at 4 it is 40% faster: a step
    measured = {
        7: [_level(1, [100, 104, 98]), _level(2, [150, 160, 155]), _level(4, [200, 205, 210])],
        4: [_level(1, [90, 92, 91]), _level(2, [158, 163, 157]), _level(4, [280, 290, 285])],
        0: [_level(1, [50, 51, 52]), _level(2, [90, 91, 92]), _level(4, [400, 410, 405])],
    }
    assert T.winners(measured, shortest=1) == {1: 7, 2: 7, 4: 4}  # off is faster at 4, but never written
    assert T.winners(measured, shortest=0) == {1: 7, 2: 7, 4: 0}
    once = {
        L: [{**x, "spread": {"output_tokens_per_second": interval([x["output_tokens_per_second"]])}} for x in rows]
        for L, rows in measured.items()
    }
    assert T.winners(once, shortest=1) == {1: 7, 2: 7, 4: 7}  # measured once: nothing is beyond noise


def test_a_longer_length_faster_later_is_not_a_rise():
    measured = {
        7: [_level(1, [100, 101, 99]), _level(2, [300, 301, 299])],
        3: [_level(1, [200, 201, 199]), _level(2, [150, 151, 149])],
    }
    warnings: list[str] = []
    assert T.winners(measured, warnings, shortest=1) == {1: 3, 2: 3}
    assert len(warnings) == 1 and "at concurrency 2 a longer draft" in warnings[0]


def test_no_step_on_noisy_repeats():
    # 4 beats 7 at concurrency 2 beyond the min–max, but its repeats are 40% apart
    measured = {
        7: [_level(1, [100, 101, 99]), _level(2, [100, 101, 99])],
        4: [_level(1, [90, 91, 89]), _level(2, [150, 210, 180])],
    }
    warnings: list[str] = []
    assert T.winners(measured, warnings, shortest=1) == {1: 7, 2: 7}
    assert len(warnings) == 1 and "no step taken" in warnings[0]
    measured[4][1] = _level(2, [175, 180, 185])  # the same step on repeats that agree
    assert T.winners(measured, shortest=1) == {1: 7, 2: 4}
