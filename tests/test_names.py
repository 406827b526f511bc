"""Names as defined: a face exports each function under the name it is defined with (so grep and
static tools find it), and within plan/, deploy/ and ingest/ no two public functions share a name
(``plan.make_plan`` and the pipeline's planning step were different functions of one name)."""

from __future__ import annotations

import ast
import importlib
import inspect
from collections import defaultdict
from pathlib import Path

import pytest

import dflash_trt

ROOT = Path(dflash_trt.__file__).parent
FACES = ["bench", "train", "serve", "deploy", "export", "runtime", "plan", "ingest", "model", "plugins"]
UNIQUE_IN = ("plan", "deploy", "ingest")


@pytest.mark.parametrize("face", FACES)
def test_faces_export_functions_under_their_own_names(face):
    module = importlib.import_module(f"dflash_trt.{face}")
    renamed = [
        f"{n} is {o.__module__}.{o.__name__}"
        for n in module.__all__
        if inspect.isfunction(o := getattr(module, n, None)) and o.__name__ != n
    ]
    assert not renamed, renamed


def test_one_function_per_name_in_plan_deploy_and_ingest():
    where: dict[str, list[str]] = defaultdict(list)
    for sub in UNIQUE_IN:
        for path in sorted((ROOT / sub).glob("*.py")):
            if path.name == "trtllm_judge.py":  # copied into every bundle and run alone: it imports nothing of ours
                continue
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                    where[node.name].append(f"{sub}/{path.name}")
    shared = {n: w for n, w in where.items() if len(w) > 1}
    assert not shared, shared
