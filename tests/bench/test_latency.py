"""Latency as the serving benchmarks define it: pure functions of (time, tokens) events, and one
end-to-end run against a stand-in server that streams chunks of known token counts."""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi import Request  # at module level: the stand-in's annotations are read as strings
from hypothesis import given
from hypothesis import strategies as st

from dflash_trt.bench import endpoint as loadgen
from dflash_trt.bench import latency as lat
from dflash_trt.bench.latency import Record


def _speculating() -> Record:
    # a speculating server: first token at 50 ms, then chunks of 4, 3 and 5 tokens every 20 ms
    return Record(
        ok=True, chunks=[(0.050, 1), (0.070, 4), (0.090, 3), (0.110, 5)], e2el=0.110, tokens_from="usage per chunk"
    )


def test_request_figures():
    r = _speculating()
    assert r.output_tokens == 13
    assert lat.ttft(r) == 0.050
    assert lat.tpot(r) == pytest.approx((0.110 - 0.050) / 12)
    assert lat.itl_per_chunk(r) == pytest.approx([0.020, 0.020, 0.020])  # what vLLM prints: 20 ms
    assert lat.itl_per_token(r) == pytest.approx([0.005] * 4 + [0.020 / 3] * 3 + [0.004] * 5)
    assert lat.per_user(r) == pytest.approx(12 / 0.060)  # TTFT left out
    assert lat.per_user_with_ttft(r) == pytest.approx(13 / 0.110)
    one = Record(ok=True, chunks=[(0.05, 1)], e2el=0.05, tokens_from="logprobs")
    assert lat.tpot(one) is None and lat.itl_per_token(one) == [] and lat.per_user(one) is None
    unknown = Record(ok=True, chunks=[(0.05, 0), (0.07, 0)], e2el=0.07)  # no usage: no token figures
    assert unknown.output_tokens is None and lat.tpot(unknown) is None and lat.itl_per_token(unknown) == []
    assert lat.itl_per_chunk(unknown) == pytest.approx([0.02])


def test_a_level_and_its_distributions():
    fast = _speculating()
    slow = Record(ok=True, chunks=[(0.100, 1), (0.200, 1)], e2el=0.200, tokens_from="logprobs")
    failed = Record(ok=False, status=500, error="boom")
    s = lat.summarize([fast, slow, failed], wall=0.5)
    assert (s["ok"], s["failed"], s["output_tokens"]) == (2, 1, 15)
    assert s["output_tokens_per_second"] == 30.0 and s["request_throughput"] == 4.0
    assert s["ttft_ms"] == {"mean": 75.0, "median": 75.0, "p90": 95.0, "p99": 99.5}
    assert s["tpot_ms"]["median"] == pytest.approx(1e3 * (0.005 + 0.1) / 2, abs=1e-3)
    assert s["itl_ms"]["median"] == 20.0 and s["e2el_ms"]["p99"] == pytest.approx(199.1)
    assert s["tokens_per_second_per_user"] == pytest.approx((200 + 10) / 2, abs=1e-3)
    assert s["tokens_from"] == ["logprobs", "usage per chunk"]
    assert lat.distribution([]) == {"mean": None, "median": None, "p90": None, "p99": None}


@given(st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=20), st.integers(0, 200))
def test_usage_spread_over_chunks_by_text(texts, total):
    counts = lat.spread_tokens(texts, total)
    assert sum(counts) == total and len(counts) == len(texts) and min(counts) >= 0
    if total >= len(texts):
        assert min(counts) >= 1  # a chunk with text carried a token


def test_tokens_per_chunk_best_source_first():
    texts = ["a", "bcd", "ef"]
    assert lat.chunk_tokens(texts, [1, 5, 7], [None] * 3, 7) == ([1, 4, 2], "usage per chunk")
    assert lat.chunk_tokens(texts, [None] * 3, [1, 3, 2], 6) == ([1, 3, 2], "logprobs")
    assert lat.chunk_tokens(texts, [None] * 3, [None] * 3, 12) == ([2, 6, 4], "usage spread over chunks by text")
    assert lat.chunk_tokens(texts, [None] * 3, [None] * 3, None) == (None, None)  # never the chunk count


# ---- a stand-in that streams known chunk sizes --------------------------------------------------
CHUNKS = [1, 4, 3, 5]  # tokens per chunk, one token per character of text
GAP = 0.02


def standin(mode: str):
    """Streams CHUNKS as completions text every GAP seconds; ``mode``: "continuous" (cumulative
    usage in every chunk, when asked), "final" (usage only at the end, per-chunk usage refused as
    the embedded server does), "none" (no usage at all)."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, StreamingResponse

    app = FastAPI()

    @app.get("/v1/models")
    def models():
        return {"data": [{"id": f"standin-{mode}"}]}

    @app.post("/v1/completions")
    async def complete(request: Request):
        body = await request.json()
        asked = bool((body.get("stream_options") or {}).get("continuous_usage_stats"))
        if asked and mode == "final":
            return JSONResponse({"error": {"message": "continuous_usage_stats: extra fields not permitted"}}, 400)

        async def events():
            done = 0
            for n in CHUNKS:
                await asyncio.sleep(GAP)
                done += n
                obj = {"choices": [{"index": 0, "text": "x" * n}]}
                if mode == "continuous":
                    obj["usage"] = {"prompt_tokens": 3, "completion_tokens": done}
                yield f"data: {json.dumps(obj)}\n\n"
            if mode != "none":
                usage = {"prompt_tokens": 3, "completion_tokens": done}
                yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


@pytest.mark.parametrize(
    "mode, source", [("continuous", "usage per chunk"), ("final", "usage spread over chunks by text"), ("none", None)]
)
def test_endpoint_counts_the_tokens_the_server_streamed(mode, source):
    from dflash_trt.serve import ServerThread

    with ServerThread(standin(mode)) as srv:
        r = loadgen.run(srv.url, concurrency=[1], requests=2, repeats=2, warmup=1, max_tokens=13, records=True)
    lv = r["endpoint"]["levels"][0]
    assert lv["ok"] == 4 and lv["tokens_from"] == ([source] if source else None)
    rec = lv["records"][0]
    assert len(rec["chunks"]) == len(CHUNKS) and len(lv["records"]) == 4
    if source is None:  # no usage: no token figures, and never the chunk count
        assert lv["output_tokens"] is None and lv["tpot_ms"]["median"] is None
        return
    assert [n for _, n in rec["chunks"]] == CHUNKS and lv["output_tokens"] == 4 * sum(CHUNKS)
    gaps = lv["itl_ms"]["median"]
    assert gaps >= 1e3 * GAP * 0.9  # per chunk: ~20 ms
    assert lv["itl_per_token_ms"]["median"] < gaps / 2  # per token: a few ms
    assert lv["tpot_ms"]["median"] == pytest.approx(1e3 * 3 * GAP / (sum(CHUNKS) - 1), rel=0.5)
