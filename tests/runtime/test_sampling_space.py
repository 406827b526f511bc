"""Every sampling value the request schema accepts has defined behaviour in the sampling math
(issue 27): hypothesis draws request bodies over (and past) the schema's bounds; a body the schema
accepts must give finite distributions summing to 1 and in-vocabulary tokens, for every entry
point the loop calls (probs, propose, accept_rows, select_rows; greedy, seeded and unseeded)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from dflash_trt.runtime.sampling import SamplingParams, accept_rows, noise_key, probs, propose, select_rows
from dflash_trt.serve.protocol import APIError, CompletionRequest, validation_message

V, K = 40, 3
floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 5e-324, 1e-300, 1e-45, 1e-38, 1e-8, 0.5, 1.0, 2.0, 2.0000001, -0.0, -1e-9]),
)
ints = st.one_of(st.integers(), st.sampled_from([-1, 0, 1, V - 1, V, V + 1, 2**63 - 1, 2**63, -(2**63), 10**40]))
bodies = st.fixed_dictionaries(
    {"prompt": st.just("x")},
    optional={"temperature": floats, "top_p": floats, "top_k": ints, "seed": st.one_of(st.none(), ints)},
)


def _params(body: dict) -> SamplingParams | None:
    """The schema's verdict: SamplingParams for an accepted body, None for a refused one (whose
    refusal names the parameter)."""
    try:
        req = CompletionRequest(**body)
        req.check_supported()
    except ValidationError as exc:
        message, param = validation_message(exc.errors())
        assert param in body and param in message, (param, message)
        return None
    except APIError as exc:
        assert exc.param in body
        return None
    return SamplingParams(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, seed=req.seed)


def _logits(seed: int, *shape) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, V, generator=g) * 8
    x[..., 0] = x[..., 1]  # a tie at the top, sometimes
    return x


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies, data=st.integers(0, 2**16))
def test_every_accepted_sampling_body_has_defined_math(body, data):
    p = _params(body)
    if p is None:
        return
    assert math.isfinite(p.temperature) and 0 <= p.temperature <= 2 and 0 < p.top_p <= 1 and p.top_k >= 0
    dist = probs(_logits(data, 2, K + 1), p)
    assert torch.isfinite(dist).all() and torch.allclose(dist.sum(-1), torch.ones(2, K + 1), atol=1e-5)
    if 0 < p.top_k < V:
        # _logits ties tokens 0 and 1: where they straddle the k-th place both stay (as transformers'
        # TopKLogitsWarper keeps ties), so one more than k may survive, never two
        assert ((dist > 0).sum(-1) <= p.top_k + 1).all()
    keys = [None if p.greedy or p.seed is None else noise_key(p.seed)] * 2
    draft, q = propose(_logits(data + 1, 2, K), [p, p], keys, [5, 9])
    assert draft.shape == (2, K) and ((0 <= draft) & (draft < V)).all()
    acc, bonus = accept_rows(draft, _logits(data + 2, 2, K + 1), q, [p, p], keys, [5, 9])
    assert ((0 <= acc) & (acc <= K)).all() and ((0 <= bonus) & (bonus < V)).all()
    tok = select_rows(_logits(data + 3, 2), [p, SamplingParams()], keys, [1, 1])
    assert ((0 <= tok) & (tok < V)).all()


@pytest.mark.parametrize("t", [5e-324, 1e-300, 1e-45, 1e-30])
def test_a_tiny_temperature_is_the_greedy_limit(t):
    """Before: logits / 1e-45 overflowed to inf and softmax gave NaN (the draw then failed)."""
    x = _logits(0, 4)
    dist = probs(x, SamplingParams(temperature=t))
    assert torch.isfinite(dist).all()
    assert torch.equal(dist.argmax(-1), x.argmax(-1))


def test_a_top_p_that_rounds_to_zero_keeps_the_top_token():
    x = _logits(1, 4)
    dist = probs(x, SamplingParams(temperature=1.0, top_p=1e-300))
    assert torch.isfinite(dist).all() and torch.equal(dist.argmax(-1), x.argmax(-1))


def test_non_finite_temperature_is_refused_in_one_line():
    from dflash_trt.errors import DFlashError

    for t in (float("nan"), float("inf")):
        with pytest.raises(DFlashError, match="temperature"):
            SamplingParams(temperature=t)
