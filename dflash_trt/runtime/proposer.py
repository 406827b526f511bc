"""How a drafter family turns one drafter round into draft tokens: the runtime's family hook.

A :class:`Proposer` is the runtime stage of a drafter family (``model.family`` documents the
seam): ``Backend.draft_block`` hands it the round, on the PyTorch modules
(:meth:`Proposer.torch_block`) or on the exported drafter graph (:meth:`Proposer.graph_block`).

* :class:`Proposer` (DFlash, every family's default): the round's draft logits, then
  :func:`~dflash_trt.runtime.sampling.propose` per row (argmax, or a draw from each position's
  distribution). Its drafter graph outputs logits.
* :class:`SelectorProposer` (DFlash2): the drafter's candidate selector walks the block left to
  right over each position's top-k (``DFlash2Drafter.propose``); q is the walk's distribution
  over the candidates, zero elsewhere. Its drafter graph walks too (``export/onnx_dflash2.py``:
  anchor, uniforms and temperature in; tokens, q, candidates out).

:func:`proposer_for` finds a family's proposer (the nearest registered one up its class
hierarchy, ``model.hook_for``); :func:`graph_proposer` the one a drafter graph's kind names.
A new family whose drafting differs registers its subclass with :func:`register`.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from dflash_trt.errors import DFlashError
from dflash_trt.model import DFlash2Family, DrafterFamily, hook_for
from dflash_trt.runtime.sampling import SamplingParams, propose


class Proposer:
    """DFlash: each draft position from the round's logits (:func:`sampling.propose`)."""

    #: the drafter graph kind (``DrafterFamily.graph``) this proposer drafts through
    graph: ClassVar[str] = "dflash"
    #: the drafter graph's outputs, in the order the graph backend reads them
    graph_outputs: ClassVar[list[str]] = ["logits", "k_cache_out", "v_cache_out"]
    #: the same for the graph's ONNX Runtime form over a dense context cache (``export/onnx_native.py``)
    dense_outputs: ClassVar[list[str]] = ["logits", "k_new", "v_new"]
    #: the drafter graph's inputs beyond the DFlash round's (``export.onnx_graphs.DRAFTER_INPUTS``)
    graph_inputs: ClassVar[tuple[str, ...]] = ()
    #: whether the drafter graph returns the round's logits (``Backend.drafter_round``)
    graph_logits: ClassVar[bool] = True

    def torch_block(self, backend, target_hidden, n_new, anchor, block_size, cache, params, keys, first):
        """``Backend.draft_block`` on ``TorchBackend``: (tokens [b, B-1] | None, q [b, B-1, V] | None)."""
        return self._from_logits(backend, target_hidden, n_new, anchor, block_size, cache, params, keys, first)

    def graph_block(self, backend, target_hidden, n_new, anchor, block_size, cache, params, keys, first):
        """``Backend.draft_block`` on a ``GraphBackend`` (the same contract through the drafter graph)."""
        return self._from_logits(backend, target_hidden, n_new, anchor, block_size, cache, params, keys, first)

    @staticmethod
    def _from_logits(backend, target_hidden, n_new, anchor, block_size, cache, params, keys, first):
        dlogits = backend.drafter_round(target_hidden, n_new, anchor, block_size, cache)
        if block_size == 1:
            return None, None
        return propose(dlogits, params, keys, first)


class SelectorProposer(Proposer):
    """DFlash2: the candidate selector's walk, on the modules and through the drafter graph."""

    graph = "dflash2"
    graph_outputs = ["tokens", "q", "candidates", "k_cache_out", "v_cache_out"]
    dense_outputs = ["tokens", "q", "candidates", "k_new", "v_new"]
    graph_inputs = ("anchor", "uniforms", "temperature")
    graph_logits = False

    def torch_block(self, backend, target_hidden, n_new, anchor, block_size, cache, params, keys, first):
        """The rows grouped by :func:`walk_groups`, each group walking ``DFlash2Drafter.propose``."""
        hidden, dlogits = backend.draft_hidden_logits(target_hidden, n_new, anchor, block_size, cache)
        if block_size == 1:
            return None, None
        lean = getattr(backend, "lean_drafter", None)  # the same proposal (``LeanDrafter.propose``) or None
        groups = walk_groups(params, keys)
        if len(groups) == 1 and groups[0][1] == 0:  # every row walks at temperature 0 (greedy batches)
            if lean is not None:
                return lean.propose(hidden, dlogits, anchor, 0.0)
            return backend.drafter.propose(hidden, dlogits, anchor, 0.0, None)
        tokens = torch.empty(dlogits.shape[:2], dtype=torch.long, device=dlogits.device)
        q = None
        for rows, temperature in groups:
            h, lg, a = hidden[rows], dlogits[rows], anchor[rows]
            tokens[rows], q_rows = (
                lean.propose(h, lg, a, temperature)
                if lean is not None
                else backend.drafter.propose(h, lg, a, temperature, None)
            )
            if temperature > 0:
                q = torch.zeros_like(dlogits, dtype=torch.float32) if q is None else q
                q[rows] = q_rows
        return tokens, q

    def graph_block(self, backend, target_hidden, n_new, anchor, block_size, cache, params, keys, first):
        """``torch_block``'s contract through the walking drafter graph.

        Rows decided by argmax (greedy and seeded rows) walk at temperature 0; the unseeded
        sampled rows walk at their temperature (one run of the graph per temperature) with
        uniforms drawn from torch's global generator, as ``DFlash2Drafter.propose`` draws them;
        their q over the candidates is scattered to the vocabulary [b, B-1, V] for rejection
        sampling. The graph is exported for the full block, so a block-size-1 round (drafting
        off) runs it on the full block for its KV injection and drops the proposal.

        Over the paged pool (``drafter.onnx``) each run injects its rows' pages; over a dense
        context (``drafter_ort.onnx``) each run returns its rows' new K/V, written once after the
        last run."""
        B = backend.profile.block_size
        if block_size not in (1, B):
            raise DFlashError(
                f"--backend {backend.name}: the DFlash2 drafter graph drafts blocks of {B}, not "
                f"{block_size}; use --backend torch for shorter blocks"
            )
        dense = backend.dense_drafter
        feeds = (backend.dense_feeds if dense else backend.round_feeds)(target_hidden, n_new, anchor, B, cache)
        b, K = anchor.shape[0], B - 1
        groups = [(list(range(b)), 0.0)] if block_size == 1 else walk_groups(params, keys)
        tokens = torch.empty(b, K, dtype=torch.long, device=backend.device)
        q, new_kv = None, None
        for rows, temperature in groups:
            t, q_k, cand, kv = self._walk(backend, feeds, rows, b, anchor, temperature, cache)
            if len(rows) == b:  # one walk over the whole batch (a greedy batch): its outputs as they are
                tokens, new_kv = t.long(), kv
            else:
                tokens[rows] = t.long()
            if dense and len(rows) < b:
                new_kv = new_kv or [x.new_empty(x.shape[0], b, *x.shape[2:]) for x in kv]
                for whole, part in zip(new_kv, kv, strict=True):
                    whole[:, rows] = part
            if temperature > 0:
                V = backend.vocab_size
                q = torch.zeros(b, K, V, device=backend.device) if q is None else q
                q[rows] = torch.zeros(len(rows), K, V, device=backend.device).scatter(-1, cand.long(), q_k.float())
        if dense:
            assert new_kv is not None  # every group drafted: each set its K/V
            cache.append(*new_kv, n_new)
        else:
            cache.lengths = cache.lengths + n_new
        return (None, None) if block_size == 1 else (tokens, q)

    @staticmethod
    def _walk(backend, feeds, rows, b, anchor, temperature, cache):
        """Run the drafter graph on batch rows ``rows``; (tokens, q, candidates, (k_new, v_new)) for
        those rows. The paged pool is shared (each run injects only its rows' pages and the pool
        comes back updated); a dense context is read by row and its new K/V returned for those rows."""
        idx = None if len(rows) == b else torch.tensor(rows, device=backend.device)
        pooled = ("k_cache", "v_cache")
        sub = {
            k: (
                v
                if idx is None or k in pooled
                else v[:, idx].contiguous()
                if k in ("k_ctx", "v_ctx")
                else v[idx].contiguous()
            )
            for k, v in feeds.items()
        }
        K = backend.profile.block_size - 1
        uniforms = (
            torch.rand(len(rows), K, device=backend.device)
            if temperature > 0
            else torch.zeros(len(rows), K, device=backend.device)
        )
        rows_anchor = (anchor if idx is None else anchor[idx]).long().contiguous()
        sub.update(
            anchor=rows_anchor, uniforms=uniforms, temperature=torch.tensor([float(temperature)], device=backend.device)
        )
        if backend.dense_drafter:
            tokens, q_k, cand, k_new, v_new = backend.run("drafter", sub)
            return tokens, q_k, cand, (k_new, v_new)
        sub.update(k_cache=cache.k, v_cache=cache.v)
        tokens, q_k, cand, cache.k, cache.v = backend.run("drafter", sub)
        return tokens, q_k, cand, None


def walk_groups(params: list[SamplingParams], keys: list) -> list[tuple[list[int], float]]:
    """How a selector's rows walk: [(rows, temperature)], the argmax rows first (greedy rows, and
    seeded rows, whose acceptance compares the draft with the target's own noise-perturbed argmax,
    so any proposal keeps them lossless) at 0, then the unseeded sampled rows, one group per
    temperature (in order of first appearance). A walk's q is the distribution its tokens were
    drawn from, whatever the row's top-k / top-p: rejection sampling against the row's own target
    distribution keeps every group lossless."""
    argmax = [r for r, (p, k) in enumerate(zip(params, keys, strict=True)) if p.greedy or k is not None]
    taken = set(argmax)
    by_temperature: dict[float, list[int]] = {}
    for r, p in enumerate(params):
        if r not in taken:
            by_temperature.setdefault(float(p.temperature), []).append(r)
    return ([(argmax, 0.0)] if argmax else []) + [(rows, t) for t, rows in by_temperature.items()]


#: family class -> its proposer class (``register``; found up the family's hierarchy by ``proposer_for``)
PROPOSERS: dict[type, type[Proposer]] = {}


def register_proposer(family: type[DrafterFamily], proposer: type[Proposer]) -> None:
    """Draft ``family``'s blocks (and its subclasses' without their own) with ``proposer``."""
    PROPOSERS[family] = proposer


def proposer_for(family: DrafterFamily) -> Proposer:
    """The proposer of ``family`` (the nearest registered up its class hierarchy)."""
    return hook_for(PROPOSERS, family)()


def graph_proposer(kind: str | None, input_names: list[str]) -> Proposer:
    """The proposer that drafts through a drafter graph of ``kind`` (``DrafterFamily.graph``, the
    manifest's ``engine.drafter_graph``); None: the one whose extra inputs the graph takes (the
    most of them)."""
    if kind is not None:
        for proposer in reversed(list(PROPOSERS.values())):
            if proposer.graph == kind:
                return proposer()
        raise DFlashError(f"no runtime drafts through a {kind!r} drafter graph; rebuild the bundle")
    fits = [p for p in PROPOSERS.values() if set(p.graph_inputs) <= set(input_names)]
    return max(fits, key=lambda p: len(p.graph_inputs))()


register_proposer(DrafterFamily, Proposer)
register_proposer(DFlash2Family, SelectorProposer)
