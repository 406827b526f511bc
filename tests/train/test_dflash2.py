"""train-drafter --arch dflash2: the selector's training term against its walk, and a run end to end."""

from __future__ import annotations

import json

import pytest
import torch

from dflash_trt import plugins
from dflash_trt.cli import run
from dflash_trt.model import DFlash2Drafter
from dflash_trt.train import objective
from tests.helpers import tiny_dflash2_drafter, tiny_target


def _block(drafter, b=2, K=3, seed=0):
    """Random normed hidden states [b, K, B-1, H], logits [b, K, B-1, V] and anchors [b, K]."""
    cfg = drafter.cfg
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(b, K, cfg.block_size - 1, cfg.hidden_size, generator=g, dtype=torch.float64)
    logits = torch.randn(b, K, cfg.block_size - 1, cfg.vocab_size, generator=g, dtype=torch.float64) * 3
    anchors = torch.randint(cfg.vocab_size, (b, K), generator=g)
    return hidden, logits, anchors


def test_teacher_forced_scores_are_the_walks_scores():
    """Fed the walk's own choices as predecessors, the training scores pick what the walk picks,
    with the scores of the dense rewrite of the formula (``plugins.selector.edge_scores``)."""
    drafter = tiny_dflash2_drafter(tiny_target(), block_size=6)
    hidden, logits, anchors = _block(drafter)
    b, K, n, _ = hidden.shape
    sel = drafter.candidate_selector
    with torch.no_grad():
        flat_h, flat_l = hidden.reshape(b * K, n, -1), logits.reshape(b * K, n, -1)
        unary, cand = sel.candidates(flat_l)
        walked, _ = sel.walk(flat_h, unary, cand, anchors.reshape(-1))
        predecessors = torch.cat([anchors.reshape(-1, 1), walked[:, :-1]], 1).view(b, K, n)
        scores, cand2 = objective.selector_scores(drafter, hidden, logits, predecessors)
        picks = cand2.gather(-1, scores.argmax(-1, keepdim=True))[..., 0]
        assert torch.equal(picks.reshape(b * K, n), walked)
        dense = plugins.selector.edge_scores(
            unary,
            cand,
            sel.hidden_projection(flat_h),
            sel.predecessor_codebook,
            sel.successor_codebook,
            anchors.reshape(-1),
        )  # [bK, n, k_prev, k]
        chosen = torch.cat(
            [torch.zeros(b * K, 1, dtype=torch.long), (cand[:, :-1] == walked[:, :-1, None]).long().argmax(-1)], 1
        )  # predecessor's index
        rows = dense.gather(2, chosen[:, :, None, None].expand(-1, -1, 1, dense.shape[-1]))[:, :, 0]
        torch.testing.assert_close(scores.reshape(b * K, n, -1), rows.float(), atol=1e-5, rtol=1e-5)
        # selector_loss lines the predecessors up the same way: labels that are the walk's own
        # tokens are what its teacher-forced picks give back, every one
        block = torch.cat([anchors[..., None], torch.zeros(b, K, n, dtype=torch.long)], -1)
        _, picks = objective.selector_loss(drafter, hidden, logits, block, walked.view(b, K, n), gamma=4.0)
        assert torch.equal(picks, walked.view(b, K, n))


def test_selector_loss_reaches_every_dflash2_weight_and_skips_labels_outside_the_candidates():
    model = tiny_target()
    cfg = objective.drafter_config_for(
        model,
        block_size=4,
        layers=1,
        mask_token_id=95,
        family="dflash2",
        sizes=dict(conv_kernel_size=2, conv_group_size=16, selector_rank=8, selector_top_k=4),
    )
    drafter = objective.init_drafter(cfg).double()
    assert isinstance(drafter, DFlash2Drafter)
    hidden, logits, anchors = _block(drafter, K=2)
    block = torch.cat([anchors[..., None], torch.full((*anchors.shape, 3), 95)], -1)
    _, top = logits.topk(4, -1)
    labels = top[..., 1]  # each label the second candidate
    loss, picks = objective.selector_loss(drafter, hidden, logits, block, labels, gamma=4.0)
    assert loss.item() > 0 and picks.shape == labels.shape
    loss.backward()
    sel = drafter.candidate_selector
    for p in (sel.predecessor_codebook, sel.successor_codebook, sel.hidden_projection.weight):
        assert p.grad is not None and p.grad.abs().sum() > 0
    outside = torch.full_like(labels, int(logits.argmin()) % cfg.vocab_size)
    outside = torch.where((top == outside[..., None]).any(-1), -100, outside)  # never a candidate
    none, _ = objective.selector_loss(drafter, hidden, logits, block, outside, gamma=4.0)
    assert none.item() == 0.0


def _args(root, tdir, out, steps, *extra):
    return [
        "train-drafter",
        "--target",
        str(tdir),
        "--data",
        str(root / "data.txt"),
        "--out",
        str(out),
        "--steps",
        str(steps),
        "--block-size",
        "4",
        "--batch-size",
        "4",
        "--anchors",
        "8",
        "--prompt-len",
        "12",
        "--gen-len",
        "16",
        "--samples",
        "24",
        "--lr",
        "3e-3",
        "--eval-every",
        "6",
        "--save-every",
        "6",
        "--json",
        *extra,
    ]


def test_train_drafter_arch_dflash2_trains_writes_the_published_form_and_resumes(train_setup, capsys):
    from safetensors.torch import load_file

    from dflash_trt import ingest
    from dflash_trt.runtime.loop import generate
    from dflash_trt.runtime.pair import load_pair

    root, tdir = train_setup
    out = root / "d2"
    assert run(_args(root, tdir, out, 12, "--arch", "dflash2", "--selector-rank", "8", "--selector-top-k", "4")) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["step"] == 12 and 1.0 <= summary["heldout_tau"] <= 4.0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["DFlash2DraftModel"]
    assert {
        k: cfg["dflash_config"][k] for k in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
    } == {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 8, "selector_top_k": 4}
    assert json.loads((out / "training.json").read_text())["arch"] == "dflash2"
    weights = load_file(str(out / "model.safetensors"))
    assert weights["candidate_selector.predecessor_codebook"].shape == (96, 8)
    # trained, not left at init: the dynamic kernels moved off zero, the base off the identity
    assert weights["layers.0.attention_conv.kernel_projection.weight"].abs().max() > 0
    base = weights["layers.0.mlp_conv.base_kernel"].float()
    assert (base[:, 0] - 1).abs().max() > 0 or base[:, 1:].abs().max() > 0

    drafter = ingest.load_drafter(out)
    assert isinstance(drafter, DFlash2Drafter)
    pair = load_pair(tdir, out, dtype="float32")
    prompts = [pair.encode("def f3(x):\n"), pair.encode("    return")]
    spec = generate(pair.target, pair.drafter, prompts, max_new_tokens=20)
    ar = generate(pair.target, None, prompts, max_new_tokens=20, block_size=1)
    assert spec.token_ids == ar.token_ids

    # a resume keeps the architecture: another one is refused, the same one continues
    assert run(_args(root, tdir, out, 14, "--resume", "--arch", "dflash")) == 2
    assert "--arch dflash differs from the run's dflash2" in capsys.readouterr().err
    assert run(_args(root, tdir, out, 14, "--resume")) == 0
    assert json.loads(capsys.readouterr().out)["step"] == 14


def test_a_dflash2_run_lowers_its_loss(train_setup):
    from dflash_trt.train.loop import TrainSettings, train_drafter

    root, tdir = train_setup
    res = train_drafter(
        TrainSettings(
            target=str(tdir),
            data=str(root / "data.txt"),
            out=str(root / "d2b"),
            block_size=4,
            steps=12,
            batch_size=4,
            anchors=8,
            prompt_len=12,
            gen_len=16,
            samples=24,
            lr=3e-3,
            eval_every=100,
            save_every=100,
            arch="dflash2",
            selector_rank=8,
            selector_top_k=4,
        )
    )
    assert sum(res.losses[-3:]) / 3 < res.losses[0] - 0.3


def test_fitting_the_selector_alone_moves_its_picks_to_the_labels():
    """With the layers' logits fixed, the selector term alone teaches the walk to pick a label the
    argmax misses (the second candidate at every position): its loss falls and its picks follow."""
    model = tiny_target()
    cfg = objective.drafter_config_for(
        model,
        block_size=4,
        layers=1,
        mask_token_id=95,
        family="dflash2",
        sizes=dict(conv_kernel_size=2, conv_group_size=16, selector_rank=8, selector_top_k=4),
    )
    drafter = objective.init_drafter(cfg)
    hidden, logits, anchors = (t.float() if t.is_floating_point() else t for t in _block(drafter, K=2))
    logits = logits * 0.1  # candidates close enough for the pair term to reorder
    block = torch.cat([anchors[..., None], torch.full((*anchors.shape, 3), 95)], -1)
    labels = logits.topk(4, -1).indices[..., 1]
    sel = drafter.candidate_selector
    opt = torch.optim.Adam(sel.parameters(), lr=0.05)
    first, picks = objective.selector_loss(drafter, hidden, logits, block, labels, gamma=4.0)
    assert not torch.equal(picks, labels)  # at init the walk is the argmax
    for _ in range(60):
        loss, picks = objective.selector_loss(drafter, hidden, logits, block, labels, gamma=4.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < first.item() / 2
    assert (picks == labels).float().mean() > 0.9


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["--arch", "dflash2", "--conv-group-size", "24"],
            "--conv-group-size 24 does not divide the target's hidden size 64",
        ),
        (["--selector-rank", "8"], "--selector-rank size a DFlash2 drafter: add --arch dflash2"),
        (["--arch", "dflash3"], "--arch 'dflash3': choose one of dflash, dflash2"),
        (
            ["--arch", "dflash2", "--selector-top-k", "500"],
            "--selector-top-k 500 must be between 2 and the vocabulary (96)",
        ),
    ],
)
def test_dflash2_user_errors_are_one_line_and_write_nothing(train_setup, tmp_path, capsys, extra, message):
    root, tdir = train_setup
    out = tmp_path / "bad"
    assert run(_args(root, tdir, out, 2, *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (out / "config.json").exists()
