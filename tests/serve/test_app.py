"""The embedded OpenAI-compatible server on a tiny bundle, over real sockets."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import threading
import time

import httpx
import pytest
import torch

from dflash_trt.cli import run
from dflash_trt.errors import DFlashError
from dflash_trt.runtime.backend import TorchBackend
from dflash_trt.runtime.loop import generate
from dflash_trt.runtime.pair import Pair, load_bundle
from dflash_trt.serve.app import ServerThread, create_app
from dflash_trt.serve.batcher import Batcher, Job
from tests.helpers import OracleDrafter, hf_greedy
from tests.serve.helpers import served

EOS = 2


@pytest.fixture(scope="module")
def pair(bundle_dir):
    return load_bundle(bundle_dir, dtype="float64")  # float64: batched and single argmax cannot tie-flip


@pytest.fixture(scope="module")
def server(pair):
    app = create_app(pair, "tiny", max_batch=8, max_queue=64)
    with ServerThread(app) as srv:
        srv.app = app
        yield srv


def expected(pair, prompt: str, n: int) -> list[int]:
    """The target's own greedy continuation (transformers generate), cut after eos like the server."""
    want = hf_greedy(pair.target.model, pair.encode(prompt), n)
    return want[: want.index(EOS) + 1] if EOS in want else want


def metric(text: str, name: str, **labels) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        base, _, lab = key.partition("{")
        if base == name and lab.rstrip("}") == want:
            return float(value)
    raise KeyError(f"{name}{{{want}}} not in /metrics")


def sse(lines) -> list:
    out = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_concurrent_greedy_completions_equal_the_targets_own_greedy_decoding(server, pair):
    prompts = [f"{i}: def f{i}(x" + "abcdefgh"[: i % 8] for i in range(32)]
    n = 12
    want = {p: expected(pair, p, n) for p in prompts}
    before = httpx.get(f"{server.url}/metrics").text

    async def go():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:

            async def one(i, p):
                if i % 2:  # half of the clients stream
                    async with c.stream(
                        "POST",
                        "/v1/completions",
                        json={
                            "model": "tiny",
                            "prompt": p,
                            "max_tokens": n,
                            "temperature": 0,
                            "stream": True,
                            "stream_options": {"include_usage": True},
                        },
                    ) as r:
                        events = sse([line async for line in r.aiter_lines()])
                        text = "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"])
                        return r.status_code, text, events[-2]["usage"]["completion_tokens"]
                r = await c.post(
                    "/v1/completions", json={"model": "tiny", "prompt": p, "max_tokens": n, "temperature": 0}
                )
                body = r.json()
                return r.status_code, body["choices"][0]["text"], body["usage"]["completion_tokens"]

            return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))

    results = asyncio.run(go())
    for p, (status, text, count) in zip(prompts, results, strict=True):
        assert status == 200
        assert count == len(want[p]), p
        assert text == pair.decode(want[p]), p
    after = httpx.get(f"{server.url}/metrics").text
    # The 32 requests really went through the batch > 1 path: rounds ran 4+ live rows on average.
    rounds = metric(after, "dflash_batch_size_count") - metric(before, "dflash_batch_size_count")
    rows = metric(after, "dflash_batch_size_sum") - metric(before, "dflash_batch_size_sum")
    singles = metric(after, "dflash_batch_size_bucket", le="1.0") - metric(before, "dflash_batch_size_bucket", le="1.0")
    assert rows / rounds >= 4 and singles < rounds / 4
    ok = "dflash_requests_total"
    assert metric(after, ok, status="200") - metric(before, ok, status="200") == 32


def test_streaming_matches_non_streaming_for_completions_and_chat(server):
    c = httpx.Client(base_url=server.url, timeout=60)
    body = {"model": "tiny", "prompt": "stream me", "max_tokens": 10, "temperature": 0}
    full = c.post("/v1/completions", json=body).json()
    with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse(r.iter_lines())
    assert events[-1] == "[DONE]"
    assert all(e["object"] == "text_completion" for e in events[:-1])
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == full["choices"][0]["text"]
    assert events[-2]["choices"][0]["finish_reason"] == full["choices"][0]["finish_reason"]
    assert len(events) > 3  # tokens arrive as they are committed, not in one piece

    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    chat = c.post(
        "/v1/chat/completions", json={"model": "tiny", "messages": msgs, "max_tokens": 8, "temperature": 0}
    ).json()
    assert chat["object"] == "chat.completion" and chat["choices"][0]["message"]["role"] == "assistant"
    # The prompt went through the tokenizer's chat template.
    assert chat["usage"]["prompt_tokens"] == len("<system>be brief\n<user>hi there\n<assistant>")
    with c.stream(
        "POST",
        "/v1/chat/completions",
        json={
            "model": "tiny",
            "messages": msgs,
            "max_tokens": 8,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ) as r:
        events = sse(r.iter_lines())
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    content = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e["choices"])
    assert content == chat["choices"][0]["message"]["content"]
    assert events[-2]["usage"] == chat["usage"] and events[-1] == "[DONE]"


@pytest.mark.parametrize(
    "kwargs, status, param, code",
    [
        (dict(content=b'{"prompt": "x", ', headers={"content-type": "application/json"}), 400, None, None),
        (dict(json={"model": "nope", "prompt": "x"}), 404, "model", "model_not_found"),
        (dict(json={"model": "tiny", "prompt": "x" * 600, "max_tokens": 4}), 400, "prompt", "context_length_exceeded"),
        (
            dict(json={"model": "tiny", "prompt": "x" * 500, "max_tokens": 20}),
            400,
            "max_tokens",
            "context_length_exceeded",
        ),
        (dict(json={"model": "tiny", "prompt": "x", "max_tokens": -3}), 400, "max_tokens", None),
        (dict(json={"model": "tiny", "prompt": "x", "temperature": -1}), 400, "temperature", None),
        (dict(json={"model": "tiny"}), 400, "prompt", None),
        (dict(json={"model": "tiny", "prompt": [5, 999999]}), 400, "prompt", None),
    ],
)
def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(server, kwargs, status, param, code):
    c = httpx.Client(base_url=server.url, timeout=60)
    r = c.post("/v1/completions", **kwargs)
    assert r.status_code == status
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param and err["code"] == code
    ok = c.post("/v1/completions", json={"model": "tiny", "prompt": "still here", "max_tokens": 3, "temperature": 0})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3


class ProfiledBackend(TorchBackend):
    """A torch backend with a graph backend's kind of request check (``Backend.check_request``)."""

    def check_request(self, prompts, max_new_tokens, block_size):
        if max_new_tokens > 6:
            raise DFlashError(f"max_new_tokens {max_new_tokens} is past this engine profile's 6")


def test_the_backends_refusal_is_the_admission_check_a_400(pair):
    """A request the backend cannot run is refused at admission, before it is queued: a 400 error
    object with the backend's one line (not a failed generation), and the server keeps serving."""
    profiled = dataclasses.replace(pair, backend=ProfiledBackend(pair.target, pair.drafter))
    with ServerThread(create_app(profiled, "tiny", max_batch=2)) as srv:
        c = httpx.Client(base_url=srv.url, timeout=60)
        r = c.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 7})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["message"] == "max_new_tokens 7 is past this engine profile's 6" and err["code"] is None
        assert metric(c.get("/metrics").text, "dflash_request_failures_total", stage="admit") == 0  # never queued
        ok = c.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 6, "temperature": 0})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 6


def test_models_and_health(server):
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    models = httpx.get(f"{server.url}/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny"]


def test_full_queue_answers_429_then_serves_the_next_request(pair):
    app = create_app(pair, "tiny", max_batch=1, max_queue=1)
    with ServerThread(app) as srv:
        batcher: Batcher = app.state.batcher
        batcher.pause()
        body = {"model": "tiny", "prompt": "queued", "max_tokens": 4, "temperature": 0}
        first: dict = {}
        t = threading.Thread(
            target=lambda: first.update(r=httpx.post(f"{srv.url}/v1/completions", json=body, timeout=60))
        )
        t.start()
        deadline = time.time() + 30
        while batcher.queue_depth < 1:
            assert time.time() < deadline
            time.sleep(0.01)
        full = httpx.post(f"{srv.url}/v1/completions", json=body, timeout=60)
        assert full.status_code == 429
        assert full.json()["error"]["type"] == "rate_limit_error"
        batcher.resume()
        t.join(60)
        assert first["r"].status_code == 200
        nxt = httpx.post(f"{srv.url}/v1/completions", json=body, timeout=60)
        assert nxt.status_code == 200 and nxt.json()["choices"][0]["text"] == first["r"].json()["choices"][0]["text"]
        m = httpx.get(f"{srv.url}/metrics").text
        assert metric(m, "dflash_requests_total", status="429") == 1
        assert metric(m, "dflash_requests_total", status="200") == 2


def test_metrics_report_the_runtimes_acceptance(pair):
    # A drafter that proposes the target's true continuation, corrupted at position 3 every
    # other round: partial acceptance, so τ and the per-position rates are non-trivial.
    prompt, n = "acceptance", 24
    ids = pair.encode(prompt)
    truth = [ids + hf_greedy(pair.target.model, ids, n + 16)]
    wrong = lambda rnd, row: 3 if rnd % 2 else None  # noqa: E731
    cfg = pair.drafter.cfg
    oracle = Pair(
        pair.target, OracleDrafter(cfg, truth, wrong).to(torch.float64), pair.tokenizer, pair.stop_token_ids, "tiny"
    )
    ref = generate(
        pair.target,
        OracleDrafter(cfg, truth, wrong).to(torch.float64),
        [ids],
        max_new_tokens=n,
        stop_token_ids=pair.stop_token_ids,
    ).stats
    assert 1 < ref.acceptance_length < cfg.block_size

    app = create_app(oracle, "tiny", max_batch=1)
    with ServerThread(app) as srv:
        r = httpx.post(
            f"{srv.url}/v1/completions",
            json={"model": "tiny", "prompt": prompt, "max_tokens": n, "temperature": 0},
            timeout=60,
        ).json()
        m = httpx.get(f"{srv.url}/metrics").text
    assert r["dflash"]["acceptance_length"] == pytest.approx(ref.acceptance_length, abs=1e-4)
    assert metric(m, "dflash_acceptance_length") == pytest.approx(ref.acceptance_length)
    assert metric(m, "dflash_spec_rounds_total") == ref.rounds
    for k, rate in enumerate(ref.per_position_acceptance, 1):
        assert metric(m, "dflash_per_position_acceptance", position=k) == pytest.approx(rate)
    assert metric(m, "dflash_generation_tokens_total") == n
    assert metric(m, "dflash_tokens_per_second") > 0
    assert metric(m, "dflash_queue_depth") == 0


@pytest.fixture
def held_until_hang_up(monkeypatch):
    """The 500-token job's worker waits once, after its first commit, until the server cancels it
    (30 s at most): however fast the runtime, the job cannot finish before the hang-up is noticed.
    Without the gate the tests raced the clock (a fast CI machine generated all 500 tokens inside
    the non-streaming poll's 0.5 s). Returns the jobs a cancel released."""
    held: set[int] = set()
    released: list[Job] = []
    commit = Job.committed

    def committed(self, new, metrics=None):
        commit(self, new, metrics)
        if self.max_tokens == 500 and self.id not in held:
            held.add(self.id)
            if self._cancel.wait(30):
                released.append(self)

    monkeypatch.setattr(Job, "committed", committed)
    return released


def _assert_the_hang_up_freed_the_slot(srv, released):
    """After a client hung up on a 500-token request (max_batch 1): the server counts a 499, serves
    the next request, and retired the row at the runtime's next round instead of generating all
    500 tokens."""
    deadline = time.time() + 30
    while metric(httpx.get(f"{srv.url}/metrics").text, "dflash_requests_total", status="499") < 1:
        assert time.time() < deadline
        time.sleep(0.05)
    ok = httpx.post(
        f"{srv.url}/v1/completions",
        json={"model": "tiny", "prompt": "next", "max_tokens": 3, "temperature": 0},
        timeout=60,
    )
    assert ok.status_code == 200
    assert len(released) == 1 and released[0].finish_reason == "cancelled"
    assert len(released[0].tokens) < 10
    # the cancelled row's rounds and the next request's (3 tokens: 3 rounds at most)
    assert metric(httpx.get(f"{srv.url}/metrics").text, "dflash_spec_rounds_total") <= released[0].rounds + 3
    assert released[0].rounds <= 2


def test_a_client_that_disconnects_mid_stream_frees_its_slot(pair, held_until_hang_up):
    app = create_app(pair, "tiny", max_batch=1)
    with ServerThread(app) as srv:
        body = {
            "model": "tiny",
            "prompt": "go",
            "max_tokens": 500,
            "temperature": 0,
            "stream": True,
            "ignore_eos": True,
        }
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            with c.stream("POST", "/v1/completions", json=body) as r:
                next(r.iter_lines())  # the first token arrived; now hang up
        _assert_the_hang_up_freed_the_slot(srv, held_until_hang_up)


def test_a_client_that_hangs_up_on_a_full_response_frees_its_slot(pair, held_until_hang_up):
    """Non-streaming: nothing is sent until the end, so the server polls for the disconnect while
    it waits (``respond_full``) and cancels the job."""
    app = create_app(pair, "tiny", max_batch=1)
    with ServerThread(app) as srv:
        body = {"model": "tiny", "prompt": "go", "max_tokens": 500, "temperature": 0, "ignore_eos": True}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{srv.url}/v1/completions", json=body, timeout=httpx.Timeout(60, read=0.3))
        _assert_the_hang_up_freed_the_slot(srv, held_until_hang_up)


def test_sigterm_drains_in_flight_requests_and_exits_0(bundle_dir):
    with served(bundle_dir, "--max-batch", "2") as (proc, url):
        deadline = time.time() + 120
        results: list = [None] * 4

        def send(i):
            results[i] = httpx.post(
                f"{url}/v1/completions",
                json={"prompt": f"drain {i}", "max_tokens": 200, "temperature": 0, "ignore_eos": True},
                timeout=120,
            )

        threads = [threading.Thread(target=send, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        while True:  # all four admitted (two running, two waiting) before the signal
            m = httpx.get(f"{url}/metrics", timeout=5).text
            if metric(m, "dflash_queue_depth") + metric(m, "dflash_running_requests") == 4:
                break
            assert time.time() < deadline
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(120)
        code = proc.wait(120)
        log = proc.stdout.read().decode(errors="replace")
        assert code == 0, log
        assert all(r is not None for r in results), log
        for r in results:
            assert r is not None and r.status_code == 200
            assert r.json()["usage"]["completion_tokens"] == 200
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{url}/health", timeout=2)


def test_a_model_too_large_for_the_cpu_is_refused(bundle_dir, tmp_path, capsys):
    import shutil

    big = tmp_path / "big"
    for sub in ("target", "drafter"):
        (big / sub).mkdir(parents=True)
        shutil.copy(bundle_dir / sub / "config.json", big / sub / "config.json")
    with open(big / "target" / "model-00001-of-00001.safetensors", "wb") as f:
        f.truncate(1 << 42)  # 4 TiB, sparse: nothing is written or read
    assert run(["serve", str(big), "--server", "embedded"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "too large" in err and "trtllm-serve" in err


def test_runtime_callbacks_stream_every_commit_and_cancel_rows(pair):
    prompts = [pair.encode("one"), pair.encode("second prompt")]
    seen: dict[int, list[int]] = {0: [], 1: []}
    stop_row_1 = lambda row: row == 1 and len(seen[1]) >= 3  # noqa: E731
    g = generate(
        pair.target,
        pair.drafter,
        prompts,
        max_new_tokens=15,
        stop_token_ids=(),
        on_commit=lambda row, new: seen[row].extend(new),
        should_stop=stop_row_1,
    )
    assert seen[0] == g.token_ids[0] and seen[1] == g.token_ids[1]
    assert g.finish_reasons == ["length", "cancelled"]
    assert len(g.token_ids[0]) == 15 and 3 <= len(g.token_ids[1]) < 15
    plain = generate(pair.target, pair.drafter, prompts[:1], max_new_tokens=15, stop_token_ids=())
    assert plain.token_ids[0] == g.token_ids[0]  # the cancelled neighbour changed nothing
