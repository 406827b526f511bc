"""Bundles end to end on the CPU: tiny pair at bf16/fp8/nvfp4, refusals, atomic output, bundles in generate."""

from __future__ import annotations

import json
import struct

import pytest
import torch

from dflash_trt.cli import run
from dflash_trt.deploy import pipeline
from dflash_trt.deploy import trtllm_config as trtllm
from dflash_trt.plan import recipe as R
from tests.helpers import hf_greedy, save_pair

GPU_FOR = {"bf16": "cpu", "fp8": "h100", "nvfp4": "b200"}


def _headers(path):
    out = {}
    for f in path.glob("*.safetensors"):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            out.update(json.loads(fh.read(n)))
    out.pop("__metadata__", None)
    return out


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_pair(tmp_path_factory.mktemp("pair"))


@pytest.fixture(scope="module")
def bundles(pair, tmp_path_factory):
    tdir, ddir = pair
    root = tmp_path_factory.mktemp("bundles")
    out = {}
    for prec, gpu in GPU_FOR.items():
        argv = [
            "build",
            "--target",
            str(tdir),
            "--drafter",
            str(ddir),
            "--gpu",
            gpu,
            "--precision",
            prec,
            "-o",
            str(root / prec),
            "--set",
            "serving.max_seq_len=256",
            "--set",
            "precision.calib_samples=4",
            "--set",
            "precision.calib_seq_len=32",
        ]
        assert run(argv) == 0, prec
        out[prec] = root / prec
    return out


@pytest.mark.parametrize("prec", list(GPU_FOR))
def test_bundle_layout_manifest_and_config(bundles, pair, prec):
    b = bundles[prec]
    for rel in (
        "manifest.json",
        "target/config.json",
        "target/tokenizer.json",
        "drafter/config.json",
        "drafter/model.safetensors",
        "trtllm/config.yaml",
        "trtllm/serve.sh",
    ):
        assert (b / rel).is_file(), rel
    m = json.loads((b / "manifest.json").read_text())
    assert m["format"] == pipeline.BUNDLE_FORMAT and m["precision"]["weights"] == prec
    assert m["gpu"]["name"] == {"bf16": "cpu", "fp8": "H100", "nvfp4": "B200"}[prec]
    assert m["inputs"]["target"]["path"] == str(pair[0].resolve())
    assert len(m["inputs"]["target"]["sha256"]["model.safetensors"]) == 64
    assert set(m["inputs"]["drafter"]["sha256"]) >= {"config.json", "model.safetensors"}
    assert m["tools"]["torch"] and m["tools"]["transformers"] and m["plan"]["tp"] == 1
    assert set(m["timings"]) >= {"plan", "target", "drafter", "total"}
    cfg = trtllm.load_trtllm_config(b)  # passes the schema
    assert cfg.speculative_config.speculative_model == "./drafter" and cfg.max_seq_len == 256
    assert cfg.speculative_config.max_draft_len <= 7
    check = pipeline.check_trtllm_bundle(b)
    assert check["precision"] == prec
    assert not list(b.parent.glob(".*partial*"))


def test_bf16_bundle_copies_the_target(bundles, pair):
    h = _headers(bundles["bf16"] / "target")
    assert h == _headers(pair[0])
    assert not (bundles["bf16"] / "target" / "hf_quant_config.json").exists()


def test_fp8_tensors(bundles):
    h = _headers(bundles["fp8"] / "target")
    q = json.loads((bundles["fp8"] / "target" / "hf_quant_config.json").read_text())["quantization"]
    assert q["quant_algo"] == "FP8" and q["kv_cache_quant_algo"] is None and "lm_head" in q["exclude_modules"]
    w = h["model.layers.0.mlp.down_proj.weight"]
    assert w["dtype"] == "F8_E4M3" and w["shape"] == [64, 128]
    assert h["model.layers.0.mlp.down_proj.weight_scale"]["dtype"] == "F32"
    assert h["model.layers.0.mlp.down_proj.input_scale"]["dtype"] == "F32"
    assert h["lm_head.weight"]["dtype"] == "BF16" and h["model.embed_tokens.weight"]["dtype"] == "BF16"
    assert sum(k.endswith(".weight_scale") for k in h) == 4 * 7


def test_nvfp4_tensors(bundles):
    h = _headers(bundles["nvfp4"] / "target")
    q = json.loads((bundles["nvfp4"] / "target" / "hf_quant_config.json").read_text())["quantization"]
    assert q["quant_algo"] == "NVFP4" and q["group_size"] == 16
    shapes = {"mlp.gate_proj": (128, 64), "mlp.down_proj": (64, 128), "self_attn.k_proj": (32, 64)}
    for name, (out_f, in_f) in shapes.items():
        pre = f"model.layers.1.{name}"
        assert h[f"{pre}.weight"]["dtype"] == "U8" and h[f"{pre}.weight"]["shape"] == [out_f, in_f // 2]
        assert h[f"{pre}.weight_scale"]["dtype"] == "F8_E4M3"
        assert h[f"{pre}.weight_scale"]["shape"] == [out_f, in_f // 16]
        assert h[f"{pre}.weight_scale_2"]["dtype"] == "F32" and h[f"{pre}.input_scale"]["dtype"] == "F32"
    assert h["lm_head.weight"]["dtype"] == "BF16"


@pytest.mark.parametrize("prec, tol", [("fp8", 0.05), ("nvfp4", 0.15)])
def test_dequantized_weights_are_close_to_the_source(bundles, pair, prec, tol):
    from safetensors.torch import load_file

    from dflash_trt.runtime.dequantize import dequantize_state

    src = load_file(str(pair[0] / "model.safetensors"))
    deq = dequantize_state(bundles[prec] / "target")
    assert set(deq) == set(src)
    for k in ("model.layers.0.self_attn.q_proj.weight", "model.layers.3.mlp.down_proj.weight"):
        ref = src[k].to(torch.bfloat16).float()
        err = ((deq[k] - ref).norm() / ref.norm()).item()
        assert 0 < err < tol, (k, err)


def test_quantized_bundle_is_lossless_on_the_reference_runtime(bundles):
    from dflash_trt.runtime.loop import generate
    from dflash_trt.runtime.pair import load_bundle

    p = load_bundle(bundles["fp8"], dtype="float32")
    prompt = p.encode("def f(x):")
    res = generate(p.target, p.drafter, [prompt], max_new_tokens=16, block_size=None, stop_token_ids=[])
    assert res.token_ids[0] == hf_greedy(p.target.model, prompt, 16)


def test_generate_accepts_a_bundle(bundles, capsys):
    assert run(["generate", str(bundles["nvfp4"]), "-p", "hello", "-n", "6", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["token_ids"]) <= 6


def test_bench_accepts_a_bundle(bundles, tmp_path, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("import os\n")
    assert run(["bench", str(bundles["bf16"]), "--prompts", str(prompts), "-n", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["lossless"] is True


def _flat_quant_config(target_dir) -> None:
    """Rewrite a ModelOpt 0.x export's hf_quant_config.json in ModelOpt >= 1.0's flat shape."""
    path = target_dir / "hf_quant_config.json"
    old = json.loads(path.read_text())
    q = old["quantization"]
    path.write_text(
        json.dumps(
            {
                "producer": {"name": "modelopt", "version": "1.0.0"},
                "quant_method": "modelopt",
                "quant_algo": q["quant_algo"],
                "kv_cache_scheme": None,
                "ignore": q["exclude_modules"],
                "config_groups": {},
            }
        )
    )


def test_flat_modelopt_1_export_is_verified_built_and_inspected(bundles, pair, tmp_path, capsys):
    import shutil

    from dflash_trt.deploy import quantize

    flat = shutil.copytree(bundles["fp8"] / "target", tmp_path / "flat")
    _flat_quant_config(flat)
    nested = quantize.verify_export(bundles["fp8"] / "target", "fp8")
    assert quantize.verify_export(flat, "fp8") == nested and nested["quant_algo"] == "FP8"
    out = tmp_path / "from-flat"
    assert (
        run(
            [
                "build",
                "-t",
                str(flat),
                "-d",
                str(pair[1]),
                "--gpu",
                "h200",
                "--precision",
                "auto",
                "-o",
                str(out),
                "--set",
                "serving.max_seq_len=256",
            ]
        )
        == 0
    )
    m = json.loads((out / "manifest.json").read_text())
    assert m["precision"]["weights"] == "fp8" and m["precision"]["quantized_by"] == "as shipped"
    capsys.readouterr()
    assert run(["inspect", str(flat), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["quantization"]["quant_algo"] == "FP8"


def test_prequantized_target_is_used_as_is(bundles, pair, tmp_path):
    fp8_target = bundles["fp8"] / "target"
    out = tmp_path / "again"
    assert (
        run(
            [
                "build",
                "-t",
                str(fp8_target),
                "-d",
                str(pair[1]),
                "--gpu",
                "h200",
                "--precision",
                "auto",
                "-o",
                str(out),
                "--set",
                "serving.max_seq_len=256",
            ]
        )
        == 0
    )
    m = json.loads((out / "manifest.json").read_text())
    assert m["precision"]["weights"] == "fp8" and m["precision"]["quantized_by"] == "as shipped"
    assert _headers(out / "target") == _headers(fp8_target)


def test_flags_override_the_recipe(pair, tmp_path):
    tdir, ddir = pair
    f = tmp_path / "r.yaml"
    f.write_text(
        f"name: mine\ntarget: {{id: {tdir}}}\ndrafter: {{id: {ddir}}}\ngpu: {{name: h100}}\n"
        "serving: {max_seq_len: 256}\n"
    )
    out = tmp_path / "o"
    assert run(["build", str(f), "--gpu", "b200", "--dry-run", "--json", "-o", str(out)]) == 0
    assert not out.exists()
    r = R.load_recipe(f, ["gpu.name=b200"])
    assert pipeline.plan_resolved(pipeline.resolve_recipe(r)).attention_backend == "TRTLLM"


def test_calibration_file_is_relative_to_the_recipe(pair, tmp_path):
    """precision.calib in a recipe file is resolved against that file before ModelOpt reads it;
    the precision section's sample count and length bound what is fed."""
    tdir, ddir = pair
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "calib.txt").write_text("one two three four five six seven eight nine ten\n" * 8)
    f = tmp_path / "recipes" / "r.yaml"
    f.write_text(
        f"name: cal\ntarget: {{id: {tdir}}}\ndrafter: {{id: {ddir}}}\ngpu: {{name: h100}}\n"
        "precision: {weights: fp8, calib: calib.txt, calib_samples: 3, calib_seq_len: 8}\n"
        "serving: {max_seq_len: 256}\n"
    )
    assert run(["build", str(f), "-o", str(tmp_path / "o")]) == 0
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())
    cal = m["precision"]["quantization"]["calibration"]
    assert cal["source"] == str(tmp_path / "recipes" / "calib.txt") and cal["samples"] == 3 and cal["tokens"] <= 24
    assert m["inputs"]["calibration"]["path"] == cal["source"] and m["precision"]["verified"]["quantized_linears"]


def test_existing_output_needs_force(bundles, pair, capsys):
    tdir, ddir = pair
    argv = ["build", "-t", str(tdir), "-d", str(ddir), "-o", str(bundles["bf16"]), "--set", "serving.max_seq_len=256"]
    assert run(argv) == 2 and "--force" in capsys.readouterr().err
    before = json.loads((bundles["bf16"] / "manifest.json").read_text())["created"]
    assert run(argv + ["--force"]) == 0
    assert pipeline.check_trtllm_bundle(bundles["bf16"])["precision"] == "bf16"
    assert json.loads((bundles["bf16"] / "manifest.json").read_text())["created"] >= before


def _bad_key_recipe(tmp_path, pair):
    f = tmp_path / "bad.yaml"
    f.write_text(f"name: bad\ntarget: {{id: {pair[0]}}}\ndrafter: {{id: {pair[1]}}}\nserving: {{max_batchsize: 8}}\n")
    return [str(f)]


@pytest.mark.parametrize(
    "case, needle",
    [
        ("nvfp4-on-h100", "nvfp4 weights do not run on H100"),
        ("fp8-on-a100", "fp8 weights do not run on A100"),
        ("does-not-fit", "does not fit on 1x H100"),
        ("unknown-gpu", "unknown GPU 'tpu-v5'"),
        ("bad-key", "serving.max_batchsize: unknown key"),
        ("bad-calib", "calibration file"),
        ("requantize", "already fp8-quantized"),
    ],
)
def test_refusals_exit_2_in_one_line_and_leave_nothing(case, needle, pair, bundles, tmp_path, capsys):
    tdir, ddir = pair
    flags = ["-t", str(tdir), "-d", str(ddir)]
    argv = {
        "nvfp4-on-h100": flags + ["--gpu", "h100", "--precision", "nvfp4"],
        "fp8-on-a100": flags + ["--gpu", "a100", "--precision", "fp8"],
        "does-not-fit": ["qwen3-8b-h100-fp8", "--set", "serving.max_batch_size=256"],
        "unknown-gpu": flags + ["--gpu", "tpu-v5"],
        "bad-key": _bad_key_recipe(tmp_path, pair),
        "bad-calib": flags + ["--gpu", "h100", "--precision", "fp8", "--calib", str(tmp_path / "none.txt")],
        "requantize": ["-t", str(bundles["fp8"] / "target"), "-d", str(ddir), "--gpu", "b200", "--precision", "nvfp4"],
    }[case]
    out = tmp_path / "out"
    assert run(["build", *argv, "-o", str(out)]) == 2
    errtext = capsys.readouterr().err.strip()
    assert needle in errtext and len(errtext.splitlines()) == 1 and "Traceback" not in errtext
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_dry_run_plans_a_real_recipe_without_weights(tmp_path, capsys):
    out = tmp_path / "x"
    assert run(["build", "qwen3-8b-b200-nvfp4", "--dry-run", "-o", str(out)]) == 0
    assert not out.exists() and "nothing written" in capsys.readouterr().out


def test_plan_command_json_and_table(capsys):
    assert run(["plan", "llama3.1-8b-h100-fp8", "--json"]) == 0
    p = json.loads(capsys.readouterr().out)["plan"]
    assert p["precision"] == "fp8" and p["block_size"] == 10 and p["max_draft_len"] <= 9
    assert run(["plan", "gpt-oss-120b-8xh200"]) == 0
    text = capsys.readouterr().out
    assert "memory per GPU" in text and "tp=8" in text and "ep=8" in text


def test_build_without_arguments_uses_the_tiny_recipe(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run(["build"]) == 0
    report = pipeline.check_trtllm_bundle(tmp_path / "dflash-out" / "tiny")
    assert report["precision"] == R.load_recipe("tiny").precision.weights


def test_serve_reads_what_build_writes(bundles, tmp_path, capsys):
    """The manifest carries what `serve` needs: the bundle's name, the planned parallelism
    (a multi-node launch that contradicts the plan is refused), the planned context length."""
    from dflash_trt.serve import launch

    b = launch.read_bundle(bundles["bf16"])
    manifest = json.loads((bundles["bf16"] / "manifest.json").read_text())
    assert b.name == manifest["recipe"]["name"]
    assert b.serve.tp_size == manifest["plan"]["tp"] == 1 and b.serve.max_seq_len == 256
    assert run(["serve", str(bundles["bf16"]), "--emit", "slurm", "--nodes", "2", "-o", str(tmp_path / "job.sh")]) == 2
    assert "planned for tp_size 1" in capsys.readouterr().err
    assert not (tmp_path / "job.sh").exists()
    assert (
        run(
            [
                "serve",
                str(bundles["bf16"]),
                "--emit",
                "slurm",
                "--nodes",
                "1",
                "--gpus-per-node",
                "1",
                "-o",
                str(tmp_path / "job.sh"),
            ]
        )
        == 0
    )
    assert "--nodes=1" in (tmp_path / "job.sh").read_text()


def test_build_json_prints_the_graphs_section_under_both_keys(tmp_path, monkeypatch, capsys):
    """The manifest calls the standalone path's section ``graphs`` (bundle format 4); ``build --json``
    prints it as ``graphs`` and, as before, ``engine`` (``--json`` key paths stay)."""
    info = {
        "onnx": ["drafter.onnx"],
        "drafter_graph": "dflash2",
        "drafter_onnx_max_error": {"k_cache": 1e-6},
        "engines_built": False,
        "engines_reason": "no TensorRT here",
    }
    monkeypatch.setattr(pipeline, "_tensorrt_path", lambda r, tmp, say: dict(info))  # no export: the keys only
    out = tmp_path / "b"
    assert run(["build", "tiny", "--graphs", "--json", "-o", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert printed["graphs"] == printed["engine"] == manifest["graphs"] == info and "engine" not in manifest
    assert manifest["format"] == "dflash-trt-bundle/4" and manifest["outputs"]["onnx"] == "onnx"
    assert run(["build", "tiny", "--dry-run", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["graphs"] is printed["engine"] is None
