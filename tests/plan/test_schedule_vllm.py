"""Schedules converted between stacks draft the same length at every batch size.

Each side is read by a lookup written out here from the stack's own source, not by the
project's readers: ``vllm_dense`` follows ``vllm/v1/spec_decode/dynamic/utils.py::
build_dynamic_sd_schedule_lookup`` (gaps and the tail inherit the previous K, K capped at
num_speculative_tokens); ``trtllm_len`` follows ``tensorrt_llm/_torch/speculative/utils.py::
get_draft_len_for_batch_size`` (first key >= batch, 0 above the largest).
"""

from __future__ import annotations

from bisect import bisect_left

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dflash_trt.errors import RecipeError
from dflash_trt.plan import schedule_vllm as sv
from dflash_trt.plan import trtllm_releases

RELEASE = trtllm_releases.get_release(trtllm_releases.DEFAULT_RELEASE)


def vllm_dense(entries, num_spec: int, max_bs: int) -> list[int]:
    dense = [0] * (max_bs + 1)
    next_bs, last_k = 1, None
    for lo, hi, k in sorted(entries):
        if lo > next_bs and last_k is not None:
            for bs in range(next_bs, min(lo, max_bs + 1)):
                dense[bs] = min(num_spec, last_k)
        for bs in range(max(lo, next_bs), min(hi, max_bs) + 1):
            dense[bs] = min(num_spec, k)
        next_bs, last_k = max(next_bs, hi + 1), k
        if next_bs > max_bs:
            break
    for bs in range(next_bs, max_bs + 1):
        dense[bs] = min(num_spec, last_k)
    return dense[1:]


def trtllm_len(schedule: dict[int, int], batch: int) -> int:
    keys = sorted(schedule)
    i = bisect_left(keys, batch)
    return schedule[keys[i]] if i < len(keys) else 0


@st.composite
def trtllm_schedules(draw):
    max_len = draw(st.integers(1, 15))
    keys = sorted(draw(st.sets(st.integers(1, 96), min_size=1, max_size=6)))
    vals = sorted(draw(st.lists(st.integers(0, max_len), min_size=len(keys), max_size=len(keys))), reverse=True)
    vals[0] = max_len
    return max_len, dict(zip(keys, vals, strict=True)), draw(st.integers(1, 128))


@st.composite
def vllm_schedules(draw):
    starts = sorted(draw(st.sets(st.integers(2, 100), max_size=5)) | {1})
    entries = []
    for i, lo in enumerate(starts):
        nxt = starts[i + 1] if i + 1 < len(starts) else lo + draw(st.integers(1, 20))
        hi = draw(st.integers(lo, nxt - 1)) if nxt > lo else lo  # leave gaps
        entries.append([lo, hi, draw(st.integers(0, 12))])
    return entries, draw(st.integers(1, 12)), draw(st.integers(1, 128))


@settings(max_examples=200, deadline=None)
@given(trtllm_schedules())
def test_trtllm_to_vllm_drafts_the_same_everywhere(case):
    max_len, schedule, max_bs = case
    want = [trtllm_len(schedule, b) for b in range(1, max_bs + 1)]
    assume(max(want) > 0)
    num_spec, entries = sv.trtllm_to_vllm(schedule, max_len, RELEASE, max_bs)
    assert vllm_dense(entries, num_spec, max_bs) == want


@settings(max_examples=200, deadline=None)
@given(vllm_schedules())
def test_vllm_to_trtllm_drafts_the_same_everywhere(case):
    entries, num_spec, max_bs = case
    want = vllm_dense(entries, num_spec, max_bs)
    try:
        max_len, schedule = sv.vllm_to_trtllm(entries, num_spec, RELEASE, max_bs)
    except RecipeError:  # refused only where TensorRT-LLM cannot express it
        assert want[0] == 0 or max(want) != want[0]
        return
    assert max_len == want[0]
    assert [trtllm_len(schedule, b) for b in range(1, max_bs + 1)] == want


def test_copying_a_schedule_would_be_wrong():
    """The same numbers mean different lengths: {4: 4, 8: 2} read as vLLM-style ranges
    [[1, 4, 4], [5, 8, 2]] inherit 2 above 8, where TensorRT-LLM stops drafting."""
    num_spec, entries = sv.trtllm_to_vllm({4: 4, 8: 2}, 4, RELEASE, 16)
    assert entries == [[1, 4, 4], [5, 8, 2], [9, 16, 0]]
    assert vllm_dense([[1, 4, 4], [5, 8, 2]], 4, 16)[8:] == [2] * 8


@pytest.mark.parametrize("bad", [[], [[2, 4, 3]], [[1, 4, 3], [4, 6, 2]], [[1, 0, 3]], [[1, 2]]])
def test_vllm_rules_refused(bad):
    with pytest.raises(RecipeError):
        sv.check_vllm(bad)


def test_the_plan_carries_its_schedule_for_vllm():
    """plan --json: the vLLM form of what TensorRT-LLM drafts reads back the same at every batch."""
    from dflash_trt.deploy import pipeline
    from dflash_trt.plan import recipe as R

    p = pipeline.plan_resolved(pipeline.resolve_recipe(R.load_recipe("gpt-oss-120b-8xb300", [])))
    want = p.lengths()
    v = p.vllm_schedule
    assert vllm_dense(v.num_speculative_tokens_per_batch_size, v.num_speculative_tokens, len(want)) == want
