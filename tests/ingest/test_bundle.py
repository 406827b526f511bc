"""The bundle module: the typed manifest round-trips what build writes, a malformed manifest or
one of another format is one line, and the check passes a real tiny bundle and refuses broken ones."""

from __future__ import annotations

import json
import shutil

import pytest

from dflash_trt import ingest
from dflash_trt.cli import run
from dflash_trt.deploy import check_trtllm_bundle as build_check_bundle
from dflash_trt.errors import CheckpointError


@pytest.fixture(scope="module")
def built(tiny_pair_dir, tmp_path_factory):
    """A bundle written by `dflash-trt build` from the tiny pair (bf16, CPU)."""
    tdir, ddir = tiny_pair_dir
    out = tmp_path_factory.mktemp("bundle") / "tiny"
    assert run(["build", "-t", str(tdir), "-d", str(ddir), "-o", str(out), "--set", "serving.max_seq_len=256"]) == 0
    return out


@pytest.fixture
def bundle(built, tmp_path):
    """A copy of the built bundle to break."""
    return shutil.copytree(built, tmp_path / "tiny")


def _edit_manifest(root, edit) -> None:
    path = root / ingest.Layout.MANIFEST
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def test_manifest_round_trips_what_build_wrote(built, tmp_path):
    text = (built / "manifest.json").read_text()
    m = ingest.read_manifest(built)
    assert m.to_json() == json.loads(text)
    assert list(m.to_json()) == list(json.loads(text))  # key order too
    again = tmp_path / "again"
    again.mkdir()
    assert ingest.write_manifest(again, m) == json.loads(text)
    assert (again / "manifest.json").read_text() == text  # byte for byte
    # typed, with the values build planned
    assert m.format == ingest.BUNDLE_FORMAT == "dflash-trt-bundle/4"
    assert m.files == ingest.bundle_hashes(built) and "trtllm/config.yaml" in m.files and "manifest.json" not in m.files
    assert m.trtllm.release == m.plan.trtllm_release and m.trtllm.image.endswith(":" + m.trtllm.release)
    assert m.drafter.dtype == "bfloat16" and m.drafter.target_layer_ids == sorted(m.drafter.target_layer_ids)
    assert m.precision.weights == "bf16" and m.precision.quantized_by is None
    assert m.gpu.name == "cpu" and m.gpu.count == 1 and m.serve.tp_size == m.plan.tp == 1
    assert m.serve.max_seq_len == 256 and m.reference_runtime.dequantize is False
    assert len(m.inputs.target.sha256["model.safetensors"]) == 64 and m.inputs.calibration is None
    assert set(m.timings) >= {"plan", "target", "drafter", "total"}


def test_the_layout_names_what_build_wrote(built):
    b = ingest.open_bundle(built)
    L = ingest.Layout
    assert (b.target, b.drafter, b.trtllm_config, b.serve_sh) == (
        built / L.TARGET,
        built / L.DRAFTER,
        built / L.TRTLLM_CONFIG,
        built / L.SERVE_SH,
    )
    assert b.manifest_path.is_file() and (b.target / "config.json").is_file() and b.trtllm_config.is_file()
    outputs = b.manifest.outputs
    for rel in (outputs.trtllm_config, outputs.serve):
        assert (built / rel).is_file(), rel
    assert outputs.onnx is None and "onnx" not in b.manifest.to_json()["outputs"]
    assert not b.onnx.exists() and not b.engines.exists()  # no TensorRT path in this recipe
    assert b.name == b.manifest.name == b.manifest.recipe["name"] != built.name  # the manifest names it


def test_check_passes_a_real_bundle(built):
    b = ingest.check_bundle(built)
    assert b.manifest.precision.weights == "bf16"
    report = build_check_bundle(built)
    assert report == {
        "bundle": str(built),
        "precision": "bf16",
        "tp": 1,
        "max_draft_len": report["max_draft_len"],
        "quantized": None,
    }
    assert 1 <= report["max_draft_len"] <= 7


@pytest.mark.parametrize(
    "content, needle",
    [
        ("{nope", "invalid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ("\xff\xfe", "cannot read"),
    ],
)
def test_malformed_manifest_is_one_line(bundle, content, needle):
    (bundle / "manifest.json").write_text(content, encoding="latin-1")
    with pytest.raises(CheckpointError, match=needle) as exc:
        ingest.read_manifest(bundle)
    msg = str(exc.value)
    assert "manifest.json" in msg and "\n" not in msg


@pytest.mark.parametrize(
    "edit, needle",
    [
        (lambda m: m["serve"].update(tp_size="eight"), "serve.tp_size"),
        (lambda m: m.update(surprise=1), "surprise"),
        (lambda m: m["precision"].pop("weights"), "precision.weights"),
    ],
)
def test_manifest_fields_are_typed(bundle, edit, needle):
    _edit_manifest(bundle, edit)
    with pytest.raises(CheckpointError, match=needle) as exc:
        ingest.read_manifest(bundle)
    assert "\n" not in str(exc.value) and "rebuild" in str(exc.value)


def test_missing_manifest_is_one_line(bundle, capsys):
    (bundle / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="no manifest.json"):
        ingest.open_bundle(bundle)
    assert run(["generate", str(bundle), "-p", "hi", "-n", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no manifest.json" in err and "Traceback" not in err
    # serve opens a directory without a manifest (a hand-made TensorRT-LLM bundle), named after it
    assert ingest.open_bundle(bundle, require_manifest=False).name == "tiny"


@pytest.mark.parametrize("fmt", ["dflash-trt-bundle/0", "dflash-trt-bundle/1", "dflash-trt-bundle/5", None])
def test_other_format_versions_are_refused_in_one_line(bundle, fmt, capsys):
    _edit_manifest(bundle, lambda m: m.update(format=fmt) if fmt else m.pop("format"))
    with pytest.raises(CheckpointError, match="rebuild the bundle with 'dflash-trt build'") as exc:
        ingest.read_manifest(bundle)
    assert repr(fmt) in str(exc.value) and ingest.BUNDLE_FORMAT in str(exc.value)
    for argv in (["generate", str(bundle), "-p", "hi", "-n", "2"], ["serve", str(bundle), "--dry-run"]):
        assert run(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "rebuild" in err and "Traceback" not in err, argv
    with pytest.raises(CheckpointError, match="rebuild"):
        build_check_bundle(bundle)


def test_a_format_1_bundle_is_refused_saying_why(bundle, capsys):
    """Format 1 wrote draft_len_schedule keys inverted: serving it would draft the wrong lengths."""
    _edit_manifest(bundle, lambda m: m.update(format="dflash-trt-bundle/1"))
    for argv in (["generate", str(bundle), "-p", "hi", "-n", "2"], ["serve", str(bundle), "--dry-run"]):
        assert run(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "inverted" in err and "rebuild the bundle" in err, argv


@pytest.mark.parametrize(
    "breakage, needle",
    [
        (lambda b: (b / "trtllm" / "config.yaml").unlink(), "bundle lacks trtllm/config.yaml"),
        (lambda b: (b / "target" / "config.json").unlink(), "bundle lacks target/config.json"),
        (lambda b: _edit_manifest(b, lambda m: m.pop("timings")), "manifest lacks 'timings'"),
        (lambda b: (b / "trtllm" / "serve.sh").chmod(0o644), "trtllm/serve.sh is not executable"),
        (lambda b: (b / "drafter" / "model.safetensors").write_bytes(b"\x00" * 4), "truncated"),
    ],
)
def test_check_refuses_a_broken_bundle(bundle, breakage, needle):
    breakage(bundle)
    with pytest.raises(CheckpointError, match=needle):
        ingest.check_bundle(bundle)
    with pytest.raises(CheckpointError, match=needle):
        build_check_bundle(bundle)


def test_a_written_manifest_carries_its_format(tmp_path):
    data = ingest.write_manifest(tmp_path, ingest.Manifest(name="x", serve={"tp_size": 2}))
    assert data == {"format": ingest.BUNDLE_FORMAT, "name": "x", "serve": {"tp_size": 2}}
    b = ingest.open_bundle(tmp_path)
    assert b.name == "x" and b.serve.tp_size == 2 and b.serve.pp_size is None
    assert b.manifest.reference_runtime.target == ingest.Layout.TARGET  # the default layout


def test_format_2_still_runs_but_has_no_hashes_to_verify(bundle):
    """A format-2 bundle (no per-file hashes) still serves and runs as it is; only the file check,
    which needs the hashes, refuses it in one line that says to rebuild."""
    _edit_manifest(bundle, lambda m: (m.update(format="dflash-trt-bundle/2"), m.pop("files")))
    b = ingest.open_bundle(bundle)
    assert b.manifest.format == "dflash-trt-bundle/2" and b.manifest.files is None
    with pytest.raises(CheckpointError, match=r"no per-file hashes.*rebuild the bundle") as exc:
        ingest.check_files(b)
    assert "\n" not in str(exc.value)


def test_check_files_names_every_file_changed_missing_or_added(bundle):
    b = ingest.open_bundle(bundle)
    assert ingest.check_files(b) == []
    (bundle / "trtllm" / "config.yaml").write_text((bundle / "trtllm" / "config.yaml").read_text() + "# edited\n")
    (bundle / "drafter" / "config.json").unlink()
    (bundle / "extra.txt").write_text("x")
    assert ingest.check_files(b) == [
        "trtllm/config.yaml: sha256 differs from the manifest's",
        "drafter/config.json: missing",
        "extra.txt: not in the manifest (added after the build)",
    ]


# The ``engine`` section `build tiny --graphs` wrote at format 3 (commit 254c6f9; error dicts cut short).
FORMAT_3_ENGINE = {
    "onnx": ["drafter.onnx", "drafter_ort.onnx", "embed.onnx", "target.onnx", "target_ort.onnx"],
    "drafter_graph": "dflash2",
    "drafter_onnx_max_error": {"k_cache": 9.5367431640625e-07, "ort_q": 4.351139068603516e-06},
    "target_onnx_max_error": {"logits": 6.67572021484375e-06},
    "engines_built": False,
    "engines_reason": "building TensorRT engines needs: the 'tensorrt' Python package",
    "profile": {
        "max_batch": 8,
        "max_tokens": 1024,
        "max_seq_len": 1032,
        "block_size": 8,
        "page_size": 16,
        "max_pages": 512,
        "max_pages_per_seq": 64,
    },
}


def _as_format_3(data: dict, engine: dict | None = FORMAT_3_ENGINE) -> dict:
    """``data`` (a manifest today's build wrote) as format 3 wrote it: the format, and the
    standalone path's section spelled ``engine``, where format 3 put it (after ``warnings``)."""
    out = {}
    for k, v in {**data, "format": "dflash-trt-bundle/3"}.items():
        if k == "timings" and engine is not None:
            out["engine"] = engine
        out[k] = v
    return out


def test_a_format_3_manifest_reads_as_today_and_writes_back_as_it_was(bundle, tmp_path, capsys):
    """Format 4 renamed ``engine`` to ``graphs``, nothing else: a format-3 bundle reads with the
    section under its new name, is rewritten (tune) in its own format byte for byte, and verifies."""
    path = bundle / ingest.Layout.MANIFEST
    text = json.dumps(_as_format_3(json.loads(path.read_text())), indent=2) + "\n"
    path.write_text(text)
    m = ingest.read_manifest(bundle)
    assert m.format == "dflash-trt-bundle/3" and "engine" not in type(m).model_fields
    assert m.graphs.drafter_graph == "dflash2" and m.graphs.profile.max_pages_per_seq == 64
    assert list(m.to_json()) == list(json.loads(text)) and "graphs" not in m.to_json()
    again = tmp_path / "again"
    again.mkdir()
    ingest.write_manifest(again, m)
    assert (again / "manifest.json").read_text() == text  # written back as format 3 wrote it
    assert ingest.Manifest.model_validate(m.to_json()) == m  # what tune validates before it writes
    assert ingest.check_files(ingest.open_bundle(bundle)) == []  # format 3 records the hashes verify checks
    assert run(["verify", str(bundle), "--no-reference", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True


def test_today_s_manifest_writes_graphs_and_refuses_the_old_key(bundle):
    m = ingest.read_manifest(bundle).model_copy(update={"graphs": ingest.GraphsInfo.model_validate(FORMAT_3_ENGINE)})
    data = m.to_json()
    assert data["format"] == ingest.BUNDLE_FORMAT and data["graphs"] == FORMAT_3_ENGINE and "engine" not in data
    assert list(data).index("graphs") == list(data).index("warnings") + 1  # where format 3 wrote engine
    # format 4 spells it graphs only; format 3 spelling it both ways is refused too (one line, rebuild)
    for fmt, edit in (
        (ingest.BUNDLE_FORMAT, lambda d: d.update(engine=FORMAT_3_ENGINE)),
        ("dflash-trt-bundle/3", lambda d: d.update(engine=FORMAT_3_ENGINE, graphs=FORMAT_3_ENGINE)),
    ):
        _edit_manifest(bundle, lambda d, fmt=fmt, edit=edit: (d.update(format=fmt), edit(d)))
        with pytest.raises(CheckpointError, match=r"engine: Extra inputs are not permitted.*rebuild") as exc:
            ingest.read_manifest(bundle)
        assert "\n" not in str(exc.value)
