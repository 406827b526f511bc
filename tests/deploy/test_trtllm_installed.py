"""Features read from the installed release's classes (deploy.trtllm_installed), against the
stand-in ``tensorrt_llm`` of :mod:`tests.deploy.fake_trtllm` (its documented class and field names)
put on sys.path in a temp dir: a feature present by field is planned with although the table's row
lacks it, and each one is reported."""

from __future__ import annotations

import sys

import pytest

from dflash_trt.deploy import pipeline, trtllm_installed
from dflash_trt.deploy import trtllm_config as trtllm
from dflash_trt.plan import get_release
from dflash_trt.plan import recipe as R

from . import fake_trtllm

FLOOR = {"DecodingBaseConfig.min_runtime_draft_len": "int = 1"}


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """Put a stand-in release on sys.path; forget it afterwards (its modules are dropped, not
    restored: a stand-in left in sys.modules would judge the next test's bundles)."""

    def forget():
        for name in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
            del sys.modules[name]

    def install(version, **kw):
        forget()
        monkeypatch.syspath_prepend(str(fake_trtllm.write(tmp_path / f"site-{version}", version, **kw)))

    yield install
    forget()


def _plan(sets):
    r = R.load_recipe("qwen3-8b-h100-fp8", sets)
    res = pipeline.resolve_recipe(r)
    return r, pipeline.plan_resolved(res), res


def test_without_an_installed_release_the_table_stands():
    warnings: list[str] = []
    assert trtllm_installed.release_row("1.3.0rc26", warnings) == get_release("1.3.0rc26") and not warnings


def test_a_feature_present_by_field_is_used_and_reported(installed):
    sets = ["trtllm.release=1.3.0rc26", "serving.enable_block_reuse=true"]
    _, before, _ = _plan(sets)  # the table: 1.3.0rc26 has no FA4 and no context_recompute_tail
    assert before.attention_backend == "VANILLA" and before.context_recompute_tail is None
    installed("1.4.0rc3", add=FLOOR)
    r, p, res = _plan(sets)
    assert p.attention_backend == "FA4" and p.context_recompute_tail == 512
    said = [w for w in p.warnings if "installed here has" in w]
    assert any("FA4 draft attention" in w for w in said)
    assert any("speculative_config.context_recompute_tail" in w for w in said)
    assert any("min_runtime_draft_len=1" in w for w in said) and all("lacks for 1.3.0rc26" in w for w in said)
    cfg = trtllm.config(r, p, res.drafter)  # the keys pass the completed row, not only the table's
    assert cfg.speculative_config.context_recompute_tail == 512 and cfg.speculative_config.attention_backend == "FA4"


def test_the_floor_by_field_becomes_the_rows_floor(installed):
    assert get_release("1.4.0rc1").draft_len_floor == 0
    installed("1.4.0rc3", add=FLOOR)
    assert trtllm_installed.release_row("1.4.0rc1").draft_len_floor == 1
    installed("1.4.0rc2")  # the same release without the field: the table's row stands
    assert trtllm_installed.release_row("1.4.0rc1").draft_len_floor == 0


def test_an_older_installed_release_or_an_opt_out_leaves_the_table(installed, monkeypatch):
    installed("1.3.0rc20", add=FLOOR)
    assert trtllm_installed.release_row("1.4.0rc1") == get_release("1.4.0rc1")
    installed("1.4.0rc3", add=FLOOR)
    monkeypatch.setenv("DFLASH_IGNORE_INSTALLED_TRTLLM", "1")
    assert trtllm_installed.release_row("1.4.0rc1") == get_release("1.4.0rc1")
