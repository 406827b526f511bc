"""The run spec: resolved once, refusing in one line only what cannot run; a loaded pair is complete
(its backend open, its kernels set) and never changed after loading."""

from __future__ import annotations

import dataclasses

import pytest

from dflash_trt.errors import DFlashError
from dflash_trt.runtime import RunSpec, TorchBackend, load_bundle, resolve_run


def test_torch_choices_resolve_as_given():
    assert resolve_run() == RunSpec("torch", "lean")
    assert resolve_run("torch", "triton") == RunSpec("torch", "triton")
    assert resolve_run().notes == () and not resolve_run().graphs


@pytest.mark.parametrize(
    "kw, needle",
    [
        (dict(backend="tvm"), "--backend 'tvm': choose one of torch, onnx, tensorrt"),
        (dict(kernels="cuda"), "--kernels 'cuda': choose one of lean, triton"),
        (dict(kernels="reference"), "--kernels 'reference': choose one of lean, triton"),  # the old spelling
        (dict(backend="onnx"), "pass a bundle built with --graphs"),
        (dict(backend="onnx", kernels="triton"), "the onnx backend runs the graphs' own"),
    ],
)
def test_what_cannot_run_is_one_line(kw, needle):
    with pytest.raises(DFlashError) as e:
        resolve_run(**kw)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_bundle_without_graphs_refuses_the_graph_backends(bundle_dir):
    for backend in ("onnx", "tensorrt"):
        with pytest.raises(DFlashError, match="built with --graphs; this one has none"):
            resolve_run(backend, bundle=bundle_dir)


def test_a_loaded_pair_is_complete_and_frozen(bundle_dir):
    pair = load_bundle(bundle_dir, resolve_run("torch", "triton"))
    assert isinstance(pair.backend, TorchBackend) and pair.backend.drafter is pair.drafter
    assert pair.drafter.kernels == "triton" and pair.spec.kernels == "triton"
    assert pair.name == bundle_dir.name
    with pytest.raises(dataclasses.FrozenInstanceError):
        pair.backend = None
    plain = dataclasses.replace(pair, draft_len_schedule=None)  # a changed pair is a new one
    assert plain.backend is pair.backend and plain.draft_len_schedule is None
