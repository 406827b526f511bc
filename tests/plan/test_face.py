"""Planning is arithmetic over configs: importing it (and ingest, whose readers it calls) loads
neither torch nor transformers, so ``plan`` and ``recipes`` answer without their start-up cost."""

from __future__ import annotations

import subprocess
import sys


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_plan_and_ingest_faces_import_no_torch():
    assert _loaded_after("import dflash_trt.plan, dflash_trt.ingest") == set()


def test_the_check_sees_torch_when_a_model_is_touched():
    """The probe can fail: touching a lazy model name loads torch."""
    assert "torch" in _loaded_after("import dflash_trt.model as m; m.Drafter")
