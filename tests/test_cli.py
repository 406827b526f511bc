"""End-to-end CLI: generate/bench/recipes on a tiny pair on disk; user errors exit 2 in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from dflash_trt.cli import run
from tests.helpers import hf_greedy


def test_generate_json_is_lossless(tiny_pair_dir, capsys):
    tdir, ddir = tiny_pair_dir
    code = run(
        [
            "generate",
            "--target",
            str(tdir),
            "--drafter",
            str(ddir),
            "--prompt",
            "def f(x):",
            "--max-tokens",
            "20",
            "--json",
        ]
    )
    assert code == 0
    res = json.loads(capsys.readouterr().out)
    for key in (
        "text",
        "token_ids",
        "acceptance_length",
        "per_position_acceptance",
        "target_forwards",
        "tokens_per_second",
    ):
        assert key in res
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tdir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(tdir)
    prompt = tok("def f(x):")["input_ids"]
    want = hf_greedy(model, prompt, 20)
    # The runtime stops at eos; transformers was told not to: compare up to the stop.
    if 2 in want:
        want = want[: want.index(2) + 1]
    assert res["token_ids"] == want
    assert res["text"] == tok.decode(want, skip_special_tokens=True)
    assert len(res["per_position_acceptance"]) == 7


def test_generate_text_and_stats_line(tiny_pair_dir, capsys):
    tdir, ddir = tiny_pair_dir
    assert (
        run(
            [
                "generate",
                "-t",
                str(tdir),
                "-d",
                str(ddir),
                "-p",
                "hello",
                "-n",
                "8",
                "--temperature",
                "0.8",
                "--seed",
                "1",
            ]
        )
        == 0
    )
    cap = capsys.readouterr()
    assert "τ" in cap.err and "target forwards" in cap.err


def test_bench_json(tiny_pair_dir, tmp_path, capsys):
    tdir, ddir = tiny_pair_dir
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "import os"}\n{"prompt": "class A:"}\n')
    assert run(["bench", "-t", str(tdir), "-d", str(ddir), "--prompts", str(prompts), "-n", "16", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["lossless"] is True and r["prompts"] == 2
    assert r["dflash"]["new_tokens"] == r["autoregressive"]["new_tokens"]
    assert 1.0 <= r["acceptance_length"] <= 8
    assert r["speedup"] > 0 and r["step"]["step_cost_ratio"] >= 1.0


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["generate", "--prompt", "x", "--drafter", "/nonexistent"], "--drafter needs --target"),
        (["generate", "--prompt", "x", "--target", "/nonexistent", "--drafter", "/nonexistent"], "no such directory"),
        (["generate"], "Missing option"),
        (["generate", "-p", "x", "--top-k", "-1"], "top-k"),
        (
            ["bench", "--prompts", "/nonexistent/file", "-t", "embedded:tiny/target", "-d", "embedded:tiny/drafter"],
            "does not exist",
        ),
        (["recipes", "show", "no-such-recipe"], "no recipe"),
        (["frobnicate"], "No such command"),
    ],
)
def test_user_errors_are_one_line_exit_2(argv, needle, capsys):
    assert run(argv) == 2
    errtext = capsys.readouterr().err.strip()
    assert needle.lower() in errtext.lower()
    assert len(errtext.splitlines()) == 1 and "Traceback" not in errtext


def test_block_size_above_trained_is_refused(tiny_pair_dir, capsys):
    tdir, ddir = tiny_pair_dir
    assert run(["generate", "-t", str(tdir), "-d", str(ddir), "-p", "x", "-b", "16"]) == 2
    assert "exceeds the drafter's trained block size" in capsys.readouterr().err


def test_console_entry_point_runs_as_module():
    proc = subprocess.run([sys.executable, "-m", "dflash_trt", "generate"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_triton_kernels_give_the_same_tokens_as_reference(tiny_pair_dir, capsys):
    tdir, ddir = tiny_pair_dir
    runs = {}
    for kernels in ("lean", "triton"):
        assert (
            run(
                [
                    "generate",
                    "-t",
                    str(tdir),
                    "-d",
                    str(ddir),
                    "-p",
                    "for i in",
                    "-n",
                    "12",
                    "--kernels",
                    kernels,
                    "--json",
                ]
            )
            == 0
        )
        runs[kernels] = json.loads(capsys.readouterr().out)
    assert runs["triton"]["token_ids"] == runs["lean"]["token_ids"]
    assert runs["triton"]["per_position_acceptance"] == runs["lean"]["per_position_acceptance"]


def test_library_warnings_never_push_a_refusal_past_one_line(monkeypatch, capsys):
    """A command that warns through transformers' logger and Python warnings, then refuses."""
    import logging
    import warnings

    from dflash_trt._cli import inspect as inspect_cmd
    from dflash_trt.errors import CheckpointError

    def chatty(*a, **k):
        logging.getLogger("transformers.modeling_utils").warning("some library warning")
        warnings.warn("modelopt: transformers version untested", UserWarning, stacklevel=2)
        raise CheckpointError("the one line")

    monkeypatch.setattr(inspect_cmd, "inspect", chatty, raising=False)
    monkeypatch.setattr("dflash_trt.ingest.read_drafter", chatty)
    monkeypatch.setattr("dflash_trt.ingest.is_drafter", lambda p: True)
    code = run(["inspect", "."])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.splitlines() == ["error: the one line"], err


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    from dflash_trt._cli import recipes as recipes_cmd

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("dflash_trt.plan.bundled_recipes", interrupted)
    code = run(["recipes", "list"])
    err = capsys.readouterr().err.strip()
    assert code == 130 and err == "interrupted", err
    assert recipes_cmd  # the command module the patch reaches


def test_generate_honours_the_context_as_the_server_does(capsys, tmp_path):
    """Issue 27: generate refused nothing; the server answers 400 context_length_exceeded."""
    long = "word " * 2100  # the tiny target's context is 2048 tokens
    assert run(["generate", "-p", long, "-n", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "context is 2048 tokens" in err
    assert run(["generate", "-p", "hello", "-n", "5000"]) == 2
    assert "pass -n" in capsys.readouterr().err
    out = tmp_path / "b"
    assert run(["build", "-o", str(out), "--set", "serving.max_seq_len=64"]) == 0
    capsys.readouterr()
    assert run(["generate", str(out), "-p", "hello", "-n", "64"]) == 2  # the bundle's planned context
    assert "context of 64 tokens" in capsys.readouterr().err


def test_the_old_kernels_spelling_is_an_unknown_choice(capsys):
    """``--kernels reference`` named the opposite of what ran (the lean path): removed, one line, exit 2."""
    assert run(["generate", "-p", "hi", "-n", "1", "--kernels", "reference"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--kernels 'reference': choose one of lean, triton" in err, err
