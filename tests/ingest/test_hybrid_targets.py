"""Ingest reads the second-wave hybrid targets' configs as transformers writes them."""

from __future__ import annotations

import json

import pytest

from dflash_trt import ingest
from dflash_trt.errors import CheckpointError
from tests.families import _glm5_next


def test_glm5_next_position_free_attention_is_read_not_refused(tmp_path):
    """transformers writes ``head_dim: 0`` for glm5_next (MLA, ``qk_rope_head_dim: 0``): the
    query/key head is qk_nope + qk_rope; a 0 elsewhere is still refused."""
    _, cfg = _glm5_next()
    cfg.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["text_config"]["head_dim"] == 0
    spec = ingest.read_target(tmp_path, require_weights=False)
    assert spec.model_type == "glm5_next" and spec.head_dim == 16
    raw["text_config"].pop("qk_nope_head_dim")
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="head_dim is 0"):
        ingest.read_target(tmp_path, require_weights=False)
