"""A DFlash2 pair built with --graphs runs through ONNX Runtime: the drafter graph's
selector walk proposes what ``TorchBackend`` proposes (tokens every round; at T > 0 the same q over
the vocabulary, from the same uniforms), and greedy output is the target's own greedy decoding."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime_extensions")
pytest.importorskip("onnxscript")

from dflash_trt import ingest
from dflash_trt.cli import run
from dflash_trt.errors import DFlashError
from dflash_trt.runtime import SamplingParams, SelectorProposer, TorchBackend, generate, load_bundle, resolve_run
from tests.helpers import hf_greedy, save_pair
from tests.helpers import prompts as random_prompts

MAX_NEW = 16


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """A tiny qwen3 target + random DFlash2 drafter, built with the standalone path (--graphs)."""
    root = tmp_path_factory.mktemp("dflash2-trt")
    tdir, ddir = save_pair(root / "pair", dflash2=True)
    out = root / "bundle"
    assert run(["build", "-t", str(tdir), "-d", str(ddir), "--gpu", "cpu", "--graphs", "-o", str(out),
                "--set", "serving.max_seq_len=128", "--set", "serving.max_batch_size=4"]) == 0
    return out


@pytest.fixture(scope="module")
def pair(bundle):
    """That bundle's onnx backend beside its PyTorch modules (the reference the tests hold it to;
    a graph backend's own pair builds its modules on the meta device)."""
    import dataclasses

    graphs = load_bundle(bundle, resolve_run("onnx", bundle=bundle))
    return dataclasses.replace(load_bundle(bundle), backend=graphs.backend, spec=graphs.spec)


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
    assert m.engine.drafter_graph == "dflash2" and type(pair.drafter).__name__ == "DFlash2Drafter"
    assert {"k_cache", "v_cache", "q"} <= set(m.engine.drafter_onnx_max_error)
    graph = onnx.load(str(bundle / "onnx" / "drafter.onnx")).graph
    assert [i.name for i in graph.input] == export_dflash2.DFLASH2_INPUTS
    assert isinstance(pair.backend.proposer, SelectorProposer)
    assert pair.backend.vocab_size == pair.drafter.cfg.vocab_size


@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_through_onnx_is_the_targets_own_and_proposes_torchs_walk(pair, batch):
    ps = random_prompts(3, seed=5, lo=2, hi=40)
    onnx_b, torch_b = recording(pair.backend), recording(TorchBackend(pair.target, pair.drafter))
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
    logits, hidden = backend.target_forward(ids, torch.arange(ids.shape[1]).expand(len(ps), -1), valid, cache,
                                            capture=True, logits_at=n - 1)
    return hidden, n, logits[:, 0].argmax(-1), dcache


def test_drafting_off_still_injects_and_odd_blocks_and_logits_are_refused(pair):
    """A block-size-1 round (the scheduler's schedule turning drafting off) through the DFlash2 graph
    proposes nothing but injects the context as TorchBackend does; a block the graph was not
    exported for, and asking it for logits, which it does not output, are one line each."""
    ps = random_prompts(2, seed=7, lo=2, hi=20)
    greedy, caches = [SamplingParams()] * 2, []
    for backend in (pair.backend, TorchBackend(pair.target, pair.drafter)):
        hidden, n, anchor, dcache = _prefilled(backend, ps)
        assert backend.draft_block(hidden, n, anchor, 1, dcache, greedy, [None, None], [0, 0]) == (None, None)
        caches.append(dcache)
    got, want = caches
    assert torch.equal(got.lengths, n) and torch.equal(want.lengths, n)
    assert torch.equal(got.page_table, want.page_table)
    used = want.used_pages
    assert torch.allclose(got.k[:, :used], want.k[:, :used].float(), atol=1e-4)
    hidden, n, anchor, dcache = _prefilled(pair.backend, ps)
    with pytest.raises(DFlashError, match="drafts blocks of 8, not 4"):
        pair.backend.draft_block(hidden, n, anchor, 4, dcache, greedy, [None, None], [0, 0])
    with pytest.raises(DFlashError, match="proposes tokens, not logits"):
        pair.backend.drafter_round(hidden, n, anchor, 8, dcache)


def test_a_batch_mixing_greedy_and_sampled_rows_is_torchs(pair):
    """Greedy rows walk at temperature 0 and the sampled rows at theirs, in one round (two runs of
    the graph over one shared pool): tokens, q and the caches as TorchBackend's."""
    ps = random_prompts(3, seed=8, lo=2, hi=30)
    params = [SamplingParams(), SamplingParams(temperature=0.9), SamplingParams()]
    out = []
    for backend in (pair.backend, TorchBackend(pair.target, pair.drafter)):
        hidden, n, anchor, dcache = _prefilled(backend, ps)
        torch.manual_seed(5)
        tokens, q = backend.draft_block(hidden, n, anchor, 8, dcache, params, [None] * 3, [0] * 3)
        out.append((tokens, q, dcache))
    (t_o, q_o, c_o), (t_t, q_t, c_t) = out
    assert torch.equal(t_o, t_t) and torch.allclose(q_o, q_t.float(), atol=1e-4)
    assert float(q_o[0].abs().sum()) == 0.0 and torch.allclose(q_o[1].sum(-1), torch.ones(7), atol=1e-4)
    assert torch.equal(c_o.lengths, c_t.lengths)
    assert torch.allclose(c_o.k[:, : c_t.used_pages], c_t.k[:, : c_t.used_pages].float(), atol=1e-4)
