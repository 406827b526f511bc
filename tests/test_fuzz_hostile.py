# ruff: noqa: F811
"""The fuzzing harness, issue 41: every CLI command (listed from the Typer app) and the classes a
hostile user or machine brings, not cases close to the schema. Each option of each command gets a
value of every hostile class (out of range at any digit count, type swaps, depth, names past
NAME_MAX, FIFOs, symlink loops, surrogates, NUL) under a deadline; hostile fragments (depth,
digits, size, type swaps) are spliced into every file the CLI reads; and faults are injected into
``os`` calls while the commands that write run. The property is ``test_fuzz.cli_ok``'s: exit 0
(or verify's 1), or exit 2 with one line and no traceback, nothing outside the output changed;
for the faults also nothing temporary left and a bundle whole or absent.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import strategies as st

from dflash_trt.cli import run
from dflash_trt.deploy import output

# the first harness's helpers, and its fixtures used here by name (built, pair_copy, work: pytest injects
# them; ruff reads the test arguments as shadowing them, hence the file-level F811)
from tests.test_fuzz import TINY, _inspect_with, built, cli_ok, fuzz, pair_copy, work  # noqa: F401


# ---- every CLI surface, listed from the Typer app ---------------------------------------------------
def leaf_commands() -> dict[str, object]:
    """Every command the CLI has ('recipes show', 'train-drafter', ...), read from the Typer app."""
    import typer

    from dflash_trt.cli import app

    out, todo = {}, [((), typer.main.get_command(app))]
    while todo:
        path, cmd = todo.pop()
        subs = getattr(cmd, "commands", None)
        if subs:
            todo.extend(((*path, name), sub) for name, sub in subs.items() if not sub.hidden)
        else:
            out[" ".join(path)] = cmd
    return out


def _small_prompts(root: Path) -> Path:
    f = root / "p.txt"
    if not f.exists():
        f.write_text("def f(x):\n")
    return f


#: a base command line per command that does little work (a dry run, two tokens, a dead endpoint);
#: the harness adds one hostile option value to it. Keys must be every command the CLI has.
BASES = {
    "build": lambda w: ["build", "--dry-run"],
    "plan": lambda w: ["plan"],
    "serve": lambda w: ["serve", str(w["bundle"]), "--dry-run"],
    "generate": lambda w: ["generate", "-p", "hi", "-n", "2"],
    "bench": lambda w: ["bench", "-n", "2", "--prompts", str(_small_prompts(w["root"]))],
    "tune": lambda w: ["tune", str(w["bundle"]), "--dry-run", "--endpoint", "http://127.0.0.1:9/v1", "--requests", "1"],
    "verify": lambda w: ["verify", str(w["bundle"])],
    "inspect": lambda w: ["inspect", "embedded:tiny/drafter", "--target", "embedded:tiny/target"],
    "train-drafter": lambda w: [
        "train-drafter",
        "--target",
        "embedded:tiny/target",
        "--data",
        str(_small_prompts(w["root"])),
        "--out",
        str(w["root"] / "run"),
        "--steps",
        "1",
        "--batch-size",
        "1",
        "--samples",
        "2",
        "--prompt-len",
        "4",
        "--gen-len",
        "2",
    ],
    "version": lambda w: ["version"],
    "recipes list": lambda w: ["recipes", "list"],
    "recipes show": lambda w: ["recipes", "show", "tiny"],
    "recipes validate": lambda w: ["recipes", "validate", "tiny"],
    "recipes copy": lambda w: ["recipes", "copy", "tiny", str(w["root"] / "copied.yaml")],
}


def test_every_command_is_a_fuzz_surface():
    assert set(leaf_commands()) == set(BASES)


def _options(cmd) -> list[str]:
    """The command's value-taking options (flags aside), as the user types them."""
    return sorted(
        p.opts[-1]
        for p in cmd.params
        if p.param_type_name == "option" and not getattr(p, "is_flag", False) and not p.hidden
    )


def hostile_values(root: Path):
    """One value of each hostile class: out of every range whatever its digit count, a type swap,
    depth, size, a name past NAME_MAX, links and special files, bytes no parser expects."""
    fifo, loop, dangling = root / "fifo", root / "loop", root / "dangling"
    if not fifo.exists():
        os.mkfifo(fifo)
        loop.symlink_to(loop)
        dangling.symlink_to(root / "nowhere")
    return st.one_of(
        st.integers(19, 6000).map(lambda n: "9" * n),  # range: huge, any digit count
        st.sampled_from(["-1", "0", "-99999999999999999999", "nan", "inf", "-inf", "1e999", "0x10"]),
        st.sampled_from(["[1, 2]", "{a: 1}", "true", "null", "auto", "AUTO", "1,2,x", ",", ""]),  # type swaps
        st.integers(50, 3000).map(lambda n: "[" * n + "]" * n),  # depth
        st.integers(256, 4096).map(lambda n: "x" * n),  # a name past NAME_MAX
        st.sampled_from([str(fifo), str(loop), str(dangling), "/dev/zero", "/", str(root), "~nosuchuser/x"]),
        st.sampled_from(["\udcff", "a\x00b", "\u202e", "../../etc/passwd", "http://", "embedded:nope"]),
    )


@pytest.fixture(scope="module")
def surfaces(built, tmp_path_factory):
    root = tmp_path_factory.mktemp("surfaces")
    bundle = root / "bundle"
    shutil.copytree(built, bundle)
    return {"root": root, "bundle": bundle}


@contextlib.contextmanager
def _deadline(seconds: int):
    """A command that does not return in ``seconds`` fails the property (a hang is a bug)."""
    import signal

    def hung(*a):
        raise AssertionError(f"no answer in {seconds} s")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("budget", [pytest.param(3, id="small"), pytest.param(30, id="large", marks=pytest.mark.slow)])
@pytest.mark.parametrize("command", sorted(BASES))
def test_fuzz_every_option_with_hostile_values(work, surfaces, command, budget):
    cmd = leaf_commands()[command]
    options = _options(cmd)
    if not options:
        return
    base = BASES[command](surfaces)

    def check(example):
        option, value = example
        if option == "--port":  # the harness never listens: a free port is asked of the OS by the property
            return
        with _deadline(120):
            cli_ok([*base, option, value], surfaces["bundle"], verdicts=(1,) if command == "verify" else ())

    fuzz(budget, st.tuples(st.sampled_from(options), hostile_values(surfaces["root"])), check)


# ---- faults injected into os calls, during the commands that write ---------------------------------
FAULTS = ["sendfile", "replace", "rename", "mkdir", "open", "write", "ftruncate", "unlink", "rmdir", "link"]
ERRNOS = [errno.ENOSPC, errno.EFBIG, errno.ENAMETOOLONG, errno.EACCES, errno.EROFS, errno.EDQUOT]


@contextlib.contextmanager
def os_fault(name: str, code: int, after: int):
    """``os.<name>`` raises ``OSError(code)`` from its ``after``-th call on (the calls before pass)."""
    from unittest import mock

    real, calls = getattr(os, name), [0]

    def faulty(*a, **k):
        calls[0] += 1
        if calls[0] > after:
            raise OSError(code, os.strerror(code), a[0] if a and isinstance(a[0], (str, Path)) else None)
        return real(*a, **k)

    with mock.patch.object(os, name, faulty):
        yield calls


WRITERS = {
    "build": lambda w, out: ["build", "-o", str(out)],
    "build --force": lambda w, out: ["build", "-o", str(out), "--force"],
    "recipes copy": lambda w, out: ["recipes", "copy", "tiny", str(out)],
    "serve --emit": lambda w, out: ["serve", str(w["bundle"]), "--emit", "slurm", "-o", str(out)],
}


def _free(lock: Path) -> bool:
    """No process holds ``lock`` (a writer's flock): a file left by a refused unlink blocks nobody."""
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _residue(work: Path) -> list[Path]:
    """Temporary files, locks and partial builds under ``work`` (outermost first)."""
    return [p for p in sorted(work.rglob("*")) if p.name.endswith((".tmp", ".lock")) or ".partial-" in p.name]


@pytest.mark.parametrize("budget", [pytest.param(8, id="small"), pytest.param(80, id="large", marks=pytest.mark.slow)])
def test_fuzz_os_faults_while_writing(work, surfaces, budget):
    def check(example):
        writer, name, code, after = example
        out = work / "out"
        for p in _residue(work):  # what an earlier example was allowed to leave (a free lock, a kept partial)
            if p.is_dir() and not p.is_symlink():  # is not this one's to answer for
                shutil.rmtree(p)
            elif os.path.lexists(p):  # not inside a partial removed just before
                p.unlink()
        if writer == "build --force" and not (out / "manifest.json").exists():
            shutil.rmtree(out, ignore_errors=True) if out.is_dir() else out.unlink(missing_ok=True)
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                assert run(["build", "-o", str(out)]) == 0
        elif writer != "build --force":
            shutil.rmtree(out, ignore_errors=True) if out.is_dir() else out.unlink(missing_ok=True)
        argv = WRITERS[writer](surfaces, out)
        err = io.StringIO()
        with os_fault(name, code, after), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            result = run(argv)
        text = err.getvalue().strip()
        assert result in (0, 2), (argv, name, code, after, text[-2000:])
        if result == 2:
            assert len(text.splitlines()) == 1 and "Traceback" not in text, (argv, name, text[-2000:])
        left = _residue(work)
        if name in ("unlink", "rmdir"):  # the OS refused the removals themselves: what stays blocks nobody
            _, prefix = output._partial_prefix(out)  # and is what the next writer sweeps (a partial of `out`)
            for p in list(left):
                if p.name.endswith(".lock"):
                    assert _free(p), (argv, name, code, after, p.name)
                    left.remove(p)
                elif p.name.startswith(prefix) and p.name[len(prefix) :].split("-")[0].isdigit():
                    left.remove(p)
        # a build whose last move the OS refused keeps the finished bundle where its one line says; one
        # whose swap was done but whose partial the OS would not remove says so (the next writer sweeps it)
        said = [
            p
            for p in left
            if ".partial-" in p.name
            and (
                result == 2
                and f"kept in {p}" in text
                or result == 0
                and "refused to remove" in text
                and f"{p} (" in text
            )
        ]
        left = [p for p in left if p not in said]
        assert not left, (argv, name, code, after, [p.name for p in left])
        if writer.startswith("build") and out.exists():  # a bundle is whole, absent, or a swap the next writer ends
            if not (out / "manifest.json").is_file():
                assert (out / ".dflash-trt.swap.json").is_file(), (argv, name, code, after)
                assert output.recover(out) and (out / "manifest.json").is_file(), (argv, name, code, after)

    fuzz(
        budget,
        st.tuples(
            st.sampled_from(sorted(WRITERS)), st.sampled_from(FAULTS), st.sampled_from(ERRNOS), st.integers(0, 40)
        ),
        check,
    )


# ---- hostile structure inside the files the CLI reads: depth, size, range, type swaps ---------------
fragments = st.one_of(
    st.integers(100, 5000).map(lambda n: "[" * n + "]" * n),  # depth past the parsers' recursion
    st.integers(100, 3000).map(lambda n: '{"a": ' * n + "1" + "}" * n),
    st.integers(19, 6000).map(lambda n: "9" * n),  # range, any digit count
    st.integers(19, 400).map(lambda n: "-" + "9" * n + ".5e" + "9" * 3),
    st.integers(10_000, 300_000).map(lambda n: '"' + "x" * n + '"'),  # size
    st.sampled_from(["[1]", '["a", 2]', "{}", '"str"', "null", "true", "-1", "0", "1e999", "[[]]"]),  # type swaps
)
PLACEHOLDER = "@@hostile@@"


def splice(data, key_path: list[str], fragment: str, fmt: str) -> str:
    """``data`` with the value at ``key_path`` replaced by the raw ``fragment``, as JSON or YAML text
    (flow-style JSON is YAML too)."""
    data = json.loads(json.dumps(data))
    node = data
    for k in key_path[:-1]:
        node = node.setdefault(k, {}) if isinstance(node.get(k), dict) or k not in node else {}
    node[key_path[-1]] = PLACEHOLDER
    text = json.dumps(data) if fmt == "json" else yaml.safe_dump(data, default_flow_style=True, width=10**9)
    return (
        text.replace(f'"{PLACEHOLDER}"', fragment).replace(f"'{PLACEHOLDER}'", fragment).replace(PLACEHOLDER, fragment)
    )


def _key_paths(data, prefix=()) -> list[list[str]]:
    out = []
    for k, v in data.items() if isinstance(data, dict) else []:
        out.append([*prefix, k])
        out.extend(_key_paths(v, (*prefix, k)))
    return out


@pytest.mark.parametrize("budget", [pytest.param(4, id="small"), pytest.param(40, id="large", marks=pytest.mark.slow)])
@pytest.mark.parametrize(
    "surface",
    ["recipe", "--set", "manifest", "target config", "generation config", "calibration report", "prompt lines"],
)
def test_fuzz_hostile_structure_in_files(work, surfaces, pair_copy, surface, budget):
    bundle = surfaces["bundle"]
    manifest = json.loads((bundle / "manifest.json").read_text())
    tcfg = json.loads((pair_copy / "target" / "config.json").read_text())
    gen = json.loads((pair_copy / "target" / "generation_config.json").read_text())
    report = {
        "endpoint": {
            "url": "x",
            "levels": [{"concurrency": 1, "tokens_per_second_per_user": 50.0, "acceptance_length": 2.0}],
        }
    }
    keys = {
        "recipe": _key_paths(TINY),
        "--set": _key_paths(TINY),
        "manifest": _key_paths(manifest),
        "target config": _key_paths(tcfg),
        "generation config": _key_paths(gen),
        "calibration report": _key_paths(report),
        "prompt lines": [["prompt"]],
    }[surface]

    def check(example):
        key, fragment = example
        if surface == "recipe":
            (work / "r.yaml").write_text(splice(TINY, key, fragment, "yaml"))
            cli_ok(["plan", str(work / "r.yaml")], work)
        elif surface == "--set":
            cli_ok(["plan", "--set", f"{'.'.join(key)}={fragment}"], work)
        elif surface == "manifest":
            b = work / "b"
            shutil.rmtree(b, ignore_errors=True)
            shutil.copytree(bundle, b)
            (b / "manifest.json").write_text(splice(manifest, key, fragment, "json"))
            cli_ok(["verify", str(b)], work, verdicts=(1,))
        elif surface in ("target config", "generation config"):
            name, data = ("config.json", tcfg) if surface == "target config" else ("generation_config.json", gen)
            _inspect_with(pair_copy, work, lambda t, d: (t / name).write_text(splice(data, key, fragment, "json")))
        elif surface == "calibration report":
            (work / "c.json").write_text(splice(report, key, fragment, "json"))
            cli_ok(["plan", "--calibration", str(work / "c.json")], work)
        else:
            (work / "p.jsonl").write_text(splice({"prompt": "x"}, key, fragment, "json") + "\n")
            with _deadline(120):
                cli_ok(["bench", "--prompts", str(work / "p.jsonl"), "-n", "2"], work)

    fuzz(budget, st.tuples(st.sampled_from(keys), fragments), check)
