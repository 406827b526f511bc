"""The loop through the exported graphs: the tiny bundle built with --graphs, run by ONNX
Runtime, is token-identical to the target's own greedy decoding and to the PyTorch backend (τ
too), over many rounds of the paged cache, and refuses what its engine profile does not cover."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime_extensions")
pytest.importorskip("onnxscript")

from dflash_trt import ingest
from dflash_trt.bench.inprocess import read_prompts
from dflash_trt.cli import run
from dflash_trt.errors import DFlashError
from dflash_trt.runtime import SamplingParams, generate, load_bundle, resolve_run
from dflash_trt.runtime.graph_backend import GRAPH_OUTPUTS, request_shapes
from dflash_trt.runtime.onnx_backend import OnnxBackend
from tests.helpers import hf_greedy

MAX_NEW = 40


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """The embedded tiny recipe built with the standalone path: onnx/ (engines/ where TensorRT is)."""
    out = tmp_path_factory.mktemp("engines") / "tiny-trt"
    assert run(["build", "--graphs", "-o", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def pair(bundle):
    """The ONNX Runtime backend beside the bundle's PyTorch modules (the reference the tests hold
    it to): a graph backend's own pair builds its modules on the meta device."""
    import dataclasses

    graphs = load_bundle(bundle, resolve_run("onnx", bundle=bundle))
    return dataclasses.replace(load_bundle(bundle), backend=graphs.backend, spec=graphs.spec)


@pytest.fixture(scope="module")
def prompts(pair):
    texts = read_prompts(ingest.embedded_dir("tiny") / "heldout_prompts.jsonl")[:6]
    return [pair.encode(t)[:96] for t in texts]


def test_the_manifest_records_the_graphs_and_their_profile(bundle, pair):
    m = ingest.read_manifest(bundle)
    assert m.graphs.onnx == ["drafter.onnx", "drafter_ort.onnx", "embed.onnx", "target.onnx", "target_ort.onnx"]
    assert max(m.graphs.target_onnx_max_error.values()) < 1e-3
    assert {"ort_logits", "ort_target_hidden", "ort_new_k", "ort_new_v"} <= set(m.graphs.target_onnx_max_error)
    # ONNX Runtime runs its own forms of both (the lossless tests below hold them to torch)
    assert pair.backend.files == {"embed": "embed.onnx", "target": "target_ort.onnx", "drafter": "drafter_ort.onnx"}
    assert max(v for k, v in m.graphs.drafter_onnx_max_error.items() if k.startswith("ort_")) < 1e-4
    p = m.graphs.profile
    serving = m.recipe["serving"]
    assert (p.max_batch, p.block_size, p.page_size) == (serving["max_batch_size"], 8, 16)
    assert p.max_seq_len == serving["max_seq_len"] + p.block_size
    assert p.max_pages == p.max_batch * p.max_pages_per_seq


@pytest.mark.parametrize("batch", [4, pytest.param(1, marks=pytest.mark.slow)])
def test_greedy_through_onnx_is_the_targets_own_and_torchs(pair, prompts, batch):
    """The drafter's native form (drafter_ort.onnx: no Python in a round) is lossless, and drafts
    exactly what PyTorch drafts (same acceptance per position)."""
    assert pair.backend.dense_drafter
    for i in range(0, len(prompts), batch):
        ps = prompts[i : i + batch]
        onnx = generate(None, None, ps, max_new_tokens=MAX_NEW, backend=pair.backend)
        ref = generate(pair.target, pair.drafter, ps, max_new_tokens=MAX_NEW)
        assert onnx.token_ids == ref.token_ids == [hf_greedy(pair.target.model, p, MAX_NEW) for p in ps]
        assert onnx.stats.acceptance_length == ref.stats.acceptance_length > 1.0
        assert onnx.stats.accepted_at == ref.stats.accepted_at
        assert onnx.stats.target_forwards == ref.stats.target_forwards


def test_autoregressive_and_sampling_through_onnx_match_torch(pair, prompts):
    ar = generate(None, None, prompts[:2], max_new_tokens=12, block_size=1, backend=pair.backend)
    assert ar.token_ids == generate(pair.target, None, prompts[:2], max_new_tokens=12, block_size=1).token_ids
    assert ar.stats.acceptance_length == 1.0
    s = SamplingParams(temperature=0.8, top_p=0.95, seed=3)
    onnx = generate(None, None, prompts[:3], max_new_tokens=24, sampling=s, backend=pair.backend)
    ref = generate(pair.target, pair.drafter, prompts[:3], max_new_tokens=24, sampling=s)
    assert onnx.token_ids == ref.token_ids and onnx.stats.accepted_at == ref.stats.accepted_at


class Recording(OnnxBackend):
    """The ONNX backend with the custom-op drafter form (``drafter.onnx``, the TensorRT form, here
    through Python custom ops), recording the largest extent of every profile dimension it is fed."""

    def __init__(self, *args):
        super().__init__(*args, native=False)
        self.seen = dict.fromkeys(("batch", "tokens", "seq", "pages_per_seq", "pages"), 0)
        self.tables = []

    def _saw(self, key, value):
        self.seen[key] = max(self.seen[key], int(value))

    def run(self, graph, feeds):
        if graph == "target":
            self._saw("batch", feeds["input_ids"].shape[0])
            self._saw("tokens", feeds["input_ids"].shape[1])
            self._saw("seq", feeds["attention_mask"].shape[1])
        if graph == "drafter":
            self._saw("pages_per_seq", feeds["page_table"].shape[1])
        return super().run(graph, feeds)

    def round_feeds(self, target_hidden, n_new, anchor, block_size, cache):
        """Every drafter family's paged round passes here, its pages reserved: (table, lengths after it)."""
        feeds = super().round_feeds(target_hidden, n_new, anchor, block_size, cache)
        self._saw("pages", cache.used_pages)
        self.tables.append((cache.page_table.clone(), cache.lengths + n_new))
        return feeds


def test_the_paged_cache_over_many_rounds_with_rows_leaving(bundle, pair, prompts):
    """The TensorRT form's paged cache (run here by ONNX Runtime's Python custom ops): rows of
    different lengths cross many page boundaries, interleave their pages, and leave at
    different rounds; every token still matches the PyTorch backend, the shapes stay within the
    bound the profile is checked against, and compaction by row keeps the target cache narrow."""
    m = ingest.read_manifest(bundle)
    rec = Recording(bundle / "onnx", m.graphs.profile, pair.drafter.cfg.mask_token_id)
    ps = [prompts[0][:70], prompts[1][:9], prompts[2][:33], prompts[3][:50]]
    leave_after = {0: 9, 1: 14, 2: 5, 3: 10**6}  # commits before a row is cancelled (<= 8 tokens each)
    n = 120

    def stopper():
        commits = [0] * len(ps)

        def should_stop(row):
            commits[row] += 1
            return commits[row] > leave_after[row]

        return should_stop

    got = generate(None, None, ps, max_new_tokens=n, should_stop=stopper(), backend=rec)
    want = generate(pair.target, pair.drafter, ps, max_new_tokens=n, should_stop=stopper())
    assert got.token_ids == want.token_ids and got.finish_reasons == want.finish_reasons
    assert got.finish_reasons == ["cancelled", "cancelled", "cancelled", "length"]
    assert len({len(t) for t in got.token_ids}) == 4
    bound = request_shapes([len(p) for p in ps], n, 8, m.graphs.profile.page_size)
    assert all(rec.seen[k] <= bound[k] for k in bound), (rec.seen, bound)
    last_table, last_len = rec.tables[-1]
    assert last_table.shape[0] == 1 and int(last_len[0]) > 6 * 16  # one row left, > 6 pages deep
    row0 = rec.tables[0][0][0]
    row0 = row0[row0 >= 0]
    assert len(row0) >= 5 and bool((row0[1:] - row0[:-1] != 1).any())  # its pages interleave with other rows'
    native = generate(None, None, ps, max_new_tokens=n, should_stop=stopper(), backend=pair.backend)
    assert pair.backend.dense_drafter and native.token_ids == want.token_ids  # the dense form, rows leaving
    assert native.stats.accepted_at == want.stats.accepted_at


def test_a_graph_backend_loads_configs_and_tokenizer_not_the_weights(bundle, pair):
    """Under a graph backend ``load_bundle`` builds the modules on the meta device (nothing allocated),
    and what the commands read from a pair (stop ids, block size, MASK, serving plan) is unchanged."""
    shell = load_bundle(bundle, resolve_run("onnx", bundle=bundle))
    assert shell.target.device.type == "meta" and {p.device.type for p in shell.drafter.parameters()} == {"meta"}
    assert (shell.stop_token_ids, shell.name, shell.max_batch_size, shell.block_size()) == (
        pair.stop_token_ids,
        pair.name,
        pair.max_batch_size,
        pair.block_size(),
    )
    assert shell.drafter.cfg == pair.drafter.cfg and shell.encode("def f(x):") == pair.encode("def f(x):")


def test_a_verify_writes_only_the_accepted_columns_and_nothing_moves(pair):
    """The target graph returns only the forward's K/V: a verify's wait until the acceptance says
    how many of each row to keep, land after that row's committed ones, and the rest are never
    written; "compaction" is the lengths read back (no column of the cache moves)."""
    from dflash_trt.runtime.graph_backend import DenseTargetCache

    be = pair.backend
    assert be.new_kv
    L, kvh, d = be._target_dims
    cache = DenseTargetCache(L, kvh, d, batch=3, max_columns=40)
    cache.reserve(torch.tensor([5, 2, 0]))
    cache.lengths = torch.tensor([5, 2, 0])
    cache.k[:] = cache.v[:] = -1.0
    before = cache.k.clone()
    k_new = torch.arange(L * 3 * kvh * 4 * d, dtype=torch.float32).reshape(L, 3, kvh, 4, d)
    cache.pending = (k_new, -k_new)
    be.commit_cache(cache, None, torch.tensor([2, 4, 1]))
    assert cache.pending is None and cache.lengths.tolist() == [7, 6, 1]
    for row, (at, n) in enumerate([(5, 2), (2, 4), (0, 1)]):
        assert torch.equal(cache.k[:, row, :, at : at + n], k_new[:, row, :, :n])
        assert torch.equal(cache.v[:, row, :, at : at + n], -k_new[:, row, :, :n])
        assert torch.equal(cache.k[:, row, :, :at], before[:, row, :, :at])  # committed ones kept
        assert torch.equal(cache.k[:, row, :, at + n :], before[:, row, :, at + n :])  # rejected: not written
    k = cache.k.clone()
    assert (
        be.compact(cache, torch.ones(3, 9, dtype=torch.bool)).tolist()
        == (torch.arange(7)[None] < torch.tensor([[7], [6], [1]])).tolist()
    )
    assert torch.equal(cache.k, k)
    cache.select(torch.tensor([2]))  # capacity past max_columns (a finishing row's) is trimmed
    assert cache.k.shape[3] <= 40 and cache.lengths.tolist() == [1]


def test_a_prefill_runs_each_prompt_at_its_own_length_and_equals_the_padded_one(pair, prompts, monkeypatch):
    """ONNX Runtime's prefill of ragged prompts is one forward per prompt (no padding to compute);
    its logits, target_hidden and cache are the padded batch forward's, and it stays lossless."""
    be = pair.backend
    assert be.prefill_rows_alone
    ps = [prompts[0][:50], prompts[1][:9], prompts[2][:31]]
    T = max(map(len, ps))
    ids = torch.zeros(3, T, dtype=torch.long)
    for i, p in enumerate(ps):
        ids[i, : len(p)] = torch.tensor(p)
    n = torch.tensor([len(p) for p in ps])
    valid = torch.arange(T)[None] < n[:, None]
    seen: list = []
    run = be.run

    def counted(graph, feeds):
        if graph == "target":
            seen.append(tuple(feeds["input_ids"].shape))
        return run(graph, feeds)

    out = {}
    for alone in (True, False):
        monkeypatch.setattr(be, "prefill_rows_alone", alone)
        monkeypatch.setattr(be, "run", counted)
        seen.clear()
        for logits_at in (n - 1, None):
            cache, _ = be.new_caches(3, False)
            out[alone, logits_at is None] = (
                *be.target_forward(ids, torch.arange(T).expand(3, T), valid, cache, True, logits_at),
                cache,
            )
        assert seen == ([(1, len(p)) for p in ps] * 2 if alone else [(3, T)] * 2)
    for full in (False, True):
        (la, ha, ca), (lp, hp, cp) = out[True, full], out[False, full]
        assert la.shape == lp.shape and ha.shape == hp.shape
        if full:  # every real position's logits (the padding's are not defined)
            la, lp = la[valid], lp[valid]
        torch.testing.assert_close(la, lp, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(ha[valid], hp[valid], atol=1e-4, rtol=1e-4)
        assert ca.lengths.tolist() == cp.lengths.tolist() == n.tolist()
        for a, b in ((ca.k, cp.k), (ca.v, cp.v)):
            for i, m in enumerate(n.tolist()):
                torch.testing.assert_close(a[:, i, :, :m], b[:, i, :, :m], atol=1e-4, rtol=1e-4)
    monkeypatch.setattr(be, "prefill_rows_alone", True)
    onnx = generate(None, None, ps, max_new_tokens=12, backend=be)
    assert onnx.token_ids == [hf_greedy(pair.target.model, p, 12) for p in ps]


class PresentTarget(OnnxBackend):
    """A bundle's target graph as exported before the new-K/V contract (the whole present cache
    out): the current graph with its past concatenated in front of its new K/V."""

    def output_names(self, graph):
        names = super().output_names(graph)
        return [{"new_k": "present_k", "new_v": "present_v"}.get(n, n) for n in names] if graph == "target" else names

    def run(self, graph, feeds):
        if graph != "target":
            return super().run(graph, feeds)
        arrays = {k: v.contiguous().numpy() for k, v in feeds.items()}
        logits, hidden, k, v = (torch.from_numpy(o) for o in self.sessions[graph].run(GRAPH_OUTPUTS[graph], arrays))
        return [logits, hidden, torch.cat([feeds["past_k"], k], 3), torch.cat([feeds["past_v"], v], 3)]


def test_an_older_bundles_present_cache_is_still_compacted_losslessly(bundle, pair, prompts):
    """An older target graph (present_k/present_v) still runs: the runtime replaces its cache by
    the present and compacts it by row, token-identical to PyTorch at batch 3."""
    from dflash_trt.runtime.graph_backend import TargetCache

    m = ingest.read_manifest(bundle)
    old = PresentTarget(bundle / "onnx", m.graphs.profile, pair.drafter.cfg.mask_token_id)
    assert not old.new_kv and isinstance(old.new_caches(1, False)[0], TargetCache)
    got = generate(None, None, prompts[:3], max_new_tokens=24, backend=old)
    assert got.token_ids == generate(pair.target, pair.drafter, prompts[:3], max_new_tokens=24).token_ids


def test_compaction_moves_each_rows_valid_columns_to_the_front(pair):
    from dflash_trt.runtime.graph_backend import TargetCache

    be = pair.backend
    L, kvh, d = be._target_dims
    k = torch.arange(L * 2 * kvh * 5 * d, dtype=torch.float32).reshape(L, 2, kvh, 5, d)
    cache = TargetCache(k.clone(), -k.clone())
    valid = torch.tensor([[True, False, True, False, False], [False, True, True, True, False]])
    packed = be.compact(cache, valid)
    assert packed.tolist() == [[True, True, False], [True, True, True]]
    assert torch.equal(cache.k[:, 0, :, :2], k[:, 0, :, [0, 2]]) and torch.equal(cache.k[:, 1], k[:, 1, :, [1, 2, 3]])
    assert torch.equal(cache.v, -cache.k)
    assert be.compact(cache, packed) is packed  # already packed: nothing moves
    tail = torch.tensor([[True, True, False], [True, False, False]])
    before = cache.k.clone()
    assert be.compact(cache, tail).tolist() == [[True, True], [True, False]]
    assert torch.equal(cache.k, before[..., :2, :])  # holes only at the tail: cut off


def test_a_request_beyond_the_profile_is_one_line(bundle, pair, prompts, capsys):
    with pytest.raises(DFlashError, match=r"profile .*batch 9 > 8"):
        generate(None, None, [prompts[0]] * 9, max_new_tokens=4, backend=pair.backend)
    with pytest.raises(DFlashError, match="block size 8, not 4"):
        generate(None, None, prompts[:1], max_new_tokens=4, block_size=4, backend=pair.backend)
    assert run(["generate", str(bundle), "--backend", "onnx", "-p", "x" * 40, "-n", "1500"]) == 2
    err = capsys.readouterr().err.strip()
    # generate refuses at the bundle's context first (as the server does, issue 27); the graphs' profile
    # (context + one block of columns) is refused by the runtime itself, above
    assert "context of 1024 tokens" in err and len(err.splitlines()) == 1


def test_generate_and_bench_cli_through_onnx(bundle, tmp_path, capsys):
    argv = ["generate", str(bundle), "-p", "def parse(", "-n", "24", "--json"]
    assert run(argv + ["--backend", "onnx"]) == 0
    onnx = json.loads(capsys.readouterr().out)
    assert run(argv) == 0
    torch_run = json.loads(capsys.readouterr().out)
    assert onnx["token_ids"] == torch_run["token_ids"] and onnx["acceptance_length"] == torch_run["acceptance_length"]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "import os"}\n{"prompt": "class Stack:"}\n')
    reports = {}
    for backend in ("torch", "onnx"):
        assert run(["bench", str(bundle), "--prompts", str(prompts), "-n", "24", "--backend", backend, "--json"]) == 0
        reports[backend] = json.loads(capsys.readouterr().out)
    o, t = reports["onnx"], reports["torch"]
    assert o["backend"] == "onnx" and t["backend"] == "torch" and o["lossless"] is True
    assert o["graphs"] == {"embed": "embed.onnx", "target": "target_ort.onnx", "drafter": "drafter_ort.onnx"}
    assert "graphs" not in t
    for key in ("acceptance_length", "per_position_acceptance", "block_size"):
        assert o[key] == t[key]
    for run_ in ("dflash", "autoregressive"):
        for key in ("new_tokens", "target_forwards", "rounds"):
            assert o[run_][key] == t[run_][key]
        assert o[run_]["tokens_per_second"] > 0


def test_the_embedded_server_answers_through_onnx(pair, monkeypatch):
    """The server's batches go through the pair's backend: every model call of the concurrent
    greedy completions is an ONNX Runtime session run, and their tokens equal the PyTorch backend's."""
    import asyncio

    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from dflash_trt.serve.app import ServerThread, create_app

    texts = ["import os\n", "def add(a, b):", "class Node:", "for i in range("]
    want = {
        t: pair.decode(generate(pair.target, pair.drafter, [pair.encode(t)], max_new_tokens=16).token_ids[0])
        for t in texts
    }

    async def ask(url):
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            rs = await asyncio.gather(
                *(
                    c.post(
                        "/v1/completions",
                        json={"model": "tiny", "prompt": t, "max_tokens": 16, "temperature": 0, "ignore_eos": True},
                    )
                    for t in texts
                )
            )
            return [(r.status_code, r.json()["choices"][0]["text"]) for r in rs]

    graphs_run = {"embed": 0, "target": 0, "drafter": 0}
    real_run = pair.backend.run

    def counted(graph, feeds):
        graphs_run[graph] += 1
        return real_run(graph, feeds)

    monkeypatch.setattr(pair.backend, "run", counted)
    app = create_app(pair, "tiny", max_batch=4, max_queue=8)
    assert app.state.batcher.pair.backend is pair.backend
    with ServerThread(app) as srv:
        got = asyncio.run(ask(srv.url))
    assert got == [(200, want[t]) for t in texts]
    assert graphs_run["target"] > 0 and graphs_run["drafter"] > 0, graphs_run


@pytest.mark.parametrize("block_size", [8, pytest.param(1, marks=pytest.mark.slow)])
def test_rows_join_and_leave_a_running_onnx_batch_losslessly(pair, prompts, block_size):
    """Continuous batching on the graphs (GraphBackend.merge_rows / keep_rows): rows of other
    lengths and limits join a running ONNX Runtime batch at later steps and leave it as they
    finish, and every row's tokens are the target's own greedy decoding."""
    from dflash_trt.runtime import Request, Scheduler

    limits = [MAX_NEW, 9, MAX_NEW - 5, 3, 17, MAX_NEW]
    reqs = [Request(p, n) for p, n in zip(prompts, limits, strict=True)]
    sched = Scheduler(pair.backend, block_size=block_size, max_batch=3)
    arrivals = {0: reqs[:2], 2: reqs[2:4], 3: reqs[4:5], 5: reqs[5:]}
    steps = []
    for k in range(400):
        for req in arrivals.get(k, []):
            sched.add(req)
        if sched.idle and k > max(arrivals):
            break
        steps.append(sched.step())
    assert [r.token_ids for r in reqs] == [
        hf_greedy(pair.target.model, p, n) for p, n in zip(prompts, limits, strict=True)
    ]
    assert any(s.admitted and s.batch_size > len(s.admitted) for s in steps), "no row joined a running batch"
    assert not any(s.isolated or s.failed or s.failed_rounds for s in steps)


def test_the_scheduler_checks_the_profile_once_with_one_line(pair):
    """The batch and block size against the engines' profile, where the scheduler is made (the
    server's start); a request's own shapes when it is added."""
    from dflash_trt.runtime import Request, Scheduler

    p = pair.backend.profile
    for kw, needle in (
        (dict(max_batch=p.max_batch + 1), "exceeds the engines' profile"),
        (dict(block_size=p.block_size - 1), f"exported for block size {p.block_size}"),
    ):
        with pytest.raises(DFlashError, match=needle) as e:
            Scheduler(pair.backend, **kw)
        assert "\n" not in str(e.value)
    with pytest.raises(DFlashError, match="outside the engines' profile"):
        Scheduler(pair.backend, max_batch=1).add(Request([1] * (p.max_seq_len + 1), 4))


def test_the_graphs_resolve_to_continuous_batching(bundle):
    spec = resolve_run("onnx", bundle=bundle)
    assert (spec.backend, spec.notes) == ("onnx", ())
    with pytest.raises(DFlashError, match="drop --dtype bfloat16"):
        resolve_run("onnx", bundle=bundle, dtype="bfloat16")


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["generate", "-p", "x", "--backend", "onnx"], "pass a bundle built with --graphs"),
        (["generate", "-p", "x", "--backend", "tvm"], "choose one of torch, onnx, tensorrt"),
    ],
)
def test_backend_flag_errors_are_one_line(argv, needle, capsys):
    assert run(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_tensorrt_backend_refuses_in_one_line_without_tensorrt_or_gpu(bundle, capsys):
    from dflash_trt.runtime.trt_backend import tensorrt_problem

    if tensorrt_problem() is None:
        pytest.skip("TensorRT and a GPU are here: bench/engines.py runs this backend")
    assert run(["generate", str(bundle), "--backend", "tensorrt", "-p", "x", "-n", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert "TensorRT and a CUDA GPU" in err and len(err.splitlines()) == 1


def test_bundles_without_graphs_or_profile_are_refused(bundle, tmp_path, capsys):
    old = shutil.copytree(bundle, tmp_path / "old")
    data = json.loads((old / "manifest.json").read_text())
    del data["graphs"]["profile"]  # a bundle of this format built before the profile
    (old / "manifest.json").write_text(json.dumps(data))
    assert ingest.read_manifest(old).graphs.profile is None  # still reads
    assert run(["generate", str(old), "--backend", "onnx", "-p", "x"]) == 2
    assert "predates the recorded engine profile" in capsys.readouterr().err
    del data["graphs"]
    (old / "manifest.json").write_text(json.dumps(data))
    assert run(["generate", str(old), "--backend", "onnx", "-p", "x"]) == 2
    assert "built with --graphs" in capsys.readouterr().err


@pytest.mark.slow
def test_a_llama_target_exports_and_runs_losslessly(tmp_path):
    """The other test family: a tiny Llama pair built with --graphs, batch 1 and 3."""
    from tests.helpers import prompts as random_prompts
    from tests.helpers import save_pair

    tdir, ddir = save_pair(tmp_path / "pair", arch="llama")
    out = tmp_path / "llama-trt"
    assert (
        run(
            [
                "build",
                "-t",
                str(tdir),
                "-d",
                str(ddir),
                "--gpu",
                "cpu",
                "--graphs",
                "-o",
                str(out),
                "--set",
                "serving.max_seq_len=256",
            ]
        )
        == 0
    )
    p = load_bundle(out, resolve_run("onnx", bundle=out))
    torch_pair = load_bundle(out)  # the reference: the graph pair's own modules are weightless (meta)
    ps = random_prompts(6, seed=5, lo=2, hi=40)
    for batch in (1, 3):
        for i in range(0, len(ps), batch):
            onnx = generate(None, None, ps[i : i + batch], max_new_tokens=24, backend=p.backend)
            ref = generate(torch_pair.target, torch_pair.drafter, ps[i : i + batch], max_new_tokens=24)
            want = [hf_greedy(torch_pair.target.model, x, 24) for x in ps[i : i + batch]]
            assert onnx.token_ids == ref.token_ids == want
            assert onnx.stats.accepted_at == ref.stats.accepted_at


def test_a_graph_backend_round_that_raises_fails_only_its_row_in_the_server(pair, monkeypatch):
    """When a continuous batch's verify through ONNX Runtime
    raises for one row (a long prompt's positions), the others run on alone from where they stood
    and get the PyTorch backend's tokens; that request alone gets an OpenAI error object."""
    import asyncio

    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from dflash_trt.serve.app import ServerThread, create_app
    from tests.runtime.test_isolation import inject

    texts = ["import os\n", "def add(a, b):", "class Node:"]
    long = pair.encode(read_prompts(ingest.embedded_dir("tiny") / "heldout_prompts.jsonl")[0])[:60]
    want = {
        t: pair.decode(generate(pair.target, pair.drafter, [pair.encode(t)], max_new_tokens=16).token_ids[0])
        for t in texts
    }
    hits = inject(monkeypatch, pair.backend, "verify", at=len(long) + 4)  # only the long row gets there
    app = create_app(pair, "tiny", max_batch=4, max_queue=8)
    app.state.batcher.pause()  # the four arrive as one batch

    async def ask(url):
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            body = {"model": "tiny", "max_tokens": 16, "temperature": 0, "ignore_eos": True}
            sent = [c.post("/v1/completions", json={**body, "prompt": p}) for p in [*texts, long]]
            tasks = [asyncio.create_task(s) for s in sent]
            while app.state.batcher.queue_depth < 4:
                await asyncio.sleep(0.01)
            app.state.batcher.resume()
            return await asyncio.gather(*tasks)

    with ServerThread(app) as srv:
        *good, bad = asyncio.run(ask(srv.url))
    assert hits[0] > 1 and hits[-1] == 1  # a shared forward raised (rows that finished left), then the row's own
    assert [(r.status_code, r.json()["choices"][0]["text"]) for r in good] == [(200, want[t]) for t in texts]
    assert bad.status_code == 500 and "injected verify failure" in bad.json()["error"]["message"]
