import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def tiny_pair_dir(tmp_path_factory):
    """A tiny Qwen3 target (safetensors + tokenizer) and a z-lab drafter, on disk."""
    from helpers import save_pair

    return save_pair(tmp_path_factory.mktemp("pair"))
