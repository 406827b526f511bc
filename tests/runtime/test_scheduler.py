"""The scheduler (step-level continuous batching): rows join and leave a running batch without changing anyone's tokens.

Fidelity is checked for every target family the runtime runs (``FAMILIES``): a new family is
one more entry there, its tiny model built by ``tests.helpers.tiny_target``.
"""

from __future__ import annotations

import pytest
import torch

from dflash_trt.errors import DFlashError
from dflash_trt.plugins import PagedKVCache
from dflash_trt.runtime.backend import TorchBackend, merge_paged, repack_paged
from dflash_trt.runtime.loop import Request, generate
from dflash_trt.runtime.sampling import SamplingParams
from dflash_trt.runtime.scheduler import Refused, Scheduler, draft_len_for_batch_size
from tests.helpers import OracleDrafter, hf_greedy, prompts, tiny_drafter, tiny_drafter_config, tiny_target, wrap

FAMILIES = ["qwen3", "llama"]
MAX_NEW = 20


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    model = tiny_target(request.param)
    drafter = tiny_drafter(model, block_size=6)
    ps = prompts(8, seed=21, lo=2, hi=40)
    truth = [hf_greedy(model, p, MAX_NEW) for p in ps]
    return TorchBackend(wrap(model, drafter), drafter), ps, truth


def run(sched: Scheduler, arrivals: dict[int, list[Request]], limit: int = 400) -> list:
    """Step until idle, adding ``arrivals[k]`` before step k; returns every Step."""
    steps = []
    for k in range(limit):
        for req in arrivals.get(k, []):
            sched.add(req)
        if sched.idle and k > max(arrivals, default=0):
            return steps
        steps.append(sched.step())
    raise AssertionError("the scheduler did not finish")


def test_rows_joining_mid_flight_are_greedy_identical_to_a_lone_run(family):
    backend, ps, truth = family
    reqs = [Request(p, MAX_NEW) for p in ps]
    # Two rows start; others join at later steps (a longer prompt than the running rows' too),
    # more than max_batch wait their turn.
    steps = run(Scheduler(backend, max_batch=4), {0: reqs[:2], 2: reqs[2:4], 3: reqs[4:7], 6: reqs[7:]})
    assert [r.token_ids for r in reqs] == truth
    assert all(r.finish_reason == "length" for r in reqs)
    joins = [s for s in steps if s.admitted and s.batch_size > len(s.admitted)]
    assert joins, "no request joined a running batch"
    assert max(s.batch_size for s in steps) == 4


def test_rows_leaving_or_cancelled_leave_the_others_untouched(family):
    backend, ps, truth = family
    gone = {"flag": False}
    short = Request(ps[1], 5)  # leaves early: its own length
    cancelled = Request(ps[2], MAX_NEW, should_stop=lambda: gone["flag"])
    stopped = Request(ps[3], MAX_NEW, stop_token_ids=frozenset({truth[3][6]}))
    others = [Request(ps[0], MAX_NEW), Request(ps[4], MAX_NEW)]
    sched = Scheduler(backend, max_batch=8)
    for r in (others[0], short, cancelled, stopped, others[1]):
        sched.add(r)
    sched.step()
    sched.step()
    gone["flag"] = True  # the client went away
    run(sched, {})
    assert short.token_ids == truth[1][:5] and short.finish_reason == "length"
    assert cancelled.finish_reason == "cancelled" and cancelled.token_ids == truth[2][: len(cancelled.token_ids)]
    assert len(cancelled.token_ids) < MAX_NEW
    cut = truth[3].index(truth[3][6]) + 1
    assert stopped.token_ids == truth[3][:cut] and stopped.finish_reason == "stop"
    assert [r.token_ids for r in others] == [truth[0], truth[4]]


def test_a_request_cancelled_while_waiting_never_runs(family):
    backend, ps, _ = family
    sched = Scheduler(backend, max_batch=1)
    first, waiting = Request(ps[0], 4), Request(ps[1], 4, should_stop=lambda: True)
    sched.add(first)
    sched.add(waiting)
    run(sched, {})
    assert waiting.finish_reason == "cancelled" and waiting.token_ids == []


def test_a_seeded_row_reproduces_whatever_shares_its_batch(family):
    backend, ps, _ = family
    params = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=7)
    # The schedule changes the draft length with the live batch size: 5 alone, 3 in twos, 1 up
    # to 4 rows, none above. The seeded row must not notice.
    schedule = {1: 5, 2: 3, 4: 1}
    alone = Request(ps[0], MAX_NEW, params)
    run(Scheduler(backend, max_batch=8, draft_len_schedule=schedule), {0: [alone]})
    crowd = Request(ps[0], MAX_NEW, params)
    mates = [
        Request(ps[1], MAX_NEW),
        Request(ps[2], 9, SamplingParams(temperature=1.0)),
        Request(ps[3], MAX_NEW, SamplingParams(temperature=0.7, seed=99)),
        Request(ps[4], 3),
        Request(ps[5], MAX_NEW, SamplingParams(temperature=1.2)),
    ]
    steps = run(
        Scheduler(backend, max_batch=8, draft_len_schedule=schedule),
        {0: mates[:2], 1: [crowd], 2: mates[2:4], 4: mates[4:]},
    )
    assert crowd.token_ids == alone.token_ids
    assert {s.draft_len for s in steps if s.batch_size} >= {0, 1}  # the length did change
    # ... and the same tokens as generate() with that seed, at the drafter's full block.
    assert (
        generate(None, None, [ps[0]], max_new_tokens=MAX_NEW, sampling=params, backend=backend).token_ids[0]
        == alone.token_ids
    )
    # The greedy mate is still the target's greedy decoding.
    assert mates[0].token_ids == hf_greedy(backend.target.model, ps[1], MAX_NEW)


def test_rounds_without_drafting_keep_the_drafter_fed():
    """Above one live row the schedule turns drafting off; when the batch shrinks to one,
    drafting resumes from a drafter cache that took in every commit: an oracle drafter (it
    proposes the target's true continuation from its cache length) is fully accepted again."""
    model = tiny_target("qwen3")
    ps = prompts(3, seed=4, lo=3, hi=20)
    truth = [p + hf_greedy(model, p, MAX_NEW + 8) for p in ps]
    oracle = OracleDrafter(tiny_drafter_config(model, block_size=6), truth).to(model.dtype)
    reqs = [Request(ps[0], MAX_NEW), Request(ps[1], 6), Request(ps[2], 8)]
    steps = run(Scheduler(TorchBackend(wrap(model, oracle), oracle), max_batch=4, draft_len_schedule={1: 5}), {0: reqs})
    crowded, alone = [s for s in steps if s.batch_size > 1], [s for s in steps if s.batch_size == 1]
    assert crowded and all(s.draft_len == 0 and s.stats.committed == s.batch_size for s in crowded)
    assert alone and all(s.draft_len == 5 for s in alone)
    assert [r.token_ids for r in reqs] == [t[len(p) :][:n] for p, t, n in zip(ps, truth, (MAX_NEW, 6, 8), strict=True)]
    assert all(s.stats.committed == 6 for s in alone[:-1])  # every draft accepted


def test_draft_len_is_tensorrt_llms_lookup():
    schedule = {4: 4, 8: 2, 32: 1}  # the example in get_draft_len_for_batch_size
    got = {b: draft_len_for_batch_size(schedule, b, 7) for b in (1, 4, 5, 8, 9, 32, 33, 200)}
    assert got == {1: 4, 4: 4, 5: 2, 8: 2, 9: 1, 32: 1, 33: 0, 200: 0}
    assert draft_len_for_batch_size(None, 500, 7) == 7
    assert draft_len_for_batch_size({16: 7}, 16, 7) == 7 and draft_len_for_batch_size({16: 7}, 17, 7) == 0


def test_admission_is_first_come_first_served_within_max_batch(family):
    backend, ps, _ = family
    reqs = [Request(p, 3) for p in ps[:5]]
    steps = run(Scheduler(backend, max_batch=2), {0: reqs})
    admitted = [r for s in steps for r in s.admitted]
    assert admitted == reqs and max(s.batch_size for s in steps) == 2


def test_the_scheduler_refuses_what_it_cannot_run(family):
    backend, ps, _ = family
    with pytest.raises(DFlashError, match="block size 8"):
        Scheduler(backend, block_size=8)
    with pytest.raises(DFlashError, match="the prompt is empty"):
        Scheduler(backend).add(Request([], 3))


def test_admission_is_one_check_with_one_message(family):
    """The context limit is the scheduler's to check (``check``, asked by ``add`` and by the server
    before queueing): a refused request is not queued; one at the limit is admitted."""
    backend, ps, _ = family
    sched = Scheduler(backend, context_len=12)
    with pytest.raises(Refused, match="the prompt has 12 tokens; this model's context is 12 tokens") as e:
        sched.add(Request(list(range(3, 15)), 1))
    assert (e.value.param, e.value.context) == ("prompt", True)
    with pytest.raises(Refused, match=r"prompt \(8 tokens\) \+ max_tokens \(5\) exceeds") as e:
        sched.check(list(range(3, 11)), 5)
    assert (e.value.param, e.value.context) == ("max_new_tokens", True)
    assert sched.idle
    sched.add(Request(list(range(3, 11)), 4))  # 8 + 4 = 12: exactly the context
    assert len(sched.waiting) == 1
    Scheduler(backend).check(list(range(3, 500)), 500)  # no context given: the backend's bound only


def test_paged_caches_merge_and_repack_without_moving_a_row():
    """Two drafter caches merged, then rows leaving and the pool repacked: every remaining
    row reads back exactly its own context."""
    torch.manual_seed(0)

    def filled(lengths):
        c = PagedKVCache(num_layers=2, batch=len(lengths), num_kv_heads=2, head_dim=4, page_size=4, pages=2)
        n = torch.tensor(lengths)
        c.reserve(n)
        page, off = c.slots(n, max(lengths))
        for i, L in enumerate(lengths):
            c.k[:, page[i, :L], off[i, :L]] = torch.randn(2, L, 2, 4)
            c.v[:, page[i, :L], off[i, :L]] = torch.randn(2, L, 2, 4)
        c.lengths = n
        return c

    a, b = filled([5, 9]), filled([13, 2, 7])
    want = [a.gather(0)[0][i, :L] for i, L in enumerate([5, 9])] + [
        b.gather(0)[0][i, :L] for i, L in enumerate([13, 2, 7])
    ]
    merged = merge_paged(a, b)
    got = merged.gather(0)[0]
    for i, L in enumerate([5, 9, 13, 2, 7]):
        assert torch.equal(got[i, :L], want[i])
    before = merged.used_pages
    merged.select(torch.tensor([3]))
    repack_paged(merged)
    assert merged.used_pages < before
    assert torch.equal(merged.gather(0)[0][0, :2], want[3])


class _OracleBackend(TorchBackend):
    """The torch backend over an oracle drafter whose rows are numbered in admission order, so
    the numbers follow the rows through joins (merge_rows) and leaves (the oracle's select)."""

    def __init__(self, target, oracle):
        super().__init__(target, oracle)
        self.next_row = 0

    def new_caches(self, batch, draft):
        cache, dcache = super().new_caches(batch, draft)
        if dcache is not None:
            dcache.row_ids = torch.arange(self.next_row, self.next_row + batch)
            self.next_row += batch
        return cache, dcache

    def merge_rows(self, target_a, draft_a, target_b, draft_b):
        ids = torch.cat([draft_a.row_ids, draft_b.row_ids])
        target, draft = super().merge_rows(target_a, draft_a, target_b, draft_b)
        draft.row_ids = ids
        return target, draft


def test_joined_rows_keep_drafting_from_the_right_context():
    """An oracle drafter (the target's true continuation, read at its cache length) stays fully
    accepted through joins and leaves: every merged drafter cache kept each row's length."""
    model = tiny_target("llama")
    ps = prompts(5, seed=8, lo=3, hi=30)
    truth = [p + hf_greedy(model, p, MAX_NEW + 8) for p in ps]  # admitted in this order below
    oracle = OracleDrafter(tiny_drafter_config(model, block_size=6), truth).to(model.dtype)
    reqs = [Request(p, MAX_NEW if i != 1 else 7) for i, p in enumerate(ps)]
    steps = run(
        Scheduler(_OracleBackend(wrap(model, oracle), oracle), max_batch=8), {0: reqs[:2], 1: reqs[2:3], 3: reqs[3:]}
    )
    assert [r.token_ids for r in reqs] == [
        t[len(p) :][: r.max_new_tokens] for p, t, r in zip(ps, truth, reqs, strict=True)
    ]
    assert any(s.admitted and s.batch_size > len(s.admitted) for s in steps)  # rows did join
    # Every round of every row accepted its whole block (6 tokens) but for each row's last.
    rounds = sum(s.stats.rounds for s in steps)
    assert rounds == sum(-(-(len(r.token_ids) - 1) // 6) for r in reqs)
