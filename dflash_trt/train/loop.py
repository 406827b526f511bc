"""The drafter training loop: regenerate, train, evaluate held-out tau, checkpoint, resume.

``train_drafter(settings)`` is what ``dflash-trt train-drafter`` calls. Output directory:

    OUT/config.json, OUT/model.safetensors   the drafter, z-lab format (rewritten at each checkpoint)
    OUT/.train/settings.json                 what the run was started with
    OUT/.train/regen.safetensors             the target-regenerated training set (+ regen.json)
    OUT/.train/state.safetensors             fp32 drafter weights + AdamW moments (+ state.json: step)

Every file is written to a temporary name and renamed, so an interrupted run leaves the
last complete checkpoint. Batches are drawn from a generator seeded by (seed, step), so a
resumed run sees the same batches as an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from dflash_trt.train import data as train_data
from dflash_trt.train import objective
from dflash_trt.errors import DFlashError
from dflash_trt.model import Drafter, Target

SHAPE_FIELDS = ("block_size", "layers", "target_layer_ids", "mask_token_id")
DATA_FIELDS = ("target", "data", "prompt_len", "gen_len", "samples", "eval_prompts", "seed")


@dataclass
class TrainSettings:
    target: str
    data: str
    out: str
    block_size: Optional[int] = None          # default 8
    layers: Optional[int] = None              # default 1
    target_layer_ids: Optional[list[int]] = None
    mask_token_id: Optional[int] = None       # default: the tokenizer's mask token, else a spare row
    steps: int = 1000
    batch_size: int = 8
    anchors: int = 16
    lr: float = 6e-4
    warmup: float = 0.04
    weight_decay: float = 0.01
    prompt_len: int = 64
    gen_len: int = 128
    samples: int = 1024
    eval_prompts: int = 8
    eval_every: int = 100
    eval_tokens: int = 64
    save_every: int = 100
    seed: int = 0
    save_dtype: str = "bfloat16"
    resume: bool = False


@dataclass
class Progress:
    """Callbacks the CLI turns into progress bars (all optional)."""

    phase: Callable[[str, int], None] = lambda name, total: None
    advance: Callable[[int, dict], None] = lambda done, info: None
    log: Callable[[str], None] = lambda line: None


@dataclass
class Result:
    out: Path
    step: int
    loss: float
    train_tau: float
    heldout_tau: float | None
    seconds: float
    history: list[dict] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)   # every step of this invocation


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    tmp.replace(path)


def pick_mask_token(tokenizer, vocab_rows: int) -> int:
    mid = getattr(tokenizer, "mask_token_id", None)
    if mid is not None and mid < vocab_rows:
        return int(mid)
    if vocab_rows > len(tokenizer):
        return len(tokenizer)          # first embedding row no token uses (Qwen3 pads its vocab)
    raise DFlashError("the tokenizer has no mask token and the embedding no spare row: pass --mask-token-id")


def lr_at(step: int, s: TrainSettings) -> float:
    warm = max(1, int(s.steps * s.warmup))
    if step < warm:
        return s.lr * (step + 1) / warm
    frac = min(1.0, (step - warm) / max(1, s.steps - warm))
    return s.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


# ---------------------------------------------------------------------------------------
# Checkpoints (safetensors + JSON; nothing pickled)
# ---------------------------------------------------------------------------------------


def save_state(work: Path, drafter: Drafter, opt: torch.optim.Optimizer, step: int, history: list) -> None:
    from safetensors.torch import save_file

    tensors = {f"model.{k}": v.detach().contiguous() for k, v in drafter.state_dict().items()}
    sd = opt.state_dict()
    for idx, st in sd["state"].items():
        for name, t in st.items():
            tensors[f"opt.{idx}.{name}"] = t.detach().reshape(-1).contiguous()
    tmp = work / "state.safetensors.tmp"
    save_file(tensors, str(tmp))
    tmp.replace(work / "state.safetensors")
    _write_json(work / "state.json", {"step": step, "param_groups": sd["param_groups"], "history": history})


def load_state(work: Path, drafter: Drafter, opt: torch.optim.Optimizer) -> tuple[int, list]:
    from safetensors.torch import load_file

    meta = json.loads((work / "state.json").read_text())
    tensors = load_file(str(work / "state.safetensors"))
    drafter.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    state: dict = {}
    for k, v in tensors.items():
        if k.startswith("opt."):
            _, idx, name = k.split(".", 2)
            state.setdefault(int(idx), {})[name] = v.reshape(()) if name == "step" else v
    params = [p for group in opt.param_groups for p in group["params"]]
    for idx, st in state.items():
        if idx >= len(params):
            raise DFlashError(f"{work}: the saved optimizer state does not match this drafter")
        for name in ("exp_avg", "exp_avg_sq"):
            if name in st:
                st[name] = st[name].view(params[idx].shape)
    opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    return int(meta["step"]), list(meta.get("history", []))


def write_drafter(drafter: Drafter, out: Path, dtype: str) -> None:
    """z-lab config.json + model.safetensors into OUT, each renamed into place."""
    import copy

    tmp = out / ".train" / "export.tmp"
    if tmp.exists():
        for f in tmp.iterdir():
            f.unlink()
    d = copy.deepcopy(drafter).to(getattr(torch, dtype))
    d.save(tmp)
    for name in ("config.json", "model.safetensors"):
        (tmp / name).replace(out / name)


# ---------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------


def _prepare(s: TrainSettings, out: Path, work: Path) -> TrainSettings:
    """Validate OUT for a fresh run or a resume; returns the settings to run with."""
    state = work / "state.json"
    if s.resume:
        if not (work / "settings.json").exists():
            raise DFlashError(f"--resume: {out} holds no training run to resume")
        saved = json.loads((work / "settings.json").read_text())
        for name in SHAPE_FIELDS + DATA_FIELDS:
            mine = getattr(s, name)
            if name in SHAPE_FIELDS and mine is not None and mine != saved[name]:
                raise DFlashError(f"--resume: --{name.replace('_', '-')} {mine} differs from the run's {saved[name]}")
        # A resumed run is the same run: everything but its length and cadence comes from OUT.
        cadence = {k: getattr(s, k) for k in ("steps", "eval_every", "save_every")}
        return TrainSettings(**{**saved, **cadence, "resume": True})
    if state.exists():
        step = json.loads(state.read_text())["step"]
        raise DFlashError(f"{out} already holds a training run at step {step}: pass --resume, or another --out")
    if out.exists() and any(p.name != ".train" for p in out.iterdir()):
        raise DFlashError(f"{out} exists and is not empty: choose another --out")
    return s


def train_drafter(settings: TrainSettings, progress: Progress = Progress()) -> Result:
    """Train a drafter for ``settings.target`` into ``settings.out`` (or resume one there)."""
    out = Path(settings.out).expanduser()
    work = out / ".train"
    s = _prepare(settings, out, work)
    if s.steps < 1 or s.batch_size < 1 or s.anchors < 1 or s.prompt_len < 2 or s.gen_len < 1:
        raise DFlashError("--steps, --batch-size, --anchors, --gen-len must be >= 1 and --prompt-len >= 2")
    model, tokenizer, stops = _frozen_target(s)
    cfg = _drafter_config(s, model, tokenizer)
    data = None if _cached_regen(s, work) else train_data.read_data(s.data)   # bad --data fails before any write
    work.mkdir(parents=True, exist_ok=True)
    if not s.resume:
        _write_json(work / "settings.json", asdict(s))

    target = Target(model, cfg.target_layer_ids)
    regen, eval_ids = _training_set(s, work, data, tokenizer, target, stops, progress)
    run = _Run(s, out, work, target, regen, eval_ids, stops, progress)
    drafter = objective.init_drafter(cfg, seed=s.seed)
    return _optimise(run, drafter, _optimizer(drafter, s))


@dataclass
class _Run:
    """What stays fixed while one run trains: its settings (shape fields filled in), where it
    writes, the frozen target, the regenerated training set and the held-out prompts."""

    s: TrainSettings
    out: Path
    work: Path
    target: Target
    regen: train_data.Regenerated
    eval_ids: list[list[int]]
    stops: list[int]
    progress: Progress


def _frozen_target(s: TrainSettings):
    """(target model in float32 without gradients, its tokenizer, its stop token ids)."""
    from dflash_trt import ingest
    from dflash_trt.model import load_target
    from dflash_trt.runtime import load_tokenizer, stop_ids

    tdir = ingest.resolve(s.target, role="target")
    model = load_target(tdir, dtype=torch.float32)
    for p in model.parameters():
        p.requires_grad_(False)
    tokenizer = load_tokenizer(tdir)
    return model, tokenizer, stop_ids(model, tokenizer)


def _drafter_config(s: TrainSettings, model, tokenizer):
    """The drafter's config for this target; fills the shape fields of ``s`` with what was chosen."""
    B = s.block_size or 8
    if B < 2:
        raise DFlashError("--block-size must be >= 2 (the anchor and at least one draft position)")
    mask_id = s.mask_token_id if s.mask_token_id is not None else pick_mask_token(
        tokenizer, model.get_input_embeddings().weight.shape[0])
    cfg = objective.drafter_config_for(model, block_size=B, layers=s.layers or 1,
                               target_layer_ids=s.target_layer_ids, mask_token_id=mask_id)
    s.block_size, s.layers, s.target_layer_ids, s.mask_token_id = B, cfg.num_hidden_layers, cfg.target_layer_ids, mask_id
    return cfg


def _optimizer(drafter: Drafter, s: TrainSettings) -> torch.optim.AdamW:
    """AdamW with weight decay on the matrices only (not norms and biases)."""
    decay = [p for n, p in drafter.named_parameters() if p.dim() > 1]
    rest = [p for n, p in drafter.named_parameters() if p.dim() <= 1]
    return torch.optim.AdamW([{"params": decay, "weight_decay": s.weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=s.lr, betas=(0.9, 0.95))


def _optimise(run: _Run, drafter: Drafter, opt: torch.optim.Optimizer) -> Result:
    """Steps from the saved one (0 when fresh) to ``s.steps``: update, evaluate, checkpoint."""
    s, progress = run.s, run.progress
    step, history = 0, []
    if s.resume and (run.work / "state.json").exists():
        step, history = load_state(run.work, drafter, opt)
        progress.log(f"resuming at step {step}")
    gamma = objective.loss_gamma(s.block_size)
    progress.phase("training", s.steps)
    progress.advance(step, {})
    start = time.time()
    loss_v, tau_v, heldout, losses = math.nan, math.nan, None, []
    drafter.train()
    while step < s.steps:
        loss_v, tau_v = _update(run, drafter, opt, step, gamma)
        step += 1
        losses.append(loss_v)
        info = {"loss": loss_v, "tau": tau_v}
        if run.eval_ids and (step % s.eval_every == 0 or step == s.steps):
            heldout = _evaluate(run, drafter, step, loss_v, tau_v, history)
            info["heldout_tau"] = heldout
        progress.advance(step, info)
        if step % s.save_every == 0 or step == s.steps:
            save_state(run.work, drafter, opt, step, history)
            write_drafter(drafter, run.out, s.save_dtype)
    if not losses and history:            # resumed a finished run: report where it stands
        loss_v, tau_v, heldout = history[-1]["loss"], history[-1]["train_tau"], history[-1]["heldout_tau"]
    return Result(run.out, step, loss_v, tau_v, heldout, time.time() - start, history, losses)


def _update(run: _Run, drafter: Drafter, opt: torch.optim.Optimizer, step: int, gamma: float) -> tuple[float, float]:
    """One optimiser step on the batch drawn for ``step`` (seeded by (seed, step)); (loss, train τ)."""
    s = run.s
    g = torch.Generator().manual_seed(s.seed * 1_000_003 + step)
    loss, m = train_step(drafter, run.target, run.regen, s.block_size, s.mask_token_id, s, gamma, g)
    for group in opt.param_groups:
        group["lr"] = lr_at(step, s)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
    opt.step()
    return loss.item(), m["tau"]


def _evaluate(run: _Run, drafter: Drafter, step: int, loss_v: float, tau_v: float, history: list) -> float:
    """Held-out τ after ``step``, appended to ``history`` and logged."""
    heldout = heldout_tau(run.target, drafter, run.eval_ids, run.s.block_size, run.s.eval_tokens, run.stops)
    history.append({"step": step, "loss": round(loss_v, 4), "train_tau": round(tau_v, 3),
                    "heldout_tau": round(heldout, 3)})
    run.progress.log(f"step {step}: loss {loss_v:.3f}, train τ {tau_v:.2f}, held-out τ {heldout:.2f}")
    return heldout


def _cached_regen(s: TrainSettings, work: Path) -> dict | None:
    mpath = work / "regen.json"
    if not ((work / "regen.safetensors").exists() and mpath.exists()):
        return None
    saved = json.loads(mpath.read_text())
    return saved if saved.get("settings") == {k: getattr(s, k) for k in DATA_FIELDS} else None


def _training_set(s: TrainSettings, work: Path, data, tokenizer, target: Target, stops, progress: Progress):
    path = work / "regen.safetensors"
    saved = _cached_regen(s, work)
    if saved is not None:
        progress.log(f"reusing {saved['sequences']} regenerated sequences from {path}")
        return train_data.Regenerated.load(path), saved["eval_prompts"]
    prompts_text, texts = data
    prompts = train_data.build_prompts(tokenizer, prompts_text, texts, prompt_len=s.prompt_len, gen_len=s.gen_len,
                              max_samples=s.samples + s.eval_prompts, seed=s.seed)
    n_eval = min(s.eval_prompts, len(prompts) // 2)
    eval_ids, train_prompts = prompts[:n_eval], prompts[n_eval:]
    progress.phase("regenerating responses with the target", len(train_prompts))
    regen = train_data.regenerate(target, train_prompts, gen_len=s.gen_len, stop_token_ids=stops,
                         progress=lambda k: progress.advance(k, {}))
    regen.save(path)
    meta = {k: getattr(s, k) for k in DATA_FIELDS}
    _write_json(work / "regen.json", {"settings": meta, "sequences": len(regen), "eval_prompts": eval_ids})
    return regen, eval_ids


def train_step(drafter: Drafter, target: Target, regen: train_data.Regenerated, B: int, mask_id: int,
               s: TrainSettings, gamma: float, g: torch.Generator):
    """Loss of one batch: target_hidden from the frozen target, K anchored blocks per sequence."""
    idx = torch.randperm(len(regen), generator=g)[: s.batch_size]
    lengths, plens = regen.lengths[idx], regen.prompt_lengths[idx]
    Tmax = int(lengths.max())
    tokens = regen.tokens[idx, :Tmax]
    with torch.no_grad():
        attn = (torch.arange(Tmax)[None] < lengths[:, None]).long()
        out = target.model(input_ids=tokens, attention_mask=attn, output_hidden_states=True, use_cache=False)
        target_hidden = torch.cat([out.hidden_states[i + 1] for i in drafter.cfg.target_layer_ids], dim=-1)
        anchors, valid = train_data.sample_anchors(lengths, plens, s.anchors, g)
        block, labels = objective.block_inputs(tokens, anchors, B, mask_id, lengths)
        labels = torch.where(valid[..., None], labels, -100)
        b, K = anchors.shape
        embeds = target.embed(block.view(b, K * B), drafter.cfg.input_embedding_scale).view(b, K, B, -1)
    hidden = objective.train_forward(drafter, target_hidden.to(drafter.dtype), embeds.to(drafter.dtype), anchors)
    logits = drafter.logits(hidden[:, :, 1:], target.head)
    return objective.block_loss(logits, labels, gamma)


def heldout_tau(target: Target, drafter: Drafter, prompts: list[list[int]], B: int, n_tokens: int,
                stops) -> float:
    """τ of the drafter on prompts it never trained on (greedy, the reference runtime)."""
    from dflash_trt.runtime import generate

    was = drafter.training
    drafter.eval()
    try:
        res = generate(target, drafter, prompts, max_new_tokens=n_tokens, block_size=B, stop_token_ids=stops)
    finally:
        drafter.train(was)
    return res.stats.acceptance_length
