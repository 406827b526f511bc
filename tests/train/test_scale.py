"""train-drafter beyond one process: regeneration through a server, cached features, gloo ranks,
resume after a kill and across a changed number of ranks."""

from __future__ import annotations

import errno
import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from dflash_trt.cli import run
from dflash_trt.errors import DFlashError
from dflash_trt.train import TrainSettings, train_drafter
from dflash_trt.train import features as train_features
from dflash_trt.train import launcher as train_launch
from dflash_trt.train import regen as train_regen
from dflash_trt.train.checkpoint import read_state
from dflash_trt.train.data import Regenerated
from tests.helpers import save_pair
from tests.serve.helpers import subprocess_env

# Reads enable_thinking as Qwen3's template does: thinking off adds an empty think block.
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>"
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}{% endif %}"
)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("scale")
    tdir, ddir = save_pair(root)
    tok = AutoTokenizer.from_pretrained(tdir)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(tdir)
    text = "".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(200))
    (root / "data.txt").write_text(text)
    lines = [json.dumps({"prompt": f"write f{i}"}) for i in range(10)]
    lines.append(
        json.dumps({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]})
    )
    (root / "chat.jsonl").write_text("\n".join(lines) + "\n")
    return root, tdir, ddir


def settings(root, tdir, out, **kw) -> TrainSettings:
    base = dict(
        target=str(tdir),
        data=str(root / "data.txt"),
        out=str(out),
        block_size=4,
        layers=1,
        steps=4,
        batch_size=4,
        anchors=4,
        prompt_len=12,
        gen_len=8,
        samples=12,
        eval_prompts=2,
        eval_every=100,
        save_every=2,
        lr=3e-3,
    )
    return TrainSettings(**{**base, **kw})


def argv(s: TrainSettings, *more: str) -> list[str]:
    """The same settings as flags of train-drafter (``more``: fields only python -m dflash_trt.train takes)."""
    out = []
    for k in (
        "target",
        "data",
        "out",
        "block_size",
        "layers",
        "steps",
        "batch_size",
        "anchors",
        "prompt_len",
        "gen_len",
        "samples",
        "eval_every",
        "save_every",
        "lr",
        *more,
    ):
        out += [f"--{k.replace('_', '-')}", str(getattr(s, k))]
    return out


def assert_same_state(a, b, atol=1e-5):
    wa, wb = read_state(a / ".train"), read_state(b / ".train")
    assert wa.keys() == wb.keys() and any(k.endswith("exp_avg") for k in wa)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=atol, rtol=1e-4)


# ---------------------------------------------------------------------------------------
# Regeneration through a server
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(setup):
    from dflash_trt.runtime import load_pair
    from dflash_trt.serve import ServerThread, create_app

    _, tdir, ddir = setup
    pair = load_pair(tdir, ddir, dtype="float32")  # the dtype training regenerates in
    with ServerThread(create_app(pair, "tiny", max_batch=8, max_queue=64)) as srv:
        yield srv


def test_regeneration_through_the_embedded_server_equals_in_process(setup, server, tmp_path, monkeypatch):
    """Same response token ids at temperature 0, chat template and thinking setting recorded;
    a crash mid-regeneration loses only what was in flight."""
    root, tdir, _ = setup
    common = dict(
        data=str(root / "chat.jsonl"),
        chat_template=True,
        thinking=False,
        steps=1,
        samples=10,
        eval_prompts=1,
        gen_len=10,
    )
    local = train_drafter(settings(root, tdir, tmp_path / "local", **common))
    assert local.step == 1

    class Crash(Exception):
        pass

    seen = []

    def advance(done, info):
        seen.append(done)
        if len(seen) == 4:
            raise Crash()

    from dflash_trt.train import Progress

    remote = settings(root, tdir, tmp_path / "remote", regen_endpoint=server.url, regen_concurrency=2, **common)
    with pytest.raises(Crash):
        train_drafter(remote, Progress(advance=advance))
    journal = (tmp_path / "remote" / ".train" / "regen-0.jsonl").read_text().splitlines()
    done = len(journal) - 1  # header + what finished before the crash
    assert done >= 4
    sent, lines = [], []
    real = train_regen.regenerate_endpoint

    def counted(url, prompts, **kw):
        sent.extend(prompts)
        return real(url, prompts, **kw)

    monkeypatch.setattr(train_regen, "regenerate_endpoint", counted)
    train_drafter(remote, Progress(log=lines.append))  # the rerun sends only the missing prompts
    assert len(sent) == 10 - done and f"regeneration: {done} of 10 responses already done, resuming" in lines

    a, b = (Regenerated.load(tmp_path / run / ".train" / "regen") for run in ("local", "remote"))
    assert torch.equal(a.lengths, b.lengths) and torch.equal(a.prompt_lengths, b.prompt_lengths)
    every, width = torch.arange(len(a)), int(a.lengths.max())
    assert torch.equal(a.rows(every, width), b.rows(every, width))
    assert int((a.lengths - a.prompt_lengths).sum()) > 10 * 5  # real responses, not empty ones
    meta = json.loads((tmp_path / "remote" / "training.json").read_text())["regeneration"]
    assert meta["sources"] == [f"{server.url} (model tiny)"] and meta["retokenized_responses"] == 0
    assert meta["chat"]["chat_template_applied"] and meta["chat"]["enable_thinking"] is False
    assert meta["chat"]["template_reads_enable_thinking"] and len(meta["chat"]["chat_template_sha256"]) == 64
    assert json.loads((tmp_path / "local" / "training.json").read_text())["regeneration"]["sources"] == [
        "reference runtime"
    ]


def test_the_thinking_switch_changes_the_prompts(setup):
    from transformers import AutoTokenizer

    from dflash_trt.train import data

    _, tdir, _ = setup
    tok = AutoTokenizer.from_pretrained(tdir)
    off = data.encode_prompt(tok, "hi", chat_template=True, thinking=False)
    on = data.encode_prompt(tok, "hi", chat_template=True, thinking=True)
    assert tok.decode(off).endswith("<assistant><think></think>") and tok.decode(on).endswith("<assistant>")
    with pytest.raises(DFlashError, match="--chat-template"):
        data.chat_record(tok, ["hi"], chat_template=False, thinking=True)


def test_a_server_that_sends_text_only_is_retokenized(setup):
    from transformers import AutoTokenizer

    from dflash_trt.serve import Completion

    _, tdir, _ = setup
    tok = AutoTokenizer.from_pretrained(tdir)
    ids = tok("abc", add_special_tokens=False)["input_ids"]
    assert train_regen.response_ids(Completion(None, "abc", "stop"), tok, [2]) == (ids + [2], True)
    assert train_regen.response_ids(Completion(ids + [2, 5], "", "stop"), tok, [2]) == (ids + [2], False)
    assert train_regen.response_ids(Completion(ids, "abc", "length"), tok, [2]) == (ids, False)


def test_server_errors_are_one_line(server):
    from dflash_trt.serve import complete_all

    with pytest.raises(DFlashError, match=r"answered 400: prompt token ids must be in \[0, 96\)"):
        complete_all(server.url, {0: [5, 999]}, 4, on_done=lambda i, c: None)
    with pytest.raises(DFlashError, match="serves tiny, not other"):
        complete_all(server.url, {0: [5]}, 4, on_done=lambda i, c: None, model="other")


def test_a_torn_journal_line_is_skipped(tmp_path):
    j = train_regen.Journal(tmp_path, 0, "abc")
    j.add(3, [1, 2], "x")
    j.close()
    with (tmp_path / "regen-0.jsonl").open("a") as f:
        f.write('{"i": 4, "resp')  # a run killed mid-line
    assert list(train_regen.Journal.read_all(tmp_path, "abc")) == [3]
    assert train_regen.Journal.read_all(tmp_path, "other prompts") == {}


# ---------------------------------------------------------------------------------------
# The feature cache
# ---------------------------------------------------------------------------------------


def shard_files(folder):
    return sorted(folder.glob("features-*.safetensors"))


def test_feature_cache_is_written_once_and_reused(setup, tmp_path, monkeypatch):
    root, tdir, _ = setup
    online = train_drafter(settings(root, tdir, tmp_path / "online"))
    cache = tmp_path / "cache"
    lines = []
    from dflash_trt.train import Progress

    first = train_drafter(
        settings(root, tdir, tmp_path / "c1", feature_cache=str(cache), feature_shard_mb=0.02),
        Progress(log=lines.append),
    )
    shards = shard_files(cache)
    assert len(shards) > 2 and (cache / "cache.json").exists()
    assert any(line.startswith("feature cache: ") and f"in {len(shards)} shards" in line for line in lines)
    torch.testing.assert_close(torch.tensor(first.losses), torch.tensor(online.losses), atol=1e-5, rtol=1e-5)
    assert_same_state(tmp_path / "online", tmp_path / "c1")

    stamps = [p.stat().st_mtime_ns for p in shards]
    monkeypatch.setattr(train_features, "save_file", lambda *a, **k: pytest.fail("the cache was written again"))
    again = train_drafter(settings(root, tdir, tmp_path / "c2", feature_cache=str(cache), feature_shard_mb=0.02))
    assert again.losses == first.losses
    assert [p.stat().st_mtime_ns for p in shard_files(cache)] == stamps
    # another data set is refused, not mixed in
    with pytest.raises(DFlashError, match="another target or data set"):
        train_drafter(settings(root, tdir, tmp_path / "c3", feature_cache=str(cache), samples=10))


def test_a_converted_capture_trains_as_in_process_features_and_mismatches_are_one_line(setup, tmp_path, capsys):
    """A feature folder written by another producer (here: transformers' own hidden states, as a
    converter of an engine's capture would write them) trains what in-process features train; a
    folder for other layers, another tokenizer or other tokens is refused in one line (exit 2)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root, tdir, _ = setup
    online = train_drafter(settings(root, tdir, tmp_path / "online", steps=3, save_every=3))
    ids = json.loads((tmp_path / "online" / "training.json").read_text())["target_layer_ids"]
    regen = Regenerated.load(tmp_path / "online" / ".train" / "regen")
    model = AutoModelForCausalLM.from_pretrained(tdir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(tdir)

    def capture():
        for i in range(len(regen)):
            n = int(regen.lengths[i])
            row = regen.rows(torch.tensor([i]), n)
            with torch.no_grad():
                states = model(input_ids=row, output_hidden_states=True).hidden_states
            yield row[0], torch.cat([states[j + 1][0] for j in ids], -1)  # z-lab id j: layer j's output

    folder = tmp_path / "captured"
    table = train_features.write_capture(
        folder,
        capture(),
        layer_ids=ids,
        hidden_size=model.config.hidden_size,
        tokenizer=tok,
        producer="test converter",
        shard_mb=0.02,
    )
    assert len(table["shards"]) > 1 and "key" not in table
    got = train_drafter(settings(root, tdir, tmp_path / "from-disk", steps=3, save_every=3, feature_cache=str(folder)))
    torch.testing.assert_close(torch.tensor(got.losses), torch.tensor(online.losses), atol=1e-5, rtol=1e-5)
    assert_same_state(tmp_path / "online", tmp_path / "from-disk")

    s = settings(root, tdir, tmp_path / "bad", steps=1)
    for field, value, says in (
        ("layer_ids", [0], "its features tap target layers [0], the drafter taps"),
        ("tokenizer_sha256", "0" * 64, "made with another tokenizer"),
        ("dtype", "int8", "dtype 'int8' is not one of"),
    ):
        bad = json.loads((folder / "cache.json").read_text())
        (folder / "cache.json").write_text(json.dumps({**bad, field: value}))
        assert run(["train-drafter", *argv(s), "--feature-cache", str(folder)]) == 2
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert err[-1].startswith("error: --feature-cache ") and says in err[-1], err
        (folder / "cache.json").write_text(json.dumps(bad))
    shard = load_file(str(folder / "features-00000.safetensors"))
    shard["tokens"][3] += 1  # one token id off: misaligned
    from safetensors.torch import save_file

    save_file(shard, str(folder / "features-00000.safetensors"))
    assert run(["train-drafter", *argv(s), "--feature-cache", str(folder)]) == 2
    assert "shard 0's token ids differ from the regenerated set's" in capsys.readouterr().err


def test_a_full_disk_is_one_line_and_keeps_the_finished_shards(setup, tmp_path, monkeypatch, capsys):
    root, tdir, _ = setup
    real = train_features.save_file
    calls = []

    def quota(tensors, path, metadata=None):
        """A disk with room for two shards: the third write fails half-way."""
        calls.append(path)
        if len(calls) == 3:
            with open(path, "wb") as f:
                f.write(b"\0" * 100)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(tensors, path, metadata=metadata)

    monkeypatch.setattr(train_features, "save_file", quota)
    cache = tmp_path / "cache"
    s = settings(root, tdir, tmp_path / "out", feature_cache=str(cache), feature_shard_mb=0.02)
    args = ["train-drafter", *argv(s), "--feature-cache", str(cache), "--feature-shard-mb", "0.02"]
    assert run(args) == 2
    errors = [ln for ln in capsys.readouterr().err.splitlines() if "error" in ln.lower()]
    assert len(errors) == 1 and errors[0].startswith("error: --feature-cache ")  # one line, no traceback
    assert "disk is full after 2 of 3 shards" in errors[0] and "finished shards stay" in errors[0]
    assert len(shard_files(cache)) == 2 and not list(cache.glob("*.tmp")) and not (cache / "cache.json").exists()

    monkeypatch.setattr(train_features, "save_file", real)
    written = []
    monkeypatch.setattr(
        train_features, "save_file", lambda t, p, metadata=None: (written.append(p), real(t, p, metadata=metadata))
    )
    assert run(args) == 0  # the rerun writes only the missing shards
    total = len(shard_files(cache))
    assert len(written) == total - 2 and (cache / "cache.json").exists()


# ---------------------------------------------------------------------------------------
# Ranks
# ---------------------------------------------------------------------------------------


def test_python_m_dflash_trt_train_takes_the_train_drafter_flags():
    import typer.main

    from dflash_trt.cli import app

    cmd = next(c for c in typer.main.get_command(app).commands.values() if c.name == "train-drafter")
    cli_flags = {o for p in cmd.params for o in p.opts if o.startswith("--")} - {"--nproc", "--json", "--help"}
    ours = {o for p in train_launch.command().params for o in p.opts}
    assert cli_flags <= ours, cli_flags - ours
    s = train_launch.settings_from_argv(
        [
            "-t",
            "T",
            "--data",
            "D",
            "-o",
            "O",
            "--target-layer-ids",
            "1,3",
            "--no-thinking",
            "--feature-cache",
            "C",
            "--steps",
            "7",
        ]
    )
    assert (s.target_layer_ids, s.thinking, s.feature_cache, s.steps, s.resume) == ([1, 3], False, "C", 7, False)


def test_a_rank_reports_a_user_error_in_one_line(setup, tmp_path, capsys):
    root, tdir, _ = setup
    assert train_launch.main(["-t", str(tdir), "--data", str(tmp_path / "none"), "-o", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == f"dflash_trt.train: error: --data {tmp_path / 'none'}: no such file or folder\n"
    s = settings(root, tdir, tmp_path / "o", batch_size=1)
    with pytest.raises(DFlashError, match="global batch: give at least one sequence to each of the 2 ranks"):
        train_launch.launch(s, 2)  # refused before any rank starts
    assert not (tmp_path / "o").exists()


def torchrun(s: TrainSettings, *flags: str) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node 2 -m dflash_trt.train`` with ``s`` (gloo on this CPU)."""
    env = {**subprocess_env(), "OMP_NUM_THREADS": "1"}
    extra = [str(f) for f in flags]
    for name in ("arch", "selector_rank", "selector_top_k", "feature_cache", "feature_shard_mb"):
        if getattr(s, name) is not None:
            extra += [f"--{name.replace('_', '-')}", str(getattr(s, name))]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "dflash_trt.train",
            *argv(s, "eval_prompts"),
            *extra,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("drafter written") == 1  # rank 0 alone reports
    return proc


def assert_same_run(ref, out, ref_dir, atol=1e-5):
    """Same fp32 weights and AdamW moments, losses and held-out τ as the 1-process run ``ref``."""
    assert_same_state(ref_dir, out, atol=atol)
    got = json.loads((out / ".train" / "result.json").read_text())
    torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(ref.losses), atol=1e-5, rtol=1e-5)
    # the gradient before clipping (the clip at norm 1 would hide a gradient off by the rank count)
    torch.testing.assert_close(torch.tensor(got["grad_norms"]), torch.tensor(ref.grad_norms), atol=1e-5, rtol=1e-4)
    assert [h["heldout_tau"] for h in got["history"]] == [h["heldout_tau"] for h in ref.history]


def test_one_process_fsdp_equals_no_engine(setup, tmp_path):
    """FSDP2 over a one-rank gloo group (drafter and target decoder layers fully_shard-ed, the
    sharded checkpoint) trains what one plain process trains."""
    root, tdir, _ = setup
    ref = train_drafter(settings(root, tdir, tmp_path / "plain", steps=3, save_every=3, eval_every=3))
    got = train_drafter(settings(root, tdir, tmp_path / "fsdp", steps=3, save_every=3, eval_every=3, parallel="fsdp"))
    assert not torch.distributed.is_initialized()  # the run closed the group it made
    assert json.loads((tmp_path / "fsdp" / "training.json").read_text())["parallel"] == "fsdp"
    assert_same_run(ref, tmp_path / "fsdp", tmp_path / "plain")
    assert got.heldout_tau == ref.heldout_tau
    # the target held in bfloat16 (its head casts the fp32 drafter's states; the held-out τ drafts in bf16)
    half = train_drafter(
        settings(
            root, tdir, tmp_path / "bf16", steps=3, save_every=3, eval_every=3, parallel="fsdp", target_dtype="bfloat16"
        )
    )
    assert json.loads((tmp_path / "bf16" / "training.json").read_text())["target_dtype"] == "bfloat16"
    # a bf16 target regenerates other responses: the same start, not the same run
    assert all(math.isfinite(v) for v in half.losses) and abs(half.losses[0] - ref.losses[0]) < 0.15 * ref.losses[0]
    assert half.heldout_tau >= 1.0


@pytest.mark.slow
@pytest.mark.parametrize("arch, parallel", [("dflash", "fsdp"), ("dflash2", "fsdp"), ("dflash", "ddp")])
def test_two_gloo_ranks_equal_one_process(setup, tmp_path, arch, parallel):
    """torchrun with 2 gloo ranks under FSDP2 (DDP) = 1 process at the same global batch: weights,
    moments, losses, held-out τ. The DFlash FSDP run also writes the feature folder between its ranks."""
    root, tdir, _ = setup
    kw = dict(steps=4, eval_every=2)
    if arch == "dflash2":
        kw.update(arch="dflash2", selector_rank=8, selector_top_k=4)
    ref = train_drafter(settings(root, tdir, tmp_path / "one", **kw))
    cache = arch == "dflash" and parallel == "fsdp"
    two = settings(
        root,
        tdir,
        tmp_path / "two",
        **kw,
        **(dict(feature_cache=str(tmp_path / "cache"), feature_shard_mb=0.02) if cache else {}),
    )
    torchrun(two, "--parallel", parallel)
    assert_same_run(ref, tmp_path / "two", tmp_path / "one")
    meta = json.loads((tmp_path / "two" / "training.json").read_text())
    assert (meta["ranks"], meta["parallel"], meta["arch"]) == (2, parallel, arch)
    if cache:
        assert len(shard_files(tmp_path / "cache")) > 2  # the two ranks wrote the shards between them


@pytest.mark.slow
def test_resume_on_another_number_of_ranks(setup, tmp_path):
    """2 fsdp ranks saved at step 2, resumed in 1 process; 1 process saved, resumed on 2 ranks
    (--nproc 2): both equal an uninterrupted 1-process run."""
    root, tdir, _ = setup
    train_drafter(settings(root, tdir, tmp_path / "one", steps=4, eval_every=2))
    torchrun(settings(root, tdir, tmp_path / "down", steps=2, eval_every=2))
    assert len(list((tmp_path / "down" / ".train" / "state").glob("shard-*.safetensors"))) == 2  # one per rank
    train_drafter(settings(root, tdir, tmp_path / "down", steps=4, eval_every=2, resume=True))
    assert_same_state(tmp_path / "one", tmp_path / "down")

    half = settings(root, tdir, tmp_path / "up", steps=2, eval_every=2)
    train_drafter(half)
    assert run(["train-drafter", *argv(half), "--steps", "4", "--resume", "--nproc", "2", "--json"]) == 0
    assert_same_state(tmp_path / "one", tmp_path / "up")


@pytest.mark.slow
def test_resume_after_a_killed_run(setup, tmp_path):
    """SIGKILL mid-training, then --resume: the result equals an uninterrupted run."""
    root, tdir, _ = setup
    s = settings(root, tdir, tmp_path / "killed", steps=40, save_every=1)
    env = {**subprocess_env(), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dflash_trt.train", *argv(s, "eval_prompts")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    state = tmp_path / "killed" / ".train" / "state.json"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if state.exists() and json.loads(state.read_text() or '{"step": 0}')["step"] >= 3:
            break
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = json.loads(state.read_text())["step"]
    assert 3 <= killed_at < 40, "the run was not killed mid-training"
    resumed = train_drafter(settings(root, tdir, tmp_path / "killed", steps=40, save_every=1, resume=True))
    assert resumed.step == 40 and len(resumed.losses) <= 40 - killed_at + 1
    train_drafter(settings(root, tdir, tmp_path / "whole", steps=40, save_every=40))
    assert_same_state(tmp_path / "killed", tmp_path / "whole", atol=1e-6)
