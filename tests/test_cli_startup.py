"""Commands that read YAML/JSON, or refuse a bad path, never import torch or transformers' model
code: a newcomer's `recipes list`, `plan`, `build --dry-run` and typo'd paths answer in about a
second (docs/design/pipeline.md, "Start-up"). Checked on ``sys.modules`` in a fresh interpreter, not on a clock."""

from __future__ import annotations

import json
import subprocess
import sys

# (argv, exit code): every command here must leave torch and transformers' modeling code unloaded
LIGHT = [
    (["recipes", "list"], 0),
    (["recipes", "show", "tiny"], 0),
    (["recipes", "validate", "qwen3-8b-h100-fp8"], 0),
    (["plan", "tiny"], 0),
    (["plan", "qwen3-8b-h100-fp8", "--json"], 0),
    (["build", "--dry-run"], 0),
    (["inspect", "{recipes}/configs/Qwen--Qwen3-8B"], 0),
    (["generate", "/nonexistent", "-p", "hi"], 2),
    (["generate", "--target", "embedded:nope", "--drafter", "embedded:tiny/drafter", "-p", "hi"], 2),
    (["bench", "/nonexistent"], 2),
    (["bench", "--target", "/nonexistent", "--drafter", "/nonexistent2", "--prompts", "x"], 2),
    (["serve", "/nonexistent"], 2),
    (["tune", "/nonexistent"], 2),
    (["verify", "/nonexistent"], 2),
    (["inspect", "/nonexistent"], 2),
    (["build", "--target", "/nonexistent", "--drafter", "/nonexistent2"], 2),
]

HEAVY = ("torch", "transformers.modeling_utils")

SCRIPT = f"""
HEAVY = {HEAVY!r}
import contextlib, io, json, sys
from pathlib import Path
import dflash_trt
from dflash_trt.cli import run
recipes = str(Path(dflash_trt.__file__).parent / "recipes")
for argv, code in json.loads(sys.argv[1]):
    argv = [a.replace("{{recipes}}", recipes) for a in argv]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as e:
        rc = run(argv)
    heavy = [m for m in HEAVY if m in sys.modules]
    print(json.dumps({{"argv": argv, "rc": rc, "want": code, "heavy": heavy, "stderr": e.getvalue()}}))
    if heavy:
        break
"""


def test_light_commands_import_no_torch():
    r = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(LIGHT)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(rows) == len(LIGHT), rows[-1]
    for row in rows:
        assert not row["heavy"], f"{row['argv']} imported {row['heavy']}"
        assert row["rc"] == row["want"], row
        if row["want"] == 2:  # a refusal is exactly one line, no blank line first
            assert row["stderr"].count("\n") == 1 and row["stderr"].startswith("error: "), row
