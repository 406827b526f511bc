"""Prompt sets in the formats users bring: the project's JSONL, ShareGPT, plain text, a Hugging
Face dataset (a stand-in for ``datasets.load_dataset``'s contract), with length controls and a seed."""

from __future__ import annotations

import json
import sys
import types

import pytest

from dflash_trt.bench import datasets
from dflash_trt.bench.datasets import Prompt
from dflash_trt.errors import DFlashError

CONVERSATIONS = [
    {
        "id": "a",
        "conversations": [
            {"from": "human", "value": "What is a monad?"},
            {"from": "gpt", "value": "A monoid in the category of endofunctors."},
        ],
    },
    {"id": "b", "conversations": [{"from": "gpt", "value": "a reply with no question"}]},  # skipped
    {
        "id": "c",
        "category": "code",
        "conversations": [{"role": "user", "content": "Sort a list."}, {"role": "assistant", "content": "sorted(xs)"}],
    },
]


@pytest.fixture(scope="module")
def tokenizer():
    from dflash_trt.ingest import embedded_dir
    from dflash_trt.runtime import load_tokenizer

    return load_tokenizer(embedded_dir("tiny") / "target")


def test_project_jsonl_with_categories_and_lengths(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(
        '{"prompt": "a b c", "category": "code", "max_tokens": 5}\n\n{"prompt": "d", "kind": "math"}\n'
        '{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]}\n'
    )
    assert datasets.load(f) == [Prompt("a b c", "code", 5), Prompt("d", "math"), Prompt("hi")]
    assert datasets.load(f, output_len=9, input_len=2)[0] == Prompt("a b", "code", 9)
    f.write_text('{"prompt": "x", "max_tokens": 0}\n')
    with pytest.raises(DFlashError, match=r"p.jsonl:1: max_tokens must be a positive integer"):
        datasets.load(f)


def test_sharegpt_json_and_jsonl(tmp_path, tokenizer):
    f = tmp_path / "sharegpt.json"
    f.write_text(json.dumps(CONVERSATIONS))
    rows = datasets.load(f, tokenizer=tokenizer)
    assert [(p.text, p.category) for p in rows] == [("What is a monad?", None), ("Sort a list.", "code")]
    reply = len(tokenizer.encode("sorted(xs)", add_special_tokens=False))
    assert rows[1].max_tokens == reply  # the reply's length sets the request's output length
    assert datasets.load(f)[0].max_tokens is None  # no tokenizer: the run's max tokens
    g = tmp_path / "sharegpt.jsonl"
    g.write_text("\n".join(json.dumps(c) for c in CONVERSATIONS) + "\n")
    assert [p.text for p in datasets.load(g)] == ["What is a monad?", "Sort a list."]
    g.write_text('{"conversations": 3}\n')
    with pytest.raises(DFlashError, match="needs a 'conversations' list"):
        datasets.load(g, "sharegpt")


def test_plain_text_a_seed_and_a_token_cut(tmp_path, tokenizer):
    f = tmp_path / "p.txt"
    f.write_text("".join(f"prompt number {i} with\\nsome words\n" for i in range(20)))
    rows = datasets.load(f)
    assert rows[3].text == "prompt number 3 with\nsome words" and len(rows) == 20
    shuffled = datasets.load(f, seed=3)
    assert shuffled == datasets.load(f, seed=3) != rows and sorted(p.text for p in shuffled) == sorted(
        p.text for p in rows
    )
    cut = datasets.load(f, input_len=3, tokenizer=tokenizer)
    assert all(len(tokenizer.encode(p.text, add_special_tokens=False)) <= 3 for p in cut)
    assert datasets.load(f, "text", limit=2) == rows[:2]


def test_a_huggingface_dataset_through_datasets(monkeypatch):
    calls = []

    class Split(list):
        column_names = ["question", "subject"]

    def load_dataset(name, split):
        calls.append((name, split))
        return Split([{"question": "2 + 2?", "subject": "math"}, {"question": "Capital of France?", "subject": "geo"}])

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    assert datasets.load("hf:org/quiz:test") == [Prompt("2 + 2?", "math"), Prompt("Capital of France?", "geo")]
    assert calls == [("org/quiz", "test")]


def test_without_datasets_installed_a_hub_dataset_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets raises ImportError
    with pytest.raises(DFlashError, match="needs the 'datasets' package"):
        datasets.load("hf:org/quiz")


def test_bench_on_a_bundle_uses_the_shipped_prompts(bundle_dir, capsys):
    from dflash_trt.cli import run
    from dflash_trt.ingest import embedded_dir

    assert run(["bench", str(bundle_dir), "-n", "2", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["prompts"] == len(datasets.load(embedded_dir("tiny") / "heldout_prompts.jsonl"))
