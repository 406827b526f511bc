"""A DFlash2 pair built with --graphs runs through ONNX Runtime: the drafter graph's
selector walk proposes what ``TorchBackend`` proposes (tokens every round; at T > 0 the same q over
the vocabulary, from the same uniforms), and greedy output is the target's own greedy decoding.
Both forms: ``drafter_ort.onnx`` (standard ops over a dense context, the default) and
``drafter.onnx`` (the TensorRT form, its custom ops as Python custom ops over the paged pool)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime_extensions")
pytest.importorskip("onnxscript")

from dflash_trt import ingest
from dflash_trt.cli import run
from dflash_trt.errors import DFlashError
from dflash_trt.export.onnx_native import dense_from_paged
from dflash_trt.runtime import SamplingParams, SelectorProposer, TorchBackend, generate, load_bundle, resolve_run
from dflash_trt.runtime.graph_backend import DenseKVCache
from dflash_trt.runtime.onnx_backend import OnnxBackend
from tests.helpers import hf_greedy, save_pair
from tests.helpers import prompts as random_prompts

MAX_NEW = 16


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """A tiny qwen3 target + random DFlash2 drafter, built with the standalone path (--graphs)."""
    root = tmp_path_factory.mktemp("dflash2-trt")
    tdir, ddir = save_pair(root / "pair", dflash2=True)
    out = root / "bundle"
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
                "serving.max_seq_len=128",
                "--set",
                "serving.max_batch_size=4",
            ]
        )
        == 0
    )
    return out


@pytest.fixture(scope="module")
def pair(bundle):
    """That bundle's onnx backend beside its PyTorch modules (the reference the tests hold it to;
    a graph backend's own pair builds its modules on the meta device)."""
    import dataclasses

    graphs = load_bundle(bundle, resolve_run("onnx", bundle=bundle))
    return dataclasses.replace(load_bundle(bundle), backend=graphs.backend, spec=graphs.spec)


@pytest.fixture(scope="module")
def customop(bundle, pair):
    """The same bundle through its TensorRT form (``drafter.onnx``'s custom ops, the paged pool)."""
    b = ingest.open_bundle(bundle)
    return OnnxBackend(b.onnx, b.manifest.graphs.profile, pair.drafter.cfg.mask_token_id, native=False)


def context(cache) -> list[torch.Tensor]:
    """Each row's drafter context [L, kvh, len, d] (k then v), from a dense or a paged cache."""
    if isinstance(cache, DenseKVCache):
        k, v = cache.k, cache.v
    else:
        k, v = dense_from_paged(cache)
    return [x[:, i, :, :n].float() for i, n in enumerate(cache.lengths.tolist()) for x in (k, v)]


def recording(backend):
    """``backend`` with every ``draft_block`` answer kept in ``backend.drafts``."""
    backend.drafts = []
    real = backend.draft_block

    def spy(*args):
        tokens, q = real(*args)
        backend.drafts.append((tokens, q))
        return tokens, q

    backend.draft_block = spy
    return backend


def test_the_manifest_says_the_drafter_graph_is_dflash2(bundle, pair):
    import onnx

    from dflash_trt.export import onnx_dflash2 as export_dflash2

    m = ingest.read_manifest(bundle)
    assert m.graphs.drafter_graph == "dflash2" and type(pair.drafter).__name__ == "DFlash2Drafter"
    assert {"k_cache", "v_cache", "q", "ort_k_new", "ort_q"} <= set(m.graphs.drafter_onnx_max_error)
    assert "drafter_ort.onnx" in m.graphs.onnx
    graph = onnx.load(str(bundle / "onnx" / "drafter.onnx")).graph
    assert [i.name for i in graph.input] == export_dflash2.DFLASH2_INPUTS
    native = onnx.load(str(bundle / "onnx" / "drafter_ort.onnx")).graph
    assert {n.domain for n in native.node} <= {"", "ai.onnx"}  # no custom op: nothing Python per round
    assert isinstance(pair.backend.proposer, SelectorProposer) and pair.backend.dense_drafter
    assert pair.backend.vocab_size == pair.drafter.cfg.vocab_size


@pytest.mark.parametrize("batch,form", [(1, "native"), (3, "native"), (3, "customop")])
def test_greedy_through_onnx_is_the_targets_own_and_proposes_torchs_walk(pair, customop, batch, form):
    ps = random_prompts(3, seed=5, lo=2, hi=40)
    graph = pair.backend if form == "native" else customop
    onnx_b, torch_b = recording(graph), recording(TorchBackend(pair.target, pair.drafter))
    try:
        for i in range(0, len(ps), batch):
            rows = ps[i : i + batch]
            got = generate(None, None, rows, max_new_tokens=MAX_NEW, backend=onnx_b)
            want = generate(None, None, rows, max_new_tokens=MAX_NEW, backend=torch_b)
            assert got.token_ids == want.token_ids == [hf_greedy(pair.target.model, p, MAX_NEW) for p in rows]
            assert got.stats.accepted_at == want.stats.accepted_at
    finally:
        del onnx_b.draft_block
    assert len(onnx_b.drafts) == len(torch_b.drafts) > 0
    for (t_o, q_o), (t_t, q_t) in zip(onnx_b.drafts, torch_b.drafts, strict=True):
        assert torch.equal(t_o, t_t) and q_o is None and q_t is None


def test_sampled_drafts_are_torchs_walk_and_q(pair):
    """Unseeded sampling: with the global generator seeded alike, both backends draw the same
    uniforms, so the graph's proposal and its q scattered to the vocabulary must equal TorchBackend's."""
    ps = random_prompts(3, seed=6, lo=2, hi=30)
    s = SamplingParams(temperature=0.8)
    onnx_b, torch_b = recording(pair.backend), recording(TorchBackend(pair.target, pair.drafter))
    try:
        torch.manual_seed(11)
        got = generate(None, None, ps, max_new_tokens=MAX_NEW, sampling=s, backend=onnx_b)
        torch.manual_seed(11)
        want = generate(None, None, ps, max_new_tokens=MAX_NEW, sampling=s, backend=torch_b)
    finally:
        del onnx_b.draft_block
    assert got.token_ids == want.token_ids
    assert len(onnx_b.drafts) == len(torch_b.drafts) > 0
    for (t_o, q_o), (t_t, q_t) in zip(onnx_b.drafts, torch_b.drafts, strict=True):
        assert torch.equal(t_o, t_t)
        assert q_o.shape == q_t.shape and torch.allclose(q_o, q_t.float(), atol=1e-4)
        assert torch.allclose(q_o.sum(-1), torch.ones(q_o.shape[:2]), atol=1e-4)


def _prefilled(backend, ps):
    """One prefill of prompts ``ps`` through ``backend``: (target_hidden, n_new, anchor, drafter cache)."""
    n = torch.tensor([len(p) for p in ps])
    ids = torch.zeros(len(ps), int(n.max()), dtype=torch.long)
    for r, p in enumerate(ps):
        ids[r, : len(p)] = torch.tensor(p)
    valid = torch.arange(ids.shape[1])[None] < n[:, None]
    cache, dcache = backend.new_caches(len(ps), True)
    logits, hidden = backend.target_forward(
        ids, torch.arange(ids.shape[1]).expand(len(ps), -1), valid, cache, capture=True, logits_at=n - 1
    )
    return hidden, n, logits[:, 0].argmax(-1), dcache


@pytest.mark.parametrize("form", ["native", "customop"])
def test_drafting_off_still_injects_and_odd_blocks_and_logits_are_refused(pair, customop, form):
    """A block-size-1 round (the scheduler's schedule turning drafting off) through the DFlash2 graph
    proposes nothing but injects the context as TorchBackend does; a block the graph was not
    exported for, and asking it for logits, which it does not output, are one line each."""
    ps = random_prompts(2, seed=7, lo=2, hi=20)
    graph = pair.backend if form == "native" else customop
    greedy, caches = [SamplingParams()] * 2, []
    for backend in (graph, TorchBackend(pair.target, pair.drafter)):
        hidden, n, anchor, dcache = _prefilled(backend, ps)
        assert backend.draft_block(hidden, n, anchor, 1, dcache, greedy, [None, None], [0, 0]) == (None, None)
        caches.append(dcache)
    got, want = caches
    assert torch.equal(got.lengths, n) and torch.equal(want.lengths, n)
    for g, w in zip(context(got), context(want), strict=True):
        assert torch.allclose(g, w, atol=1e-4)
    hidden, n, anchor, dcache = _prefilled(graph, ps)
    with pytest.raises(DFlashError, match="drafts blocks of 8, not 4"):
        graph.draft_block(hidden, n, anchor, 4, dcache, greedy, [None, None], [0, 0])
    with pytest.raises(DFlashError, match="proposes tokens, not logits"):
        graph.drafter_round(hidden, n, anchor, 8, dcache)


@pytest.mark.parametrize("form", ["native", "customop"])
def test_a_batch_mixing_greedy_and_sampled_rows_is_torchs(pair, customop, form):
    """Greedy rows walk at temperature 0 and the unseeded sampled rows at theirs, one run of the graph
    per temperature in one round (over one shared pool, or each run returning its rows' new
    context): tokens, q and the caches as TorchBackend's."""
    ps = random_prompts(4, seed=8, lo=2, hi=30)
    params = [SamplingParams(), SamplingParams(temperature=0.9), SamplingParams(), SamplingParams(temperature=0.5)]
    out = []
    for backend in (pair.backend if form == "native" else customop, TorchBackend(pair.target, pair.drafter)):
        hidden, n, anchor, dcache = _prefilled(backend, ps)
        torch.manual_seed(5)
        tokens, q = backend.draft_block(hidden, n, anchor, 8, dcache, params, [None] * 4, [0] * 4)
        out.append((tokens, q, dcache))
    (t_o, q_o, c_o), (t_t, q_t, c_t) = out
    assert torch.equal(t_o, t_t) and torch.allclose(q_o, q_t.float(), atol=1e-4)
    assert float(q_o[0].abs().sum()) == 0.0 and float(q_o[2].abs().sum()) == 0.0
    for r in (1, 3):
        assert torch.allclose(q_o[r].sum(-1), torch.ones(7), atol=1e-4)
    assert torch.equal(c_o.lengths, c_t.lengths)
    for g, w in zip(context(c_o), context(c_t), strict=True):
        assert torch.allclose(g, w, atol=1e-4)
