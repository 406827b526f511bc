"""Held-out τ: the drafter, in the dtype it ships in, drafting for the target under the reference
runtime's greedy decoding, on prompts it never trained on (cut from ``--eval-data`` as the training
prompts are cut from ``--data``, or windows held back from ``--data``).

Invariant: τ (tokens committed per round) is summed over the ranks, each decoding its share of the
prompts, so it does not depend on how many ranks measure it; a sharded target's forwards are
collectives, so then every rank decodes every prompt, in lockstep.
"""

from __future__ import annotations

from dflash_trt import runtime  # a module, read at call time as the function-level import was
from dflash_trt.model import Drafter, Target
from dflash_trt.train import data as train_data
from dflash_trt.train.dist import Ranks
from dflash_trt.train.settings import TrainSettings


def eval_prompts(s: TrainSettings, tokenizer, data) -> list[list[int]]:
    """``s.eval_prompts`` prompts cut from ``--eval-data`` (``read_data``'s prompts and texts) as the
    training prompts are cut from ``--data``."""
    prompts_text, texts = data
    return train_data.build_prompts(
        tokenizer,
        prompts_text,
        texts,
        prompt_len=s.prompt_len,
        gen_len=s.gen_len,
        window_stride=s.window_stride,
        max_samples=s.eval_prompts,
        seed=s.seed,
        chat_template=s.chat_template,
        thinking=s.thinking,
        flag="--eval-data",
    )


def heldout_tau(
    target: Target,
    drafter: Drafter,
    prompts: list[list[int]],
    B: int,
    n_tokens: int,
    stops,
    ranks: Ranks = Ranks(),
    sharded: bool = False,
) -> float:
    """τ of the drafter on prompts it never trained on (greedy, the reference runtime), over all ranks."""
    mine = ranks.mine(prompts)
    committed = rounds = 0
    if mine:
        was = drafter.training
        drafter.eval()
        try:
            # A sharded target runs transformers' forward (its FSDP hooks gather each layer); the
            # runtime's lean forward reads the weights directly and would see this rank's shards.
            backend = runtime.TorchBackend(target, drafter, lean=False) if sharded else None
            stats = runtime.generate(
                target, drafter, mine, max_new_tokens=n_tokens, block_size=B, stop_token_ids=stops, backend=backend
            ).stats
        finally:
            drafter.train(was)
        committed, rounds = stats.committed, stats.rounds
    committed, rounds = ranks.sum([committed, rounds])
    return committed / rounds if rounds else 0.0
