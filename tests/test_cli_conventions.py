"""One convention per flag, and documentation that matches the real CLI.

The README's command table and docs/reference/cli.md are generated from the command typer builds
(``typer.main.get_command``) and must equal what the generator writes; shared flags have one range
and one name everywhere; printed verdicts agree with the numbers beside them."""

from __future__ import annotations

import dataclasses
import re
import shutil
import typing
from pathlib import Path
from typing import Annotated

import pytest
import typer

from dflash_trt.cli import app, run

CLI = typer.main.get_command(app)


def _command(path: str):
    cmd = CLI
    for part in path.split():
        assert part in cmd.commands, f"`dflash-trt {path}` does not exist"
        cmd = cmd.commands[part]
    return cmd


def test_cli_reference_is_generated_from_this_cli():
    """The command table (README) and the CLI reference (docs/) are written from the Typer app
    by scripts/gen_docs.py; the committed pages equal what it writes for this CLI."""
    from tests.test_docs import expected, gen_docs

    root = Path(__file__).resolve().parents[1]
    assert (root / "docs/reference/cli.md").read_text() == gen_docs().cli_page()
    assert expected()["README.md"] == (root / "README.md").read_text()
    for path, _ in gen_docs().commands():
        assert f"#{path.replace(' ', '-')})" in gen_docs().readme_commands(), path


def _param(cmd: str, name: str):
    return next(p for p in _command(cmd).params if name in p.opts)


def test_block_size_has_one_range_everywhere():
    ranges = {c: (_param(c, "--block-size").min, _param(c, "--block-size").max) for c in ("bench", "generate", "serve")}
    assert len(set(ranges.values())) == 1, ranges


def test_one_name_per_flag():
    """One spelling each (the removed old ones: tests/test_removed_spellings.py)."""
    for cmd in ("build", "plan", "serve"):
        assert not _param(cmd, "--gpus-per-node").hidden
    hidden = [(c, o) for c, cmd in _all_commands() for p in cmd.params if getattr(p, "hidden", False) for o in p.opts]
    assert hidden == [], f"hidden aliases: {hidden} (CHANGELOG.md: removed before a release, warned after one)"
    for cmd in ("bench", "generate"):
        assert any(isinstance(p, typer.core.TyperArgument) and p.name == "bundle" for p in _command(cmd).params)


def _all_commands(group=CLI, prefix=""):
    for name, cmd in group.commands.items():
        if isinstance(cmd, typer.core.TyperGroup):
            yield from _all_commands(cmd, f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}", cmd


def test_choices_are_case_insensitive(capsys):
    assert run(["serve", "/nonexistent", "--server", "EMBEDDED", "--backend", "TORCH"]) == 2
    err = capsys.readouterr().err
    assert "no such bundle directory" in err and "Invalid value" not in err


def test_embedded_names_in_help_and_in_the_error(capsys):
    from dflash_trt._cli.common import EMBEDDED_REFS
    from dflash_trt.ingest.resolve import embedded_names

    assert sorted(EMBEDDED_REFS) == sorted("embedded:" + n for n in embedded_names())
    for cmd in ("generate", "bench", "build", "plan"):
        helps = _param(cmd, "--target").help + _param(cmd, "--drafter").help
        assert all(ref in helps for ref in EMBEDDED_REFS), cmd
    assert run(["inspect", "embedded:nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and all(ref in err for ref in EMBEDDED_REFS), err


def test_no_backoff_verdict_agrees_with_the_table(capsys):
    """A plan kept drafting everywhere (schedule none) whose table predicts a slowdown says so."""
    sets = [
        "--set",
        "speculative.schedule=none",
        "--set",
        "speculative.acceptance=1.5",
        "--set",
        "serving.max_batch_size=64",
        "--set",
        "serving.max_seq_len=2048",
    ]
    assert run(["plan", "qwen3-8b-h100-fp8", *sets, "--json"]) == 0
    import json

    curve = json.loads(capsys.readouterr().out)["plan"]["curve"]
    slow = [r["batch"] for r in curve if r["draft_len"] and r["speedup"] < 1]
    assert slow  # the case this test is about
    assert run(["plan", "qwen3-8b-h100-fp8", *sets]) == 0
    text = capsys.readouterr().out
    assert "pays at every" not in text and f"slowdown at batch {slow[0]}" in text


def test_bundled_plan_prints_no_unactionable_warnings(capsys):
    assert run(["plan", "qwen3-8b-h100-fp8"]) == 0
    err = capsys.readouterr().err
    assert "site-packages" not in err and "dflash_trt/recipes" not in err and "absent" not in err, err


def test_damaged_bundle_speaks_of_bundles(bundle_dir, tmp_path, capsys):
    b = tmp_path / "b"
    shutil.copytree(bundle_dir, b)
    shard = sorted((b / "target").glob("*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:64])  # a truncated file: its header runs past the end
    assert run(["generate", str(b), "-p", "hi", "-n", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bundle is damaged" in err and "download" not in err, err


def _level(c: int) -> dict:
    return {
        "concurrency": c,
        "ok": 64,
        "requests": 64,
        "output_tokens_per_second": 12345.6,
        "tokens_per_second_per_user": 123.4,
        "ttft_ms": {"median": 1234.5, "p99": 2345.6},
        "itl_ms": {"median": 12.3, "p99": 45.6},
        "tpot_ms": {"median": 4.1, "p99": 9.8},
        "itl_per_token_ms": {"median": 4.0, "p99": 9.0},
        "acceptance_length": 3.21,
        "errors": [],
    }


def _endpoint_report(baseline: bool) -> dict:
    r = {
        "endpoint": {"url": "http://127.0.0.1:8000", "model": "qwen3-8b-h100-fp8", "levels": [_level(1), _level(32)]},
        "max_tokens": 128,
        "temperature": 0.0,
    }
    if baseline:
        r["baseline"] = {"url": "http://127.0.0.1:8001", "model": "qwen3-8b", "levels": [_level(1), _level(32)]}
        r["comparison"] = {
            "speedup": [{"concurrency": 1, "speedup": 2.5}, {"concurrency": 32, "speedup": 0.9}],
            "stops_paying_at": 32,
        }
    return r


def _at_80_columns(monkeypatch, module, show, *args) -> list[str]:
    import io

    from rich.console import Console

    buf = io.StringIO()
    monkeypatch.setattr(module, "out", Console(file=buf, width=80, highlight=False, soft_wrap=True))
    show(*args)
    return buf.getvalue().splitlines()


def test_endpoint_table_fits_80_columns_with_whole_headers(monkeypatch):
    from dflash_trt._cli import bench_show

    lines = _at_80_columns(monkeypatch, bench_show, bench_show.show_endpoint, _endpoint_report(baseline=True))
    assert max(len(line.rstrip()) for line in lines) <= 80
    text = "\n".join(lines)
    assert "…" not in text and "speedup" in text and "TTFT" in text and "12346" in text


def test_recipes_list_fits_80_columns(monkeypatch):
    from dflash_trt._cli import recipes

    lines = _at_80_columns(monkeypatch, recipes, recipes.list_, True)
    assert max(len(line.rstrip()) for line in lines) <= 80
    assert "…" not in "\n".join(lines)
    assert any(re.match(r"^[\w.-]+: \w", line) for line in lines)  # --reasons: one line per recipe, under the table


@pytest.mark.parametrize(
    "baseline, device, unit",
    [(False, "cpu", "per process (CPU)"), (True, "H100", "per GPU"), (False, None, "per server")],
)
def test_endpoint_plot_title_panels_and_units(baseline, device, unit, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from dflash_trt.bench import plots

    figs, close = [], plt.close
    monkeypatch.setattr(plt, "close", figs.append)
    plots.plot(_endpoint_report(baseline), tmp_path / "p.png", device=device, name="my-bundle")
    fig = figs[0]
    assert fig._suptitle.get_text() == "my-bundle, max 128 tokens, temperature 0.0"
    assert len(fig.axes) == (4 if baseline else 3) and all(ax.axison and ax.has_data() for ax in fig.axes)
    close(fig)
    assert fig.axes[0].get_ylabel() == f"output tokens/s {unit}"


def test_bench_prints_a_line_per_step_without_a_terminal(tmp_path, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("import os\nclass A:\n")
    assert (
        run(
            [
                "bench",
                "-t",
                "embedded:tiny/target",
                "-d",
                "embedded:tiny/drafter",
                "--prompts",
                str(prompts),
                "-n",
                "4",
                "--json",
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert re.search(r"^prompts: 1/2 \(\d+ s\)$", err, re.M) and re.search(r"^prompts: 2/2 ", err, re.M), err


def test_recipe_list_page_is_every_recipe_with_its_status():
    """docs/reference/recipes.md (generated) lists every bundled recipe under the status
    `dflash-trt recipes list` derives, and the committed page is the generator's."""
    from dflash_trt import plan as R
    from tests.test_docs import gen_docs

    page = gen_docs().recipes_page()
    assert (Path(__file__).resolve().parents[1] / "docs/reference/recipes.md").read_text() == page
    listed = {}
    for line in page.splitlines():
        if m := re.match(r"^\| `([\w-]+)` \(\d+\) \| (.*) \|$", line):
            listed.update({name: m.group(1) for name in re.findall(r"`([^`]+)`", m.group(2))})
    actual = {n: R.recipe_status(R.load_recipe(p)).kind for n, p in R.bundled_recipes().items()}
    assert listed == actual, sorted(set(listed.items()) ^ set(actual.items()))


def _options_mismatch(command, options) -> list[str]:
    """How ``options`` (a dataclass) differs from ``command``'s parameters: names, order, types."""
    params = typing.get_type_hints(command)  # Annotated[T, typer.Option(...)] read as T
    params.pop("return", None)
    fields = typing.get_type_hints(options)
    order = [f.name for f in dataclasses.fields(options)]
    said = [] if list(params) == order else [f"parameters {list(params)} != fields {order}"]
    return said + [
        f"{k}: {params.get(k)} != {fields.get(k)}" for k in {*params, *fields} if params.get(k) != fields.get(k)
    ]


def _options_pairs():
    from dflash_trt._cli import bench, serve, serve_options, tune

    return [(bench.bench, bench.BenchOptions), (serve.serve, serve_options.ServeOptions), (tune.tune, tune.TuneOptions)]


@pytest.mark.parametrize("command, options", _options_pairs(), ids=lambda x: getattr(x, "__name__", ""))
def test_an_options_object_is_its_commands_signature(command, options):
    """A command builds its options object from ``locals()``: every parameter is a field of the same
    name, in the same order, of the same type (Annotated stripped), and nothing else is; frozen."""
    assert _options_mismatch(command, options) == []
    assert options.__dataclass_params__.frozen


def _cmd(a: Annotated[int, typer.Option("--a")], b: str | None = None) -> None: ...


@pytest.mark.parametrize("fields", [[("a", int), ("b", str)], [("b", str | None), ("a", int)], [("a", int)]])
def test_the_options_check_sees_a_mismatch(fields):
    """The check above can fail: a field of another type, out of order, or missing is seen."""
    assert _options_mismatch(_cmd, dataclasses.make_dataclass("Opts", fields, frozen=True))
    assert not _options_mismatch(_cmd, dataclasses.make_dataclass("Opts", [("a", int), ("b", str | None)]))
