"""A third drafter family, defined here and nowhere else, runs through every stage by its hooks alone.

``GatedFamily`` is DFlash with one trivially different trait: a learned per-channel gate
``output_gate`` [H] (published as ``output_gate.weight``) times an integer ``gate_scale`` (a
``dflash_config`` field) multiplies the block's normed hidden states. Nothing outside this module
knows it: it is registered through each layer's ``register`` (model family, runtime proposer,
export round, TensorRT-LLM rules, training objective) for the duration of this module, and its
checkpoint is read from a directory the test writes. Through ingest (recognised by its
architecture, its field read, its tensor renamed and shape-checked), the runtime (greedy output
is the target's own greedy decoding, drafted by its proposer), export (its ONNX round written and
checked by ONNX Runtime, then the whole bundle run through ONNX Runtime, token-identical) and the
training hook (its extra loss reaches its gate).
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from dflash_trt import ingest
from dflash_trt.model import DRAFTER_FAMILIES, Drafter, DrafterFamily, family_of, register_family
from tests.helpers import hf_greedy, prompts, tiny_drafter_config, tiny_target, wrap

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime_extensions")
pytest.importorskip("onnxscript")

from dflash_trt.export import ExportRound, register_round  # noqa: E402
from dflash_trt.plan import TrtllmRules, drafter_attention_backend, register_trtllm_rules  # noqa: E402
from dflash_trt.runtime import Proposer, generate, register_proposer  # noqa: E402
from dflash_trt.train import objective  # noqa: E402

MAX_NEW = 12


class GatedDrafter(Drafter):
    """DFlash with ``output_gate * gate_scale`` on the block's normed hidden states."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.output_gate = nn.Parameter(torch.ones(cfg.hidden_size))

    def block_forward(self, block_embeds, positions, attend, block_len=None):
        x = super().block_forward(block_embeds, positions, attend, block_len)
        return x * (self.output_gate * self.cfg.field("gate_scale"))


class GatedFamily(DrafterFamily):
    name = "dflash-gated"
    architecture = "DFlashGatedDraftModel"
    fields = ("gate_scale",)

    def module_class(self):
        return GatedDrafter

    def tensor_name(self, name):
        return "output_gate" if name == "output_gate.weight" else name

    def expected_shapes(self, cfg):
        return {"output_gate": (cfg.hidden_size,)}


#: which hooks ran, by stage (each hook appends its stage's name)
CALLS: list[str] = []


class GatedProposer(Proposer):
    def torch_block(self, *args):
        CALLS.append("runtime")
        return super().torch_block(*args)


class GatedRound(ExportRound):
    def export(self, drafter, head, onnx_dir, page_size, say):
        CALLS.append("export")
        return super().export(drafter, head, onnx_dir, page_size, say)


class GatedRules(TrtllmRules):
    def attention_backend(self, requested, cfg, sm, release_backends):
        return "VANILLA" if requested == "auto" else requested


class GatedObjective(objective.Objective):
    defaults = {"gate_scale": 1}

    def extra_loss(self, drafter, hidden, logits, block, labels, gamma, normaliser=None):
        return 1e-3 * ((drafter.output_gate - 1) ** 2).sum(), None


@pytest.fixture(scope="module", autouse=True)
def gated():
    """The family and its hooks registered through each layer's ``register``, removed afterwards."""
    from dflash_trt.export import rounds
    from dflash_trt.plan import trtllm_family
    from dflash_trt.runtime import proposer

    registries = [DRAFTER_FAMILIES, proposer.PROPOSERS, rounds.ROUNDS, trtllm_family.RULES, objective.OBJECTIVES]
    saved = [dict(r) for r in registries]
    family = register_family(GatedFamily())
    register_proposer(GatedFamily, GatedProposer)
    register_round(GatedFamily, GatedRound)
    register_trtllm_rules(GatedFamily, GatedRules)
    objective.register(GatedFamily, GatedObjective)
    yield family
    for registry, before in zip(registries, saved, strict=True):
        registry.clear()
        registry.update(before)


def gated_drafter(target, seed: int = 3, **kw) -> GatedDrafter:
    torch.manual_seed(seed)
    d = GatedDrafter(tiny_drafter_config(target, family="dflash-gated", family_fields={"gate_scale": 2}, **kw))
    for p in d.parameters():
        if p.dim() > 1:
            nn.init.normal_(p, std=0.2)
    nn.init.uniform_(d.output_gate, 0.5, 1.5)
    return d.to(target.dtype).eval()


def write_checkpoint(drafter: GatedDrafter, path) -> None:
    """The published form: ``drafter.save`` (its family's z-lab form), the gate under its published name."""
    from safetensors.torch import load_file, save_file

    drafter.save(path)
    state = load_file(str(path / "model.safetensors"))
    state["output_gate.weight"] = state.pop("output_gate")
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny float32 target (HF + tokenizer) and a gated drafter written in its published form."""
    from tests.helpers import char_tokenizer

    root = tmp_path_factory.mktemp("gated")
    model = tiny_target(dtype=torch.float32)
    drafter = gated_drafter(model)
    model.save_pretrained(root / "target", safe_serialization=True)
    char_tokenizer().save_pretrained(root / "target")
    write_checkpoint(drafter, root / "drafter")
    return model, drafter, root


def test_ingest_recognises_reads_and_loads_the_family(checkpoint):
    model, drafter, root = checkpoint
    raw = json.loads((root / "drafter" / "config.json").read_text())
    assert raw["architectures"] == ["DFlashGatedDraftModel"] and raw["dflash_config"]["gate_scale"] == 2
    spec = ingest.read_drafter(root / "drafter")
    assert spec.format == "dflash-gated" and isinstance(family_of(spec.config), GatedFamily)
    assert spec.config.field("gate_scale") == 2 and "output_gate" in spec.drafter_tensors()
    loaded = ingest.load_drafter(root / "drafter", dtype=torch.float32)
    assert type(loaded) is GatedDrafter and torch.equal(loaded.output_gate, drafter.output_gate)
    assert ingest.validate_pair(root / "target", root / "drafter").ok


def test_ingest_refuses_the_family_without_its_tensor(checkpoint, tmp_path):
    from safetensors.torch import load_file, save_file

    from dflash_trt.errors import CheckpointError

    _, drafter, _ = checkpoint
    write_checkpoint(drafter, tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    del state["output_gate.weight"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="drafter weights lack output_gate"):
        ingest.read_drafter(tmp_path)


def test_greedy_through_the_family_is_the_targets_own(checkpoint):
    model, drafter, root = checkpoint
    loaded = ingest.load_drafter(root / "drafter", dtype=torch.float32)
    ps = prompts(3, seed=4, lo=2, hi=30)
    CALLS.clear()
    got = generate(wrap(model, loaded), loaded, ps, max_new_tokens=MAX_NEW)
    assert got.token_ids == [hf_greedy(model, p, MAX_NEW) for p in ps]
    assert "runtime" in CALLS  # drafted by the family's proposer


def test_the_family_s_export_round_writes_drafter_onnx_checked_by_onnx_runtime(checkpoint, tmp_path):
    """The family's round (``export.round_for``) writes drafter.onnx and checks it with ONNX Runtime
    against the gated PyTorch module (``onnx_graphs.check_drafter_onnx``: caches and logits)."""
    from dflash_trt.export import bundle_graphs

    model, _, root = checkpoint
    loaded = ingest.load_drafter(root / "drafter", dtype=torch.float32)
    CALLS.clear()
    kind, err = bundle_graphs.export_drafter(
        loaded, model.get_output_embeddings().weight.detach(), tmp_path, 4, lambda msg: None
    )
    assert CALLS == ["export"] and kind == "dflash" and (tmp_path / "drafter.onnx").is_file()
    assert set(err) >= {"logits", "k_cache", "v_cache"} and max(err.values()) < 1e-4


@pytest.mark.slow
def test_bundle_exports_the_family_round_and_runs_through_onnx_runtime(checkpoint, tmp_path):
    """``build --graphs`` on the gated pair: its export round writes and checks drafter.onnx
    (ONNX Runtime against PyTorch), and the bundle's ONNX backend decodes the target's greedy tokens."""
    from dflash_trt.cli import run
    from dflash_trt.runtime import load_bundle, resolve_run

    model, _, root = checkpoint
    out = tmp_path / "bundle"
    CALLS.clear()
    assert (
        run(
            [
                "build",
                "-t",
                str(root / "target"),
                "-d",
                str(root / "drafter"),
                "--gpu",
                "cpu",
                "--graphs",
                "-o",
                str(out),
                "--set",
                "serving.max_seq_len=128",
                "--set",
                "serving.max_batch_size=4",
            ]
        )
        == 0
    )
    assert CALLS == ["export"]
    manifest = ingest.read_manifest(out)
    assert manifest.graphs.drafter_graph == "dflash" and max(manifest.graphs.drafter_onnx_max_error.values()) < 1e-4
    assert json.loads((out / "drafter" / "config.json").read_text())["architectures"] == ["DFlashGatedDraftModel"]
    pair = load_bundle(out, resolve_run("onnx", bundle=out))
    assert type(pair.drafter) is GatedDrafter
    backend = pair.backend
    ps = prompts(2, seed=9, lo=2, hi=20)
    got = generate(None, None, ps, max_new_tokens=MAX_NEW, backend=backend)
    assert got.token_ids == [hf_greedy(model, p, MAX_NEW) for p in ps]


def test_trtllm_rules_and_training_hook_are_the_family_s(checkpoint):
    model, drafter, _ = checkpoint
    cfg = drafter.cfg
    assert drafter_attention_backend("auto", cfg, 100, ("VANILLA", "TRTLLM")) == "VANILLA"
    plain = tiny_drafter_config(model)
    assert drafter_attention_backend("auto", plain, 100, ("VANILLA", "TRTLLM")) == "auto"
    tcfg = objective.drafter_config_for(
        model, block_size=4, layers=1, mask_token_id=95, family="dflash-gated", sizes={"gate_scale": 1}
    )
    fresh = objective.init_drafter(tcfg)
    assert type(fresh) is GatedDrafter and tcfg.field("gate_scale") == 1
    with torch.no_grad():
        fresh.output_gate.mul_(1.5)
    loss, picks = objective.objective_for(family_of(tcfg)).extra_loss(fresh, None, None, None, None, 4.0)
    loss.backward()
    assert picks is None and loss.item() > 0 and fresh.output_gate.grad.abs().sum() > 0
