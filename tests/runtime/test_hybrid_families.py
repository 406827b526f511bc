"""Hybrid targets keep exact recurrent states without a replay, and the second-wave hybrids
(nemotron_h: Mamba2; kimi_linear: KDA + MLA; glm5_next: KDA-like + position-free MLA with a
pooled sparse indexer and hyper-connection streams) decode losslessly.

The verify kernels (``runtime/linear_states.py``) must compute what transformers' own torch
kernels compute, and the state they select for a prefix of n tokens must be the state
transformers reaches over those n tokens alone; then greedy output is the target's own
greedy decoding, with drafts mostly rejected and mostly accepted (every acceptance length),
at batch 1 and 3, rows joining and leaving the scheduler, and a seeded row samples
the same tokens whatever shares its batch.
"""

from __future__ import annotations

import pytest
import torch

from dflash_trt.runtime import Request, SamplingParams, Scheduler, TorchBackend, generate
from dflash_trt.runtime import linear_states as ls
from tests.families import GLM5_NEXT, GLM5_NEXT_SHARED, HYBRID_2, family_drafter, family_target
from tests.helpers import hf_greedy, wrap
from tests.runtime.test_families import MAX_NEW, case, check_lossless, check_matrix_cell
from tests.runtime.test_scheduler import run


def _gdn_case(g):
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mod

    b, T, hk, hv, dk, dv = 3, 7, 2, 4, 8, 6
    args = dict(
        query=torch.randn(b, T, hk, dk, generator=g),
        key=torch.randn(b, T, hk, dk, generator=g),
        value=torch.randn(b, T, hv, dv, generator=g),
        g=-torch.rand(b, T, hv, generator=g),
        beta=torch.rand(b, T, hv, generator=g),
        use_qk_l2norm_in_kernel=True,
    )
    return mod, "torch_chunk_gated_delta_rule", args, "initial_state", torch.randn(b, hv, dk, dv, generator=g)


def _kda_case(g):
    from transformers.models.kimi_linear import modeling_kimi_linear as mod

    b, T, h, d = 3, 7, 3, 8
    args = dict(
        query=torch.randn(b, T, h, d, generator=g),
        key=torch.randn(b, T, h, d, generator=g),
        value=torch.randn(b, T, h, d, generator=g),
        g=-torch.rand(b, T, h, d, generator=g),
        beta=torch.rand(b, T, h, generator=g),
        use_qk_l2norm_in_kernel=True,
    )
    return mod, "chunk_kimi_delta_attention", args, "initial_state", torch.randn(b, h, d, d, generator=g)


def _mamba2_case(g):
    from transformers.models.nemotron_h import modeling_nemotron_h as mod

    b, T, h, p, n, groups = 3, 7, 4, 5, 6, 2
    args = dict(
        hidden_states=torch.randn(b, T, h, p, generator=g),
        dt=torch.randn(b, T, h, generator=g),
        A=-torch.rand(h, generator=g),
        B=torch.randn(b, T, groups, n, generator=g),
        C=torch.randn(b, T, groups, n, generator=g),
        chunk_size=4,
        D=torch.randn(h, generator=g),
        dt_bias=torch.randn(h, generator=g),
        dt_softplus=True,
        dt_limit=(0.001, float("inf")),
    )
    return mod, "mamba2_chunk_scan", args, "initial_states", torch.randn(b, h, p, n, generator=g)


def _prefix(args: dict, n: int) -> dict:
    """The kernel's arguments over the first n tokens (per-token tensors are [b, T, ...])."""
    return {k: v[:, :n] if isinstance(v, torch.Tensor) and v.dim() >= 3 else v for k, v in args.items()}


@pytest.mark.parametrize("make", [_gdn_case, _kda_case, _mamba2_case], ids=["gated_deltanet", "kda", "mamba2"])
def test_per_token_kernels_are_transformers_and_select_any_prefix(make):
    mod, name, args, init_key, S0 = make(torch.Generator().manual_seed(0))
    final_key = "return_final_states" if name == "mamba2_chunk_scan" else "output_final_state"
    want_o, want_S = getattr(mod, name)(**args, **{init_key: S0, final_key: True})
    got = []
    o, S = ls.KERNELS[name](got.append, getattr(mod, "l2norm", None))(**args, **{init_key: S0, final_key: True})
    torch.testing.assert_close(o, want_o, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(S, want_S, atol=2e-5, rtol=1e-4)
    factors, T = got[0], args["dt" if "dt" in args else "beta"].shape[1]
    # One row per prefix length, mixed in one call, as a commit selects them.
    for n in ([0, 3, 7], [1, 2, 5], [6, 4, 7]):
        n = torch.tensor(n)
        chosen = factors.state(n)
        for row, k in enumerate(n.tolist()):
            ref = (
                S0[row] if k == 0 else getattr(mod, name)(**_prefix(args, k), **{init_key: S0, final_key: True})[1][row]
            )
            torch.testing.assert_close(chosen[row], ref.to(chosen.dtype), atol=2e-5, rtol=1e-4)
    assert T == 7


@pytest.mark.parametrize("family", HYBRID_2 + [GLM5_NEXT])
def test_greedy_is_lossless_on_the_second_wave_hybrids(family):
    check_lossless(family)


@pytest.mark.slow
@pytest.mark.parametrize("family", HYBRID_2 + [GLM5_NEXT])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("block", [4, 8])
@pytest.mark.parametrize("kind", ["random", "oracle"])
def test_greedy_is_lossless_on_the_second_wave_hybrids_full_matrix(family, batch, block, kind):
    check_matrix_cell(family, batch, block, kind)


def _scheduled(family: str):
    c = case(family)
    drafter = family_drafter(c.model, block_size=6)
    return TorchBackend(wrap(c.model, drafter), drafter), c


@pytest.mark.parametrize(
    "family",
    [
        pytest.param("nemotron_h"),
        pytest.param("kimi_linear", marks=pytest.mark.slow),
        pytest.param(GLM5_NEXT, marks=pytest.mark.slow),
        pytest.param("qwen3_5", marks=pytest.mark.slow),
    ],
)
def test_rows_joining_and_leaving_a_hybrid_batch_keep_their_tokens(family):
    backend, c = _scheduled(family)
    reqs = [Request(p, MAX_NEW if i % 2 else 7) for i, p in enumerate(c.prompts)]  # short rows leave early
    steps = run(Scheduler(backend, max_batch=3), {0: reqs[:2], 2: reqs[2:4], 5: reqs[4:]})
    assert [r.token_ids for r in reqs] == [c.truth(i)[: len(r.token_ids)] for i, r in enumerate(reqs)]
    assert [len(r.token_ids) for r in reqs] == [7, MAX_NEW] * 3
    assert any(s.admitted and s.batch_size > len(s.admitted) for s in steps), "no row joined a running batch"


@pytest.mark.slow
@pytest.mark.parametrize("family", HYBRID_2 + [GLM5_NEXT])
def test_a_seeded_row_on_a_hybrid_reproduces_whatever_shares_its_batch(family):
    backend, c = _scheduled(family)
    ps = c.prompts
    params = SamplingParams(temperature=0.9, top_k=40, seed=7)
    schedule = {1: 5, 2: 3, 4: 1}  # the draft length changes with the live batch size
    alone = Request(ps[0], MAX_NEW, params)
    run(Scheduler(backend, max_batch=8, draft_len_schedule=schedule), {0: [alone]})
    crowd = Request(ps[0], MAX_NEW, params)
    mates = [
        Request(ps[1], MAX_NEW),
        Request(ps[2], 9, SamplingParams(temperature=1.0)),
        Request(ps[3], MAX_NEW, SamplingParams(temperature=0.7, seed=99)),
        Request(ps[4], 3),
    ]
    run(Scheduler(backend, max_batch=8, draft_len_schedule=schedule), {0: mates[:2], 1: [crowd], 2: mates[2:]})
    assert crowd.token_ids == alone.token_ids
    assert (
        generate(None, None, [ps[0]], max_new_tokens=MAX_NEW, sampling=params, backend=backend).token_ids[0]
        == alone.token_ids
    )
    assert mates[0].token_ids == hf_greedy(c.model, ps[1], MAX_NEW)


@pytest.mark.parametrize("family", HYBRID_2 + [GLM5_NEXT])
def test_the_graph_backends_say_in_one_line_they_cannot_carry_hybrid_states(family):
    from dflash_trt.export.onnx_graphs import target_export_problem

    problem = target_export_problem(family_target(family).config)
    assert problem and "recurrent/conv state (hybrid)" in problem and "\n" not in problem


@pytest.mark.slow
def test_greedy_is_lossless_on_glm5_next_with_a_shared_indexer_layer():
    """A layer reusing the previous layer's top-k reads the same back-packed columns."""
    check_lossless(GLM5_NEXT_SHARED)


def test_glm5_next_target_hidden_is_each_tapped_layers_streams_through_hc_head():
    """glm5_next's tap (``model/target.py``): layer i's [b, T, hc, H] output streams through the
    model's own ``hc_head`` (an unweighted mean), so target_hidden is n_tap x H wide, the width
    ingest expects of a drafter's ``fc.weight`` and planning counts (``n_taps * hidden``)."""
    from dflash_trt.ingest.formats import expected_shapes
    from tests.families import family_drafter_config

    model = family_target(GLM5_NEXT)
    cfg = family_drafter_config(model)
    target = wrap(model, family_drafter(model))
    ids = torch.tensor([[5, 9, 14, 3, 22, 7]])
    with torch.no_grad():
        _, hidden = target.forward(ids, torch.arange(6)[None], torch.ones_like(ids), None)
        streams = model(ids, output_hidden_states=True).hidden_states  # [1, T, hc, H] per layer
    H = model.config.get_text_config().hidden_size
    assert hidden.shape == (1, 6, len(cfg.target_layer_ids) * H) == (1, 6, expected_shapes(cfg)["fc.weight"][1])
    want = torch.cat([streams[i + 1].mean(2) for i in cfg.target_layer_ids], dim=-1)
    torch.testing.assert_close(hidden, want, atol=1e-12, rtol=0)


def test_glm5_next_runtime_cache_holds_what_planning_counts():
    """The runtime's glm5_next cache grows per committed token by exactly the latent KV + indexer
    elements ``plan/hybrid_shapes.py`` counts (back-packing moves columns, it adds none), and its
    recurrent states are the planned size."""
    from dflash_trt.plan.family_shapes import layer_counts
    from dflash_trt.runtime.loop import prefill

    model = family_target(GLM5_NEXT, dtype=torch.float32)
    text = model.config.get_text_config(decoder=True)
    counts = layer_counts({**text.to_dict(), "model_type": text.model_type})
    backend = TorchBackend(wrap(model), None)
    p = [5, 9, 14, 3, 22, 7, 31, 8, 40, 11]

    def elements(n: int) -> tuple[int, int]:
        cache = prefill(backend, [Request(p[:n], 4)], draft=False).target_cache
        grows = sum(
            getattr(lay, k)[0].numel()
            for lay in cache.layers
            for k in ("keys", "values", "indexer_keys")
            if isinstance(getattr(lay, k, None), torch.Tensor)
        )
        state = sum(
            t[0].numel()
            for lay in cache.layers
            for t in (getattr(lay, "recurrent_states", {}) or {}).values()
            if t is not None
        )
        return grows, state

    (a, state), (b, _) = elements(9), elements(10)
    assert b - a == sum(g.layers * g.kv_heads * g.dims for g in counts.kv) > 0
    assert state == counts.states[0].layers * counts.states[0].recurrent
