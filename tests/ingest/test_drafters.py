"""Every supported drafter format loads to the same drafter as its z-lab original.

The checkpoints are written by the tests (formats_writers.py), never by the loader under
test; the originals are read back with ``Drafter.load`` (model.py's plain z-lab reader).
"Same" is checked three ways: identical tensors, identical draft logits on real target
hidden states (catches layer-id shifts and head/vocabulary mistakes), and identical greedy
tokens and acceptance statistics through the reference runtime.
"""

from __future__ import annotations

import json

import pytest
import torch

from dflash_trt import ingest
from dflash_trt.errors import CheckpointError
from dflash_trt.model.drafter import Drafter
from dflash_trt.model.target import Target
from dflash_trt.runtime.loop import generate
from tests.helpers import hf_greedy, prompts, tiny_drafter, tiny_drafter_config
from tests.ingest.formats_writers import write_modelopt, write_speculators, write_zlab_newer, write_zlab_v1

DRAFT_VOCAB = 40
MAX_NEW = 16


@pytest.fixture(scope="module")
def target(tiny_pair_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_pair_dir[0], dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def drafters(target):
    """Base drafters: full vocabulary, and a reduced draft vocabulary with its own head."""
    full = tiny_drafter(target, seed=7)
    torch.manual_seed(8)
    reduced = Drafter(tiny_drafter_config(target, draft_vocab_size=DRAFT_VOCAB))
    for p in reduced.parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.2)
    g = torch.Generator().manual_seed(9)
    reduced.d2t = torch.sort(torch.randperm(target.config.vocab_size, generator=g)[:DRAFT_VOCAB]).values
    return {"full": full.float().eval(), "reduced": reduced.float().eval()}


@pytest.fixture(scope="module")
def originals(drafters, tmp_path_factory):
    root = tmp_path_factory.mktemp("originals")
    return {k: write_zlab_v1(root / k, d.cfg, d.state_dict()) for k, d in drafters.items()}


WRITERS = {
    "zlab-v1": write_zlab_v1,
    "zlab": write_zlab_newer,
    "modelopt": write_modelopt,
    "modelopt-prefixed": lambda r, c, s: write_modelopt(r, c, s, prefix="model."),
    "modelopt-dflash_module": lambda r, c, s: write_modelopt(r, c, s, prefix="dflash_module."),
    "speculators": write_speculators,
}


def draft_logits(model, drafter: Drafter, prompt: list[int]) -> torch.Tensor:
    """One drafting step on the target's real hidden states: target_hidden -> inject -> block -> logits."""
    target = Target(model, drafter.cfg.target_layer_ids)
    ids = torch.tensor([prompt])
    with torch.no_grad():
        hs = model(ids, output_hidden_states=True).hidden_states
        target_hidden = torch.cat([hs[i + 1] for i in drafter.cfg.target_layer_ids], dim=-1)[:, :-1]
        cache = drafter.new_cache(1)
        drafter.inject(target_hidden, torch.tensor([len(prompt) - 1]), cache)
        block = torch.full((1, drafter.cfg.block_size), drafter.cfg.mask_token_id)
        block[0, 0] = prompt[-1]
        hidden = drafter.draft(target.embed(block), cache)
        return drafter.logits(hidden[:, 1:], target.head)


def assert_same_drafter(model, orig: Drafter, loaded: Drafter):
    assert loaded.cfg.target_layer_ids == orig.cfg.target_layer_ids
    assert loaded.cfg.mask_token_id == orig.cfg.mask_token_id
    assert loaded.cfg.block_size == orig.cfg.block_size
    assert loaded.cfg.draft_vocab_size == orig.cfg.draft_vocab_size
    want, got = orig.state_dict(), loaded.state_dict()
    assert set(want) == set(got)
    for k in want:
        assert torch.equal(want[k], got[k]), k
    for p in prompts(3, seed=11, lo=3, hi=20):
        torch.testing.assert_close(draft_logits(model, loaded, p), draft_logits(model, orig, p), rtol=0, atol=0)
    ps = prompts(4, seed=5, lo=2, hi=24)
    a = generate(Target(model, orig.cfg.target_layer_ids), orig, ps, max_new_tokens=MAX_NEW)
    b = generate(Target(model, loaded.cfg.target_layer_ids), loaded, ps, max_new_tokens=MAX_NEW)
    assert b.token_ids == a.token_ids == [hf_greedy(model, p, MAX_NEW) for p in ps]
    assert b.stats.per_position_acceptance == a.stats.per_position_acceptance
    assert b.stats.target_forwards == a.stats.target_forwards


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_full_vocabulary_formats_load_as_their_zlab_original(fmt, target, drafters, originals, tmp_path):
    d = drafters["full"]
    path = WRITERS[fmt](tmp_path / fmt, d.cfg, d.state_dict())
    spec = ingest.read_drafter(path)
    assert spec.format == fmt.split("-")[0] if fmt.startswith("modelopt") else spec.format == fmt
    loaded = ingest.load_drafter(path, dtype=torch.float32)
    assert_same_drafter(target, Drafter.load(originals["full"]), loaded)


def test_speculators_reduced_vocabulary_keeps_its_own_head(target, drafters, originals, tmp_path):
    d = drafters["reduced"]
    path = write_speculators(tmp_path / "spec", d.cfg, d.state_dict())
    spec = ingest.read_drafter(path)
    assert spec.format == "speculators" and spec.config.draft_vocab_size == DRAFT_VOCAB
    assert spec.published_layer_ids == [i + 1 for i in d.cfg.target_layer_ids]
    assert spec.config.target_layer_ids == d.cfg.target_layer_ids
    loaded = ingest.load_drafter(path, dtype=torch.float32)
    orig = Drafter.load(originals["reduced"])
    assert loaded.lm_head is not None and loaded.lm_head.weight.shape == (DRAFT_VOCAB, d.cfg.hidden_size)
    assert torch.equal(loaded.d2t, d.d2t)  # offsets became absolute target ids
    assert_same_drafter(target, orig, loaded)
    # Proposals stay inside the draft vocabulary; the target's head would propose anything.
    logits = draft_logits(target, loaded, [5, 6, 7, 8])
    assert set(logits.argmax(-1).flatten().tolist()) <= set(d.d2t.tolist())
    assert torch.isinf(logits[..., [i for i in range(d.cfg.vocab_size) if i not in set(d.d2t.tolist())]]).all()


def test_speculators_full_vocabulary_drops_verifier_copies(target, drafters, originals, tmp_path):
    d = drafters["full"]
    head = target.lm_head.weight.detach().clone()
    emb = target.get_input_embeddings().weight.detach().clone()
    path = write_speculators(
        tmp_path / "spec", d.cfg, d.state_dict(), verifier_head=head, extra={"embed_tokens.weight": emb}
    )
    loaded = ingest.load_drafter(path, dtype=torch.float32)
    assert loaded.lm_head is None
    assert_same_drafter(target, Drafter.load(originals["full"]), loaded)


@pytest.mark.parametrize(
    "kind,fmt", [("full", "speculators"), ("full", "modelopt-prefixed"), ("reduced", "speculators"), ("full", "zlab")]
)
def test_write_zlab_round_trips_to_the_original(kind, fmt, target, drafters, originals, tmp_path):
    d = drafters[kind]
    writer = WRITERS[fmt]
    src = writer(tmp_path / "src", d.cfg, d.state_dict())
    out = ingest.write_zlab(src, tmp_path / "out" / "drafter")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["block_size"] == d.cfg.block_size
    assert cfg["dflash_config"]["target_layer_ids"] == d.cfg.target_layer_ids
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "fc.weight" in names and not any(n.startswith("model.") for n in names)
    assert ("lm_head.weight" in names) == (kind == "reduced")
    assert_same_drafter(target, Drafter.load(originals[kind]), Drafter.load(out))
    assert sorted(p.name for p in out.parent.iterdir()) == ["drafter"]  # no temp dir left behind


def test_write_zlab_refuses_non_empty_output(drafters, tmp_path):
    d = drafters["full"]
    src = write_zlab_v1(tmp_path / "src", d.cfg, d.state_dict())
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("x")
    with pytest.raises(CheckpointError, match="not empty"):
        ingest.write_zlab(src, tmp_path / "out")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]


def test_d2t_given_as_absolute_ids_is_recognised_through_t2d(target, drafters, originals, tmp_path):
    d = drafters["reduced"]
    path = write_speculators(tmp_path / "spec", d.cfg, d.state_dict())
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    tensors["d2t"] = d.d2t.clone()  # some converters store absolute ids
    save_file(tensors, str(path / "model.safetensors"))
    loaded = ingest.load_drafter(path, dtype=torch.float32)
    assert torch.equal(loaded.d2t, d.d2t)
    tensors["d2t"] = torch.flip(d.d2t, [0])  # consistent with neither reading
    tensors["t2d"] = torch.zeros_like(tensors["t2d"])
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="vocabulary maps are corrupt"):
        ingest.load_drafter(path)


def test_layer_ids_in_both_conventions(drafters, tmp_path):
    d = drafters["full"]
    spec = ingest.read_drafter(write_speculators(tmp_path / "s", d.cfg, d.state_dict()))
    info = spec.to_dict()["target_layer_ids"]
    assert info["zlab"] == d.cfg.target_layer_ids
    assert info["output_hidden_states"] == info["published"] == [i + 1 for i in d.cfg.target_layer_ids]
    assert info["published_convention"] == "output_hidden_states"


def test_validate_pair_accepts_each_format_and_warns_about_reduced_heads(tiny_pair_dir, drafters, tmp_path):
    tdir = tiny_pair_dir[0]
    for fmt, writer in WRITERS.items():
        r = ingest.validate_pair(tdir, writer(tmp_path / fmt, drafters["full"].cfg, drafters["full"].state_dict()))
        assert r.ok and not any("head" in w for w in r.warnings), (fmt, r.errors, r.warnings)
    d = drafters["reduced"]
    r = ingest.validate_pair(tdir, write_speculators(tmp_path / "red", d.cfg, d.state_dict()))
    assert r.ok and any("TensorRT-LLM's DFlash loader uses the target's LM head" in w for w in r.warnings)


def test_config_only_directories_validate_without_weights(tiny_pair_dir, tmp_path):
    import shutil

    tdir, ddir = tiny_pair_dir
    for src, name in ((tdir, "t"), (ddir, "d")):
        (tmp_path / name).mkdir()
        for f in src.iterdir():
            if f.suffix != ".safetensors":
                shutil.copy(f, tmp_path / name / f.name)
    r = ingest.validate_pair(tmp_path / "t", tmp_path / "d", require_weights=False)
    assert r.ok and r.to_dict()["weights_present"] == {"target": False, "drafter": False}
    # absent weights are what a config-only read expects: said in the checks, not as warnings (plan prints those)
    assert not r.warnings and sum("weights absent" in str(c) for c in r.checks) == 2
    assert (
        ingest.read_drafter(tmp_path / "d", require_weights=False).num_parameters
        == ingest.read_drafter(ddir).num_parameters
    )
    with pytest.raises(CheckpointError, match="no .safetensors weights"):
        ingest.validate_pair(tmp_path / "t", tmp_path / "d")


def test_sha256_files_hashes_content_and_skips_hidden(tmp_path):
    import hashlib

    (tmp_path / "a.json").write_text("{}")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.bin").write_bytes(b"\x00\x01")
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / "x").write_text("ignored")
    (tmp_path / "link.json").symlink_to(tmp_path / "a.json")
    got = ingest.sha256_files(tmp_path)
    assert got == {
        "a.json": hashlib.sha256(b"{}").hexdigest(),
        "link.json": hashlib.sha256(b"{}").hexdigest(),
        "sub/b.bin": hashlib.sha256(b"\x00\x01").hexdigest(),
    }


@pytest.mark.parametrize(
    "files,want",
    [
        (
            {
                "hf_quant_config.json": {
                    "producer": {"name": "modelopt", "version": "0.23.0rc1"},
                    "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": None},
                }
            },
            {"method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": None},
        ),
        (
            {
                "hf_quant_config.json": {
                    "quantization": {
                        "quant_algo": "NVFP4",
                        "kv_cache_quant_algo": "FP8",
                        "group_size": 16,
                        "exclude_modules": ["lm_head"],
                    }
                }
            },
            {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "group_size": 16, "exclude_modules": ["lm_head"]},
        ),
        (
            {"config.json": {"quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["lm_head"]}}},
            {"method": "mxfp4", "quant_algo": "MXFP4", "exclude_modules": ["lm_head"], "source": "config.json"},
        ),
        (
            {
                "config.json": {
                    "quantization_config": {
                        "quant_method": "modelopt",
                        "quant_algo": "NVFP4",
                        "kv_cache_scheme": "FP8",
                        "ignore": ["lm_head"],
                    }
                }
            },
            {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]},
        ),
        ({"config.json": {"model_type": "qwen3"}}, None),
    ],
)
def test_target_quantization(files, want, tmp_path):
    for name, data in files.items():
        (tmp_path / name).write_text(json.dumps(data))
    got = ingest.target_quantization(tmp_path)
    if want is None:
        assert got is None
    else:
        assert {k: got[k] for k in want} == want


def test_published_pairs_validate_from_configs_alone():
    """The real published configs the recipes ship (dflash_trt/recipes/configs, copied from the hub files)."""
    from dflash_trt.plan import recipe

    root = recipe._bundled_dir() / "configs"
    ok = [("Qwen--Qwen3-8B", "z-lab--Qwen3-8B-DFlash-b16"), ("openai--gpt-oss-20b", "z-lab--gpt-oss-20b-DFlash")]
    for t, d in ok:
        r = ingest.validate_pair(root / t, root / d, require_weights=False)
        assert r.ok, r.errors
    spec = ingest.read_drafter(root / "z-lab--Qwen3-8B-DFlash-b16", require_weights=False)
    assert spec.num_parameters == 1_048_626_432  # the published checkpoint's header count (SIZES.json)
    gpt = ingest.read_drafter(root / "z-lab--gpt-oss-20b-DFlash", require_weights=False)
    assert gpt.num_parameters == 784_767_104 and gpt.config.rope_scaling["rope_type"] == "yarn"
    assert ingest.read_target(root / "openai--gpt-oss-20b", require_weights=False).quantization["quant_algo"] == "MXFP4"
    r = ingest.validate_pair(
        root / "openai--gpt-oss-20b", root / "z-lab--Qwen3-8B-DFlash-b16", require_weights=False, raise_on_error=False
    )
    assert not r.ok and "hidden_size 4096 != target hidden_size 2880" in r.errors[0]
