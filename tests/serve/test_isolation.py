"""Failure isolation in the embedded server (issue 27): a failure injected for ONE request while it
is admitted (its prefill), streamed (its tokens handed on) or stepped (the backend's verify raising
for its row inside a round it shares) fails that request with an OpenAI error object, frees its
slot, leaves every other request's greedy output exactly the target's own (a seeded one's, its
output alone), and is counted in ``dflash_request_failures_total{stage}``. A request whose sampling
values used to break the draw (a tiny temperature) runs beside the others. A drain that runs out
of time fails what is left instead of waiting forever."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from dflash_trt.runtime import scheduler as engine_mod
from dflash_trt.runtime.pair import load_bundle
from dflash_trt.serve.app import ServerThread, create_app
from dflash_trt.serve.batcher import Job
from tests.helpers import prompts
from tests.runtime.test_isolation import LONG, inject
from tests.serve.test_app import expected, metric

MARK = 77  # the injected failure hits the request whose prompt starts with this token id
PROMPTS = ["def add(a, b):", "import os\n", "class Point:"]


@pytest.fixture(scope="module")
def pair(bundle_dir):
    return load_bundle(bundle_dir, dtype="float64")


def _serving(pair):
    app = create_app(pair, "tiny", max_batch=8, max_queue=16)
    with ServerThread(app) as srv:
        srv.app = app
        yield srv


@pytest.fixture
def server(pair):
    yield from _serving(pair)


def _together(srv, bodies: list[dict]) -> list[httpx.Response]:
    """Send ``bodies`` while the worker is paused, then let them in: one prefill, one batch."""
    batcher = srv.app.state.batcher
    batcher.pause()
    out: list = [None] * len(bodies)

    def send(i):
        out[i] = httpx.post(f"{srv.url}/v1/completions", json=bodies[i], timeout=120)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    deadline = time.time() + 60
    while batcher.queue_depth < len(bodies):
        assert time.time() < deadline
        time.sleep(0.01)
    batcher.resume()
    for t in threads:
        t.join(120)
    return out


def _bodies(n: int = 12) -> list[dict]:
    good = [{"prompt": p, "max_tokens": n, "temperature": 0} for p in PROMPTS]
    return good + [{"prompt": [MARK, 5, 6, 7], "max_tokens": n, "temperature": 0}]


def _check(srv, pair, replies, stage: str, n: int = 12) -> None:
    *good, bad = replies
    assert bad.status_code == 500, bad.text
    err = bad.json()["error"]
    assert err["type"] == "server_error" and stage in err["message"]
    for p, r in zip(PROMPTS, good, strict=True):
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == pair.decode(expected(pair, p, n))
    m = httpx.get(f"{srv.url}/metrics").text
    assert metric(m, "dflash_request_failures_total", stage=stage) == 1
    assert metric(m, "dflash_running_requests") == 0 and metric(m, "dflash_queue_depth") == 0
    after = httpx.post(f"{srv.url}/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0})
    assert after.status_code == 200  # the slot was freed, the worker goes on


def test_a_failing_prefill_fails_only_its_request(server, pair, monkeypatch, caplog):
    """...and its traceback is logged (the client gets one line; the operator the whole story),
    never the prompt's text."""
    real = engine_mod.admit

    def admit(backend, rows, draft, stats):
        if any(r.prompt[0] == MARK for r in rows):
            raise RuntimeError("injected prefill failure")
        return real(backend, rows, draft, stats)

    monkeypatch.setattr(engine_mod, "admit", admit)
    with caplog.at_level("ERROR", logger="dflash_trt"):
        _check(server, pair, _together(server, _bodies()), "admit")
    failed = [r for r in caplog.records if r.exc_info and "injected prefill failure" in str(r.exc_info[1])]
    assert failed and failed[0].name == "dflash_trt.runtime.scheduler", caplog.records
    assert all(p not in r.getMessage() for r in caplog.records for p in PROMPTS)


def test_a_failing_stream_fails_only_its_request(server, pair, monkeypatch):
    srv = server
    real = Job.committed

    def committed(self, new, metrics=None):
        if self.prompt[0] == MARK and self.tokens:  # its second commit: mid-generation
            raise RuntimeError("injected streaming failure")
        return real(self, new, metrics)

    monkeypatch.setattr(Job, "committed", committed)
    _check(srv, pair, _together(srv, _bodies()), "stream")


def test_a_failing_round_fails_only_its_row(server, pair, monkeypatch):
    """The backend's verify raises for one row (its long prompt's positions) in the round it shares with
    the others: that request alone gets the error, the greedy ones their greedy text, a seeded one the
    text it gets alone."""
    seeded = {"prompt": "x = 1", "max_tokens": 12, "temperature": 0.9, "seed": 7}
    alone = httpx.post(f"{server.url}/v1/completions", json=seeded, timeout=120)
    hits = inject(monkeypatch, pair.backend, "verify")
    long = [MARK] + prompts(1, seed=6, lo=LONG - 1, hi=LONG - 1)[0]
    *good, bad = _bodies()
    *replies, mate = _together(server, [*good, {**bad, "prompt": long}, seeded])
    assert hits[0] == 5 and hits[-1] == 1  # the shared round raised, then the long row's own
    assert mate.status_code == 200 and mate.json()["choices"][0]["text"] == alone.json()["choices"][0]["text"]
    _check(server, pair, replies, "step")
    assert "injected verify failure" in replies[-1].json()["error"]["message"]
    assert metric(httpx.get(f"{server.url}/metrics").text, "dflash_isolated_rounds_total") >= 1  # operators see it


def test_a_tiny_temperature_runs_beside_greedy_requests(server, pair):
    """Before: the draw of a temperature-1e-300 row failed in its prefill, every row beside it got a 500,
    it kept its slot and the worker spun."""
    bodies = [{"prompt": p, "max_tokens": 12, "temperature": 0} for p in PROMPTS]
    bodies.append({"prompt": "x = 1", "max_tokens": 12, "temperature": 1e-300, "top_p": 1e-300})
    replies = _together(server, bodies)
    assert [r.status_code for r in replies] == [200] * 4, [r.text for r in replies]
    for p, r in zip(PROMPTS, replies[:3], strict=True):
        assert r.json()["choices"][0]["text"] == pair.decode(expected(pair, p, 12))
    tiny = replies[-1].json()["choices"][0]["text"]
    assert tiny == pair.decode(expected(pair, "x = 1", 12))  # T -> 0 is the greedy limit


def test_a_drain_out_of_time_fails_what_is_left(server):
    out = {}

    def send():
        out["r"] = httpx.post(
            f"{server.url}/v1/completions",
            json={"prompt": "long", "max_tokens": 500, "ignore_eos": True, "temperature": 0},
            timeout=120,
        )

    t = threading.Thread(target=send)
    t.start()
    batcher = server.app.state.batcher
    deadline = time.time() + 30
    while batcher.running == 0:
        assert time.time() < deadline and "r" not in out, out
        time.sleep(0.01)
    server.app.state.drain()
    server.app.state.abandon()
    t.join(60)
    r = out["r"]
    assert r.status_code == 500 and "shutting down" in r.json()["error"]["message"]
    t0 = time.time()
    batcher.stop(timeout=30)
    assert time.time() - t0 < 30 and not batcher._thread.is_alive()


@pytest.mark.slow  # a server subprocess (~20 s); the abandon path is tested in-process above
def test_sigterm_with_a_drain_timeout_stops_in_bounded_time(bundle_dir):
    """serve --drain-timeout 0: SIGTERM fails the running request (an OpenAI error object) and the
    server exits 0 at once instead of waiting for it."""
    import signal

    from tests.serve.helpers import served

    with served(bundle_dir, "--drain-timeout", "0") as (proc, url):
        deadline = time.time() + 120
        out = {}

        def send():
            out["r"] = httpx.post(
                f"{url}/v1/completions",
                json={"prompt": "drain", "max_tokens": 500, "ignore_eos": True, "temperature": 0},
                timeout=120,
            )

        t = threading.Thread(target=send)
        t.start()
        while metric(httpx.get(f"{url}/metrics", timeout=5).text, "dflash_running_requests") < 1:
            assert time.time() < deadline and "r" not in out
            time.sleep(0.02)
        t0 = time.time()
        proc.send_signal(signal.SIGTERM)
        t.join(60)
        code = proc.wait(60)
        log = proc.stdout.read().decode(errors="replace")
        assert code == 0 and time.time() - t0 < 30, log
        r = out["r"]
        assert r.status_code == 500 and "shutting down" in r.json()["error"]["message"], r.text
