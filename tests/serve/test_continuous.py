"""Continuous batching in the embedded server: joins at every round, admission, per-request metrics."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from dflash_trt.cli import run
from dflash_trt.runtime import SamplingParams, generate, load_bundle, load_pair
from dflash_trt.serve.app import ServerThread, create_app
from tests.helpers import hf_greedy
from tests.serve.helpers import make_bundle
from tests.serve.test_app import expected, metric, sse


@pytest.fixture(scope="module")
def pair(bundle_dir):
    return load_bundle(bundle_dir, dtype="float64")


async def _stream(c: httpx.AsyncClient, body: dict, started: asyncio.Event | None = None) -> tuple[str, float]:
    """(text, finish time) of a streamed completion; ``started`` is set at its first chunk."""
    text = ""
    async with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text += json.loads(line[6:])["choices"][0]["text"]
                if started is not None:
                    started.set()
    return text, time.perf_counter()


def test_short_requests_behind_long_ones_join_the_running_batch(pair):
    app = create_app(pair, "tiny", max_batch=8)
    long_body = {"prompt": "long", "max_tokens": 160, "temperature": 0, "ignore_eos": True}
    prompts = [f"short {i}" for i in range(6)]

    async def go(url):
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            started = [asyncio.Event(), asyncio.Event()]
            longs = [asyncio.create_task(_stream(c, long_body, s)) for s in started]
            for s in started:
                await s.wait()  # both long requests are generating
            shorts = await asyncio.gather(
                *(_stream(c, {"prompt": p, "max_tokens": 8, "temperature": 0}) for p in prompts)
            )
            return await asyncio.gather(*longs), shorts

    with ServerThread(app) as srv:
        longs, shorts = asyncio.run(go(srv.url))
    assert max(t for _, t in shorts) < min(t for _, t in longs)  # the short ones did not wait
    for p, (text, _) in zip(prompts, shorts, strict=True):
        assert text == pair.decode(expected(pair, p, 8))
    want_long = pair.decode(hf_greedy(pair.target.model, pair.encode("long"), 160))  # ignore_eos: no cut
    assert longs[0][0] == longs[1][0] == want_long


def test_a_seeded_request_reproduces_whatever_shares_its_batch(pair):
    body = {"prompt": "seeded", "max_tokens": 12, "temperature": 0.8, "top_p": 0.9, "seed": 1234}
    want = pair.decode(
        generate(
            pair.target,
            pair.drafter,
            [pair.encode("seeded")],
            max_new_tokens=12,
            sampling=SamplingParams(temperature=0.8, top_p=0.9, seed=1234),
            stop_token_ids=pair.stop_token_ids,
        ).token_ids[0]
    )
    app = create_app(pair, "tiny", max_batch=8)
    with ServerThread(app) as srv:
        alone = httpx.post(f"{srv.url}/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]

        async def crowd():
            async with httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
                mates = [
                    c.post(
                        "/v1/completions",
                        json={"prompt": f"mate {i}", "max_tokens": 5 + i, "temperature": [0, 1.0, 0.5][i % 3]},
                    )
                    for i in range(6)
                ]
                rs = await asyncio.gather(c.post("/v1/completions", json=body), *mates)
                return rs[0].json()["choices"][0]["text"]

        together = asyncio.run(crowd())
    assert alone == together == want


def test_queue_bound_and_429_but_never_on_an_idle_server(pair):
    app = create_app(pair, "tiny", max_batch=1, max_queue=0)
    with ServerThread(app) as srv:
        body = {"prompt": "idle", "max_tokens": 3, "temperature": 0}
        for _ in range(2):  # no queue at all, yet an idle server serves
            assert httpx.post(f"{srv.url}/v1/completions", json=body, timeout=60).status_code == 200
        batcher = app.state.batcher
        batcher.pause()  # busy: nothing is admitted
        r = httpx.post(f"{srv.url}/v1/completions", json=body, timeout=60)
        assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full"
        batcher.resume()
        assert httpx.post(f"{srv.url}/v1/completions", json=body, timeout=60).status_code == 200


def test_per_request_metrics_queue_time_ttft_itl_and_tau(pair):
    app = create_app(pair, "tiny", max_batch=4)
    with ServerThread(app) as srv:

        async def go():
            async with httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
                await asyncio.gather(
                    *(
                        c.post(
                            "/v1/completions",
                            json={"prompt": f"m{i}", "max_tokens": 10, "temperature": 0, "ignore_eos": True},
                        )
                        for i in range(6)
                    )
                )

        asyncio.run(go())
        m = httpx.get(f"{srv.url}/metrics").text
    for name in (
        "dflash_queue_seconds",
        "dflash_time_to_first_token_seconds",
        "dflash_request_seconds",
        "dflash_request_acceptance_length",
    ):
        assert metric(m, f"{name}_count") == 6, name
    assert metric(m, "dflash_inter_token_seconds_count") == 6 * 9  # 10 tokens: prefill + 9 commits (τ = 1)
    assert metric(m, "dflash_batch_size_sum") / metric(m, "dflash_batch_size_count") > 1
    assert metric(m, "dflash_draft_len") == 7


def test_batch_size_and_draft_schedule_come_from_the_bundles_plan(tmp_path):
    root = make_bundle(tmp_path / "planned")
    (root / "trtllm" / "config.yaml").write_text(
        "max_batch_size: 3\nspeculative_config:\n  decoding_type: DFlash\n  max_draft_len: 7\n"
        "  draft_len_schedule: {1: 7, 2: 3}\n"
    )
    pair = load_bundle(root, dtype="float64")
    assert (pair.max_batch_size, pair.draft_len_schedule) == (3, {1: 7, 2: 3})
    app = create_app(pair, "tiny")
    batcher = app.state.batcher
    assert batcher.max_batch == 3 and batcher.scheduler.schedule == {1: 7, 2: 3}
    assert [batcher.scheduler.draft_len(n) for n in (1, 2, 3)] == [7, 3, 0]
    assert create_app(pair, "tiny", max_batch=5).state.batcher.max_batch == 5  # the flag wins


def test_chat_works_on_the_embedded_tiny_model(capsys):
    pair = load_pair("embedded:tiny/target", "embedded:tiny/drafter", dtype="float32")
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "add two numbers"}]
    text = pair.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    app = create_app(pair, "tiny", max_batch=2)
    with ServerThread(app) as srv:
        r = httpx.post(
            f"{srv.url}/v1/chat/completions", json={"messages": msgs, "max_tokens": 6, "temperature": 0}, timeout=60
        )
        with httpx.stream(
            "POST",
            f"{srv.url}/v1/chat/completions",
            timeout=60,
            json={"messages": msgs, "max_tokens": 6, "temperature": 0, "stream": True},
        ) as s:
            events = sse(s.iter_lines())
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["prompt_tokens"] == len(pair.tokenizer(text, add_special_tokens=False)["input_ids"])
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert (
        "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e["choices"])
        == body["choices"][0]["message"]["content"]
    )
    assert run(["generate", "--chat", "-p", "add two numbers", "-n", "6", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["token_ids"]


def test_a_failing_round_fails_its_requests_not_the_server(pair, monkeypatch):
    app = create_app(pair, "tiny", max_batch=2)
    sched = app.state.batcher.scheduler
    assert sched.backend is pair.backend  # the pair's backend, not one of its own
    real, calls = sched.step, {"n": 0}

    def flaky():
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("boom")
        return real()

    monkeypatch.setattr(sched, "step", flaky)
    with ServerThread(app) as srv:
        bad = httpx.post(
            f"{srv.url}/v1/completions", json={"prompt": "x", "max_tokens": 20, "temperature": 0}, timeout=60
        )
        ok = httpx.post(
            f"{srv.url}/v1/completions", json={"prompt": "y", "max_tokens": 3, "temperature": 0}, timeout=60
        )
    assert bad.status_code == 500 and "boom" in bad.json()["error"]["message"]
    assert ok.status_code == 200


def test_a_dflash2_batch_mixes_unseeded_temperatures(tmp_path):
    """A DFlash2 selector walks each unseeded temperature as its own group: four requests at three
    settings share one continuous batch and are all answered (a batch at more than one setting
    was once refused), the greedy one with the target's own greedy decoding."""
    from tests.helpers import save_pair

    tdir, ddir = save_pair(tmp_path / "pair", dflash2=True)
    pair = load_pair(tdir, ddir, dtype="float64")
    want = pair.decode(expected(pair, "greedy", 10))
    app = create_app(pair, "tiny", max_batch=8)
    bodies = [
        {"prompt": "greedy", "max_tokens": 10, "temperature": 0},
        {"prompt": "hot", "max_tokens": 10, "temperature": 1.0},
        {"prompt": "warm", "max_tokens": 10, "temperature": 0.5, "top_k": 20},
        {"prompt": "hot again", "max_tokens": 10, "temperature": 1.0, "top_p": 0.9},
    ]
    app.state.batcher.pause()  # the four arrive as one batch

    async def ask(url):
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            tasks = [asyncio.create_task(c.post("/v1/completions", json=b)) for b in bodies]
            while app.state.batcher.queue_depth < len(bodies):
                await asyncio.sleep(0.01)
            app.state.batcher.resume()
            return await asyncio.gather(*tasks)

    with ServerThread(app) as srv:
        rs = asyncio.run(ask(srv.url))
        m = httpx.get(f"{srv.url}/metrics", timeout=10).text
    assert [r.status_code for r in rs] == [200] * 4, [r.text for r in rs]
    assert rs[0].json()["choices"][0]["text"] == want
    # drafted together: no shared round raised and reran its rows alone (which would still answer all four)
    assert metric(m, "dflash_draft_rounds_total", batch_size="4", draft_len="7") >= 1
    assert metric(m, "dflash_isolated_rounds_total") == 0
