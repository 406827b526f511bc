"""The bundle's ``trtllm/serve.sh``: go to the bundle, check the machine, exec trtllm-serve.

Before it ``exec``s, the script checks what the bundle was built for (:class:`ServeCheck`)
and fails with one line on stderr (exit 2) naming what differs:

* the installed ``tensorrt_llm`` is the targeted release: its version is read from
  ``tensorrt_llm/version.py`` (``__version__``, TensorRT-LLM's own version file) without
  importing the package (importing it initialises CUDA), else from the installed
  distribution's metadata; a local build suffix (``+cu130``) is ignored;
* the GPUs ``nvidia-smi`` reports match the plan: compute capability (SM), memory within
  -3% .. +15% of the datasheet figure (drivers report a little more than the datasheet's
  GB), and at least as many GPUs as this node serves with. A bundle planned for the CPU
  (``sm`` 0) skips the GPU check.

``DFLASH_SKIP_VERSION_CHECK=1`` / ``DFLASH_SKIP_GPU_CHECK=1`` skip a check, for whoever knows
better. Extra arguments (``"$@"``) come last so trtllm-serve's last-value-wins options
override the script's.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from dflash_trt.plan import TRTLLM_IMAGE as IMAGE

INDEX_URL = "https://pypi.nvidia.com"

_VERSION_PY = r'''
import importlib.util, pathlib, re
spec = importlib.util.find_spec("tensorrt_llm")
if spec is None:
    raise SystemExit(1)
for loc in spec.submodule_search_locations or []:
    f = pathlib.Path(loc, "version.py")
    m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", f.read_text()) if f.is_file() else None
    if m:
        print(m.group(1))
        raise SystemExit(0)
from importlib import metadata
print(metadata.version("tensorrt_llm"))
'''

_AWK = r'''
NF == 0 { next }
{ n++ }
bad == "" {
    split($2, cc, "."); sm = cc[1] * 10 + cc[2]; gb = $3 * 1048576 / 1e9
    if (sm != want_sm) bad = sprintf("GPU %d (%s) is SM%d, not SM%d", n - 1, $1, sm, want_sm)
    else if (gb < 0.97 * want_gb || gb > 1.15 * want_gb)
        bad = sprintf("GPU %d (%s) has %.0f GB, not %s GB", n - 1, $1, gb, want_gb)
}
END { if (bad == "" && n < want_n) bad = sprintf("%d GPU(s) present, %d needed", n, want_n); print bad }
'''


@dataclass(frozen=True)
class ServeCheck:
    """What ``serve.sh`` checks before it serves: the TensorRT-LLM release and the planned GPUs."""

    release: str            # the TensorRT-LLM version the bundle was built for
    gpu: str                # catalog name (H100, B200, ..., cpu)
    sm: int                 # compute capability x 10; 0: planned for the CPU
    memory_gb: float        # datasheet memory per GPU
    gpus: int               # GPUs this node serves with


def _checks(c: ServeCheck) -> str:
    planned = f"{c.gpus}x {c.gpu} (SM{c.sm}, {c.memory_gb:g} GB)"
    q = shlex.quote
    return f'''NEED_TRTLLM={q(c.release)}
check_trtllm() {{
    [ "${{DFLASH_SKIP_VERSION_CHECK:-0}}" = 1 ] && return 0
    local have
    have="$("${{PYTHON:-python3}}" -c {q(_VERSION_PY)} 2>/dev/null)" || have=""
    if [ -z "$have" ]; then
        echo "serve.sh: tensorrt_llm is not installed; this bundle needs TensorRT-LLM $NEED_TRTLLM" \\
             "(pip install tensorrt-llm==$NEED_TRTLLM --extra-index-url {INDEX_URL}," \\
             "or the {IMAGE}:$NEED_TRTLLM container)" >&2
        exit 2
    fi
    if [ "${{have%%+*}}" != "$NEED_TRTLLM" ]; then
        echo "serve.sh: TensorRT-LLM $have is installed; this bundle was built for TensorRT-LLM $NEED_TRTLLM:" \\
             "install tensorrt-llm==$NEED_TRTLLM, or rebuild with --set trtllm.release=<a release dflash-trt knows>" >&2
        exit 2
    fi
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
check_trtllm
check_gpus
'''


def render(command: str, check: ServeCheck | None) -> str:
    """The script text; ``command`` is the quoted ``trtllm-serve ...`` invocation."""
    for_release = f"TensorRT-LLM {check.release}" if check else "TensorRT-LLM (PyTorch backend)"
    return (
        "#!/usr/bin/env bash\n"
        f"# Serve this DFlash bundle with {for_release}.\n"
        "# Paths are relative to the bundle directory; extra arguments are passed to trtllm-serve.\n"
        "set -euo pipefail\n"
        'cd "$(dirname "${BASH_SOURCE[0]}")/.."\n'
        + (_checks(check) if check else "")
        + f'exec {command} "$@"\n'
    )
