"""The documentation agrees with the code: every generated page (and README block) is what its
generator in ``scripts/gen_docs.py`` writes today, the README's commands are the ones CI runs,
every measured figure is a well-formed file under ``bench/results/``, and the site builds
with ``mkdocs build --strict``. A stale page is fixed with ``python scripts/gen_docs.py``."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@cache
def gen_docs():
    """``scripts/gen_docs.py`` as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@cache
def expected() -> dict[str, str]:
    return gen_docs().expected()


@pytest.mark.parametrize("page", [*gen_docs().PAGES, "README.md"])
def test_generated_page_is_fresh(page):
    text = (ROOT / page).read_text() if (ROOT / page).exists() else None
    assert text == expected()[page], f"{page} is stale: run python scripts/gen_docs.py"


def test_a_changed_command_makes_the_cli_page_stale(monkeypatch):
    """The freshness check can fail: an option added to a command changes its generated page."""
    import typer

    from dflash_trt import cli

    app = typer.Typer()
    app.registered_commands = list(cli.app.registered_commands)
    app.registered_groups = list(cli.app.registered_groups)

    @app.command("docs-probe")
    def probe(flag: bool = typer.Option(False, "--probe-flag", help="planted")) -> None:
        """A planted command."""

    monkeypatch.setattr(cli, "app", app)
    page = gen_docs().cli_page()
    assert "--probe-flag" in page and page != expected()["docs/reference/cli.md"]


def test_every_option_of_every_command_is_in_the_reference():
    page = expected()["docs/reference/cli.md"]
    for name, cmd in gen_docs().commands():
        section = page.split(f"## {name} {{#")[1].split("\n## ")[0]
        for p in cmd.params:
            for opt in (*p.opts, *p.secondary_opts):
                if opt.startswith("-") and opt not in ("--help", "-h"):
                    assert f"`{opt}`" in section, f"{name} {opt} missing from docs/reference/cli.md"


def test_readme_test_command_is_the_one_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    block = ci.split("# The README's test command, verbatim")[1].split("\n\n")[0]
    ci_cmd = "\n".join(line for line in block.splitlines()[1:] if line.strip())
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    assert ci_cmd.strip() in [b.strip() for b in blocks], "README's test command differs from .ci/run's"
    setup = ci_cmd.split(" \\\n")[0].split(" && ruff")[0]
    assert any(b.strip() == f"{setup} && dflash-trt build" for b in blocks), "README's build command drifted"
    assert "mkdocs build --strict" in ci
    assert ci_cmd.strip() in (ROOT / "docs" / "guides" / "cpu.md").read_text(), "the CPU guide's set-up drifted"


def test_every_result_file_is_dated_and_complete(tmp_path):
    spec = importlib.util.spec_from_file_location("docs_perf", ROOT / "scripts" / "docs_perf.py")
    assert spec and spec.loader
    perf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(perf)
    files = sorted((ROOT / "bench" / "results").glob("*.json"))
    assert files
    for f in files:
        data = perf.load(f)  # raises naming the file and the missing keys
        assert f.name.startswith(data["date"]), f"{f.name}: its name's date is not its date {data['date']}"
    probe = tmp_path / "2026-01-01-probe.json"  # a file without its commit is refused, naming the key
    probe.write_text(json.dumps({"date": "2026-01-01", "machine": "m", "command": "c", "results": []}))
    with pytest.raises(ValueError, match="missing: commit"):
        perf.load(probe)


def test_the_site_builds_strict(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    res = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 0, res.stderr[-3000:]


@pytest.mark.parametrize("doc", ["README.md", "CHANGELOG.md"])
def test_links_outside_the_site_point_at_files(doc):
    """mkdocs checks the links inside docs/; the README's and the changelog's are checked here."""
    text = (ROOT / doc).read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    assert local, f"{doc}: no relative links found"
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, f"{doc} links to files that do not exist: {missing}"
