"""serve --dry-run, serve through a (fake) trtllm-serve, and the multi-node launch files."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from dflash_trt.cli import run
from tests.serve.helpers import make_bundle

FAKE_TRTLLM_SERVE = """#!/usr/bin/env bash
# Records how it was called, one argument per line, then exits with $FAKE_EXIT.
printf '%s\\n' "$@" > "$RECORD"
echo "DFLASH_HOST=$DFLASH_HOST DFLASH_PORT=$DFLASH_PORT" >> "$RECORD.env"
exit "${FAKE_EXIT:-0}"
"""


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    return make_bundle(tmp_path_factory.mktemp("launch") / "tiny-bundle")


@pytest.fixture
def fake_trtllm(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "trtllm-serve"
    exe.write_text(FAKE_TRTLLM_SERVE)
    exe.chmod(0o755)
    record = tmp_path / "args.txt"
    monkeypatch.setenv("PATH", f"{bindir}:{Path('/usr/bin')}:{Path('/bin')}")
    monkeypatch.setenv("RECORD", str(record))
    return record


def test_dry_run_prints_the_bundles_trtllm_serve_command(bundle, capsys, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no trtllm-serve here
    assert run(["serve", str(bundle), "--dry-run", "--port", "9001"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert shlex.split(lines[0]) == [
        "bash",
        str(bundle.resolve() / "trtllm" / "serve.sh"),
        "--host",
        "127.0.0.1",
        "--port",
        "9001",
    ]
    assert 'trtllm-serve "$DIR/../target" --config "$DIR/config.yaml"' in out
    assert "embedded server" in out  # says what 'serve' would do here instead


def test_with_trtllm_serve_on_path_the_bundles_command_runs(bundle, fake_trtllm, capsys):
    assert run(["serve", str(bundle), "--port", "9002", "--host", "0.0.0.0"]) == 0
    args = fake_trtllm.read_text().splitlines()
    target = str((bundle / "trtllm" / ".." / "target").resolve())
    assert str(Path(args[0]).resolve()) == target
    assert args[1:] == [
        "--config",
        str(bundle.resolve() / "trtllm" / "config.yaml"),
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--host",
        "0.0.0.0",
        "--port",
        "9002",
    ]  # ours come last and win
    assert "DFLASH_HOST=0.0.0.0 DFLASH_PORT=9002" in Path(str(fake_trtllm) + ".env").read_text()


def test_trtllm_serve_failure_is_reported_with_its_status(bundle, fake_trtllm, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_EXIT", "3")
    assert run(["serve", str(bundle), "--server", "trtllm"]) == 3
    assert "exited with status 3" in capsys.readouterr().err


@pytest.mark.parametrize("server", [[], ["--server", "trtllm"]])
@pytest.mark.parametrize("how", ["flag", "env"])
def test_an_api_key_is_never_dropped_on_trtllm_serve(bundle, fake_trtllm, monkeypatch, capsys, server, how):
    """trtllm-serve checks no key (NO_KEY_IN_TRTLLM cites where): asked for one, serve refuses in
    one line and starts nothing, rather than an open server on the requested host."""
    args = ["--api-key", "s3cret"] if how == "flag" else []
    if how == "env":
        monkeypatch.setenv("DFLASH_API_KEY", "s3cret")
    assert run(["serve", str(bundle), "--host", "0.0.0.0", *server, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "checks no API key" in err and len(err.splitlines()) == 1, err
    assert "s3cret" not in err
    assert not fake_trtllm.exists()  # the stand-in trtllm-serve never ran


def test_server_trtllm_without_trtllm_serve_is_a_one_line_error(bundle, monkeypatch, capsys):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert run(["serve", str(bundle), "--server", "trtllm"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "trtllm-serve is not on PATH" in err


def test_not_a_bundle(tmp_path, capsys):
    assert run(["serve", str(tmp_path / "nope"), "--dry-run"]) == 2
    assert "no such bundle" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert run(["serve", str(tmp_path / "empty"), "--dry-run"]) == 2
    assert "trtllm/serve.sh" in capsys.readouterr().err


def test_emit_slurm_writes_an_srun_trtllm_llmapi_launch_script(bundle, tmp_path, capsys):
    out = tmp_path / "job.sh"
    assert run(["serve", str(bundle), "--emit", "slurm", "--nodes", "2", "--gpus-per-node", "4", "-o", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("#!/bin/bash\n")
    directives = dict(
        line[len("#SBATCH ") :].split("=", 1) for line in text.splitlines() if line.startswith("#SBATCH ")
    )
    assert directives["--nodes"] == "2" and directives["--ntasks-per-node"] == "4"
    assert directives["--gpus-per-node"] == "4"
    srun = " ".join(line.strip().rstrip("\\") for line in text[text.index("srun ") :].splitlines())
    assert "--mpi=pmix" in srun
    assert 'trtllm-llmapi-launch bash "$BUNDLE/trtllm/serve.sh" --host 0.0.0.0 --port "$PORT" --tp_size 8' in srun
    assert f"DEFAULT_BUNDLE={shlex.quote(str(bundle.resolve()))}\n" in text
    assert 'BUNDLE="${BUNDLE:-$DEFAULT_BUNDLE}"' in text
    assert subprocess.run(["bash", "-n", str(out)]).returncode == 0
    assert out.stat().st_mode & 0o111


def test_emit_slurm_checks_the_planned_parallelism(tmp_path, capsys):
    b = make_bundle(tmp_path / "tp8", manifest_extra={"serve": {"tp_size": 8, "gpus_per_node": 8}})
    out = tmp_path / "job.sh"
    assert run(["serve", str(b), "--emit", "slurm", "--nodes", "2", "-o", str(out)]) == 2
    assert "tp_size 8" in capsys.readouterr().err and not out.exists()
    assert run(["serve", str(b), "--emit", "slurm", "--nodes", "1", "-o", str(out)]) == 0
    assert "--tp_size" not in out.read_text()  # serve.sh already carries the planned layout


def test_emit_k8s_writes_a_leaderworkerset(bundle, tmp_path):
    out = tmp_path / "lws.yaml"
    assert (
        run(
            [
                "serve",
                str(bundle),
                "--emit",
                "k8s",
                "--nodes",
                "3",
                "--gpus-per-node",
                "8",
                "--port",
                "8080",
                "--image",
                "nvcr.io/nvidia/tensorrt-llm/release:1.3.0",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    docs = list(yaml.safe_load_all(out.read_text()))
    lws = next(d for d in docs if d["kind"] == "LeaderWorkerSet")
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    tmpl = lws["spec"]["leaderWorkerTemplate"]
    assert tmpl["size"] == 3
    leader = tmpl["leaderTemplate"]["spec"]["containers"][0]
    worker = tmpl["workerTemplate"]["spec"]["containers"][0]
    for c in (leader, worker):
        assert c["image"] == "nvcr.io/nvidia/tensorrt-llm/release:1.3.0"
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 8
    script = leader["command"][-1]
    assert "mpirun" in script and "-np 24" in script
    assert (
        "trtllm-llmapi-launch bash /bundles/tiny-bundle/trtllm/serve.sh --host 0.0.0.0 --port 8080 --tp_size 24"
        in script
    )
    assert "LWS_LEADER_ADDRESS" in script and "LWS_GROUP_SIZE" in script
    assert subprocess.run(["bash", "-n", "-c", script]).returncode == 0
    assert leader["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8080}
    assert "sshd" in worker["command"][-1]
    svc = next(d for d in docs if d["kind"] == "Service")
    assert svc["spec"]["selector"]["role"] == "leader" and svc["spec"]["ports"][0]["port"] == 8080
    assert svc["spec"]["selector"]["leaderworkerset.sigs.k8s.io/name"] == lws["metadata"]["name"]


def test_manifest_that_is_not_json_is_refused(tmp_path, capsys):
    b = tmp_path / "b"
    b.mkdir()
    (b / "manifest.json").write_text("{nope")
    assert run(["serve", str(b), "--dry-run"]) == 2
    assert "manifest.json" in capsys.readouterr().err


FAKE_LAUNCH = """#!/usr/bin/env bash
# trtllm-llmapi-launch as TensorRT-LLM's runs it: rank 0 runs the command, the others stay
# where they were started (mgmn_worker_node) and load the paths rank 0 sends.
rank=${SLURM_PROCID:-${OMPI_COMM_WORLD_RANK:-0}}
echo "rank $rank $PWD" >> "$RECORD"
if [ "$rank" = 0 ]; then exec "$@"; fi
"""
FAKE_SRUN = """#!/usr/bin/env bash
# srun: --chdir=DIR is where every task starts (else srun's own directory); FAKE_NTASKS tasks.
dir=$PWD
while [[ "$1" == -* ]]; do case "$1" in --chdir=*) dir="${1#--chdir=}";; esac; shift; done
for ((r = 0; r < FAKE_NTASKS; r++)); do (cd "$dir" && SLURM_PROCID=$r "$@"); done
"""
FAKE_MPIRUN = """#!/usr/bin/env bash
# mpirun: -np N ranks, each started in -wdir DIR (else mpirun's own directory).
dir=$PWD np=1
while [[ "$1" == -* ]]; do
  case "$1" in -np) np=$2; shift;; -wdir) dir=$2; shift;; --hostfile|--bind-to) shift;; esac; shift
done
for ((r = 0; r < np; r++)); do (cd "$dir" && OMPI_COMM_WORLD_RANK=$r "$@"); done
"""


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """srun, mpirun, trtllm-llmapi-launch and trtllm-serve fakes on PATH; ranks report to RECORD."""
    bindir = tmp_path / "cluster-bin"
    bindir.mkdir()
    for name, text in (
        ("srun", FAKE_SRUN),
        ("mpirun", FAKE_MPIRUN),
        ("trtllm-llmapi-launch", FAKE_LAUNCH),
        ("trtllm-serve", '#!/usr/bin/env bash\necho "serve $PWD" >> "$RECORD"\n'),
    ):
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    record = tmp_path / "ranks.txt"
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    monkeypatch.setenv("RECORD", str(record))
    return record


def test_every_slurm_rank_starts_in_the_bundle(bundle, tmp_path, cluster):
    out = tmp_path / "job.sh"
    assert run(["serve", str(bundle), "--emit", "slurm", "--nodes", "2", "--gpus-per-node", "2", "-o", str(out)]) == 0
    elsewhere = tmp_path / "submitted-from"
    elsewhere.mkdir()
    env = {**os.environ, "FAKE_NTASKS": "4", "CONTAINER_IMAGE": ""}
    subprocess.run(["bash", str(out)], cwd=elsewhere, env=env, check=True, capture_output=True)
    lines = cluster.read_text().splitlines()
    ranks = {line.split()[1]: line.split(maxsplit=2)[2] for line in lines if line.startswith("rank ")}
    assert set(ranks) == {"0", "1", "2", "3"}
    assert set(ranks.values()) == {str(bundle.resolve())}, lines  # every rank, not only rank 0
    assert f"serve {bundle.resolve()}" in lines
    assert '--container-workdir="$BUNDLE"' in out.read_text()  # and inside a pyxis container


def test_every_leaderworkerset_rank_starts_in_the_bundle(bundle, tmp_path, cluster):
    from dflash_trt.serve import launch

    b = launch.read_bundle(bundle)
    lws = launch.k8s_manifests(b, nodes=2, gpus_per_node=2, mount=str(bundle.resolve().parent))[0]
    leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    assert leader["workingDir"] == str(bundle.resolve())
    mpirun = next(x for x in leader["command"][-1].splitlines() if x.startswith("exec mpirun"))
    elsewhere = tmp_path / "pod-home"
    elsewhere.mkdir()
    subprocess.run(["bash", "-c", mpirun], cwd=elsewhere, env=dict(os.environ), check=True, capture_output=True)
    lines = cluster.read_text().splitlines()
    ranks = [line for line in lines if line.startswith("rank ")]
    assert len(ranks) == 4 and {r.split(maxsplit=2)[2] for r in ranks} == {str(bundle.resolve())}, lines


def test_the_image_tag_is_the_bundles_release(tmp_path):
    image = "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc27"
    b = make_bundle(tmp_path / "rel", manifest_extra={"trtllm": {"release": "1.3.0rc27", "image": image}})
    slurm, k8s = tmp_path / "job.sh", tmp_path / "lws.yaml"
    assert run(["serve", str(b), "--emit", "slurm", "--nodes", "1", "-o", str(slurm)]) == 0
    assert f"DEFAULT_IMAGE={image}\n" in slurm.read_text()
    assert run(["serve", str(b), "--emit", "k8s", "--nodes", "2", "-o", str(k8s)]) == 0
    lws = next(d for d in yaml.safe_load_all(k8s.read_text()) if d["kind"] == "LeaderWorkerSet")
    assert lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["image"] == image


HOSTILE_PATHS = ["b$(touch PWNED)", "b`touch PWNED`", "b'; touch PWNED; '", 'b"$(touch PWNED)"', "b with spaces & ;"]


@pytest.mark.parametrize("dirname", HOSTILE_PATHS)
def test_hostile_bundle_paths_never_run_in_launch_files(tmp_path, cluster, dirname, capsys):
    """The emitted Slurm script parses (bash -n) and, run with fake srun/trtllm-* on PATH, starts every
    rank in the bundle's literal path; nothing the path spells out runs (no PWNED file anywhere)."""
    b = make_bundle(tmp_path / dirname, name="hostile")
    job = tmp_path / "job.sh"
    assert run(["serve", str(b), "--emit", "slurm", "--nodes", "1", "--gpus-per-node", "8", "-o", str(job)]) == 0
    subprocess.run(["bash", "-n", str(job)], check=True)
    env = {**os.environ, "FAKE_NTASKS": "2", "CONTAINER_IMAGE": ""}
    subprocess.run(["bash", str(job)], cwd=tmp_path, env=env, check=True, capture_output=True)
    ranks = [line.split(maxsplit=2)[2] for line in cluster.read_text().splitlines() if line.startswith("rank ")]
    assert ranks == [str(b.resolve())] * 2
    assert not list(tmp_path.rglob("PWNED")) and not Path("PWNED").exists()
    lws = tmp_path / "lws.yaml"
    assert run(["serve", str(b), "--emit", "k8s", "--nodes", "1", "--gpus-per-node", "8", "-o", str(lws)]) == 0
    docs = list(yaml.safe_load_all(lws.read_text()))
    script = docs[0]["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["command"][-1]
    subprocess.run(["bash", "-n", "-c", script], check=True)


@pytest.mark.parametrize(
    "bad",
    [
        ("name", "x\n#SBATCH --wrap=touch PWNED"),
        ("name", "$(touch PWNED)"),
        ("name", "../../etc"),
    ],
)
def test_hostile_manifest_names_are_refused_in_one_line(tmp_path, capsys, bad):
    import json

    b = make_bundle(tmp_path / "b", name="fine")
    m = json.loads((b / "manifest.json").read_text())
    m[bad[0]] = bad[1]
    (b / "manifest.json").write_text(json.dumps(m))
    capsys.readouterr()  # what building the fixture printed
    for kind in ("slurm", "k8s"):
        out = tmp_path / f"out.{kind}"
        code = run(["serve", str(b), "--emit", kind, "--nodes", "1", "--gpus-per-node", "8", "-o", str(out)])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and "not a plain name" in err, err
        assert not out.exists()


def test_a_bundle_path_with_a_newline_is_refused(tmp_path, capsys):
    b = make_bundle(tmp_path / "a\nb", name="fine")
    capsys.readouterr()
    code = run(
        ["serve", str(b), "--emit", "slurm", "--nodes", "1", "--gpus-per-node", "8", "-o", str(tmp_path / "j.sh")]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and "control character" in err and not (tmp_path / "j.sh").exists()


@pytest.mark.parametrize("opt", [["--image", "x$(touch PWNED)"], ["--image", "a b"]])
def test_hostile_images_are_refused(bundle, tmp_path, capsys, opt):
    code = run(
        [
            "serve",
            str(bundle),
            "--emit",
            "slurm",
            "--nodes",
            "1",
            "--gpus-per-node",
            "8",
            *opt,
            "-o",
            str(tmp_path / "j.sh"),
        ]
    )
    assert code == 2 and "image" in capsys.readouterr().err
