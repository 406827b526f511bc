"""The package's layout holds: imports point one way, through each subpackage's public face.

Every import statement of every module is read (inside functions too, where cycles hide).
Four rules:

1. **Direction.** A subpackage imports only from subpackages below it in ``ORDER``; a
   module of the top-level (``cli``, ``_cli``) may import anything. At the bottom sit two single
   modules that import nothing of ours (``LEAVES``: ``logs``, ``errors``), which every layer may use.
2. **Faces.** From another subpackage, import what its ``__init__`` lists in ``__all__``
   (``from dflash_trt.ingest import validate_pair``), never one of its modules
   (``from dflash_trt.ingest.compat import ...``); a leaf module is its own face.
3. **No cycles** between modules, counting imports inside functions.
4. **Imports at module top** in every module of the package, unless the import says why it waits
   (``WHY``): ``# start-up: torch`` (a heavy import the command may not need),
   ``# optional: onnx`` (a dependency that may be absent), ``# cycle: ...`` (a cycle it breaks).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dflash_trt

ROOT = Path(dflash_trt.__file__).parent
# Top to bottom: each may import from the ones after it, never before.
ORDER = [
    "bench",
    "train",
    "serve",
    "deploy",
    "export",
    "runtime",
    "plan",
    "ingest",
    "model",
    "plugins",
    "logs",
    "errors",
]
# Single modules, not packages: each imports nothing of ours and is its own face.
LEAVES = ("logs", "errors")
TOP = {"cli", "_cli", "__main__", "__init__"}
WHY = ("# start-up:", "# optional:", "# cycle:")


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(["dflash_trt", *parts])] = path
    return out


def imports(path: Path, name: str) -> list[tuple[int, str, list[str]]]:
    """(line, imported module, names) for every import of ours in the file, at any depth."""
    found = []
    pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, []) for a in node.names if a.name.startswith("dflash_trt")]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                mod = ".".join(base + ([mod] if mod else []))
            if mod == "dflash_trt":  # from dflash_trt import ingest: the subpackage itself
                found += [(node.lineno, f"dflash_trt.{a.name}", []) for a in node.names if a.name != "__version__"]
            elif mod.startswith("dflash_trt"):
                found.append((node.lineno, mod, [a.name for a in node.names]))
    return found


def stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def resolve_targets(mod: str, names: list[str], known: dict[str, Path]) -> list[str]:
    """The modules an import really loads: ``from pkg import submodule`` counts as the submodule."""
    subs = [f"{mod}.{n}" for n in names if f"{mod}.{n}" in known]
    return subs or [mod]


MODS = modules()


def test_every_stage_is_a_package_with_a_public_face():
    stages = [s for s in ORDER if s not in LEAVES]
    for s in stages:
        init = ROOT / s / "__init__.py"
        assert init.exists(), f"{s}/ has no __init__.py"
        assert ast.get_docstring(ast.parse(init.read_text())), f"{s}/__init__.py has no docstring"
    for s in stages:
        module = __import__(f"dflash_trt.{s}", fromlist=["__all__"])
        assert module.__all__, f"dflash_trt.{s} exports nothing"
        missing = [n for n in module.__all__ if not hasattr(module, n) and not (ROOT / s / f"{n}.py").exists()]
        assert not missing, f"dflash_trt.{s}.__all__ names what it does not define: {missing}"


@pytest.mark.parametrize("name", sorted(MODS))
def test_imports_point_down_and_through_faces(name):
    src = stage(name)
    problems = []
    for line, mod, names in imports(MODS[name], name):
        dst = stage(mod)
        if dst == src:
            continue
        if dst in TOP and src not in TOP:
            problems.append(f"line {line}: {src} imports the CLI ({mod})")
            continue
        if src not in TOP and ORDER.index(dst) < ORDER.index(src):
            problems.append(f"line {line}: {src} imports {mod}, which sits above it ({' > '.join(ORDER)})")
        face = f"dflash_trt.{dst}"
        if dst not in (*LEAVES, *TOP):
            if mod != face:
                problems.append(f"line {line}: {src} reaches inside {dst} ({mod}); import from {face}")
            else:
                public = getattr(__import__(face, fromlist=["__all__"]), "__all__", [])
                hidden = [n for n in names if n not in public]
                if hidden:
                    problems.append(f"line {line}: {face} does not export {hidden}")
    assert not problems, f"{MODS[name]}:\n  " + "\n  ".join(problems)


def test_no_import_cycles():
    graph = {m: set() for m in MODS}
    for name, path in MODS.items():
        for _, mod, names in imports(path, name):
            for target in resolve_targets(mod, names, MODS):
                if target in graph and target != name:
                    graph[name].add(target)
    # a package __init__ re-exporting its own modules is not a cycle of theirs
    for name in graph:
        graph[name] = {t for t in graph[name] if not (name.startswith(t + ".") and (MODS[t].name == "__init__.py"))}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycle = stack[stack.index(t) :] + [t]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_the_checker_sees_a_planted_violation(tmp_path):
    """The rules above can fail: a model module importing the runtime, and a two-module cycle."""
    a = tmp_path / "a.py"
    a.write_text("def f():\n    from dflash_trt.runtime.loop import generate\n")
    found = imports(a, "dflash_trt.model.a")
    assert found == [(2, "dflash_trt.runtime.loop", ["generate"])]
    assert ORDER.index(stage(found[0][1])) < ORDER.index("model")


def unexplained_late_imports(path: Path) -> list[str]:
    """``line: import`` for each import inside a function that gives no ``WHY`` comment on its lines."""
    text = path.read_text()
    lines = text.splitlines()
    bad = []
    for fn in ast.walk(ast.parse(text, str(path))):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                said = " ".join(lines[node.lineno - 1 : node.end_lineno])
                if not any(why in said for why in WHY):
                    bad.append(f"line {node.lineno}: {ast.unparse(node)}")
    return bad


@pytest.mark.parametrize("name", sorted(MODS))
def test_late_imports_say_why(name):
    bad = unexplained_late_imports(MODS[name])
    assert not bad, (
        f"{MODS[name]}: move these imports to the top, or say why they wait ({', '.join(WHY)}):\n  " + "\n  ".join(bad)
    )


def test_the_late_import_check_sees_a_planted_one(tmp_path):
    """Rule 4 can fail: a function-level import without a reason is found, one with a reason is not."""
    a = tmp_path / "a.py"
    a.write_text(
        "import json\n\n\ndef f():\n    import math\n    import torch  # start-up: torch\n"
        "    from onnx import (  # optional: onnx\n        helper,\n    )\n"
    )
    assert unexplained_late_imports(a) == ["line 5: import math"]
