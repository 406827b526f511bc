"""The bundle's ``trtllm/serve.sh``: go to the bundle, check the machine, exec trtllm-serve.

Before it ``exec``s, the script checks the machine against what the bundle was built for
(:class:`ServeCheck`) and fails with one line on stderr (exit 2) naming what differs (the GPUs
first, then the release, so a refusal is the only line); on success it prints the TensorRT-LLM
version and commit it checked against (recorded outside the bundle: :mod:`trtllm_judge`):

* the installed TensorRT-LLM is the judge (``trtllm/judge.py``, a verbatim copy of
  :mod:`dflash_trt.deploy.trtllm_judge`): its version is read without importing the package
  (``tensorrt_llm/version.py``; a local suffix such as ``+cu130`` is ignored); absent or older
  than the release the plan was made for: refused; the same or newer: the bundle's
  ``trtllm/config.yaml`` goes through that release's own LLM-API classes the way
  ``trtllm-serve --config`` reads it, and a key it rejects is one line naming the key. A newer
  release then serves, with one line naming the release the plan was made for. A config asking
  for disaggregated serving (``cache_transceiver_config``) is refused (PR #19352 only warns);
* the GPUs ``nvidia-smi`` reports match the plan: compute capability (SM), memory within
  -3% .. +15% of the datasheet figure (drivers report a little more than the datasheet's
  GB), and at least as many GPUs as this node serves with. A bundle planned for the CPU
  (``sm`` 0) skips the GPU check.

``DFLASH_SKIP_VERSION_CHECK=1`` skips the TensorRT-LLM check, ``DFLASH_SKIP_CONFIG_CHECK=1`` only
its config validation (no import of tensorrt_llm), ``DFLASH_SKIP_GPU_CHECK=1`` the GPU check, for
whoever knows better. Opt-in telemetry: ``TLLM_DFLASH_ACCEPT_STATS_DIR=DIR`` (made absolute and
created before the script leaves the caller's directory) makes TensorRT-LLM write per-rank
acceptance histograms there (``tensorrt_llm/_torch/speculative/accept_stats.py``; meant for
measurement runs). Extra arguments (``"$@"``) come last so trtllm-serve's last-value-wins
options override the script's.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

JUDGE = "trtllm/judge.py"  # deploy.trtllm_judge, copied into the bundle

_AWK = r"""
NF == 0 { next }
{ n++ }
bad == "" {
    split($2, cc, "."); sm = cc[1] * 10 + cc[2]; gb = $3 * 1048576 / 1e9
    if (sm != want_sm) bad = sprintf("GPU %d (%s) is SM%d, not SM%d", n - 1, $1, sm, want_sm)
    else if (gb < 0.97 * want_gb || gb > 1.15 * want_gb)
        bad = sprintf("GPU %d (%s) has %.0f GB, not %s GB", n - 1, $1, gb, want_gb)
}
END { if (bad == "" && n < want_n) bad = sprintf("%d GPU(s) present, %d needed", n, want_n); print bad }
"""


_ACCEPT_STATS = (  # resolved before the cd, so a relative DIR is the caller's
    'if [ -n "${TLLM_DFLASH_ACCEPT_STATS_DIR:-}" ]; then\n'
    '    mkdir -p "$TLLM_DFLASH_ACCEPT_STATS_DIR"\n'
    '    TLLM_DFLASH_ACCEPT_STATS_DIR="$(cd "$TLLM_DFLASH_ACCEPT_STATS_DIR" && pwd)"\n'
    "    export TLLM_DFLASH_ACCEPT_STATS_DIR\n"
    '    echo "serve.sh: per-rank acceptance histograms go to $TLLM_DFLASH_ACCEPT_STATS_DIR" >&2\n'
    "fi\n"
)


@dataclass(frozen=True)
class ServeCheck:
    """What ``serve.sh`` checks before it serves: the TensorRT-LLM release and the planned GPUs."""

    release: str  # the TensorRT-LLM version the bundle was built for
    gpu: str  # catalog name (H100, B200, ..., cpu)
    sm: int  # compute capability x 10; 0: planned for the CPU
    memory_gb: float  # datasheet memory per GPU
    gpus: int  # GPUs this node serves with


def _checks(c: ServeCheck) -> str:
    planned = f"{c.gpus}x {c.gpu} (SM{c.sm}, {c.memory_gb:g} GB)"
    q = shlex.quote
    return f"""NEED_TRTLLM={q(c.release)}
check_trtllm() {{
    [ "${{DFLASH_SKIP_VERSION_CHECK:-0}}" = 1 ] && return 0
    "${{PYTHON:-python3}}" {JUDGE} --planned "$NEED_TRTLLM" || exit 2
}}
check_gpus() {{
    [ "${{DFLASH_SKIP_GPU_CHECK:-0}}" = 1 ] && return 0
    [ {c.sm} -eq 0 ] && return 0  # planned for the CPU: nothing to compare
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        echo "serve.sh: nvidia-smi not found; this bundle is planned for {planned}" >&2
        exit 2
    fi
    local rows why
    rows="$(nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv,noheader,nounits 2>&1)" || {{
        echo "serve.sh: nvidia-smi failed (${{rows%%$'\\n'*}}); this bundle is planned for {planned}" >&2
        exit 2
    }}
    why="$(awk -F', *' -v want_sm={c.sm} -v want_gb={c.memory_gb:g} -v want_n={c.gpus} {q(_AWK)} <<<"$rows")"
    if [ -n "$why" ]; then
        echo "serve.sh: this bundle is planned for {planned}, but $why: rebuild with --gpu for this" \\
             "machine (or DFLASH_SKIP_GPU_CHECK=1)" >&2
        exit 2
    fi
}}
check_gpus
check_trtllm
"""


def render(command: str, check: ServeCheck | None) -> str:
    """The script text; ``command`` is the quoted ``trtllm-serve ...`` invocation."""
    for_release = f"TensorRT-LLM {check.release}" if check else "TensorRT-LLM (PyTorch backend)"
    return (
        "#!/usr/bin/env bash\n"
        f"# Serve this DFlash bundle with {for_release} (or a newer release that accepts its config).\n"
        "# Paths are relative to the bundle directory; extra arguments are passed to trtllm-serve.\n"
        "# Opt-in: TLLM_DFLASH_ACCEPT_STATS_DIR=DIR writes per-rank acceptance histograms to DIR.\n"
        "set -euo pipefail\n"
        + _ACCEPT_STATS
        + 'cd "$(dirname "${BASH_SOURCE[0]}")/.."\n'
        + (_checks(check) if check else "")
        + f'exec {command} "$@"\n'
    )
