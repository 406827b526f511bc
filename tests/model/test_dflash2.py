"""The DFlash2 drafter module: published names, save/load round trip, the convolutions' wiring."""

from __future__ import annotations

import json

import torch

from dflash_trt.model import DFlash2Drafter, Drafter, drafter_for
from tests.helpers import DFLASH2, tiny_dflash2_drafter, tiny_drafter_config, tiny_target


def _passthrough(i, q, k, v):
    """Attention that mixes no positions (each query returns itself): isolates the convolutions."""
    return q


def test_published_names_and_round_trip(tmp_path):
    model = tiny_target()
    d = tiny_dflash2_drafter(model)
    names = set(d.state_dict())
    assert {
        "candidate_selector.predecessor_codebook",
        "candidate_selector.successor_codebook",
        "candidate_selector.hidden_projection.weight",
        "layers.1.attention_conv.base_kernel",
        "layers.1.mlp_conv.kernel_projection.weight",
    } <= names
    d.save(tmp_path / "d")
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    assert cfg["architectures"] == ["DFlash2DraftModel"]
    assert all(cfg["dflash_config"][k] == v for k, v in DFLASH2.items())
    back = DFlash2Drafter.load(tmp_path / "d")
    assert back.cfg.model_copy(update={"dtype": d.cfg.dtype}) == d.cfg  # save records the stored dtype
    assert all(torch.equal(back.state_dict()[n], t) for n, t in d.state_dict().items())
    assert drafter_for(back.cfg) is DFlash2Drafter and drafter_for(tiny_drafter_config(model)) is Drafter


def test_fresh_convolutions_are_the_identity():
    """Identity-initialised convolutions: a fresh DFlash2 drafter computes its DFlash backbone."""
    model = tiny_target()
    torch.manual_seed(0)
    d2 = DFlash2Drafter(tiny_drafter_config(model, **DFLASH2)).double()
    d1 = Drafter(tiny_drafter_config(model)).double()
    d1.load_state_dict({k: v for k, v in d2.state_dict().items() if k in d1.state_dict()})
    x = torch.randn(2, 8, model.config.hidden_size, dtype=torch.float64)
    pos = torch.arange(8).expand(2, 8)
    torch.testing.assert_close(d2.block_forward(x, pos, _passthrough), d1.block_forward(x, pos, _passthrough))


def test_convolutions_mix_positions_within_a_block_only():
    model = tiny_target()
    d = tiny_dflash2_drafter(model).double()
    B, H = 4, model.config.hidden_size
    x = torch.randn(1, 3 * B, H, dtype=torch.float64)
    pos = torch.arange(3 * B)[None]
    together = d.block_forward(x, pos, _passthrough, block_len=B)
    apart = torch.cat(
        [d.block_forward(x[:, k * B : (k + 1) * B], pos[:, k * B : (k + 1) * B], _passthrough) for k in range(3)], dim=1
    )
    torch.testing.assert_close(together, apart)
    # and within a block they do mix: a later position moves when an earlier one does
    y = x.clone()
    y[:, 0] += 1.0
    moved = d.block_forward(y, pos, _passthrough, block_len=B)
    assert not torch.allclose(moved[:, 1], together[:, 1]) and torch.allclose(moved[:, B:], together[:, B:])
