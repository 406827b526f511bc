"""Open-loop load: arrival times, goodput, and a run at a request rate against a stand-in that
streams known chunks (its raw records in --json, the summary re-derived from them)."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from dflash_trt.bench import endpoint as loadgen
from dflash_trt.bench import latency as lat
from dflash_trt.bench.latency import Record
from dflash_trt.bench.load import arrivals, parse_goodput
from dflash_trt.cli import run
from dflash_trt.errors import DFlashError
from tests.bench.test_latency import CHUNKS, standin


def _gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def test_poisson_arrivals_have_the_rate_and_burstiness_asked_for():
    poisson = _gaps(arrivals(4.0, 1.0, n=4000, seed=1))
    assert statistics.fmean(poisson) == pytest.approx(0.25, rel=0.05)
    assert statistics.stdev(poisson) / statistics.fmean(poisson) == pytest.approx(1.0, rel=0.08)  # exponential: CV 1
    bursty = _gaps(arrivals(4.0, 0.25, n=4000, seed=1))  # gamma shape 0.25: CV 2
    assert statistics.fmean(bursty) == pytest.approx(0.25, rel=0.1)
    assert statistics.stdev(bursty) / statistics.fmean(bursty) == pytest.approx(2.0, rel=0.1)
    assert _gaps(arrivals(5.0, math.inf, n=4)) == pytest.approx([0.2] * 3)  # a fixed rate
    assert arrivals(4.0, n=50, seed=7) == arrivals(4.0, n=50, seed=7) != arrivals(4.0, n=50, seed=8)


def test_a_duration_bounds_the_sends():
    times = arrivals(10.0, math.inf, duration=1.0)
    assert len(times) == 11 and times[-1] <= 1.0
    assert len(arrivals(10.0, math.inf, n=3, duration=1.0)) == 3  # whichever comes first
    with pytest.raises(DFlashError, match="--requests or --duration"):
        arrivals(1.0)


def test_goodput_counts_requests_within_every_limit():
    assert parse_goodput("ttft:500,tpot:50") == {"ttft": 500.0, "tpot": 50.0}
    for bad in ("ttft", "ttft:x", "speed:5", "tpot:-1"):
        with pytest.raises(DFlashError, match="--goodput"):
            parse_goodput(bad)
    fast = Record(ok=True, chunks=[(0.1, 1), (0.2, 10)], e2el=0.2, tokens_from="logprobs")  # TPOT 10 ms
    slow = Record(ok=True, chunks=[(0.9, 1), (1.0, 1)], e2el=1.0, tokens_from="logprobs")  # TTFT 900 ms
    one = Record(ok=True, chunks=[(0.1, 1)], e2el=0.1, tokens_from="logprobs")  # no TPOT
    failed = Record(ok=False)
    g = lat.goodput([fast, slow, one, failed], wall=2.0, limits={"ttft": 500, "tpot": 50})
    assert (g["good_requests"], g["goodput"], g["good_fraction"]) == (2, 1.0, 0.5)


@pytest.fixture(scope="module")
def server():
    from dflash_trt.serve import ServerThread

    with ServerThread(standin("final")) as srv:
        yield srv


def test_an_open_loop_level_reports_the_rate_it_achieved(server):
    r = loadgen.run(
        server.url,
        concurrency=[],
        request_rate=[20.0],
        burstiness=math.inf,
        requests=6,
        repeats=2,
        warmup=1,
        goodput={"ttft": 5000, "e2el": 10000},
        max_tokens=13,
    )
    assert r["endpoint"]["levels"] == []
    (lv,) = r["endpoint"]["rate_levels"]
    assert lv["request_rate"] == 20.0 and lv["ok"] == 12 and lv["output_tokens"] == 12 * sum(CHUNKS)
    assert lv["achieved_request_rate"] == pytest.approx(20.0, rel=0.3)  # sends 50 ms apart, whatever the replies
    assert lv["goodput"]["good_fraction"] == 1.0 and len(lv["spread"]["goodput"]["values"]) == 2


def test_json_keeps_every_request_and_the_summary_is_derived_from_them(server, capsys):
    assert (
        run(
            [
                "bench",
                "--endpoint",
                server.url,
                "--concurrency",
                "2",
                "--request-rate",
                "30",
                "--requests",
                "4",
                "--repeats",
                "2",
                "--warmup",
                "0",
                "--max-tokens",
                "13",
                "--json",
            ]
        )
        == 0
    )
    r = json.loads(capsys.readouterr().out)
    for lv in [*r["endpoint"]["levels"], *r["endpoint"]["rate_levels"]]:
        records = lv["records"]
        assert len(records) == lv["requests"] == 8
        assert all(rec["ok"] and rec["status"] == 200 and len(rec["chunks"]) == len(CHUNKS) for rec in records)
        again = lat.summarize([Record.from_dict(d) for d in records], lv["seconds"])
        for key in (
            "output_tokens",
            "ttft_ms",
            "tpot_ms",
            "itl_ms",
            "itl_per_token_ms",
            "e2el_ms",
            "tokens_per_second_per_user",
            "output_tokens_per_second",
        ):
            assert again[key] == lv[key], key
