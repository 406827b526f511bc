"""``verify --endpoint``'s zero-draft probe: does acceptance recover after a load above the schedule's top?

TensorRT-LLM releases without the draft-length floor (PR #16888, open) stop drafting above the
largest ``draft_len_schedule`` key (or ``max_concurrency``); the drafter's per-request context
rows for those steps are never written, and once the batch shrinks and drafting resumes
acceptance collapses for the rest of every request that lived through it. Output stays
correct and nothing is raised, so only a measurement shows it. The probe:

1. **load phase**: ``SURVIVORS`` long requests (``LONG x max_tokens`` tokens, ``ignore_eos``)
   start first, then enough short ones (``max_tokens``) that ``top + 1`` are in flight, ``top``
   being the schedule's largest key, ``max_concurrency``, or else ``max_batch_size``;
2. **low phase**: when the short ones are done, the survivors decode on alone, at low
   concurrency. τ over that phase (``/metrics`` read when the short ones finish and when the
   survivors do, :mod:`verify_server`) is held to the plan's τ at the draft lengths the server
   ran there (``expected_tau(alpha, L)``): ``τ - 1 < COLLAPSE x (τ_plan - 1)`` fails, naming the
   trap as the likely cause.

A server that keeps drafting (a release with the floor, a schedule that covers max_batch_size,
the embedded server, which feeds the drafter every committed token even at draft length 0)
recovers. Where the server reports no counters, or the survivors finished first, the check is
"not measured".
"""

from __future__ import annotations

import asyncio
from typing import Any

from dflash_trt import plan as planner
from dflash_trt.bench import verify_server
from dflash_trt.bench.stream import Endpoint

SURVIVORS = 2
LONG = 8
COLLAPSE = 0.5


def schedule_top(config: dict) -> int:
    """The largest batch size the config's schedule drafts by: its largest key, ``max_concurrency``,
    or (no schedule) ``max_batch_size``."""
    spec = config.get("speculative_config") or {}
    if spec.get("draft_len_schedule"):
        return max(int(k) for k in spec["draft_len_schedule"])
    if spec.get("max_concurrency"):
        return int(spec["max_concurrency"])
    return int(config.get("max_batch_size") or 8)


async def _phases(
    url: str, model: str | None, prompts: list[str], crowd: int, max_tokens: int
) -> tuple[list[str | None], list[str]]:
    """The three /metrics bodies (before, when the crowd is done, when the survivors are) and the
    errors of the requests that failed. The warm-up (before the first scrape, so outside both
    windows) settles what the server accepts, as ``bench.endpoint.run``'s does: a server that
    refuses per-chunk usage (the embedded one, vLLM's extension) is asked without it."""
    bodies: list[str | None] = []
    ep = Endpoint(url, model, on_scrape=bodies.append)
    try:
        await ep.discover()
        await ep.warm_up(prompts[0], min(8, max_tokens), 0.0, True)
        await ep.scrape()
        long = [
            asyncio.create_task(ep.request(prompts[i % len(prompts)], LONG * max_tokens, 0.0, True))
            for i in range(SURVIVORS)
        ]
        await asyncio.sleep(0.05)  # the survivors are admitted first
        short = [ep.request(prompts[(SURVIVORS + i) % len(prompts)], max_tokens, 0.0, True) for i in range(crowd)]
        records = list(await asyncio.gather(*short))
        await ep.scrape()
        records += await asyncio.gather(*long)
        await ep.scrape()
    finally:
        await ep.close()
    return bodies, [f"{r.status or '-'} {r.error}" for r in records if not r.ok]


def _expected(w: verify_server.Window, plan: planner.Plan) -> float:
    runs = w.draft_rounds or {(SURVIVORS, plan.max_draft_len): 1}
    return sum(n * planner.expected_tau(plan.alpha, L) for (_, L), n in runs.items()) / sum(runs.values())


def probe(
    url: str,
    plan: planner.Plan,
    config: dict,
    *,
    model: str | None = None,
    prompts: list[str],
    max_tokens: int = 32,
    collapsed: bool = False,
) -> dict:
    """The ``trap`` check of ``verify --endpoint`` (module docstring); ``collapsed``: acceptance
    already collapsed at the load levels, so a low τ here could not be told from that."""
    top = schedule_top(config)
    if collapsed:
        return {
            "name": "trap",
            "status": "not measured",
            "details": {"top": top},
            "summary": "acceptance already collapsed at the load levels: the probe cannot tell the zero-draft "
            "trap from that",
        }
    bodies, errors = asyncio.run(_phases(url, model, prompts, top + 1 - SURVIVORS, max_tokens))
    load, low = verify_server.window(bodies[0], bodies[1]), verify_server.window(bodies[1], bodies[2])
    details: dict[str, Any] = {
        "top": top,
        "load_concurrency": top + 1,
        "survivors": SURVIVORS,
        "load_acceptance_length": load.tau,
        "low_acceptance_length": low.tau,
        "load_draft_rounds": {f"{b}:{L}": n for (b, L), n in sorted(load.draft_rounds.items())},
    }
    if errors:
        details["failed_requests"] = {"count": len(errors), "first": errors[0]}
    return _judge(low, plan, top, errors, details)


def _judge(low: verify_server.Window, plan: planner.Plan, top: int, errors: list[str], details: dict) -> dict:
    """The check from the low phase's counters: not measured without them, failed where τ did not
    recover to the plan's (``details`` gains the plan's τ), else passed."""
    if low.tau is None:
        why = (
            f"{len(errors)} of {top + 1} requests failed ({errors[0]})"
            if errors
            else "the server reports none, or the survivors finished first"
        )
        return {
            "name": "trap",
            "status": "not measured",
            "details": details,
            "summary": "no speculative counters for the low-concurrency phase after the load above the "
            f"schedule's top ({top}): {why}",
        }
    expected = _expected(low, plan)
    details["expected_acceptance_length"] = round(expected, 3)
    where = f"after {top + 1} requests in flight (the schedule's top: {top})"
    if low.tau - 1 < COLLAPSE * (expected - 1):
        return {
            "name": "trap",
            "status": "fail",
            "details": details,
            "summary": f"acceptance did not recover {where}: τ {low.tau:.2f} at low concurrency against the "
            f"plan's {expected:.2f}; likely cause: {planner.ZERO_DRAFT_TRAP}: serve a config whose "
            "draft_len_schedule drafts >= 1 up to max_batch_size (dflash-trt build writes one), or a "
            "TensorRT-LLM release with the draft-length floor",
        }
    return {
        "name": "trap",
        "status": "pass",
        "details": details,
        "summary": f"acceptance recovered {where}: τ {low.tau:.2f} at low concurrency against the plan's "
        f"{expected:.2f}",
    }
