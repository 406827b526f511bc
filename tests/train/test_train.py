"""Drafter training: the mask, train/inference consistency, data, and train-drafter end to end."""

from __future__ import annotations

import json

import pytest
import torch

from dflash_trt.cli import run
from dflash_trt.errors import DFlashError
from dflash_trt.model.drafter import Drafter
from dflash_trt.train import data, objective

# Tiny matrices: one thread avoids OpenMP stalls on a shared CPU (10x faster here).
from tests.helpers import char_tokenizer, tiny_dflash2_drafter, tiny_drafter, tiny_target, wrap

# ---------------------------------------------------------------------------------------
# The training mask
# ---------------------------------------------------------------------------------------


def test_block_cannot_see_later_context_or_other_blocks():
    T_, B = 12, 4
    anchors = torch.tensor([[3, 7]])
    vis = objective.training_visibility(anchors, T_, B)[0]  # [K*B, T + K*B]
    assert vis.shape == (2 * B, T_ + 2 * B)
    for k, a in enumerate([3, 7]):
        rows = vis[k * B : (k + 1) * B]
        # context strictly before the anchor, nothing at or after it
        assert rows[:, :a].all()
        assert not rows[:, a:T_].any()
        # its own block, bidirectionally; no other block
        own = slice(T_ + k * B, T_ + (k + 1) * B)
        other = slice(T_ + (1 - k) * B, T_ + (2 - k) * B)
        assert rows[:, own].all()
        assert not rows[:, other].any()


def test_causal_and_window_masks_follow_the_runtime_rules():
    vis = objective.training_visibility(torch.tensor([[5]]), 8, 4, causal=True)[0]
    assert torch.equal(vis[:, 8:], torch.tril(torch.ones(4, 4, dtype=torch.bool)))
    win = objective.training_visibility(torch.tensor([[5]]), 8, 4, window=3)[0]
    # query t at position 5+t sees context j only if 5+t-j < 3 (and j < 5)
    assert win[0, :8].nonzero().flatten().tolist() == [3, 4]
    assert win[2, :8].nonzero().flatten().tolist() == []


def _target_hidden(model, drafter, ids):
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
    return torch.cat([out.hidden_states[i + 1] for i in drafter.cfg.target_layer_ids], -1)


@pytest.mark.parametrize("kind", ["full", "sliding", "dflash2"])
def test_training_forward_equals_inject_then_draft(kind):
    """The guarantee that training optimises what inference runs: same hidden states (DFlash2: its
    convolutions stay inside each of the blocks training lays back to back)."""
    model = tiny_target(layers=4)
    extra = {} if kind == "full" else dict(layer_types=["sliding_attention", "full_attention"], sliding_window=6)
    if kind == "dflash2":
        drafter = tiny_dflash2_drafter(model, block_size=8, layers=2, causal=False, **extra)
    else:
        drafter = tiny_drafter(model, block_size=8, layers=2, **extra)
    target = wrap(model, drafter)
    L = 30
    ids = torch.randint(3, 90, (2, L), generator=torch.Generator().manual_seed(0))
    target_hidden = _target_hidden(model, drafter, ids)
    anchors = torch.tensor([[1, 7, 12, 20], [4, 5, 16, 22]])
    block, _ = objective.block_inputs(ids, anchors, 8, drafter.cfg.mask_token_id, torch.tensor([L, L]))
    emb = target.embed(block.view(2, -1)).view(2, 4, 8, -1)
    trained = objective.train_forward(drafter, target_hidden, emb, anchors)
    for i in range(2):
        for k, a in enumerate(anchors[i].tolist()):
            cache = drafter.new_cache(1)
            drafter.inject(target_hidden[i : i + 1, :a], torch.tensor([a]), cache)
            inferred = drafter.draft(target.embed(block[i : i + 1, k]), cache)
            torch.testing.assert_close(trained[i, k], inferred[0], atol=1e-5, rtol=1e-5)


def test_training_forward_depends_only_on_context_before_the_anchor():
    model = tiny_target(layers=4)
    drafter = tiny_drafter(model, block_size=4, layers=1)
    target = wrap(model, drafter)
    ids = torch.randint(3, 90, (1, 20), generator=torch.Generator().manual_seed(1))
    target_hidden = _target_hidden(model, drafter, ids)
    anchors = torch.tensor([[6, 12]])
    block, _ = objective.block_inputs(ids, anchors, 4, drafter.cfg.mask_token_id, torch.tensor([20]))
    emb = target.embed(block.view(1, -1)).view(1, 2, 4, -1)
    base = objective.train_forward(drafter, target_hidden, emb, anchors)
    changed = target_hidden.clone()
    changed[:, 6:] += 1.0  # later context: block 0 must not move, block 1 must
    emb2 = emb.clone()
    emb2[:, 1] += 1.0  # another block's inputs: block 0 must not move
    again = objective.train_forward(drafter, changed, emb2, anchors)
    torch.testing.assert_close(again[:, 0], base[:, 0])
    assert not torch.allclose(again[:, 1], base[:, 1])


def test_block_inputs_and_loss_weights():
    tokens = torch.arange(10, 20)[None]
    block, labels = objective.block_inputs(tokens, torch.tensor([[2, 7]]), 4, 99, torch.tensor([10]))
    assert block.tolist() == [[[12, 99, 99, 99], [17, 99, 99, 99]]]
    assert labels.tolist() == [[[13, 14, 15], [18, 19, -100]]]
    assert [objective.loss_gamma(b) for b in (8, 10, 16)] == [4.0, 5.0, 7.0]
    assert objective.default_layer_ids(36) == [1, 9, 17, 25, 33]
    assert objective.default_layer_ids(8) == [1, 3, 5]
    assert [objective.default_layer_ids(n) for n in (1, 2, 3, 4)] == [[0], [0], [1], [1]]
    # a perfect prediction at every position gives tau = B and zero-ish loss
    logits = torch.nn.functional.one_hot(labels.clamp_min(0), 100).float() * 30
    loss, m = objective.block_loss(logits, labels, 4.0)
    assert loss.item() < 1e-6 and m["tau"] == 4.0


def test_anchors_stay_in_the_response():
    g = torch.Generator().manual_seed(0)
    anchors, valid = data.sample_anchors(torch.tensor([20, 6]), torch.tensor([8, 5]), 50, g)
    a0 = anchors[0][valid[0]]
    assert a0.min() >= 8 and a0.max() <= 18 and len(a0) == 11 and len(set(a0.tolist())) == 11
    # a response too short to hold a label: anchors fall back to the whole sequence
    assert anchors[1][valid[1]].tolist() == [1, 2, 3, 4]


# ---------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------


def test_read_data_forms(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"prompt": "a b"}\n\n{"prompt": "c"}\n')
    assert data.read_data(tmp_path / "p.jsonl") == (["a b", "c"], [])
    (tmp_path / "t.txt").write_text("some text\n")
    assert data.read_data(tmp_path / "t.txt") == ([], ["some text\n"])
    folder = tmp_path / "dir"
    (folder / "sub").mkdir(parents=True)
    (folder / "b.py").write_text("x = 1\n")
    (folder / "sub" / "a.txt").write_text("y = 2\n")
    (folder / "blob.bin").write_bytes(b"\x00\xff\x00")
    assert data.read_data(folder) == ([], ["x = 1\n", "y = 2\n"])
    (tmp_path / "bad.jsonl").write_text('{"text": "no prompt"}\n')
    with pytest.raises(DFlashError, match="prompt"):
        data.read_data(tmp_path / "bad.jsonl")
    with pytest.raises(DFlashError, match="no such"):
        data.read_data(tmp_path / "missing")


def test_build_prompts_cuts_text_into_windows():
    tok = char_tokenizer()
    prompts = data.build_prompts(tok, ["hello"], ["abcdefghij" * 3], prompt_len=4, gen_len=6, max_samples=100, seed=0)
    assert sorted(map(len, prompts)) == [4, 4, 4, 4]
    assert any(p == tok("abcd", add_special_tokens=False)["input_ids"] for p in prompts)


def test_window_stride_draws_overlapping_windows():
    """--window-stride: windows start every N tokens instead of every prompt_len + gen_len."""
    tok = char_tokenizer()
    text = "abcdefghij" * 3  # 30 tokens
    enc = tok(text, add_special_tokens=False)["input_ids"]
    got = data.build_prompts(tok, [], [text], prompt_len=4, gen_len=6, max_samples=100, seed=0, window_stride=3)
    assert sorted(got) == sorted(enc[s : s + 4] for s in range(0, 28, 3))  # starts 0, 3, ..., 27 (>= 2 tokens)
    default = data.build_prompts(tok, [], [text], prompt_len=4, gen_len=6, max_samples=100, seed=0)
    assert sorted(default) == sorted(enc[s : s + 4] for s in (0, 10, 20))


# ---------------------------------------------------------------------------------------
# train-drafter end to end
# ---------------------------------------------------------------------------------------


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
        "--layers",
        "1",
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
        "3",
        "--json",
        *extra,
    ]


def test_train_drafter_lowers_loss_writes_zlab_and_resumes(train_setup, capsys):
    from dflash_trt import ingest
    from dflash_trt.runtime.loop import generate
    from dflash_trt.runtime.pair import load_pair
    from dflash_trt.train.loop import TrainSettings, train_drafter

    root, tdir = train_setup
    out = root / "trained"
    # the loss falls over a short run (library call, to read every step's loss)
    settings = TrainSettings(
        target=str(tdir),
        data=str(root / "data.txt"),
        out=str(out),
        block_size=4,
        layers=1,
        steps=12,
        batch_size=4,
        anchors=8,
        prompt_len=12,
        gen_len=16,
        samples=24,
        lr=3e-3,
        eval_every=6,
        save_every=3,
    )
    res = train_drafter(settings)
    assert res.step == 12 and len(res.losses) == 12
    assert sum(res.losses[-3:]) / 3 < res.losses[0] - 0.3
    assert res.heldout_tau is not None and 1.0 <= res.heldout_tau <= 4.0

    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["block_size"] == 4
    assert cfg["dflash_config"]["mask_token_id"] == 95 and cfg["dflash_config"]["target_layer_ids"] == [1]
    drafter = ingest.load_drafter(out)
    assert isinstance(drafter, Drafter) and not any(k.startswith("model.") for k in drafter.state_dict())
    pair = load_pair(tdir, out, dtype="float32")
    prompts = [pair.encode("def f3(x):\n"), pair.encode("    return")]
    spec = generate(pair.target, pair.drafter, prompts, max_new_tokens=20)
    ar = generate(pair.target, None, prompts, max_new_tokens=20, block_size=1)
    assert spec.token_ids == ar.token_ids

    # the CLI refuses to overwrite a run, and --resume continues from the saved step
    assert run(_args(root, tdir, out, 15)) == 2
    assert "already holds a training run at step 12" in capsys.readouterr().err
    capsys.readouterr()
    assert run(_args(root, tdir, out, 15, "--resume")) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["step"] == 15
    assert json.loads((out / ".train" / "state.json").read_text())["step"] == 15


def test_resume_matches_an_uninterrupted_run(train_setup):
    from dflash_trt.train.checkpoint import read_state
    from dflash_trt.train.loop import TrainSettings, train_drafter

    root, tdir = train_setup
    common = dict(
        target=str(tdir),
        data=str(root / "data.txt"),
        block_size=4,
        layers=1,
        batch_size=2,
        anchors=4,
        prompt_len=12,
        gen_len=8,
        samples=8,
        eval_prompts=2,
        eval_every=100,
        save_every=2,
    )
    a = root / "a"
    train_drafter(TrainSettings(out=str(a), steps=2, **common))
    res = train_drafter(TrainSettings(out=str(a), steps=4, resume=True, **common))
    assert len(res.losses) == 2  # steps 3 and 4 only
    b = root / "b"
    train_drafter(TrainSettings(out=str(b), steps=4, **common))
    wa, wb = read_state(a / ".train"), read_state(b / ".train")
    assert wa.keys() == wb.keys() and any(k.endswith("exp_avg_sq") for k in wa)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=1e-6, rtol=1e-5)


def test_train_drafter_user_errors(train_setup, tmp_path, capsys):
    root, tdir = train_setup
    assert run(_args(root, tdir, tmp_path / "x", 2, "--resume")) == 2
    assert "no training run to resume" in capsys.readouterr().err
    assert (
        run(
            [
                "train-drafter",
                "--target",
                str(tdir),
                "--data",
                str(tmp_path / "nope"),
                "--out",
                str(tmp_path / "y"),
                "--steps",
                "1",
            ]
        )
        == 2
    )
    assert "--data" in capsys.readouterr().err
    assert (
        run(
            [
                "train-drafter",
                "--target",
                str(tdir),
                "--data",
                str(root / "data.txt"),
                "--out",
                str(tmp_path / "z"),
                "--target-layer-ids",
                "1,9",
            ]
        )
        == 2
    )
    assert "out of range" in capsys.readouterr().err
    assert (
        run(
            [
                "train-drafter",
                "--target",
                str(tdir),
                "--data",
                str(root / "data.txt"),
                "--out",
                str(tmp_path / "z"),
                "--target-layer-ids",
                "1,3",
            ]
        )
        == 2
    )
    assert "last layer (3)" in capsys.readouterr().err
    assert not (tmp_path / "y").exists() and not (tmp_path / "z" / "config.json").exists()


def test_eval_data_measures_heldout_tau_on_other_files(train_setup, tmp_path, monkeypatch, capsys):
    """--eval-data: the held-out τ runs on prompts cut from those files (as --data's windows are
    cut), not on windows held back from --data; training.json says which; a bad path is one line."""
    from transformers import AutoTokenizer

    from dflash_trt.train import loop

    root, tdir = train_setup
    held = tmp_path / "held.txt"
    held.write_text("".join(f"class C{i}:\n    size = {i * 3}\n\n" for i in range(40)))
    seen: list = []
    real = loop.heldout_tau

    def spy(target, drafter, prompts, *args, **kwargs):
        seen.append(prompts)
        return real(target, drafter, prompts, *args, **kwargs)

    monkeypatch.setattr(loop, "heldout_tau", spy)
    s = loop.TrainSettings(
        target=str(tdir),
        data=str(root / "data.txt"),
        out=str(tmp_path / "d"),
        block_size=4,
        layers=1,
        steps=2,
        batch_size=2,
        anchors=4,
        prompt_len=12,
        gen_len=8,
        samples=8,
        eval_prompts=3,
        eval_every=2,
        save_every=2,
        eval_data=str(held),
    )
    res = loop.train_drafter(s)
    tok = AutoTokenizer.from_pretrained(tdir)
    want = loop.eval_prompts(s, tok, data.read_data(held))
    assert len(want) == 3 and seen == [want] and res.heldout_tau is not None
    assert all("class" in tok.decode(p) or "size" in tok.decode(p) for p in want)  # the held-out file's text
    assert json.loads((tmp_path / "d" / "training.json").read_text())["eval_data"] == str(held)
    assert run(_args(root, tdir, tmp_path / "e", 2, "--eval-data", str(tmp_path / "nope"))) == 2
    err = capsys.readouterr().err
    assert "--eval-data" in err and "no such file" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "e").exists()


def test_jsonl_messages_go_through_the_chat_template(tmp_path):
    tok = char_tokenizer()
    tok.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<a>"
    (tmp_path / "c.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{"prompt": "yo"}\n')
    prompts, texts = data.read_data(tmp_path / "c.jsonl")
    assert prompts == [[{"role": "user", "content": "hi"}], "yo"] and texts == []
    ids = data.build_prompts(tok, prompts, [], prompt_len=64, gen_len=4, max_samples=10, seed=0)
    assert sorted(tok.decode(p) for p in ids) == ["<user>hi<a>", tok.decode(tok("yo")["input_ids"])]
    record = data.chat_record(tok, prompts, chat_template=False, thinking=None)
    assert record["chat_template_applied"] and record["enable_thinking"] is None
    (tmp_path / "bad.jsonl").write_text('{"messages": [{"role": "user"}]}\n')
    with pytest.raises(DFlashError, match="'messages' list"):
        data.read_data(tmp_path / "bad.jsonl")
    tok.chat_template = None
    with pytest.raises(DFlashError, match="chat template, and it has none"):
        data.build_prompts(tok, prompts, [], prompt_len=64, gen_len=4, max_samples=10, seed=0)


def test_local_regeneration_batches_by_regen_concurrency_and_gives_the_same_responses(
    train_setup, tmp_path, monkeypatch
):
    """--regen-concurrency sizes the in-process regeneration's batches; wider batches give the
    same greedy responses (a row's tokens never depend on what shares its batch)."""
    import dflash_trt.runtime as runtime
    from dflash_trt.train.loop import TrainSettings, train_drafter

    root, tdir = train_setup
    widths: list[int] = []
    real = runtime.generate
    monkeypatch.setattr(
        runtime, "generate", lambda t, d, ps, **kw: (d is None and widths.append(len(ps))) or real(t, d, ps, **kw)
    )
    journals = {}
    for width in (5, 32):
        out = tmp_path / f"w{width}"
        train_drafter(
            TrainSettings(
                target=str(tdir),
                data=str(root / "data.txt"),
                out=str(out),
                block_size=4,
                layers=1,
                steps=1,
                batch_size=4,
                anchors=8,
                prompt_len=12,
                gen_len=8,
                samples=12,
                eval_every=100,
                save_every=100,
                regen_concurrency=width,
            )
        )
        journals[width] = {f.name: f.read_bytes() for f in (out / ".train" / "regen").iterdir()}
    assert widths[:3] == [5, 5, 2] and widths[3] == 12  # 12 prompts: 5 + 5 + 2, then all at once
    assert journals[5] == journals[32] and journals[5]  # the same regenerated set, byte for byte
