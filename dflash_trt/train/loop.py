"""The drafter training loop: regenerate, train, evaluate held-out tau, checkpoint, resume.

``train_drafter(settings)`` is what ``dflash-trt train-drafter`` calls, in one process or in
each of the processes torchrun starts (``python -m dflash_trt.train``). Output directory:

    OUT/config.json, OUT/model.safetensors   the drafter, z-lab format (rewritten at each checkpoint)
    OUT/training.json                        how it was trained (regeneration, chat template, ranks)
    OUT/.train/settings.json                 what the run was started with
    OUT/.train/regen/                        the target-regenerated training set, sharded (+ regen.json)
    OUT/.train/state/                        fp32 drafter weights + AdamW moments, sharded (+ state.json)
    OUT/.train/result.json                   the summary of the last invocation

Every file is written to a temporary name and renamed, so an interrupted run leaves the
last complete checkpoint. Batches are drawn from a generator seeded by (seed, step), so a
resumed run sees the same batches as an uninterrupted one, on any number of ranks: each
rank trains its rows of the step's global batch under torch's engine (FSDP2, DDP or none:
:mod:`dflash_trt.train.dist`). The drafter's training forward is one module,
:class:`DraftStep`, so the engine sees one forward and one backward per step. The target's
features come online or from a feature folder (:mod:`dflash_trt.train.features`); the
training set from the reference runtime or a server (:mod:`dflash_trt.train.regen`), both
made before the target is sharded (the reference runtime's generation is not lockstep).
What a run is checked against before any work is :mod:`dflash_trt.train.checks`'s; held-out
τ is :mod:`dflash_trt.train.heldout`'s.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from dflash_trt.model import Drafter, Target, family_of
from dflash_trt.train import data as train_data
from dflash_trt.train import dist, objective, regen
from dflash_trt.train import features as train_features
from dflash_trt.train.checkpoint import (
    full_drafter,
    has_state,
    load_state,
    reading_state,
    save_state,
    write_drafter,
    write_json,
)
from dflash_trt.train.checks import check_numbers, prepare
from dflash_trt.train.dist import Ranks, init_ranks
from dflash_trt.train.forward import train_forward
from dflash_trt.train.heldout import eval_prompts, heldout_tau
from dflash_trt.train.settings import Progress, Result, TrainSettings
from dflash_trt.train.setup import drafter_setup, frozen_target, optimizer


def lr_at(step: int, s: TrainSettings) -> float:
    warm = max(1, int(s.steps * s.warmup))
    if step < warm:
        return s.lr * (step + 1) / warm
    frac = min(1.0, (step - warm) / max(1, s.steps - warm))
    return s.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


# ---------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------


def train_drafter(settings: TrainSettings, progress: Progress | None = None) -> Result:
    """Train a drafter for ``settings.target`` into ``settings.out`` (or resume one there).

    Under torchrun every rank calls this with the same settings; ``progress`` is reported by
    rank 0 only.
    """
    ranks = init_ranks(settings.device, settings.parallel)
    try:
        result = _train(settings, ranks, progress if progress is not None and ranks.main else Progress())
        # every rank's work is done (rank 0's last write included) before any rank ends the group:
        # a rank that tore its gloo group down while a peer still worked was seen to abort at exit
        # ("terminate called without an active exception", once in a loaded CI run)
        ranks.barrier()
        return result
    finally:
        ranks.close()


def _train(settings: TrainSettings, ranks: Ranks, progress: Progress) -> Result:
    out = Path(settings.out).expanduser()
    work = out / ".train"

    def setup():
        """Every rank checks OUT, the numbers, the target and the data before rank 0 writes."""
        s = prepare(settings, out, work)
        check_numbers(s, ranks.world)
        model, tokenizer, stops = frozen_target(s, ranks.device)
        cfg = drafter_setup(s, model, tokenizer)
        data = None if regen.cached_set(s, work) else train_data.read_data(s.data)  # bad --data fails first
        held = None if s.eval_data is None else train_data.read_data(s.eval_data, flag="--eval-data")
        return s, model, tokenizer, stops, cfg, data, held

    s, model, tokenizer, stops, cfg, data, held = ranks.together(setup)
    work.mkdir(parents=True, exist_ok=True)
    if ranks.main and not s.resume:
        write_json(work / "settings.json", s.model_dump())
    target = Target(model, cfg.target_layer_ids)
    regen_set, regen_meta = regen.training_set(s, work, data, tokenizer, target, stops, ranks, progress)
    if held is not None:  # held-out τ on prompts from other files (the windows held back from --data go unused)
        regen_meta = {**regen_meta, "eval_prompts": eval_prompts(s, tokenizer, held)}
    if s.feature_cache is None:
        features = train_features.OnlineFeatures(target, cfg.target_layer_ids)
    else:
        features = train_features.open_cache(
            s.feature_cache,
            s.target,
            target,
            cfg.target_layer_ids,
            regen_set,
            ranks,
            progress,
            s.feature_shard_mb,
            tokenizer,
        )
    dist.shard_target(model, ranks)  # after regeneration and the feature cache: those are not lockstep
    drafter = objective.init_drafter(cfg, seed=s.seed).to(ranks.device)
    module = dist.wrap_drafter(DraftStep(drafter), ranks)
    progress.log(train_data.memory_line(regen_set, s, cfg, target, features, ranks))
    mb = 2**20  # weights, then AdamW: fp32 weights, gradients and two moments, 16 bytes a parameter
    dtype = str(target.dtype).removeprefix("torch.")
    progress.log(
        f"weights per rank: target {dist.local_bytes(model) / mb:.1f} MB ({dtype}), "
        f"drafter with AdamW {4 * dist.local_bytes(drafter) / mb:.1f} MB ({ranks.parallel})"
    )
    run = _Run(s, out, work, target, regen_set, regen_meta, stops, progress, ranks, features, drafter, module)
    return _optimise(run, optimizer(drafter, s))


class DraftStep(nn.Module):
    """The drafter's training forward as one module, the unit torch's engines wrap: this rank's
    share of the block loss (and the batch's metrics) from the target's features and block
    embeddings. The target's head is an argument, not a child: it is frozen and not the engine's."""

    def __init__(self, drafter: Drafter):
        super().__init__()
        self.drafter = drafter

    def forward(
        self,
        hidden_in: torch.Tensor,
        embeds: torch.Tensor,
        anchors: torch.Tensor,
        block: torch.Tensor,
        labels: torch.Tensor,
        gamma: float,
        total: float,
        head,
    ) -> tuple[torch.Tensor, dict]:
        drafter = self.drafter
        hidden = train_forward(drafter, hidden_in, embeds, anchors)
        logits = drafter.logits(hidden[:, :, 1:], head)
        # the family's term (DFlash2: the selector picks among the candidates these logits propose)
        select, picks = objective.objective_for(family_of(drafter.cfg)).extra_loss(
            drafter, hidden[:, :, 1:], logits, block, labels, gamma, total
        )
        loss, m = objective.block_loss(logits, labels, gamma, normaliser=total, picks=picks)
        if select is not None:
            loss = loss + select
        return loss, m


@dataclass
class _Run:
    """What stays fixed while one run trains: its settings (shape fields filled in), where it
    writes, the frozen target, the regenerated training set and its metadata (held-out
    prompts, how it was made), the ranks, and where ``target_hidden`` comes from."""

    s: TrainSettings
    out: Path
    work: Path
    target: Target
    regen: train_data.Regenerated
    regen_meta: dict
    stops: list[int]
    progress: Progress
    ranks: Ranks
    features: object  # OnlineFeatures | CachedFeatures: (idx, tokens, lengths) -> target_hidden
    drafter: Drafter  # the drafter inside module (under fsdp: this rank's shards)
    module: nn.Module  # DraftStep under the engine

    @property
    def eval_ids(self) -> list[list[int]]:
        return self.regen_meta["eval_prompts"]

    def metadata(self, step: int) -> dict:
        """training.json: how the drafter in OUT was trained."""
        s = self.s
        return {
            "target": s.target,
            "data": s.data,
            "step": step,
            "steps": s.steps,
            "global_batch_size": s.batch_size,
            "ranks": self.ranks.world,
            "parallel": self.ranks.parallel,
            "arch": s.arch,
            "target_dtype": str(self.target.dtype).removeprefix("torch."),
            "block_size": s.block_size,
            "target_layer_ids": s.target_layer_ids,
            "mask_token_id": s.mask_token_id,
            "prompt_len": s.prompt_len,
            "gen_len": s.gen_len,
            "sequences": len(self.regen),
            "eval_data": s.eval_data or "windows held back from data",
            "regeneration": self.regen_meta.get("regeneration", {"sources": ["unknown (an older run)"]}),
            "features": "online" if s.feature_cache is None else f"cached in {s.feature_cache}",
        }


def _optimise(run: _Run, opt: torch.optim.Optimizer) -> Result:
    """Steps from the saved one (0 when fresh) to ``s.steps``: update, evaluate, checkpoint."""
    s, progress, module = run.s, run.progress, run.module
    step, history = 0, []
    if s.resume and has_state(run.work):
        with reading_state(run.work):
            step, history = load_state(run.work, module, opt)
        progress.log(f"resuming at step {step}" + (f" on {run.ranks.world} ranks" if run.ranks.world > 1 else ""))
    gamma = objective.loss_gamma(s.block_size)
    progress.phase("training", s.steps)
    progress.advance(step, {})
    start = time.time()
    loss_v, tau_v, heldout, losses, norms = math.nan, math.nan, None, [], []
    module.train()
    while step < s.steps:
        loss_v, tau_v, norm = _update(run, opt, step, gamma)
        step += 1
        losses.append(loss_v)
        norms.append(norm)
        info = {"loss": loss_v, "tau": tau_v}
        if run.eval_ids and (step % s.eval_every == 0 or step == s.steps):
            heldout = _evaluate(run, step, loss_v, tau_v, history)
            info["heldout_tau"] = heldout
        progress.advance(step, info)
        if step % s.save_every == 0 or step == s.steps:
            save_state(run.work, module, opt, step, history, run.ranks)
            whole = full_drafter(module, run.drafter, run.ranks)  # gathered on rank 0
            if run.ranks.main:
                write_drafter(whole, run.out, s.save_dtype, run.metadata(step))
    if not losses and history:  # resumed a finished run: report where it stands
        loss_v, tau_v, heldout = history[-1]["loss"], history[-1]["train_tau"], history[-1]["heldout_tau"]
    result = Result(run.out, step, loss_v, tau_v, heldout, time.time() - start, history, losses, norms)
    if run.ranks.main:
        write_json(run.work / "result.json", {**asdict(result), "out": str(run.out)})
    return result


def _update(run: _Run, opt: torch.optim.Optimizer, step: int, gamma: float) -> tuple[float, float, float]:
    """One optimiser step on the batch drawn for ``step`` (seeded by (seed, step)); (loss, train τ,
    the gradient's norm before clipping: the one-process gradient's under every engine)."""
    s = run.s
    g = torch.Generator().manual_seed(s.seed * 1_000_003 + step)
    loss, m = train_step(run.module, run.target, run.regen, run.features, s, gamma, g, run.ranks)
    for group in opt.param_groups:
        group["lr"] = lr_at(step, s)
    opt.zero_grad(set_to_none=True)
    dist.engine_loss(loss, run.ranks).backward()  # the engine averages the ranks' gradients
    norm = torch.nn.utils.clip_grad_norm_(run.module.parameters(), 1.0)
    opt.step()
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # fsdp: a replicated DTensor
    return m["loss"], m["tau"], float(norm)


def _evaluate(run: _Run, step: int, loss_v: float, tau_v: float, history: list) -> float:
    """Held-out τ after ``step``, appended to ``history``: a whole copy of the drafter in the target's
    dtype (as it ships) drafts for the target. Every rank takes its share of the prompts; under
    fsdp every rank decodes all of them, because the sharded target's forwards are collectives
    that the ranks must run in lockstep, and greedy decoding of the same prompts is."""
    drafter = full_drafter(run.module, run.drafter, run.ranks, everywhere=True).to(run.target.dtype)
    heldout = heldout_tau(
        run.target,
        drafter,
        run.eval_ids,
        run.s.block_size,
        run.s.eval_tokens,
        run.stops,
        Ranks(device=run.ranks.device) if run.ranks.sharded else run.ranks,
        run.ranks.sharded,
    )
    history.append(
        {"step": step, "loss": round(loss_v, 4), "train_tau": round(tau_v, 3), "heldout_tau": round(heldout, 3)}
    )
    run.progress.log(f"step {step}: loss {loss_v:.3f}, train τ {tau_v:.2f}, held-out τ {heldout:.2f}")
    return heldout


def train_step(
    module: nn.Module,
    target: Target,
    regen_set: train_data.Regenerated,
    features,
    s: TrainSettings,
    gamma: float,
    g: torch.Generator,
    ranks: Ranks = Ranks(),
):
    """This rank's loss on its rows of one global batch, and the batch's (loss, τ) over all ranks.

    The global batch (``s.batch_size`` sequences) and its anchors are drawn from ``g`` on
    every rank alike; this rank takes rows ``rank, rank + world, ...``. Its loss is divided by
    the global batch's weight, so the ranks' losses (and gradients) add up to the one-process
    ones. ``features(idx, tokens, lengths)`` gives ``target_hidden`` [b, T, n_tap*H]. ``module``
    is :class:`DraftStep` (under its engine).
    """
    B, mask_id, dev = s.block_size, s.mask_token_id, ranks.device
    idx = torch.randperm(len(regen_set), generator=g)[: s.batch_size]
    anchors, valid = train_data.sample_anchors(regen_set.lengths[idx], regen_set.prompt_lengths[idx], s.anchors, g)
    rows = torch.tensor(ranks.mine(range(len(idx))), dtype=torch.long)
    idx, anchors, valid = idx[rows], anchors[rows].to(dev), valid[rows].to(dev)
    lengths = regen_set.lengths[idx]
    tokens = regen_set.rows(idx, int(lengths.max())).to(dev)
    lengths = lengths.to(dev)
    hidden_in = features(idx, tokens, lengths)
    with torch.no_grad():
        block, labels = objective.block_inputs(tokens, anchors, B, mask_id, lengths)
        labels = torch.where(valid[..., None], labels, -100)
        b, K = anchors.shape
        drafter = dist.inner(module).drafter
        embeds = target.embed(block.view(b, K * B), drafter.cfg.input_embedding_scale).view(b, K, B, -1)
    (total,) = ranks.sum([objective.loss_weights(labels, gamma).sum().item()])
    loss, m = module(
        hidden_in.to(drafter.dtype),
        embeds.to(drafter.dtype),
        anchors,
        block,
        labels,
        gamma,
        total,
        _head_in(target, drafter.dtype),
    )
    loss_all, tau_sum, blocks = ranks.sum([loss.item(), m["tau_sum"], m["blocks"]])
    return loss, {"loss": loss_all, "tau": tau_sum / blocks if blocks else math.nan}


def _head_in(target: Target, dtype: torch.dtype):
    """The target's (frozen) head on the drafter's hidden states: in the target's dtype, the
    logits back in the drafter's."""
    head = target.head
    if target.dtype == dtype:
        return head
    return lambda h: head(h.to(target.dtype)).to(dtype)
