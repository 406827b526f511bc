"""The regenerated set on disk: sharded, written streaming from the journals, read per rank."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import torch
from safetensors.torch import save_file

from dflash_trt.train import data as train_data
from dflash_trt.train import regen as train_regen
from dflash_trt.train.dist import Ranks


def _prompts_and_journals(work, n=23, world=3):
    """n prompts of mixed lengths, their responses journalled by `world` ranks (strided, as
    regeneration writes them), one torn last line included."""
    rng = random.Random(0)
    prompts = [[rng.randrange(1, 50) for _ in range(rng.randrange(2, 9))] for _ in range(n)]
    responses = [[rng.randrange(1, 50) for _ in range(rng.randrange(0, 12))] for _ in range(n)]
    prints = train_regen.fingerprint(prompts, 12)
    for r in range(world):
        j = train_regen.Journal(work, r, prints)
        for i in range(r, n, world):
            j.add(i, responses[i], "reference runtime", retokenized=(i == 4))
        j.close()
    with (work / "regen-0.jsonl").open("a") as f:
        f.write('{"i": 1, "respo')  # a killed run's torn line
    return prompts, responses, prints


def _padded(prompts, responses):
    """The old single padded set: tokens [N, T], lengths [N]."""
    seqs = [p + r for p, r in zip(prompts, responses, strict=True)]
    tokens = torch.zeros(len(seqs), max(map(len, seqs)), dtype=torch.long)
    for i, q in enumerate(seqs):
        tokens[i, : len(q)] = torch.tensor(q)
    return tokens, torch.tensor([len(q) for q in seqs])


def test_sharded_set_equals_the_padded_set_and_holds_one_shard_at_most(tmp_path, monkeypatch):
    prompts, responses, prints = _prompts_and_journals(tmp_path)
    peaks, budget = [], 8 * 20 * 3  # three rows of 20 tokens: many shards
    real = train_data.ShardWriter.close

    def close(self):
        peaks.append(self.peak)
        return real(self)

    monkeypatch.setattr(train_data.ShardWriter, "close", close)
    regen, info = train_regen._assemble(
        prompts, train_regen.Journal.read_all(tmp_path, prints), tmp_path / "regen", budget
    )
    tokens, lengths = _padded(prompts, responses)
    index = json.loads((tmp_path / "regen" / "index.json").read_text())
    assert len(index["shards"]) >= 5 and index["sequences"] == len(prompts)
    assert all(sh["width"] * (sh["stop"] - sh["start"]) * 8 <= budget for sh in index["shards"])
    held = max(sh["stop"] - sh["start"] for sh in index["shards"])
    assert peaks == [held] and held <= 5  # never more rows held than one shard's (of 23)
    assert torch.equal(regen.lengths, lengths)
    assert torch.equal(regen.prompt_lengths, torch.tensor([len(p) for p in prompts]))
    assert torch.equal(regen.rows(torch.arange(len(prompts)), tokens.shape[1]), tokens)
    idx = torch.tensor([22, 0, 7, 7, 13])  # across shards, out of order, repeated, cut short
    assert torch.equal(regen.rows(idx, 5), tokens[idx, :5])
    assert info["retokenized_responses"] == 1 and info["sources"] == ["reference runtime"]


def test_ranks_stride_over_shards(tmp_path):
    """Each rank's rows of a global batch (rows rank, rank + world, ...) read from the shards
    they live in equal its rows of the padded set; together the ranks read the batch once."""
    prompts, responses, prints = _prompts_and_journals(tmp_path)
    regen, _ = train_regen._assemble(
        prompts, train_regen.Journal.read_all(tmp_path, prints), tmp_path / "regen", 8 * 20 * 4
    )
    tokens, _ = _padded(prompts, responses)
    batch = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(1))[:10]
    seen = []
    for rank in range(3):
        mine = batch[torch.tensor(Ranks(rank=rank, world=3).mine(range(len(batch))))]
        w = int(regen.lengths[mine].max())
        assert torch.equal(regen.rows(mine, w), tokens[mine, :w])
        assert (
            len(
                {
                    regen.shards[int(k)]["file"]
                    for k in torch.bucketize(mine, torch.tensor([sh["stop"] for sh in regen.shards]), right=True)
                }
            )
            > 1
        )  # a step touches several shards
        seen += mine.tolist()
    assert sorted(seen) == sorted(batch.tolist())


def test_an_older_single_file_set_still_reads(tmp_path):
    tokens = torch.tensor([[5, 6, 7, 0], [8, 9, 10, 11]])
    save_file(
        {"tokens": tokens, "lengths": torch.tensor([3, 4]), "prompt_lengths": torch.tensor([2, 2])},
        str(tmp_path / "regen.safetensors"),
    )
    assert train_regen.set_path(tmp_path) == tmp_path / "regen.safetensors"
    old = train_data.Regenerated.load(train_regen.set_path(tmp_path))
    assert len(old.shards) == 1 and torch.equal(old.rows(torch.tensor([1, 0]), 4), tokens[[1, 0]])
    train_data.ShardWriter(tmp_path / "regen").close()  # a finished shard folder takes precedence
    assert train_regen.set_path(tmp_path) == tmp_path / "regen"


def test_the_memory_line_states_the_shard_bound(tmp_path):
    prompts, _, prints = _prompts_and_journals(tmp_path)
    regen, _ = train_regen._assemble(
        prompts, train_regen.Journal.read_all(tmp_path, prints), tmp_path / "regen", 8 * 20 * 3
    )
    ns = SimpleNamespace
    line = train_data.memory_line(
        regen,
        ns(batch_size=4),
        ns(target_layer_ids=[0, 1], hidden_size=8),
        ns(dtype=torch.float32),
        object(),
        Ranks(world=2),
    )
    largest = max(sh["bytes"] for sh in regen.shards) / 2**20
    assert f"in {len(regen.shards)} shard(s), largest {largest:.1f} MB" in line
    assert f"per step 2 rows x {int(regen.lengths.max())} tokens" in line
