"""A stand-in for ``trtllm-serve``: its documented HTTP and metrics contract, answered by the
reference runtime serving a bundle as TensorRT-LLM would (its config's draft lengths).

The contract (``tensorrt_llm/serve/openai_server.py``, ``tensorrt_llm/serve/openai_protocol.py``):

- ``GET /health`` 200; ``GET /v1/models``;
- ``POST /v1/completions``: OpenAI completions, the prompt as text or token ids, ``logprobs: k`` ->
  ``choices[0].logprobs = {tokens, token_logprobs, top_logprobs, text_offset}``; no token ids in the
  response (``return_token_ids`` is vLLM's), ``usage``;
- ``GET /metrics``: a JSON list of the iteration stats since the previous call (each handed out
  once): ``iter``, ``iterLatencyMS``, ``gpuMemUsage``, ``cpuMemUsage``, ``numActiveRequests``,
  ``inflightBatchingStats`` (``numScheduledRequests``, ``numContextRequests``, ``numGenRequests``,
  ...), ``kvCacheStats``, ``specDecodingStats`` (``numDraftTokens``, ``numAcceptedTokens``,
  ``numRequestsWithDraftTokens``, ``acceptanceLength``, ``iterLatencyMS``, ``draftOverhead``);
- with ``accept_stats_dir`` (TLLM_DFLASH_ACCEPT_STATS_DIR), ``dflash_accept_stats_rank0.json`` as
  ``tensorrt_llm/_torch/speculative/accept_stats.py`` writes it, cumulative.

Requests are run one at a time; an iteration row stands for one request's decode, and its batch
size (``numGenRequests``) is the requests in flight when it started, so the draft length in force
follows the config's ``draft_len_schedule`` as TensorRT-LLM's ``get_draft_len_for_batch_size`` does.
Where that length is 0 a speculating server still reports ``specDecodingStats``, every count 0
(``py_executor.py::_update_iter_stats`` fills them whenever speculation is configured); the baseline
reports none.

Launch settings a deployment may get wrong: ``speculative=False`` (the baseline: the same target,
no drafter), ``argmax=False`` (a speculating server whose verify step samples where temperature 0
asks for argmax: its output diverges, and its drafts are rejected more), ``gpu_memory`` (what
``gpuMemUsage`` reports; default: the plan's total).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import torch
from fastapi import Request

from dflash_trt.runtime import SamplingParams, draft_len_for_batch_size, generate, load_bundle


class StandIn:
    def __init__(
        self,
        bundle: Path,
        *,
        speculative: bool = True,
        argmax: bool = True,
        gpu_memory: int | None = None,
        accept_stats_dir: Path | None = None,
        name: str = "trtllm-model",
    ):
        from dflash_trt.ingest import open_bundle

        self.pair = load_bundle(bundle, dtype="float32")
        planned = open_bundle(bundle).manifest.plan.memory.total  # default: what the plan says it uses
        self.speculative, self.argmax, self.gpu_memory, self.name = speculative, argmax, gpu_memory or planned, name
        self.stats_dir = accept_stats_dir
        self.max_draft_len = self.pair.drafter.cfg.block_size - 1
        self.rows: list[dict] = []
        self.hist = [0] * (self.max_draft_len + 1)
        self.lock, self.count_lock = threading.Lock(), threading.Lock()
        self.in_flight = 0
        self.iter = 0

    def complete(self, prompt_ids: list[int], max_tokens: int, temperature: float, logprobs: int | None) -> dict:
        with self.count_lock:
            self.in_flight += 1
            batch = self.in_flight
        try:
            with self.lock, torch.inference_mode():
                return self._complete(prompt_ids, max_tokens, temperature, logprobs, batch)
        finally:
            with self.count_lock:
                self.in_flight -= 1

    def _complete(self, ids: list[int], max_tokens: int, temperature: float, k: int | None, batch: int) -> dict:
        L = draft_len_for_batch_size(self.pair.draft_len_schedule, batch, self.max_draft_len) if self.speculative else 0
        sampling = SamplingParams(temperature=temperature or (0.0 if self.argmax else 1.0), seed=len(ids))
        start = time.perf_counter()
        gen = generate(
            self.pair.target,
            self.pair.drafter,
            [ids],
            max_new_tokens=max_tokens,
            sampling=sampling,
            block_size=L + 1,
            stop_token_ids=self.pair.stop_token_ids,
        )
        out = list(gen.token_ids[0])
        self._record(gen.stats, L, batch, 1e3 * (time.perf_counter() - start))
        text = self.pair.decode(out)
        choice = {"index": 0, "text": text, "finish_reason": gen.finish_reasons[0], "logprobs": None}
        if k:
            choice["logprobs"] = self._logprobs(ids, out, k)
        return {
            "id": f"cmpl-{self.iter}",
            "object": "text_completion",
            "model": self.name,
            "choices": [choice],
            "usage": {"prompt_tokens": len(ids), "completion_tokens": len(out), "total_tokens": len(ids) + len(out)},
        }

    def _logprobs(self, ids: list[int], out: list[int], k: int) -> dict:
        seq = torch.tensor([ids + out])  # [1, P + N]
        logp = torch.log_softmax(self.pair.target.model(seq).logits[0, len(ids) - 1 : -1].float(), -1)  # [N, V]
        top = logp.topk(k, -1)
        word = lambda t: self.pair.tokenizer.decode([int(t)])  # noqa: E731
        return {
            "tokens": [word(t) for t in out],
            "token_logprobs": [float(logp[i, t]) for i, t in enumerate(out)],
            "top_logprobs": [
                {word(t): float(v) for t, v in zip(top.indices[i], top.values[i], strict=True)} for i in range(len(out))
            ],
            "text_offset": [0] * len(out),
        }

    def _record(self, stats, L: int, batch: int, ms: float) -> None:
        self.iter += 1
        row = {
            "iter": self.iter,
            "iterLatencyMS": ms,
            "gpuMemUsage": self.gpu_memory,
            "cpuMemUsage": 1 << 30,
            "numActiveRequests": batch,
            "attentionDpRank": 0,
            "inflightBatchingStats": {
                "numScheduledRequests": batch,
                "numContextRequests": 0,
                "numGenRequests": batch,
                "numPausedRequests": 0,
                "numCtxTokens": 0,
            },
            "kvCacheStats": {
                "maxNumBlocks": 1000,
                "usedNumBlocks": 10,
                "freeNumBlocks": 990,
                "tokensPerBlock": 32,
                "allocNewBlocks": 1,
                "allocTotalBlocks": 10,
                "reusedBlocks": 0,
                "cacheHitRate": 0.0,
            },
        }
        if self.speculative and not L:  # drafting off at this batch size: the stats say no request drafted
            row["specDecodingStats"] = {
                "numDraftTokens": 0,
                "numAcceptedTokens": 0,
                "numRequestsWithDraftTokens": 0,
                "acceptanceLength": 0.0,
                "iterLatencyMS": 0.0,
                "draftOverhead": 0.0,
            }
        if L and stats.rounds:
            row["specDecodingStats"] = {
                "numDraftTokens": L * stats.rounds,
                "numAcceptedTokens": stats.committed - stats.rounds,
                "numRequestsWithDraftTokens": stats.rounds,
                "acceptanceLength": stats.committed / stats.rounds,
                "iterLatencyMS": ms,
                "draftOverhead": 0.0,
            }
            acc = [stats.rounds] + list(stats.accepted_at[:L]) + [0]  # rounds with >= a accepted, a = 0..L+1
            for a in range(L + 1):
                self.hist[a] += acc[a] - acc[a + 1]
            self._flush()
        self.rows.append(row)

    def _flush(self) -> None:
        if self.stats_dir is None:
            return
        self.stats_dir.mkdir(parents=True, exist_ok=True)
        snap = {
            "rank": 0,
            "max_draft_len": self.max_draft_len,
            "num_steps": sum(self.hist),
            "accepted_draft_hist": list(self.hist),
            "per_request": {},
            "confidence_calibration": {"num_bins": 20, "attempts": [], "accepted": []},
        }
        (self.stats_dir / "dflash_accept_stats_rank0.json").write_text(json.dumps(snap))

    def take_rows(self) -> list[dict]:
        rows, self.rows = self.rows, []
        return rows


def create_app(standin: StandIn):
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    app = FastAPI()

    @app.get("/health")
    async def health():
        return JSONResponse({}, status_code=200)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": standin.name, "object": "model", "owned_by": "tensorrt_llm"}]}

    @app.get("/metrics")
    async def metrics():
        return standin.take_rows()

    @app.post("/v1/completions")
    async def completions(request: Request):
        import asyncio

        body = await request.json()
        prompt = body["prompt"]
        ids = prompt if isinstance(prompt, list) else standin.pair.tokenizer(prompt)["input_ids"]
        out = await asyncio.to_thread(
            standin.complete,
            ids,
            int(body.get("max_tokens") or 16),
            float(body.get("temperature", 1.0)),
            body.get("logprobs"),
        )
        if not body.get("stream"):
            return out
        from fastapi.responses import StreamingResponse

        def events():
            choice = dict(out["choices"][0], logprobs=None)
            yield "data: " + json.dumps({**out, "choices": [choice]}) + "\n\n"
            yield "data: " + json.dumps({**out, "choices": [], "usage": out["usage"]}) + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app
