"""TensorRT-LLM's capture verdict per target family: rows cite the file read; build refuses the
families without the hook, per release, in one line naming the runtimes that still run the pair."""

from __future__ import annotations

import pytest

from dflash_trt.plan import KNOWN_RELEASES, capture_missing, capture_supported
from dflash_trt.plan import trtllm_capture as C


def test_every_row_cites_a_tensorrt_llm_file_and_says_captured_or_missing():
    archs = [a for row in C.CAPTURES for a in row.architectures]
    assert len(archs) == len(set(archs)), "an architecture belongs to one family"
    for row in C.CAPTURES:
        assert row.source.startswith("tensorrt_llm/_torch/models/"), row.family
        assert (row.since is None) == (row.missing is not None), row.family
        assert row.since is None or row.since in KNOWN_RELEASES, row.family


@pytest.mark.parametrize(
    "arch,expected",
    [
        ("Qwen3_5ForConditionalGeneration", True),
        ("NemotronHForCausalLM", True),
        ("KimiK25ForConditionalGeneration", True),
        ("Gemma4ForConditionalGeneration", False),
        ("Gemma4UnifiedForConditionalGeneration", False),
        ("MiniMaxM2ForCausalLM", False),
        ("MuseGlimmerForCausalLM", False),
        ("SomethingNewForCausalLM", None),
        ("Glm5NextForConditionalGeneration", False),
    ],
)
def test_the_verdict_per_architecture(arch, expected):
    assert capture_supported(arch) is expected
    assert (capture_missing(arch, "1.4.0rc1") is not None) == (expected is False)


def test_a_hook_newer_than_the_release_is_missing_there():
    oldest, newest = list(KNOWN_RELEASES)[0], list(KNOWN_RELEASES)[-1]
    assert capture_missing("NemotronHForCausalLM", newest) is None
    why = capture_missing("NemotronHForCausalLM", oldest)
    assert why and "modeling_nemotron_h.py" in why and newest in why


def test_the_ingest_layer_no_longer_holds_the_table():
    from dflash_trt.ingest import target

    assert not hasattr(target, "CAPTURE_ARCHITECTURES") and not hasattr(target, "NO_CAPTURE_ARCHITECTURES")
