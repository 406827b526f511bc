import os

import pytest
import torch

# No GPU here: Triton kernels run through its CPU interpreter, which must be chosen before
# anything imports triton (so here, not in one test module).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Every model in the tests is tiny: one CPU thread runs them fastest, and a suite that
# does not fight itself for the cores keeps its run time steady on a busy machine.
torch.set_num_threads(1)



@pytest.fixture(scope="session")
def tiny_pair_dir(tmp_path_factory):
    """A tiny Qwen3 target (safetensors + tokenizer) and a z-lab drafter, on disk."""
    from tests.helpers import save_pair

    return save_pair(tmp_path_factory.mktemp("pair"))


@pytest.fixture(scope="session")
def bundle_dir(tmp_path_factory):
    """The serving tests' bundle (tests.serve.helpers.make_bundle), built once for serve/ and bench/."""
    from tests.serve.helpers import make_bundle

    return make_bundle(tmp_path_factory.mktemp("bundle") / "tiny-bundle")
