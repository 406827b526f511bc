"""FP8 / NVFP4 post-training quantization of the target through NVIDIA Model Optimizer.

``quantize_target`` loads the target in BF16, calibrates it with ``mtq.quantize`` on a
few hundred tokens of text (``--calib FILE``, else built-in snippets tokenized with the
target's own tokenizer), and writes a Hugging Face checkpoint with
``export_hf_checkpoint(model, export_dir=..., dtype=torch.bfloat16)``, which
TensorRT-LLM's PyTorch backend loads directly. The drafter is never quantized.

On the CPU (ModelOpt 0.47, seen): calibration works for both formats, because max
calibration only records amax statistics; what needs CUDA is NVFP4's *fake-quantized*
forward after calibration, which this module never runs. The model must be BF16 before
export or the non-quantized tensors stay FP32 (``dtype=`` only casts what it quantizes).
With transformers 5.x ``config.architectures`` must be set.

``verify_export`` reads the safetensors headers (transformers would ignore the scales on
reload) and ``dequantize_state`` turns an export back into dense weights for the reference
runtime (weight-only: what a quantized target computes, minus activation quantization).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from dflash_trt import ingest
from dflash_trt.errors import CheckpointError, DFlashError, read_text, require
from dflash_trt.model import load_target
from dflash_trt.plan import PrecisionSpec
from dflash_trt.runtime import load_tokenizer

ALGO = {"fp8": "FP8", "nvfp4": "NVFP4"}

BUILTIN_CALIBRATION = [
    "The quick brown fox jumps over the lazy dog while the farmer watches from the porch.",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    "User: What is the capital of France?\nAssistant: The capital of France is Paris.",
    "Let x be a real number such that x^2 - 5x + 6 = 0. Then (x - 2)(x - 3) = 0, so x = 2 or x = 3.",
    "In 1869 Dmitri Mendeleev published a periodic table that arranged the elements by atomic weight.",
    "SELECT name, COUNT(*) FROM orders JOIN users ON users.id = orders.user_id GROUP BY name;",
    "Photosynthesis converts light energy into chemical energy stored in glucose molecules.",
    "Dear team, the quarterly report is attached. Please review the figures before Friday's meeting.",
    "import numpy as np\nx = np.linspace(0, 1, 100)\ny = np.sin(2 * np.pi * x)\nprint(y.mean())\n",
    "Q: A train travels 120 km in 1.5 hours. What is its average speed?\nA: 120 / 1.5 = 80 km/h.",
    "La vie est belle, et le soleil brille sur les montagnes enneigées des Alpes.",
    "The mitochondria is the powerhouse of the cell; it produces ATP through oxidative phosphorylation.",
]


def calibration_texts(calib: str | Path | None) -> list[str]:
    """Calibration samples: a text file (one sample per line) or JSONL with 'prompt'/'text'."""
    if calib is None:
        return list(BUILTIN_CALIBRATION)
    path = Path(calib)
    if not path.exists():
        raise DFlashError(f"calibration file {path} does not exist")
    texts = []
    for line in read_text(path, "calibration file").splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            try:
                obj = json.loads(line)
                line = (obj.get("prompt") or obj.get("text") or "") if isinstance(obj, dict) else line
            except (json.JSONDecodeError, RecursionError):
                pass
            if not isinstance(line, str):
                raise DFlashError(f"calibration file {path}: a JSONL 'prompt'/'text' is not a string")
        if line:
            texts.append(line)
    if not texts:
        raise DFlashError(f"calibration file {path} has no samples")
    return texts


def calibration_batches(tokenizer, texts: list[str], samples: int, seq_len: int) -> list[torch.Tensor]:
    """Up to ``samples`` sequences of at most ``seq_len`` tokens: the texts, tokenized and packed."""
    stream: list[int] = []
    for t in texts:
        stream += tokenizer(t, add_special_tokens=False)["input_ids"]
    if not stream:
        raise DFlashError("calibration texts tokenize to nothing")
    out = []
    for start in range(0, len(stream), seq_len):
        out.append(torch.tensor([stream[start : start + seq_len]]))
        if len(out) == samples:
            break
    return out


def _quant_cfg(mtq, precision: str, kv_cache: str) -> dict:
    cfg = copy.deepcopy(mtq.FP8_DEFAULT_CFG if precision == "fp8" else mtq.NVFP4_DEFAULT_CFG)
    if kv_cache == "fp8":
        kv = copy.deepcopy(mtq.FP8_KV_CFG["quant_cfg"])
        if isinstance(cfg["quant_cfg"], list):  # ModelOpt >= 0.4x: ordered list of rules
            cfg["quant_cfg"] = list(cfg["quant_cfg"]) + list(kv)
        else:
            cfg["quant_cfg"].update(kv)
    return cfg


def quantize_target(target_dir: Path, out_dir: Path, spec: PrecisionSpec, progress=None) -> dict:
    """Calibrate and export the target at ``spec.weights`` (fp8 | nvfp4) into ``out_dir``.

    ``spec`` is the recipe's precision section: ``kv_cache`` (auto | fp8), ``calib`` (a text
    file, already resolved against the recipe; None: built-in snippets), ``calib_samples``
    sequences of at most ``calib_seq_len`` tokens. ``progress(done, total)`` per batch.
    """
    precision, kv_cache, calib = spec.weights, spec.kv_cache, spec.calib
    if precision not in ALGO:
        raise DFlashError(f"cannot quantize to {precision!r}; choose fp8 or nvfp4")
    mtq = require("modelopt.torch.quantization", "quant", "quantizing the target")
    export = require("modelopt.torch.export", "quant", "exporting the quantized target")
    require("requests", "quant", "ModelOpt's export")
    _quiet_progress_bars()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = load_tokenizer(Path(target_dir))
    batches = calibration_batches(tokenizer, calibration_texts(calib), spec.calib_samples, spec.calib_seq_len)
    model = load_target(target_dir, dtype=torch.bfloat16, device=device)
    config: Any = model.config  # a transformers PretrainedConfig
    if not getattr(config, "architectures", None):
        config.architectures = [type(model).__name__]
    t0 = time.perf_counter()

    def forward_loop(m):
        with torch.no_grad():
            for i, ids in enumerate(batches):
                m(ids.to(device))
                if progress is not None:
                    progress(i + 1, len(batches))

    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mtq.quantize(model, _quant_cfg(mtq, precision, kv_cache), forward_loop)
            out_dir = Path(out_dir)
            out_dir.mkdir(parents=True, exist_ok=True)
            export.export_hf_checkpoint(model, export_dir=str(out_dir), dtype=torch.bfloat16)
    except (RuntimeError, AssertionError, ValueError) as exc:
        raise DFlashError(f"ModelOpt {precision} quantization failed on {device}: {str(exc).splitlines()[0]}") from exc
    _copy_tokenizer(Path(target_dir), out_dir)
    return {
        "tool": "nvidia-modelopt",
        "algorithm": ALGO[precision],
        "kv_cache": kv_cache,
        "device": device,
        "calibration": {
            "source": str(calib) if calib else "built-in snippets",
            "samples": len(batches),
            "tokens": sum(b.numel() for b in batches),
        },
        "seconds": round(time.perf_counter() - t0, 2),
    }


def _quiet_progress_bars() -> None:
    """Turn off transformers' and huggingface_hub's progress bars (the CLI reports its own)."""
    from transformers.utils import logging as hf_logging  # start-up: transformers

    hf_logging.disable_progress_bar()
    with contextlib.suppress(ImportError):
        from huggingface_hub.utils import disable_progress_bars  # start-up: huggingface_hub

        disable_progress_bars()


def _copy_tokenizer(target_dir: Path, out_dir: Path) -> None:
    """The target's tokenizer files into the export: only the checkpoint's own, no wider than they are."""
    for name in ingest.tokenizer_files(target_dir):
        real = ingest.checkpoint_file(target_dir, target_dir / name)
        shutil.copyfile(real, out_dir / name)
        (out_dir / name).chmod(real.stat().st_mode & 0o777)


# ---------------------------------------------------------------------------------------
# Reading an export back
# ---------------------------------------------------------------------------------------


def verify_export(directory: Path, precision: str, kv_cache: str = "auto") -> dict:
    """Check a ModelOpt export by its safetensors headers and hf_quant_config.json (nested, or
    ModelOpt >= 1.0's flat shape: ``ingest.read_modelopt_quant_config``): the format
    ``modelopt.torch.export.export_hf_checkpoint`` writes (FP8: float8_e4m3fn ``weight`` + FP32
    ``weight_scale``/``input_scale``; NVFP4: packed uint8 ``weight``, FP8 ``weight_scale`` per 16,
    FP32 ``weight_scale_2``; ``lm_head`` excluded)."""
    directory = Path(directory)
    where = f"quantized target {directory}"
    q = _read_quant_config(directory, where, precision, kv_cache)
    h = ingest.read_headers(directory)
    quantized = sorted(k[: -len(".weight_scale")] for k in h if k.endswith(".weight_scale"))
    if not quantized:
        raise CheckpointError(f"{where}: no quantized linear layers (no *.weight_scale tensors)")
    for m in quantized:
        w, s = h.get(f"{m}.weight"), h[f"{m}.weight_scale"]
        if w is None or f"{m}.input_scale" not in h:
            raise CheckpointError(f"{where}: {m} lacks weight or input_scale")
        if precision == "fp8":
            ok = w.dtype == "F8_E4M3" and s.dtype == "F32" and s.shape in ((), (1,))
        else:  # two e2m1 values per U8 byte, one F8_E4M3 scale per 16 values
            s2 = h.get(f"{m}.weight_scale_2")
            ok = (
                w.dtype == "U8"
                and s.dtype == "F8_E4M3"
                and s2 is not None
                and s2.dtype == "F32"
                and len(w.shape) == 2
                and s.shape == (w.shape[0], w.shape[1] * 2 // 16)
            )
        if not ok:
            raise CheckpointError(
                f"{where}: {m} has unexpected {precision} tensors: weight {w.dtype} "
                f"{list(w.shape)}, weight_scale {s.dtype} {list(s.shape)}"
            )
    for name in ("lm_head.weight", "model.embed_tokens.weight"):
        if name in h and h[name].dtype not in ("BF16", "F16", "F32"):
            raise CheckpointError(f"{where}: {name} is {h[name].dtype}; it must stay unquantized")
    kv_scales = sum(k.endswith((".k_scale", ".v_scale")) for k in h)
    if kv_cache == "fp8" and not kv_scales:
        raise CheckpointError(f"{where}: FP8 KV cache requested but no k_scale/v_scale tensors")
    return {
        "quant_algo": q["quant_algo"],
        "kv_cache_quant_algo": q.get("kv_cache_quant_algo"),
        "quantized_linears": len(quantized),
        "kv_scales": kv_scales,
        "excluded": q.get("exclude_modules"),
    }


def _read_quant_config(directory: Path, where: str, precision: str, kv_cache: str) -> dict:
    """The export's hf_quant_config.json, checked: the algorithm, KV cache, NVFP4 group size and lm_head excluded."""
    try:  # the nested (ModelOpt 0.x) or flat (ModelOpt >= 1.0) shape
        q = ingest.read_modelopt_quant_config(json.loads((directory / "hf_quant_config.json").read_text()))
    except (FileNotFoundError, json.JSONDecodeError):
        q = None
    if q is None:
        raise CheckpointError(f"{where}: no readable hf_quant_config.json") from None
    if q.get("quant_algo") != ALGO[precision]:
        raise CheckpointError(f"{where}: quant_algo {q.get('quant_algo')!r}, expected {ALGO[precision]!r}")
    want_kv = "FP8" if kv_cache == "fp8" else None
    if q.get("kv_cache_quant_algo") != want_kv:
        raise CheckpointError(f"{where}: kv_cache_quant_algo {q.get('kv_cache_quant_algo')!r}, expected {want_kv!r}")
    if precision == "nvfp4" and q.get("group_size") != 16:
        raise CheckpointError(f"{where}: NVFP4 group_size {q.get('group_size')}, expected 16")
    if not any("lm_head" in m for m in q.get("exclude_modules") or []):
        raise CheckpointError(f"{where}: lm_head is not excluded from quantization")
    return q
