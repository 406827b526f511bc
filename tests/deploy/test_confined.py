"""Nothing outside the bundle is written, deleted or loaded (issue 39): links and climbing names on
every writer (build, tune, train-drafter, --plot, recipes copy), a checkpoint's symlinks and modes,
a manifest whose paths or settings were edited after the build, weights altered after the build."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from dflash_trt.cli import run
from dflash_trt.ingest import embedded_dir


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("confined") / "tiny"
    assert run(["build", "-o", str(out)]) == 0
    return out


@pytest.fixture
def bundle(built, tmp_path):
    return shutil.copytree(built, tmp_path / "b")


@pytest.fixture
def victim(tmp_path):
    """Files outside every output, which no writer may touch."""
    d = tmp_path / "elsewhere"
    d.mkdir()
    (d / "victim.txt").write_text("precious")
    return d


def _tree(d: Path) -> dict:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _one_line(capsys, code: int) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def _edit(bundle: Path, fn) -> None:
    m = json.loads((bundle / "manifest.json").read_text())
    fn(m)
    (bundle / "manifest.json").write_text(json.dumps(m))


# ---- build --force -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["../elsewhere/victim.txt", "target/../../elsewhere/victim.txt", "ABS"])
def test_force_deletes_nothing_a_climbing_manifest_names(bundle, victim, capsys, name):
    name = str(victim / "victim.txt") if name == "ABS" else name
    _edit(bundle, lambda m: m["files"].update({name: "0" * 64}))
    before = _tree(bundle.parent)
    err = _one_line(capsys, run(["build", "-o", str(bundle), "--force"]))
    assert repr(name) in err
    assert _tree(bundle.parent) == before


def test_force_never_deletes_through_a_symlinked_directory(bundle, victim, capsys):
    shutil.copytree(bundle / "target", victim / "target")  # the old bundle's target/, now a link to elsewhere
    shutil.rmtree(bundle / "target")
    (bundle / "target").symlink_to(victim / "target")
    before = _tree(victim)
    err = _one_line(capsys, run(["build", "-o", str(bundle), "--force"]))
    assert "symlink" in err
    assert _tree(victim) == before


def test_a_checkpoints_symlinks_are_followed_only_into_its_store(tmp_path, victim, capsys):
    src = embedded_dir("tiny") / "target"
    # a Hugging Face cache snapshot: every file a link into the repository's blobs/
    repo = tmp_path / "hub" / "models--org--tiny"
    snap, blobs = repo / "snapshots" / "abc123", repo / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for f in src.iterdir():
        shutil.copyfile(f, blobs / f.name)
        (snap / f.name).symlink_to(Path("../../blobs") / f.name)
    os.chmod(blobs / "training.json", 0o600)  # a file its owner keeps private stays private
    flags = ["-t", str(snap), "-d", "embedded:tiny/drafter", "--set", "serving.max_seq_len=1024"]
    assert run(["build", *flags, "-o", str(tmp_path / "ok")]) == 0, capsys.readouterr().err
    assert stat.S_IMODE((tmp_path / "ok" / "target" / "training.json").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "ok" / "target" / "config.json").stat().st_mode) == 0o644
    assert not (tmp_path / "ok" / "target" / "config.json").is_symlink()
    # one link out of the store: refused, nothing written
    (snap / "training.json").unlink()
    (snap / "training.json").symlink_to(victim / "victim.txt")
    # this pair plans batch sizes up to 64, where the floor-cost warning rightly comes first (the
    # plan's table says drafting does not pay at 16-64): the refusal is its one error line
    code = run(["build", *flags, "-o", str(tmp_path / "no")])
    out = capsys.readouterr().err.strip()
    assert code == 2 and "Traceback" not in out, out
    errors = [line for line in out.splitlines() if not line.startswith("warning: ")]
    assert len(errors) == 1 and errors[0].startswith("error: "), out
    assert "outside the checkpoint" in errors[0] and not (tmp_path / "no").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".no")]  # no partial, no lock left


def test_a_drafters_link_out_of_its_checkpoint_is_refused_before_anything_is_written(tmp_path, victim, capsys):
    d = shutil.copytree(embedded_dir("tiny") / "drafter", tmp_path / "drafter")
    shutil.move(d / "model.safetensors", victim / "model.safetensors")
    (d / "model.safetensors").symlink_to(victim / "model.safetensors")
    err = _one_line(capsys, run(["build", "-t", "embedded:tiny/target", "-d", str(d), "-o", str(tmp_path / "no")]))
    assert "outside the checkpoint" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["drafter", "elsewhere"]


# ---- the bundle checks itself --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value",
    [
        (("reference_runtime", "target"), "../elsewhere"),
        (("reference_runtime", "drafter"), "ABS"),
        (("outputs", "trtllm_config"), "trtllm/../../elsewhere/victim.txt"),
    ],
)
def test_a_manifest_path_outside_the_bundle_is_refused_by_every_reader(bundle, victim, capsys, field, value):
    shutil.copytree(bundle / "target", victim / "target")
    value = str(victim / "target") if value == "ABS" else value
    _edit(bundle, lambda m: m[field[0]].update({field[1]: value}))
    for argv in (["generate", str(bundle), "-p", "hi", "-n", "2"], ["verify", str(bundle)]):
        err = _one_line(capsys, run(argv))
        assert f"{field[0]}.{field[1]}" in err and "not a path inside the bundle" in err


def test_a_symlink_leading_out_of_the_bundle_is_refused(bundle, victim, capsys):
    target = bundle / "target" / "model.safetensors"
    shutil.move(target, victim / "model.safetensors")
    target.symlink_to(victim / "model.safetensors")
    err = _one_line(capsys, run(["generate", str(bundle), "-p", "hi", "-n", "2"]))
    assert "symlink leading outside the bundle" in err


@pytest.mark.parametrize(
    "edit, needle",
    [
        (lambda m: m["trtllm"].update(release="1.3.0"), "manifest trtllm.release is '1.3.0', trtllm/serve.sh says"),
        (lambda m: m["gpu"].update(sm=90), "manifest gpu.sm is '90'"),
        (lambda m: m["serve"].update(tp_size=4), "manifest serve.tp_size is 4, trtllm/config.yaml says 1"),
        (lambda m: m["serve"].update(max_seq_len=99), "manifest serve.max_seq_len is 99"),
        (lambda m: m["drafter"].update(target_layer_ids=[1, 2, 3]), "manifest drafter.target_layer_ids"),
        (lambda m: m["serve"].update(chat_template_sha256="0" * 64), "manifest serve.chat_template_sha256"),
    ],
)
def test_verify_checks_the_manifests_own_settings_against_its_files(bundle, capsys, edit, needle):
    assert run(["verify", str(bundle), "--json"]) == 0  # as built: every setting agrees
    capsys.readouterr()
    _edit(bundle, edit)
    assert run(["verify", str(bundle), "--json"]) == 1
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["manifest"]["status"] == "fail" and needle in checks["manifest"]["summary"]
    assert checks["files"]["status"] == "pass"  # the manifest is checked against its files, not sealed


@pytest.mark.parametrize("how", ["changed", "added", "missing"])
def test_generate_refuses_weights_that_are_not_as_built(bundle, capsys, how):
    f = bundle / "drafter" / "model.safetensors"
    if how == "changed":
        data = bytearray(f.read_bytes())
        data[-3] ^= 1  # one bit of a tensor: headers still read
        f.write_bytes(bytes(data))
    elif how == "added":
        shutil.copyfile(f, bundle / "drafter" / "extra.safetensors")
    else:
        (bundle / "target" / "generation_config.json").unlink()
    err = _one_line(capsys, run(["generate", str(bundle), "-p", "hi", "-n", "2"]))
    assert "what would be loaded is not what was built" in err
    assert {"changed": "sha256 differs", "added": "not in the manifest", "missing": "missing"}[how] in err


@pytest.mark.slow  # a server process (torch imported again): generate above covers the same load path by default
def test_serve_refuses_weights_that_are_not_as_built(bundle):
    import subprocess
    import sys

    from tests.serve.helpers import free_port, subprocess_env

    f = bundle / "target" / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-3] ^= 1
    f.write_bytes(bytes(data))
    proc = subprocess.run(
        [sys.executable, "-m", "dflash_trt", "serve", str(bundle), "--server", "embedded", "--port", str(free_port())],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )  # serving instead of refusing: a timeout, not a hang
    err = proc.stderr.strip()
    assert proc.returncode == 2 and len(err.splitlines()) == 1, err
    assert "what would be loaded is not what was built" in err


# ---- tune, --plot, recipes copy, train-drafter ---------------------------------------------------------


def test_tune_writes_nothing_through_a_symlinked_directory(bundle, victim, capsys):
    shutil.copytree(bundle / "trtllm", victim / "trtllm")
    shutil.rmtree(bundle / "trtllm")
    (bundle / "trtllm").symlink_to(victim / "trtllm")
    before = _tree(victim)
    err = _one_line(capsys, run(["tune", str(bundle), "--concurrency", "1", "--draft-lens", "1", "-n", "2"]))
    assert "symlink" in err
    assert _tree(victim) == before


def test_tunes_prev_copy_replaces_a_link_never_writes_through_it(bundle):
    from dflash_trt.bench import tune as T

    weights = bundle / "target" / "model.safetensors"
    before = weights.read_bytes()
    (bundle / "trtllm" / "config.yaml.prev").symlink_to("../target/model.safetensors")  # inside: opens fine
    config = bundle / "trtllm" / "config.yaml"
    old = config.read_text()
    T.commit(bundle, {config: old + "# tuned\n"})
    assert weights.read_bytes() == before
    prev = bundle / "trtllm" / "config.yaml.prev"
    assert not prev.is_symlink() and prev.read_text() == old


def test_plot_and_its_results_replace_a_symlink_never_write_through_it(tmp_path, victim):
    from dflash_trt._cli.common import save_then_plot

    plot = tmp_path / "p.png"
    plot.symlink_to(victim / "victim.txt")
    (tmp_path / "p.json").symlink_to(victim / "other.txt")  # dangling: would create a file elsewhere
    assert save_then_plot({"r": 1}, plot, lambda p: Path(p).write_bytes(b"\x89PNG")) is None
    assert (victim / "victim.txt").read_text() == "precious" and not (victim / "other.txt").exists()
    assert not plot.is_symlink() and plot.read_bytes() == b"\x89PNG"
    assert json.loads((tmp_path / "p.json").read_text()) == {"r": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "p.json", "p.png"]


@pytest.mark.parametrize("kind", ["dangling", "to a file"])
def test_recipes_copy_never_writes_through_a_symlink(tmp_path, victim, capsys, kind):
    dest = tmp_path / "mine.yaml"
    dest.symlink_to(victim / ("new.yaml" if kind == "dangling" else "victim.txt"))
    assert "exists" in _one_line(capsys, run(["recipes", "copy", "tiny", str(dest)]))
    assert _tree(victim) == {"victim.txt": b"precious"}
    assert run(["recipes", "copy", "tiny", str(tmp_path / "real.yaml")]) == 0
    from dflash_trt.plan import load_recipe

    assert (tmp_path / "real.yaml").read_bytes() == Path(load_recipe("tiny").source).read_bytes()


def test_train_drafter_refuses_a_symlinked_work_directory(tmp_path, victim, capsys):
    out = tmp_path / "drafter"
    out.mkdir()
    (out / ".train").symlink_to(victim)
    err = _one_line(
        capsys,
        run(
            [
                "train-drafter",
                "-t",
                "embedded:tiny/target",
                "--data",
                str(embedded_dir("tiny") / "heldout_prompts.jsonl"),
                "-o",
                str(out),
                "--steps",
                "1",
            ]
        ),
    )
    assert ".train" in err and "symlink" in err
    assert _tree(victim) == {"victim.txt": b"precious"}


def test_train_json_replaces_a_symlink_never_writes_through_it(tmp_path, victim):
    from dflash_trt.train.checkpoint import write_json

    (tmp_path / "training.json.tmp").symlink_to(victim / "victim.txt")  # a link planted at the temporary name
    (tmp_path / "training.json").symlink_to(victim / "victim.txt")
    write_json(tmp_path / "training.json", {"step": 1})
    assert (victim / "victim.txt").read_text() == "precious"
    assert json.loads((tmp_path / "training.json").read_text()) == {"step": 1}
