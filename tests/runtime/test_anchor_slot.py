"""Parity guard from a peer's bug (hipfire PR #483: broadcasting the mask embedding to every slot
gave τ 1.46 instead of 6.34): the block's first slot carries the ANCHOR token's embedding (the
last committed token), every other slot the mask token's, on the torch backend and the graph
backends' block embedding alike."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from dflash_trt.runtime import SamplingParams, generate, load_pair
from dflash_trt.runtime.backend import TorchBackend
from dflash_trt.runtime.graph_backend import GraphBackend


def test_the_first_slot_carries_the_anchor_embedding(tiny_pair_dir):
    pair = load_pair(*tiny_pair_dir, dtype="float32")
    backend = TorchBackend(pair.target, pair.drafter)
    run = backend.lean_drafter or backend.drafter
    table = pair.target.model.get_input_embeddings().weight  # [V, H]
    mask = pair.drafter.cfg.mask_token_id
    seen: list[int] = []
    real = run.draft

    def spy(block_embeds, cache):  # block_embeds: [b, B, H]
        first = (block_embeds[0, 0][None] == table).all(-1).nonzero().flatten().tolist()
        assert len(first) == 1 and first[0] != mask, "the first slot is not one token's embedding (or is MASK)"
        assert torch.equal(block_embeds[0, 1:], table[mask].expand_as(block_embeds[0, 1:])), "slots 1.. are not MASK"
        seen.append(first[0])
        return real(block_embeds, cache)

    run.draft = spy
    ids = [pair.tokenizer("the quick brown fox")["input_ids"]]
    with torch.inference_mode():
        out = generate(
            None,
            None,
            ids,
            max_new_tokens=20,
            sampling=SamplingParams(),
            block_size=8,
            stop_token_ids=[],
            backend=backend,
        )
    tokens = list(out.token_ids[0])
    assert seen and seen[0] == tokens[0]  # round 1 drafts from the token the prefill committed
    # every later anchor is the last token the round before committed: a strictly advancing prefix
    at = [0]
    for a in seen[1:]:
        at.append(tokens.index(a, at[-1] + 1))
    assert at == sorted(at) and len(seen) == out.stats.rounds


def test_the_graph_backends_embed_the_anchor_first():
    table = torch.randn(16, 4)
    graphs = SimpleNamespace(mask_token_id=15, run=lambda name, feeds: (table[feeds["input_ids"]],))  # no graphs
    embeds = GraphBackend._block_embeds(graphs, torch.tensor([3, 7]), 5)  # [b=2, B=5, H]
    assert torch.equal(embeds[:, 0], table[[3, 7]]) and torch.equal(embeds[:, 1:], table[15].expand(2, 4, 4))
