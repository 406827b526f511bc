"""A failure inside a shared round fails only the row whose own computation fails (issue 27).

The fault is injected into a real torch backend: its draft, verify or cache commit raises whenever a
row of the forward has reached position ``AT``, which only the one long prompt ever does (a fault
in one row's own data, as a kernel that breaks past some context length). The round it shares with
the others raises; the scheduler drops that batch, rebuilds each row alone from its prompt and its
tokens so far (``loop.readmit``), and reruns the round row by row: the long row's own round raises
again and it alone is failed, every other row goes on token-identical to the target's greedy
decoding (a seeded row: to its run alone), and the freed slot admits a waiting request.
"""

from __future__ import annotations

import pytest

from dflash_trt.runtime.backend import TorchBackend
from dflash_trt.runtime.loop import Request
from dflash_trt.runtime.sampling import SamplingParams
from dflash_trt.runtime.scheduler import Scheduler
from tests.families import family_drafter, family_target
from tests.helpers import VOCAB, hf_greedy, prompts, tiny_drafter, tiny_target, wrap
from tests.runtime.test_scheduler import run

MAX_NEW = 16
LONG = 48  # the faulty row's prompt length; the others' prompts are at most 12 tokens
AT = LONG + 5  # a forward with a row at this position raises: only the long row gets there
SEEDED = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=7)


def inject(monkeypatch, backend, stage: str, at: int = AT) -> list[int]:
    """Make ``backend``'s ``stage`` (draft | verify | commit) raise in any round that has a row at
    position >= ``at`` (prefills never raise); returns the batch sizes of the forwards that raised."""
    hits: list[int] = []

    def fault(reached: int, rows: int) -> None:
        if reached >= at:
            hits.append(rows)
            raise RuntimeError(f"injected {stage} failure")

    if stage == "verify":
        real_verify = backend.target_forward

        def target_forward(ids, positions, attention_mask, cache, capture, logits_at=None):
            if logits_at is None:  # a verify ([n, B] at positions[:, 0] + 0..B-1), not a prefill
                fault(int(positions[:, 0].max()), ids.shape[0])
            return real_verify(ids, positions, attention_mask, cache, capture, logits_at)

        monkeypatch.setattr(backend, "target_forward", target_forward)
    elif stage == "draft":
        real_draft = backend.draft_block

        def draft_block(target_hidden, n_new, anchor, block_size, cache, params, keys, first):
            fault(max(first), len(first))
            return real_draft(target_hidden, n_new, anchor, block_size, cache, params, keys, first)

        monkeypatch.setattr(backend, "draft_block", draft_block)
    elif stage == "commit":
        real_commit = backend.commit_cache

        def commit_cache(target_cache, col_valid, n_new):
            fault(int(col_valid.sum(1).max()), col_valid.shape[0])  # committed columns per row
            return real_commit(target_cache, col_valid, n_new)

        monkeypatch.setattr(backend, "commit_cache", commit_cache)
    else:
        raise ValueError(stage)
    return hits


def check_isolation(backend, model, stage: str, monkeypatch, vocab: int = VOCAB) -> None:
    """Four rows (greedy and seeded) share rounds with the long row until it fails in ``stage``;
    ``model`` is the transformers target ``backend`` runs (the greedy reference)."""
    short = prompts(5, seed=5, lo=3, hi=12, vocab=vocab)
    long = prompts(1, seed=6, lo=LONG, hi=LONG, vocab=vocab)[0]
    truth = [hf_greedy(model, p, MAX_NEW) for p in short[:4]]
    alone = Request(short[0], MAX_NEW, SEEDED)
    run(Scheduler(backend), {0: [alone]})  # the seeded row's tokens alone, no fault yet

    hits = inject(monkeypatch, backend, stage)
    seeded, bad = Request(short[0], MAX_NEW, SEEDED), Request(long, MAX_NEW)
    greedy = [Request(p, MAX_NEW) for p in short[1:4]]
    later = Request(short[4], MAX_NEW)  # waits for a free slot (max_batch 5)
    steps = run(Scheduler(backend, max_batch=5), {0: [greedy[0], bad, seeded, *greedy[1:]], 1: [later]})

    assert bad.finish_reason == "error" and f"injected {stage} failure" in (bad.error or "")
    assert 0 < len(bad.token_ids) < MAX_NEW  # it failed mid-generation, its tokens so far exact
    assert bad.token_ids == hf_greedy(model, long, MAX_NEW)[: len(bad.token_ids)]
    assert hits[0] == 5 and hits[-1] == 1  # the shared round raised, then the long row's own
    failing = [i for i, s in enumerate(steps) if s.failed_rounds]
    assert len(failing) == 1 and steps[failing[0]].failed_rounds == [bad] and bad in steps[failing[0]].finished
    assert [r.token_ids for r in greedy] == truth[1:] and all(r.finish_reason == "length" for r in greedy)
    assert seeded.token_ids == alone.token_ids and seeded.finish_reason == "length"
    admitted_at = next(i for i, s in enumerate(steps) if later in s.admitted)
    assert admitted_at > failing[0]  # the failed row's slot admitted the waiting request
    assert later.token_ids == hf_greedy(model, short[4], MAX_NEW)


@pytest.fixture(scope="module")
def qwen3():
    model = tiny_target("qwen3")
    return model, tiny_drafter(model, block_size=6)


def test_a_row_failing_in_a_shared_verify_fails_alone(qwen3, monkeypatch):
    model, drafter = qwen3
    check_isolation(TorchBackend(wrap(model, drafter), drafter), model, "verify", monkeypatch)


def test_a_prefill_that_raised_after_first_tokens_rebuilds_those_rows(qwen3):
    """The joint prefill raises once its second row has taken its first token (handing it on failed
    once): the retry rebuilds the two rows that took one (never drawing a first token twice) and
    prefills the third; all three are the target's greedy decoding."""
    model, drafter = qwen3
    ps = prompts(3, seed=9, lo=3, hi=12)
    calls = []

    def hiccup(new):
        calls.append(new)
        if len(calls) == 1:
            raise RuntimeError("injected hand-on failure")

    reqs = [Request(ps[0], MAX_NEW), Request(ps[1], MAX_NEW, on_commit=hiccup), Request(ps[2], MAX_NEW)]
    steps = run(Scheduler(TorchBackend(wrap(model, drafter), drafter)), {0: reqs})
    assert not steps[0].failed and len(steps[0].admitted) == 3
    assert [r.token_ids for r in reqs] == [hf_greedy(model, p, MAX_NEW) for p in ps]
    assert sum(calls, []) == reqs[1].token_ids  # every token handed on once, the first included


@pytest.mark.slow  # every stage on a dense, a hybrid (recurrent) and a sliding-window target
@pytest.mark.parametrize("stage", ["draft", "verify", "commit"])
@pytest.mark.parametrize("family", ["llama", "qwen3_next", "gemma4"])
def test_a_row_failing_in_a_shared_round_fails_alone(family, stage, monkeypatch):
    model = family_target(family)
    drafter = family_drafter(model, block_size=6)
    check_isolation(TorchBackend(wrap(model, drafter), drafter), model, stage, monkeypatch)
