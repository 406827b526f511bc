"""Lossless on every target family the published drafters pair with.

Greedy speculative decoding must emit exactly what transformers' own ``generate`` emits, on
tiny random targets of each family (tests/families.py): hybrid Gated DeltaNet targets, whose
recurrent and conv states must take only accepted tokens; sliding-window targets, whose
windows must hold exactly the committed tokens however many holes a batch leaves; MLA, MoE
and VLM wrappers served text-only. Each with a drafter that is mostly rejected (random) and
one that is mostly accepted (the oracle, corrupted at a varying position so acceptance is
partial and the rollback runs every round). The default run takes one case per family;
the full matrix (batch 1 and 3, block 4 and 8) is marked slow.
"""

from __future__ import annotations

import pytest
import torch

from dflash_trt.runtime.loop import generate
from tests.families import FAMILIES, VLM, family_drafter, family_drafter_config, family_target
from tests.helpers import OracleDrafter, hf_greedy, prompts, wrap

MAX_NEW = 20
ALL = FAMILIES + [f for f in VLM if f not in FAMILIES]


class Case:
    """One family's target (``make(family)``: tests/families.py's by default, test_second_wave.py
    passes its own), six prompts of 1 to ``hi`` tokens and the target's own greedy continuations
    of ``max_new`` tokens (computed on first use: the default run needs three, the slow matrix six)."""

    def __init__(self, family: str, make=family_target, max_new: int = MAX_NEW, hi: int = 30):
        self.family, self.max_new = family, max_new
        self.model = make(family)
        self.prompts = prompts(6, seed=3, lo=1, hi=hi)
        self._truth: dict[int, list[int]] = {}

    def truth(self, i: int) -> list[int]:
        if i not in self._truth:
            self._truth[i] = hf_greedy(self.model, self.prompts[i], self.max_new + 8)
        return self._truth[i]

    def run(self, drafter_kind: str, batch: int, block: int, n: int = 6) -> tuple[list[list[int]], float]:
        """Generate the first ``n`` prompts in batches of ``batch``; returns (tokens, mean
        acceptance length)."""
        got, taus = [], []
        for i in range(0, n, batch):
            rows = list(range(i, min(i + batch, n)))
            d = self.drafter(drafter_kind, block, rows)
            out = generate(
                wrap(self.model, d), d, [self.prompts[r] for r in rows], max_new_tokens=self.max_new, block_size=block
            )
            got += out.token_ids
            taus.append(out.stats.acceptance_length)
        return got, sum(taus) / len(taus)

    def drafter(self, kind: str, block: int, rows: list[int]):
        if kind == "random":
            return family_drafter(self.model, block_size=block)
        full = [self.prompts[r] + self.truth(r) for r in rows]
        # Corrupt draft position (round + row) % (B-1) + 1: every acceptance length occurs.
        cfg = family_drafter_config(self.model, block_size=block)
        return OracleDrafter(cfg, full, lambda rnd, row: (rnd + row) % (block - 1) + 1).to(torch.float64)

    def expected(self, n: int = 6) -> list[list[int]]:
        return [self.truth(i)[: self.max_new] for i in range(n)]


_cases: dict[str, Case] = {}


def case(family: str, **kw) -> Case:
    """The one :class:`Case` of ``family`` (built with ``kw`` on first use)."""
    if family not in _cases:
        _cases[family] = Case(family, **kw)
    return _cases[family]


def check_lossless(family: str, c: Case | None = None, block: int = 8, min_tau: float = 2.5) -> None:
    """The default run's case: batch 3, a rejected and a mostly accepted drafter (the oracle's τ
    above ``min_tau``), each token-identical to the target's greedy (test_hybrid_families.py and
    test_second_wave.py run it on their families too, the latter passing its own ``c``)."""
    c = c or case(family)
    for kind in ("random", "oracle"):
        got, tau = c.run(kind, batch=3, block=block, n=3)
        assert got == c.expected(3), f"{family}, {kind} drafter"
        if kind == "oracle":
            assert tau > min_tau, f"{family}: the oracle should be mostly accepted (tau {tau:.2f})"


def check_matrix_cell(family: str, batch: int, block: int, kind: str, c: Case | None = None) -> None:
    """One cell of the slow matrix: token-identical to the target's greedy."""
    c = c or case(family)
    got, _ = c.run(kind, batch=batch, block=block)
    assert got == c.expected()


@pytest.mark.parametrize("family", [f for f in ALL if f not in ("qwen3", "llama")])  # those two: test_loop.py
def test_greedy_is_lossless_on_every_family(family):
    check_lossless(family)


@pytest.mark.slow
@pytest.mark.parametrize("family", ALL)
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("block", [4, 8])
@pytest.mark.parametrize("kind", ["random", "oracle"])
def test_greedy_is_lossless_full_matrix(family, batch, block, kind):
    check_matrix_cell(family, batch, block, kind)


def test_autoregressive_is_lossless_on_ragged_batches():
    """Block size 1 (no drafter) at batch 6 with prompts of 1..30 tokens: padding must enter
    neither a recurrent state nor a sliding window."""
    for family in ("qwen3_next", "gpt_oss"):
        c = case(family)
        out = generate(wrap(c.model), None, c.prompts, max_new_tokens=MAX_NEW, block_size=1)
        assert out.token_ids == c.expected(), family


@pytest.mark.slow  # ~16 s: the chunked delta rule pads every row to 64 tokens
def test_speculative_sampling_on_a_hybrid_target_matches_the_target():
    """Sampling keeps the target's distribution on a Gated DeltaNet target: the third token
    comes out of a second round whenever the first rejected part of its block, i.e. out of
    rolled-back recurrent states; its frequencies must match the exact marginal."""
    from dflash_trt.runtime.sampling import SamplingParams, probs
    from tests.runtime.test_loop import _chi2_ok

    params = SamplingParams(temperature=1.0, top_k=12, seed=31)
    model = family_target("qwen3_5", dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.3)  # flatter distributions: more tokens in play
    drafter = family_drafter(model, block_size=4)
    prompt = prompts(1, seed=9, lo=6, hi=6)[0]
    n = 1500
    out = generate(wrap(model, drafter), drafter, [prompt] * n, max_new_tokens=3, sampling=params)
    toks = torch.tensor(out.token_ids)  # [n, 3]
    assert out.stats.rounds > n  # some rows needed a second round: their states were rolled back
    with torch.no_grad():
        p1 = probs(model(torch.tensor([prompt])).logits[0, -1], params).double()  # [V]
        V = p1.shape[0]
        t1 = p1.nonzero().squeeze(1)
        ctx2 = torch.tensor([prompt + [a] for a in t1.tolist()])
        p2 = probs(model(ctx2).logits[:, -1], params).double()  # [n1, V]
        pairs = [(i, a, b) for i, a in enumerate(t1.tolist()) for b in p2[i].nonzero().squeeze(1).tolist()]
        ctx3 = torch.tensor([prompt + [a, b] for _, a, b in pairs])
        p3_given = probs(model(ctx3).logits[:, -1], params).double()  # [pairs, V]
    weight = torch.tensor([p1[a] * p2[i, b] for i, a, b in pairs], dtype=torch.float64)
    p3 = (weight[:, None] * p3_given).sum(0)
    counts = torch.bincount(toks[:, 2], minlength=V).double()
    ok, msg = _chi2_ok(counts, p3, n)
    assert ok, f"token 3: {msg}"
