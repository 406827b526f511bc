"""The walk-through the docs show is what the commands print.

``docs/guides/cpu.md`` ("The walk-through") holds one console block: ``$ `` lines are commands,
the lines under each are what it prints (table rows without their borders; ``...`` stands for
run-to-run text). This test runs the block on the embedded tiny pair in a scratch directory and
checks every quoted line against the command's output. The default run takes the steps before
the server (plan, build, the offline verify, serve --dry-run) and checks the README's GPU-only
lines against the files ``build`` wrote (``serve.sh`` cannot run here: no TensorRT-LLM); the
whole block (the embedded server, verify and bench against it, tune) is ``-m slow``."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dflash_trt.cli import run

ROOT = Path(__file__).resolve().parents[1]
BOX = re.compile(r"[│┃┏┓┗┛━┡┩╇╈┳┻─┼╭╮╰╯┠┨┯┷]")


def steps() -> list[tuple[str, list[str]]]:
    """(command line, quoted output lines) of the walk-through's console block."""
    page = (ROOT / "docs" / "guides" / "cpu.md").read_text()
    block = page.split("## The walk-through", 1)[1].split("```console\n", 1)[1].split("```", 1)[0]
    out: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            out.append((line[2:], []))
        elif line.strip():
            out[-1][1].append(line)
    return out


def norm(text: str) -> list[str]:
    return [" ".join(BOX.sub(" ", line).split()) for line in text.splitlines()]


def check(cmd: str, quoted: list[str], printed: str) -> None:
    lines = norm(printed)
    for q in quoted:
        pat = re.escape(" ".join(q.split()))  # "..." is any text; at a line's end, also none (a wrapped row)
        pat = pat.replace(re.escape(" ..."), "(?: .*)?").replace(re.escape("..."), ".*")
        assert any(re.fullmatch(pat, line) for line in lines), f"`{cmd}` did not print {q!r}:\n{printed}"


def run_step(cmd: str, quoted: list[str], capsys) -> None:
    argv = shlex.split(cmd)
    assert argv[0] == "dflash-trt", cmd
    assert run(argv[1:]) == 0, capsys.readouterr().err
    res = capsys.readouterr()
    check(cmd, quoted, res.out + res.err)


def before_server() -> list[tuple[str, list[str]]]:
    s = steps()
    return s[: next(i for i, (c, _) in enumerate(s) if c.endswith("&"))]


def test_the_walkthrough_shows_all_six_steps():
    verbs = [shlex.split(c)[1] for c, _ in steps()]
    for verb in ("plan", "build", "serve", "verify", "bench", "tune"):
        assert verb in verbs, verb
    assert all(quoted for _, quoted in steps()), "every step quotes what it prints"


def test_the_steps_before_the_server_print_what_the_page_says(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for cmd, quoted in before_server():
        run_step(cmd, quoted, capsys)
    readme_gpu_lines_match_the_bundle(tmp_path / "out")


def readme_gpu_lines_match_the_bundle(out: Path) -> None:
    """The README's six GPU lines: what build prints and what serve.sh execs, from the files."""
    readme = (ROOT / "README.md").read_text()
    six = readme.split("## On a GPU, in six lines", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    build = next(line for line in six.splitlines() if line.startswith("dflash-trt build"))
    said = build.split("then: ", 1)[1].strip()
    assert said == "bundle written to out  (serve: out/trtllm/serve.sh)"  # what the CPU build printed above
    serve = next(line for line in six.splitlines() if line.startswith("out/trtllm/serve.sh"))
    execs = serve.split("then: ", 1)[1].removesuffix("...").strip()
    sh = (out / "trtllm" / "serve.sh").read_text()
    assert re.search(rf"^{re.escape(execs)} ", sh, re.M), f"serve.sh does not `{execs}`"
    assert "judge.py" in sh and (out / "trtllm" / "judge.py").exists()  # "judges the config with ..."
    for word in ("files", "config", "lossless", "acceptance", "schedule", "memory"):
        assert word in next(line for line in six.splitlines() if line.startswith("dflash-trt verify"))


@pytest.mark.slow
def test_the_whole_walkthrough_on_the_embedded_server(tmp_path, monkeypatch, capsys):
    import httpx

    from tests.serve.helpers import free_port, subprocess_env

    monkeypatch.chdir(tmp_path)
    all_steps = steps()
    for cmd, quoted in before_server():
        run_step(cmd, quoted, capsys)
    serve_cmd, serve_quoted = all_steps[len(before_server())]
    port = free_port()
    sub = lambda s: s.replace(":8000", f":{port}").replace("--port 8000", f"--port {port}")  # noqa: E731
    log = tmp_path / "serve.log"
    argv = [sys.executable, "-m", "dflash_trt", *shlex.split(sub(serve_cmd))[1:-1]]
    with open(log, "w") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=subprocess_env(), cwd=tmp_path)
    try:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, log.read_text()
            time.sleep(0.2)
        check(serve_cmd, [sub(q) for q in serve_quoted], log.read_text())
        for cmd, quoted in all_steps[len(before_server()) + 1 :]:
            run_step(sub(cmd), [sub(q) for q in quoted], capsys)
    finally:
        proc.terminate()
        proc.wait(60)
