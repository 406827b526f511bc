"""How load is offered to a server: closed loop at a concurrency, or open loop at a request rate.

- **Closed loop** (``concurrency``): at most ``c`` requests in flight; the next starts when one
  ends (``vllm bench serve --max-concurrency``, with an infinite request rate).
- **Open loop** (``request_rate``): requests are sent at times drawn independently of how fast
  the server answers (:func:`arrivals`): gaps from a gamma distribution with shape
  ``burstiness`` and mean ``1 / rate``, as ``vllm bench serve`` draws them (burstiness 1 is a
  Poisson process; below 1 burstier, above 1 steadier; ``inf``: a fixed rate, every gap
  ``1 / rate``). A server slower than the rate falls behind: the achieved rate and the
  latencies say so.

A level ends after ``requests`` requests or, with ``duration``, after the requests sent within
that many seconds (both: whichever comes first). Its repeats send the same arrival pattern
(seeded), each after the previous has finished, so they differ only by the server's noise.

Goodput (``goodput``: limits in ms on ``ttft``, ``tpot``, ``e2el``, DistServe's and vLLM's
``--goodput``): completed requests per second that met every limit
(:func:`dflash_trt.bench.latency.goodput`).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass

from dflash_trt.bench.datasets import Prompt
from dflash_trt.bench.latency import Record
from dflash_trt.errors import DFlashError

GOODPUT_KEYS = ("ttft", "tpot", "e2el")


@dataclass(frozen=True)
class Level:
    """One load level: a concurrency (closed loop) or a request rate (open loop)."""

    concurrency: int | None = None
    request_rate: float | None = None
    burstiness: float = 1.0
    requests: int | None = None
    duration: float | None = None
    seed: int = 0

    @property
    def label(self) -> str:
        return f"concurrency {self.concurrency}" if self.concurrency else f"rate {self.request_rate:g}/s"


def arrivals(
    rate: float, burstiness: float = 1.0, *, n: int | None = None, duration: float | None = None, seed: int = 0
) -> list[float]:
    """Send times in seconds from the start: the first at 0, then gaps ~ Gamma(shape=burstiness,
    scale=1/(rate x burstiness)) (mean 1/rate); ``burstiness`` inf: every gap 1/rate. Ends after
    ``n`` sends or past ``duration`` seconds, whichever first (at least one bound)."""
    if not rate > 0 or not burstiness > 0:
        raise DFlashError("--request-rate and --burstiness must be positive")
    if n is None and duration is None:
        raise DFlashError("an open-loop level needs --requests or --duration")
    rng = random.Random(seed)
    out: list[float] = []
    t = 0.0
    while (n is None or len(out) < n) and (duration is None or t <= duration):
        out.append(t)
        if math.isinf(rate):
            continue
        t += 1 / rate if math.isinf(burstiness) else rng.gammavariate(burstiness, 1 / (rate * burstiness))
    return out


def parse_goodput(text: str | None) -> dict[str, float] | None:
    """``"ttft:500,tpot:50"`` (milliseconds) as ``{"ttft": 500.0, "tpot": 50.0}``."""
    if not text:
        return None
    out = {}
    for part in text.split(","):
        key, _, value = part.strip().partition(":")
        try:
            ms = float(value)
        except ValueError:
            ms = -1.0
        if key not in GOODPUT_KEYS or not ms > 0 or math.isinf(ms):
            raise DFlashError(
                f"--goodput {text!r}: expected KEY:MS pairs with KEY one of "
                f"{', '.join(GOODPUT_KEYS)}, e.g. ttft:500,tpot:50"
            )
        out[key] = ms
    return out


async def closed_loop(
    send, prompts: list[Prompt], concurrency: int, n: int | None, duration: float | None, offset: int
) -> tuple[list[Record], float]:
    """``concurrency`` workers, each sending the next prompt when its last one ended, until ``n``
    were sent or ``duration`` passed. ``send(prompt, t0)`` returns a Record."""
    t0 = time.perf_counter()
    records: list[Record] = []
    counter = iter(range(n if n is not None else 1 << 62))

    async def worker() -> None:
        for i in counter:
            if duration is not None and time.perf_counter() - t0 > duration:
                return
            records.append(await send(prompts[(offset + i) % len(prompts)], t0))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return sorted(records, key=lambda r: r.start), time.perf_counter() - t0


async def open_loop(send, prompts: list[Prompt], times: list[float], offset: int) -> tuple[list[Record], float]:
    """One request at each of ``times`` (seconds from now), however the server keeps up."""
    t0 = time.perf_counter()

    async def one(i: int, at: float) -> Record:
        await asyncio.sleep(max(0.0, at - (time.perf_counter() - t0)))
        return await send(prompts[(offset + i) % len(prompts)], t0)

    records = await asyncio.gather(*(one(i, at) for i, at in enumerate(times)))
    return list(records), time.perf_counter() - t0


async def one_pass(send, prompts: list[Prompt], level: Level, n: int | None, offset: int) -> tuple[list[Record], float]:
    """One repeat of ``level``: closed loop at its concurrency, or open loop at its rate."""
    if level.concurrency:
        return await closed_loop(send, prompts, level.concurrency, n, level.duration, offset)
    times = arrivals(level.request_rate or math.inf, level.burstiness, n=n, duration=level.duration, seed=level.seed)
    return await open_loop(send, prompts, times, offset)
