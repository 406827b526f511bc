"""Lossless on the second-wave target families (tests/second_wave.py).

Greedy speculative decoding must emit exactly what the target's own incremental greedy decoding
(transformers ``generate``) emits: DeepSeek sparse attention (deepseek_v32, glm_moe_dsa), whose
indexer must never choose a rejected draft's key; DeepSeek V4, whose compressors must never
take in a rejected token; and the sliding-window families (mimo_v2_flash, laguna, muse_glimmer,
gemma4_unified). Each with a mostly rejected (random) and a mostly accepted drafter (the
oracle, corrupted at a varying position so every round rolls back), and rows joining and leaving
the step-level scheduler. The default run takes one case per family; the full matrix is slow.

The tiny sparse targets give their indexers 8 heads: with 2, a query's scores tie at exactly
zero (ReLU) often enough that ``topk`` breaks the tie differently for different shapes, and
transformers' own full-sequence forward then disagrees with its own incremental decoding.
"""

from __future__ import annotations

import pytest

from dflash_trt.runtime.backend import TorchBackend
from dflash_trt.runtime.loop import Request
from tests.helpers import wrap
from tests.runtime.test_families import Case, check_lossless, check_matrix_cell
from tests.runtime.test_families import case as families_case
from tests.second_wave import FAMILIES, TEXT_ONLY, second_wave_target

MAX_NEW = 12


def case(family: str) -> Case:
    """test_families' case, on this module's targets (12 new tokens, prompts of up to 24)."""
    return families_case(family, make=second_wave_target, max_new=MAX_NEW, hi=24)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_is_lossless_on_second_wave_families(family):
    check_lossless(family, case(family), block=4, min_tau=1.8)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES + TEXT_ONLY)
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("block", [4, 8])
@pytest.mark.parametrize("kind", ["random", "oracle"])
def test_greedy_is_lossless_full_matrix(family, batch, block, kind):
    check_matrix_cell(family, batch, block, kind, case(family))


def _scheduler_joins_and_leaves(family: str) -> None:
    """Rows join a running batch at later steps (prefilled apart, merged), more than max_batch
    wait, one is cancelled mid-flight, the rest finish: each row stays the target's greedy decoding."""
    from dflash_trt.runtime import Scheduler

    c = case(family)
    drafter = c.drafter("random", 4, [])  # the oracle double cannot follow rows merged by the scheduler
    scheduler = Scheduler(TorchBackend(wrap(c.model, drafter), drafter), max_batch=3)
    asked = {"n": 0}

    def cancel_second():
        asked["n"] += 1
        return asked["n"] == 2

    reqs = [Request(p, MAX_NEW, should_stop=cancel_second if i == 1 else None) for i, p in enumerate(c.prompts)]
    arrivals = {0: reqs[:2], 2: reqs[2:4], 3: reqs[4:]}
    for k in range(200):
        for req in arrivals.get(k, []):
            scheduler.add(req)
        if scheduler.idle and k > max(arrivals):
            break
        scheduler.step()
    assert reqs[1].finish_reason == "cancelled"
    assert reqs[1].token_ids == c.truth(1)[: len(reqs[1].token_ids)]
    for i, r in enumerate(reqs):
        if i != 1:
            assert r.token_ids == c.expected(6)[i], f"{family}: row {i}"


@pytest.mark.parametrize("family", ["glm_moe_dsa", "deepseek_v4"])
def test_the_scheduler_joins_and_drops_sparse_rows_mid_flight(family):
    _scheduler_joins_and_leaves(family)


@pytest.mark.slow
@pytest.mark.parametrize("family", [f for f in FAMILIES if f not in ("glm_moe_dsa", "deepseek_v4")])
def test_the_scheduler_joins_and_drops_rows_mid_flight_slow(family):
    _scheduler_joins_and_leaves(family)


def test_the_graph_export_refuses_each_in_one_line():
    """The standalone graph path stacks one plain KV cache per layer: each of these is refused
    before any export work, in one line naming what its cache holds."""
    from dflash_trt.export.onnx_graphs import target_export_problem

    want = {"deepseek_v32": "indexer", "glm_moe_dsa": "indexer", "deepseek_v4": "compressor"}
    for family in FAMILIES:
        problem = target_export_problem(case(family).model.config)
        assert problem and "\n" not in problem, family
        assert want.get(family, "sliding-window") in problem, (family, problem)


def test_each_is_in_the_family_registry():
    """The registry recipes read names every family proven here, VLM and text model alike."""
    from dflash_trt.ingest import target_family_of as family_of
    from tests.second_wave import _config

    for family in FAMILIES + TEXT_ONLY:
        cfg = _config(family)[1]
        assert family_of(cfg.model_type) is not None, cfg.model_type
        assert family_of(cfg.get_text_config().model_type) is not None, cfg.get_text_config().model_type
