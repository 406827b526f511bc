"""The per-family target cache: rows leave and join without disturbing the others' states."""

from __future__ import annotations

import pytest
import torch

from dflash_trt.errors import DFlashError
from dflash_trt.runtime.backend import TorchBackend
from dflash_trt.runtime.loop import Batch, Request, commit, generate, prefill, verify
from tests.families import family_drafter, family_target
from tests.helpers import hf_greedy, prompts, wrap

MAX_NEW = 16


@pytest.mark.parametrize("family", ["qwen3_5", "gemma4"])
def test_a_row_leaving_keeps_the_others_lossless(family):
    """A cancelled row leaves mid-generation (keep_rows on recurrent states and windows)."""
    model = family_target(family)
    drafter = family_drafter(model, block_size=6)
    ps = prompts(3, seed=5, lo=2, hi=20)
    truth = [hf_greedy(model, p, MAX_NEW) for p in ps]
    asked = {}

    def should_stop(row):
        asked[row] = asked.get(row, 0) + 1
        return row == 1 and asked[row] == 2

    out = generate(wrap(model, drafter), drafter, ps, max_new_tokens=MAX_NEW, block_size=6, should_stop=should_stop)
    assert out.finish_reasons == ["length", "cancelled", "length"]
    assert out.token_ids[0] == truth[0] and out.token_ids[2] == truth[2]


def _decode_greedy(backend, batch: Batch, steps: int) -> list[list[int]]:
    """Autoregressive greedy decoding through the loop's verify/commit on a prepared batch."""
    got = [[t] for t in batch.last.tolist()]
    for _ in range(steps - 1):
        block = batch.last[:, None]
        logits, _ = verify(backend, batch, block)
        bonus = logits[:, 0].argmax(-1)
        commit(backend, batch, block, torch.zeros_like(bonus), bonus, None)
        for row, tok in zip(got, bonus.tolist(), strict=True):
            row.append(tok)
    return got


@pytest.mark.parametrize("family", ["qwen3", "qwen3_next", "gpt_oss"])
def test_batches_prefilled_apart_merge_into_one(family):
    """Two batches prefilled (and decoded) apart, then merged (``Batch.merge`` through
    ``TorchBackend.merge_rows``): the merged batch decodes what each prompt decodes alone
    (full-attention columns padded, sliding windows and recurrent states concatenated)."""
    model = family_target(family)
    backend = TorchBackend(wrap(model), None)  # the lean forward where the family has one (qwen3)
    ps = prompts(3, seed=8, lo=3, hi=24)
    truth = [hf_greedy(model, p, MAX_NEW) for p in ps]
    a = prefill(backend, [Request(p, MAX_NEW) for p in ps[:2]], draft=False)
    got_a = _decode_greedy(backend, a, 4)  # a is 3 commits ahead of b
    b = prefill(backend, [Request(p, MAX_NEW) for p in ps[2:]], draft=False)
    a.merge(backend, b)
    rest = _decode_greedy(backend, a, MAX_NEW - 3)
    assert [g[:-1] + r for g, r in zip(got_a, rest[:2], strict=True)] == truth[:2]
    assert rest[2] == truth[2][: MAX_NEW - 3]


def test_an_unsupported_layer_type_is_one_line():
    model = family_target("qwen3")
    model.config.layer_types = ["full_attention", "chunked_attention"] * 2  # Llama 4's, say
    model.config.attention_chunk_size = 4
    with pytest.raises(DFlashError, match="layer type chunked_attention is not supported"):
        TorchBackend(wrap(model), None)


@pytest.mark.parametrize("family", ["qwen3_5", "gpt_oss", "gemma4"])
def test_the_scheduler_joins_hybrid_and_sliding_rows_mid_flight(family):
    """Continuous batching on the families whose caches need more than masks: rows join a
    running batch at later steps (prefilled apart, merged through the cache policy), more
    than max_batch wait, rows leave; each row's tokens stay the target's greedy decoding."""
    from dflash_trt.runtime.scheduler import Scheduler

    model = family_target(family)
    drafter = family_drafter(model, block_size=6)
    ps = prompts(6, seed=21, lo=2, hi=30)
    truth = [hf_greedy(model, p, MAX_NEW) for p in ps]
    sched = Scheduler(TorchBackend(wrap(model, drafter), drafter), max_batch=3)
    reqs = [Request(p, MAX_NEW) for p in ps]
    arrivals = {0: reqs[:2], 2: reqs[2:4], 3: reqs[4:]}
    for k in range(200):
        for req in arrivals.get(k, []):
            sched.add(req)
        if sched.idle and k > max(arrivals):
            break
        sched.step()
    assert [r.token_ids for r in reqs] == truth
