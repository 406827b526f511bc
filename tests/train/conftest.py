"""Fixtures shared by the training tests."""

from __future__ import annotations

import pytest

from tests.helpers import save_pair


@pytest.fixture(scope="module")
def train_setup(tmp_path_factory):
    """(root, target dir): a tiny saved pair and ``root/data.txt``, 200 small Python functions."""
    root = tmp_path_factory.mktemp("train")
    tdir, _ = save_pair(root)
    text = "".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(200))
    (root / "data.txt").write_text(text)
    return root, tdir
