"""Launching a bundle on TensorRT-LLM: ``trtllm-serve`` through the bundle's own script,
and launch files for multi-node clusters.

What is read from a bundle (kept small so any build fits):

- ``OUT/trtllm/serve.sh``: an executable bash script that ``exec``s
  ``trtllm-serve <target> --config <cfg> ... "$@"``, with ``"$@"`` last. ``serve`` runs it
  as ``bash OUT/trtllm/serve.sh --host H --port P``: trtllm-serve's options take the last
  value given, so the host and port from ``dflash-trt serve`` override the script's. The
  same values are also exported as ``DFLASH_HOST`` / ``DFLASH_PORT`` for scripts that
  prefer the environment.
- ``OUT/manifest.json`` (optional; read and checked through ``ingest.Manifest`` when
  present): ``name`` (the bundle's name), and in ``serve`` the optional ``tp_size``,
  ``pp_size`` and ``gpus_per_node`` the multi-node files use; ``trtllm.image`` (the
  targeted release's container, ``nvcr.io/nvidia/tensorrt-llm/release:<release>``) is the
  default image.

Multi-node launches go through TensorRT-LLM's own launcher: on Slurm,
``srun --mpi=pmix ... trtllm-llmapi-launch bash serve.sh`` (one task per GPU, the world
size equal to tp x pp); on Kubernetes, a LeaderWorkerSet whose leader runs ``mpirun``
over the group's pods with ``trtllm-llmapi-launch`` and whose workers run ``sshd``.
``tensorrt_llm/llmapi/trtllm-llmapi-launch`` runs the serve command on rank 0 only; every
other rank runs ``mgmn_worker_node`` where it was started and loads the weights from the
paths rank 0 sends, which the bundle keeps relative (``./target``, ``./drafter``). So every
rank starts IN the bundle: ``srun --chdir`` (and pyxis' ``--container-workdir``) on Slurm,
``mpirun -wdir`` at the in-pod mount path on Kubernetes; the bundle itself stays relocatable.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import yaml

from dflash_trt.errors import CheckpointError, DFlashError
from dflash_trt.ingest import Bundle, Layout, open_bundle

DEFAULT_IMAGE = "nvcr.io/nvidia/tensorrt-llm/release"


def read_bundle(out: str | Path) -> Bundle:
    """The bundle at ``out`` (an absolute path: the launch files name it); its manifest, when
    there is one, read and checked (``ingest.open_bundle``)."""
    if not Path(out).is_dir():
        raise DFlashError(f"{out}: no such bundle directory (build one with 'dflash-trt build -o DIR')")
    return open_bundle(Path(out).resolve(), require_manifest=False)


# ---- single node: trtllm-serve -----------------------------------------------------------
def find_trtllm_serve() -> str | None:
    return shutil.which("trtllm-serve")


def trtllm_argv(bundle: Bundle, host: str, port: int) -> list[str]:
    """The command ``serve`` runs on a machine with TensorRT-LLM."""
    if not bundle.serve_sh.is_file():
        raise CheckpointError(
            f"{bundle.root}: no {Layout.SERVE_SH} (not built for TensorRT-LLM; rebuild with 'dflash-trt build')"
        )
    return ["bash", str(bundle.serve_sh), "--host", host, "--port", str(port)]


def script_command(bundle: Bundle) -> str | None:
    """The ``trtllm-serve ...`` invocation written in serve.sh (continuation lines joined), for display."""
    if not bundle.serve_sh.is_file():
        return None
    lines, joined = bundle.serve_sh.read_text().splitlines(), []
    for i, line in enumerate(lines):
        if "trtllm-serve" in line and not line.lstrip().startswith("#"):
            j = i
            joined.append(line.rstrip().rstrip("\\").strip())
            while lines[j].rstrip().endswith("\\") and j + 1 < len(lines):
                j += 1
                joined.append(lines[j].rstrip().rstrip("\\").strip())
            break
    text = " ".join(x for x in joined if x)
    return text.removeprefix("exec ").strip() or None


def run(argv: list[str], host: str, port: int) -> int:
    """Run the command, forwarding SIGTERM/SIGINT to it; returns its exit code."""
    env = dict(os.environ, DFLASH_HOST=host, DFLASH_PORT=str(port))
    proc = subprocess.Popen(argv, env=env)

    def forward(sig, _frame):
        proc.send_signal(sig)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return proc.wait()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


# ---- multi node --------------------------------------------------------------------------
def _world(bundle: Bundle, nodes: int, gpus_per_node: int | None) -> tuple[int, int, list[str]]:
    """(gpus per node, world size, extra trtllm-serve args) for a multi-node launch."""
    if nodes < 1:
        raise DFlashError(f"--nodes must be >= 1, got {nodes}")
    g = gpus_per_node or bundle.serve.gpus_per_node or 8
    if g < 1:
        raise DFlashError(f"--gpus-per-node must be >= 1, got {g}")
    world = nodes * g
    tp, pp = bundle.serve.tp_size, bundle.serve.pp_size or 1
    if tp is not None:
        if tp * pp != world:
            raise DFlashError(
                f"{bundle.name} was planned for tp_size {tp} x pp_size {pp} = {tp * pp} GPUs, "
                f"but {nodes} node(s) x {g} GPUs = {world}; change --nodes/--gpus-per-node"
            )
        return g, world, []
    return g, world, ["--tp_size", str(world)]


def image_for(bundle: Bundle, image: str | None) -> str:
    """``image``, else the container of the release the bundle was built for (a directory
    without a manifest: the latest release image)."""
    if image:
        return image
    info = bundle.manifest.trtllm if bundle.manifest else None
    if info is not None:
        return info.image or f"{DEFAULT_IMAGE}:{info.release}"
    return f"{DEFAULT_IMAGE}:latest"


_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_SAFE_TIME = re.compile(r"^[0-9]+(-[0-9]+)?(:[0-9]+){0,2}$")
_SAFE_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$")


def _checked(bundle: Bundle, image: str | None = None, time_limit: str = "04:00:00", **paths) -> str:
    """Refuse, in one line, what a launch file cannot carry safely; returns the image.

    Launch files are shell and YAML: the bundle's name (from its manifest) lands in comments and
    job names, so it must be a plain name; paths and the image are quoted where they are used,
    but a control character (a newline) cannot be quoted into a ``#SBATCH`` line or a comment.
    """
    if not _SAFE_NAME.match(bundle.name):
        raise DFlashError(
            f"{bundle.root}: bundle name {bundle.name!r} is not a plain name (letters, digits, '.', "
            "'_', '-'); rebuild it with a recipe name of that form"
        )
    for what, value in {"bundle path": str(bundle.root), **paths}.items():
        if any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise DFlashError(f"{what} {value!r} contains a control character; move the bundle to a plain path")
    img = image_for(bundle, image)
    if not _SAFE_IMAGE.match(img):
        raise DFlashError(f"container image {img!r} is not an image reference (registry/name:tag)")
    if not _SAFE_TIME.match(time_limit):
        raise DFlashError(f"time limit {time_limit!r} is not a Slurm time (e.g. 04:00:00 or 1-00:00:00)")
    return img


def slurm_script(
    bundle: Bundle,
    nodes: int,
    gpus_per_node: int | None = None,
    port: int = 8000,
    image: str | None = None,
    time_limit: str = "04:00:00",
) -> str:
    img = _checked(bundle, image, time_limit)
    g, world, extra = _world(bundle, nodes, gpus_per_node)
    serve = shlex.join(["--host", "0.0.0.0", "--port"]) + ' "$PORT" ' + shlex.join(extra)
    q = shlex.quote
    return f"""#!/bin/bash
# Serve the dflash-trt bundle '{bundle.name}' on {nodes} node(s) x {g} GPUs with TensorRT-LLM.
# Written by 'dflash-trt serve --emit slurm'. Submit with: sbatch {bundle.name}.slurm.sh
# Add your account and partition (#SBATCH -A / -p). The bundle must be on storage every
# node sees; one MPI task per GPU, world size {world} (tensor x pipeline parallel).
#SBATCH --job-name=dflash-{bundle.name}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node={g}
#SBATCH --gpus-per-node={g}
#SBATCH --time={time_limit}
#SBATCH --output=dflash-{bundle.name}-%j.out

set -euo pipefail
# Defaults are single-quoted literals: nothing in a path or a tag is ever expanded or run.
DEFAULT_BUNDLE={q(str(bundle.root))}
DEFAULT_IMAGE={q(img)}
BUNDLE="${{BUNDLE:-$DEFAULT_BUNDLE}}"
PORT="${{PORT:-{int(port)}}}"
CONTAINER_IMAGE="${{CONTAINER_IMAGE-$DEFAULT_IMAGE}}"   # set it empty: no container (pyxis) flags
CONTAINER_MOUNTS="${{CONTAINER_MOUNTS:-$BUNDLE:$BUNDLE}}"

echo "serving on http://$(hostname):$PORT (first node)"
# Every rank starts in the bundle: the ranks other than 0 load ./target and ./drafter from there.
srun -l --mpi=pmix --chdir="$BUNDLE" \\
    ${{CONTAINER_IMAGE:+--container-image="$CONTAINER_IMAGE" --container-mounts="$CONTAINER_MOUNTS" \\
    --container-workdir="$BUNDLE"}} \\
    trtllm-llmapi-launch bash "$BUNDLE/trtllm/serve.sh" {serve.strip()}
"""


def _k8s_name(name: str) -> str:

    n = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    return ("dflash-" + n)[:50].rstrip("-")


def k8s_manifests(
    bundle: Bundle,
    nodes: int,
    gpus_per_node: int | None = None,
    port: int = 8000,
    image: str | None = None,
    pvc: str = "dflash-bundles",
    mount: str = "/bundles",
) -> list[dict]:
    """A LeaderWorkerSet (one group of ``nodes`` pods) and a Service for its leader."""
    img = _checked(bundle, image, mount=mount, pvc=pvc)
    g, world, extra = _world(bundle, nodes, gpus_per_node)
    name = _k8s_name(bundle.name)
    bundle_path = f"{mount}/{bundle.root.name}"
    leader_script = _leader_script(bundle_path, port, extra, g, world)
    worker_script = "mkdir -p /run/sshd && exec /usr/sbin/sshd -D"
    volume = {"name": "bundles", "persistentVolumeClaim": {"claimName": pvc, "readOnly": True}}
    shm = {"name": "dshm", "emptyDir": {"medium": "Memory"}}
    mounts = [{"name": "bundles", "mountPath": mount, "readOnly": True}, {"name": "dshm", "mountPath": "/dev/shm"}]

    def pod(role: str, script: str, probe: bool) -> dict:
        c = {
            "name": role,
            "image": img,
            "command": ["bash", "-c", script],
            "workingDir": bundle_path,
            "resources": {"limits": {"nvidia.com/gpu": g}},
            "volumeMounts": mounts,
        }
        if probe:
            c["ports"] = [{"containerPort": port, "name": "http"}]
            c["readinessProbe"] = {
                "httpGet": {"path": "/health", "port": port},
                "periodSeconds": 10,
                "failureThreshold": 180,
            }
        return {"metadata": {"labels": {"role": role}}, "spec": {"containers": [c], "volumes": [volume, shm]}}

    lws = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": name, "dflash-trt/bundle": name}},
        "spec": {
            "replicas": 1,
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": pod("leader", leader_script, probe=True),
                "workerTemplate": pod("worker", worker_script, probe=False),
            },
        },
    }
    return [lws, _k8s_service(name, port)]


def _leader_script(bundle_path: str, port: int, extra: list[str], g: int, world: int) -> str:
    """The leader pod's script: a hostfile of the group's pods from the LWS addresses, then
    ``mpirun`` of the bundle's serve.sh over ``world`` ranks, ``g`` per pod."""
    serve = shlex.join(
        [
            "trtllm-llmapi-launch",
            "bash",
            f"{bundle_path}/trtllm/serve.sh",
            "--host",
            "0.0.0.0",
            "--port",
            str(port),
            *extra,
        ]
    )
    return "\n".join(
        [
            "set -euo pipefail",
            "# hostfile: the leader, then workers <leader>-1 .. <leader>-(size-1) in the LWS headless service",
            f'echo "$LWS_LEADER_ADDRESS slots={g}" > /tmp/hostfile',
            "for i in $(seq 1 $((LWS_GROUP_SIZE - 1))); do",
            f'  echo "${{LWS_LEADER_ADDRESS%%.*}}-$i.${{LWS_LEADER_ADDRESS#*.}} slots={g}" >> /tmp/hostfile',
            "done",
            "# every rank starts in the bundle: the ranks other than 0 load ./target and ./drafter from there",
            f"exec mpirun --allow-run-as-root --hostfile /tmp/hostfile -np {world} --bind-to none "
            f"-wdir {shlex.quote(bundle_path)} {serve}",
        ]
    )


def _k8s_service(name: str, port: int) -> dict:
    """The Service in front of the group's leader pod."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {
            "selector": {"leaderworkerset.sigs.k8s.io/name": name, "role": "leader"},
            "ports": [{"name": "http", "port": port, "targetPort": port}],
        },
    }


def k8s_yaml(bundle: Bundle, nodes: int, **kw) -> str:
    head = (
        f"# Serve the dflash-trt bundle '{bundle.name}' on a LeaderWorkerSet of {nodes} pod(s).\n"
        "# Written by 'dflash-trt serve --emit k8s'. Needs the LWS controller, a ReadWriteMany PVC\n"
        "# holding the bundle, and an image with TensorRT-LLM, mpirun and sshd (passwordless ssh\n"
        "# between the group's pods). Apply with: kubectl apply -f FILE\n"
    )
    return head + yaml.safe_dump_all(k8s_manifests(bundle, nodes, **kw), sort_keys=False)


def write_atomic(path: Path, text: str, executable: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o755 if executable else 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def emit(bundle: Bundle, kind: str, nodes: int, output: Path | None = None, **kw) -> Path:
    """Write the Slurm batch script or the Kubernetes manifests; returns the file written."""
    if kind == "slurm":
        path = output or Path(f"{bundle.name}.slurm.sh")
        kw.pop("pvc", None)
        write_atomic(path, slurm_script(bundle, nodes, **kw), executable=True)
    elif kind == "k8s":
        path = output or Path(f"{bundle.name}.lws.yaml")
        write_atomic(path, k8s_yaml(bundle, nodes, **kw))
    else:
        raise DFlashError(f"unknown --emit {kind!r}; choose slurm or k8s")
    return path
