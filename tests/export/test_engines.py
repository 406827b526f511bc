"""The standalone path's build: a target family whose cache the target graph cannot carry is
refused in one line, with nothing written; the engine profile follows the recipe's serving limits."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("onnx")
pytest.importorskip("onnxscript")

from dflash_trt.cli import run
from dflash_trt.export import engines
from dflash_trt.plan.recipe import ServingSpec
from tests.helpers import char_tokenizer, tiny_drafter


def _sliding_pair(root):
    """A tiny Qwen3 target whose first layer is sliding-window, and a drafter for it."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        use_sliding_window=True,
        sliding_window=16,
        max_window_layers=1,
        layer_types=["sliding_attention"] + ["full_attention"] * 3,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = Qwen3ForCausalLM(cfg).eval()
    tdir, ddir = root / "target", root / "drafter"
    model.save_pretrained(tdir, safe_serialization=True)
    char_tokenizer().save_pretrained(tdir)
    tiny_drafter(model.float()).save(ddir)
    return tdir, ddir


def test_a_sliding_window_target_is_refused_in_one_line(tmp_path, capsys):
    tdir, ddir = _sliding_pair(tmp_path)
    capsys.readouterr()  # save_pretrained's progress bar is not the build's
    out = tmp_path / "out"
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
                "serving.max_seq_len=256",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert "does not export to target.onnx" in err and "sliding-window" in err and "without --graphs" in err
    assert len(err.splitlines()) == 1
    assert not out.exists() and not list(tmp_path.glob(".out.partial*"))


def test_the_profile_follows_the_serving_limits():
    p = engines.profile_for(ServingSpec(max_batch_size=6, max_seq_len=300, max_num_tokens=128), 10)
    assert (p.max_batch, p.max_tokens, p.max_seq_len, p.block_size) == (6, 128, 310, 10)
    assert (p.page_size, p.max_pages_per_seq, p.max_pages) == (16, 19, 6 * 19)
    r = engines.dim_ranges(p)
    assert r["past"] == (0, 309, 309) and r["batch"] == (1, 6, 6) and r["tokens"][2] == 128


def test_the_device_script_imports_and_helps():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "bench" / "engines.py"
    out = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--backends" in out.stdout and "--bundle" in out.stdout
