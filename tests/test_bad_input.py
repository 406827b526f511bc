"""One line on stderr and exit 2 for every bad-input class of issue 27 (text that is not UTF-8,
files that are not regular files, wrong types and out-of-range or non-finite numbers in recipes,
--set, data files), run in-process through ``dflash_trt.cli.run``."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from dflash_trt.cli import run
from dflash_trt.plan import recipe as R


def _one_line(capsys, code) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def _tiny_recipe(tmp_path: Path, **speculative) -> Path:
    data = yaml.safe_load(R.bundled_recipes()["tiny"].read_text())
    data["speculative"] = {**data.get("speculative", {}), **speculative}
    f = tmp_path / "r.yaml"
    f.write_text(yaml.safe_dump(data))
    return f


def _nan_acceptance(tmp_path: Path) -> Path:
    """The tiny recipe with ``acceptance: .nan`` (YAML's NaN, which ``yaml.safe_dump`` never writes)."""
    f = _tiny_recipe(tmp_path)
    text, n = re.subn(r"(?m)^(\s+acceptance:) \S+$", r"\1 .nan", f.read_text())
    assert n == 1, "the tiny recipe has one speculative.acceptance line"
    f.write_text(text)
    return f


def _bench_report(levels) -> dict:
    return {"endpoint": {"url": "x", "levels": levels}}


GOOD_LEVEL = {"concurrency": 1, "tokens_per_second_per_user": 50.0, "acceptance_length": 2.0}


CASES = {
    "recipe is not UTF-8": (lambda d: ["plan", str(_bytes(d / "r.yaml", b"name: \xff\xfe\n"))], "not UTF-8"),
    "recipe acceptance below 1": (lambda d: ["plan", str(_tiny_recipe(d, acceptance=0.5))], "acceptance"),
    "recipe per-position acceptance above 1": (
        lambda d: ["plan", str(_tiny_recipe(d, per_position_acceptance=[0.9, 1.5]))],
        "per_position_acceptance",
    ),
    "recipe acceptance NaN": (lambda d: ["plan", str(_nan_acceptance(d))], "finite"),
    "--set per-position acceptance negative": (
        lambda d: ["plan", "--set", "speculative.per_position_acceptance=[-0.1]"],
        "per_position_acceptance",
    ),
    "--set a list where a number goes": (lambda d: ["plan", "--set", "serving.max_batch_size=[1]"], "max_batch_size"),
    "--set an overflowing number": (lambda d: ["plan", "--set", "gpu.count=1e999"], "gpu.count"),
    "prompts not UTF-8": (
        lambda d: ["bench", "--prompts", str(_bytes(d / "p.txt", b"hi\n\xc3\x28\n"))],
        "not UTF-8 text (byte 0xc3 on line 2)",
    ),
    "prompts JSONL line is a list": (
        lambda d: ["bench", "--prompts", str(_bytes(d / "p.txt", b'{"prompt": 1}\n'))],
        "string 'prompt'",
    ),
    "prompts is a FIFO": (lambda d: ["bench", "--prompts", str(_fifo(d / "p.txt"))], "not a regular file"),
    "calibration not UTF-8": (lambda d: ["plan", "--calibration", str(_bytes(d / "c.json", b"\xff"))], "not UTF-8"),
    "calibration concurrency is a word": (
        lambda d: [
            "plan",
            "--calibration",
            str(_json(d / "c.json", _bench_report([{**GOOD_LEVEL, "concurrency": "four"}]))),
        ],
        "concurrency is 'four'",
    ),
    "calibration acceptance below 1": (
        lambda d: [
            "plan",
            "--calibration",
            str(_json(d / "c.json", _bench_report([{**GOOD_LEVEL, "acceptance_length": 0.3}]))),
        ],
        "acceptance_length is 0.3",
    ),
    "calibration rate is NaN": (
        lambda d: [
            "plan",
            "--calibration",
            str(
                _bytes(
                    d / "c.json",
                    json.dumps(_bench_report([{**GOOD_LEVEL, "tokens_per_second_per_user": float("nan")}])).encode(),
                )
            ),
        ],
        "tokens_per_second_per_user is nan",
    ),
    "generate temperature NaN": (lambda d: ["generate", "-p", "hi", "--temperature", "nan"], "temperature"),
    # issue 41: every integer has a range, whatever its digit count; depth past the parsers' recursion
    "--set a 30-digit GPU count": (lambda d: ["plan", "--set", "gpu.count=" + "9" * 30], "less than or equal to 4096"),
    "--set a 5000-digit batch": (lambda d: ["plan", "--set", "serving.max_batch_size=" + "9" * 5000], "digits"),
    "--set a schedule key past any batch": (
        lambda d: ["plan", "--set", "speculative.draft_len_schedule={99999999999: 3}"],
        "draft_len_schedule",
    ),
    "recipe nested 5000 deep": (
        lambda d: ["plan", str(_bytes(d / "r.yaml", b"name: " + b"[" * 5000 + b"]" * 5000))],
        "nested too deeply",
    ),
    "calibration concurrency 10**30": (
        lambda d: [
            "plan",
            "--calibration",
            str(_json(d / "c.json", _bench_report([{**GOOD_LEVEL, "concurrency": 10**30}]))),
        ],
        "in [1, 65536]",
    ),
    "train 30-digit steps": (
        lambda d: [
            "train-drafter",
            "--target",
            "embedded:tiny/target",
            "--data",
            str(_bytes(d / "t.txt", b"def f(x):\n    return x\n")),
            "--out",
            str(d / "o"),
            "--steps",
            "9" * 30,
        ],
        "--steps",
    ),
    "train --regen-endpoint without a scheme": (  # found by the fuzzer: refused after a progress line
        lambda d: _small_run(d, "--regen-endpoint", "9" * 19),
        "not an http:// or https:// URL",
    ),
    "train --regen-endpoint a lone surrogate": (  # found by the fuzzer: a bug line (exit 1)
        lambda d: _small_run(d, "--regen-endpoint", "\udcff"),
        "not an http:// or https:// URL",
    ),
    "train --feature-cache a FIFO": (  # found by the fuzzer: refused only after regeneration had run
        lambda d: _small_run(d, "--feature-cache", str(_fifo(d / "fifo"))),
        "exists and is not a directory",
    ),
}


def _bytes(f: Path, data: bytes) -> Path:
    f.write_bytes(data)
    return f


def _json(f: Path, obj) -> Path:
    f.write_text(json.dumps(obj))
    return f


def _small_run(d: Path, *extra: str) -> list[str]:
    """A train-drafter run small enough to reach regeneration at once, plus ``extra``."""
    data = _bytes(d / "t.txt", b"def f(x):\n    return x\n")
    small = ["--steps", "1", "--batch-size", "1", "--samples", "2", "--prompt-len", "4", "--gen-len", "2"]
    return [
        "train-drafter",
        "--target",
        "embedded:tiny/target",
        "--data",
        str(data),
        "--out",
        str(d / "o"),
        *small,
        *extra,
    ]


def _fifo(f: Path) -> Path:
    os.mkfifo(f)
    return f


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_and_exit_2(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv, needle = CASES[case]
    err = _one_line(capsys, run(argv(tmp_path)))
    assert needle in err, err


def _choices(model, prefix=()):
    """(key path, choice) for every string choice (a Literal) of the recipe model, found by walking it."""
    import typing

    for name, field in model.model_fields.items():
        stack = [field.annotation]
        while stack:
            t = stack.pop()
            if isinstance(t, type) and issubclass(t, BaseModel):
                yield from _choices(t, (*prefix, name))
            elif typing.get_origin(t) is typing.Literal:
                yield from (((*prefix, name), c) for c in typing.get_args(t) if isinstance(c, str))
            else:
                stack.extend(typing.get_args(t))


def test_every_recipe_choice_accepts_any_case():
    found = list(_choices(R.Recipe))
    assert {("precision", "weights"), ("speculative", "attention_backend"), ("parallel", "tp")} <= {k for k, _ in found}
    base = yaml.safe_load(R.bundled_recipes()["tiny"].read_text())
    for keys, choice in found:
        for spelling in {choice.upper(), choice.lower(), choice.title()}:
            recipe = R.recipe_from_dict(base, overrides=[f"{'.'.join(keys)}={spelling}"])
            node = recipe
            for k in keys:
                node = getattr(node, k)
            expected = choice == "tensorrt" if keys == ("engine",) else choice
            assert (recipe.graphs if keys == ("engine",) else node) == expected, (keys, spelling)


def test_precision_flag_in_any_case(capsys):
    assert run(["plan", "--precision", "BF16"]) == 0, capsys.readouterr().err
    assert "bf16 weights" in capsys.readouterr().out
    err = _one_line(capsys, run(["plan", "--precision", "bf17"]))
    assert "--precision 'bf17'" in err
