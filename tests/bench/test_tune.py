"""dflash-trt tune against the embedded server: the schedule it writes is what TensorRT-LLM's lookup
reads as the measured best, it is written atomically (the previous files kept), Ctrl-C mid-sweep
leaves the bundle as it was, and --endpoint measures without writing."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest
import yaml

from dflash_trt import ingest
from dflash_trt.bench import tune as T
from dflash_trt.cli import run
from dflash_trt.deploy import check_trtllm_bundle


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The embedded tiny pair (a drafter that is accepted: tau ~3) built into a bundle."""
    out = tmp_path_factory.mktemp("tune") / "tiny"
    assert run(["build", "tiny", "-o", str(out), "--set", "serving.max_batch_size=4"]) == 0
    return out


@pytest.fixture
def bundle(built, tmp_path):
    return shutil.copytree(built, tmp_path / "tiny")


def _files(root):
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def trtllm_draft_len(schedule: dict[int, int], batch: int) -> int:
    """TensorRT-LLM ``_torch/speculative/utils.py::get_draft_len_for_batch_size``: the FIRST key
    >= the batch size applies; above the largest key, 0."""
    return next((schedule[k] for k in sorted(schedule) if k >= batch), 0)


def _png(path) -> None:
    import matplotlib.image as mpimg

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and mpimg.imread(path).shape[0] > 400


def test_tune_writes_the_measured_best_schedule_atomically(bundle, tmp_path, capsys):
    before = _files(bundle)
    assert run(["tune", str(bundle), "--concurrency", "1,2,4", "--draft-lens", "7,3,1", "--max-tokens", "8",
                "--requests", "4", "--json", "--plot", str(tmp_path / "tune.png")]) == 0
    _png(tmp_path / "tune.png")
    r = json.loads(capsys.readouterr().out)
    spec = yaml.safe_load((bundle / "trtllm/config.yaml").read_text())["speculative_config"]
    sched = {int(k): v for k, v in spec["draft_len_schedule"].items()}
    assert "max_concurrency" not in spec and spec["max_draft_len"] == r["max_draft_len"] == r["winners"]["1"]
    tps = {int(L): {lv["concurrency"]: lv["output_tokens_per_second"] for lv in levels}
           for L, levels in r["measured"].items()}
    assert sorted(tps) == [0, 1, 3, 7]
    for c in (1, 2, 4):
        got = trtllm_draft_len(sched, c)
        assert got == r["winners"][str(c)]
        if c > 1:   # the fastest length measured there, among those the schedule may hold
            allowed = [L for L in tps if L <= spec["max_draft_len"]]
            assert tps[got][c] == max(tps[L][c] for L in allowed)
    # atomically: the previous config and manifest kept beside them, nothing half-written left
    for rel in (ingest.Layout.TRTLLM_CONFIG, ingest.Layout.MANIFEST):
        assert (bundle / f"{rel}.prev").read_bytes() == before[Path(rel)]
    assert not [p for p in bundle.rglob(".*tune-*")]
    plan = json.loads((bundle / "manifest.json").read_text())["plan"]
    assert {int(k): v for k, v in plan["draft_len_schedule"].items()} == sched
    assert plan["max_draft_len"] == spec["max_draft_len"] and plan["tuned"]["winners"] == r["winners"]
    check_trtllm_bundle(bundle)   # still a bundle TensorRT-LLM's schema accepts
    assert ingest.check_files(ingest.open_bundle(bundle)) == []   # and every file as the manifest records


@pytest.fixture
def ctrl_c_interrupts():
    """SIGINT with Python's default handler, as in a terminal. A process started in the background
    by a non-interactive shell (``cmd &``) inherits SIGINT ignored, and ``asyncio.run`` turns
    Ctrl-C into KeyboardInterrupt only over the default handler."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def test_ctrl_c_mid_sweep_leaves_the_bundle_as_it_was(bundle, ctrl_c_interrupts):
    before = _files(bundle)
    t = T.read(bundle)
    seen = []

    def progress(L, c):   # the user presses Ctrl-C once the first level is measured
        seen.append((L, c))
        os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        T.measure_embedded(t, [0, 3], [1, 2], requests=2, max_tokens=4, prompts=None, progress=progress)
    assert seen == [(0, 1)]
    assert _files(bundle) == before


def test_commit_holds_ctrl_c_until_every_file_is_in_place(tmp_path, monkeypatch):
    a, b = tmp_path / "a.yaml", tmp_path / "b.json"
    a.write_text("old a")
    b.write_text("old b")
    real = os.replace

    def replace_then_interrupt(src, dst):   # Ctrl-C between the two renames
        real(src, dst)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(T.os, "replace", replace_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        T.commit({a: "new a", b: "new b"})
    assert (a.read_text(), b.read_text()) == ("new a", "new b")
    assert ((tmp_path / "a.yaml.prev").read_text(), (tmp_path / "b.json.prev").read_text()) == ("old a", "old b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.yaml", "a.yaml.prev", "b.json", "b.json.prev"]


def test_tune_endpoint_measures_and_refits_without_writing(bundle, capsys):
    from dflash_trt.runtime import load_bundle
    from dflash_trt.serve import ServerThread, create_app

    before = _files(bundle)
    app = create_app(load_bundle(bundle), "tiny", max_batch=4)
    with ServerThread(app) as srv:
        assert run(["tune", str(bundle), "--endpoint", srv.url, "--concurrency", "1,2", "--max-tokens", "8",
                    "--requests", "4", "--json"]) == 0
        r = json.loads(capsys.readouterr().out)
        # bench --plot with the bundle: its plan's predicted curves beside the measured ones
        png = bundle.parent / "bench.png"
        assert run(["bench", "--endpoint", srv.url, "--bundle", str(bundle), "--concurrency", "1,2",
                    "--max-tokens", "4", "--requests", "2", "--plot", str(png)]) == 0
        _png(png)
        capsys.readouterr()
    assert [lv["concurrency"] for lv in r["endpoint"]["levels"]] == [1, 2]
    assert r["calibration"]["source"].startswith("tune of tiny") and len(r["predicted_vs_measured"]) == 2
    assert _files(bundle) == before


def test_winners_respect_what_a_schedule_can_say():
    lv = lambda c, v: {"concurrency": c, "output_tokens_per_second": v}  # noqa: E731
    measured = {0: [lv(1, 10), lv(2, 30)], 3: [lv(1, 20), lv(2, 25)], 7: [lv(1, 19), lv(2, 40)]}
    warnings: list[str] = []
    wins = T.winners(measured, warnings)
    assert wins == {1: 7, 2: 7}   # 7 loses 5% at c=1, wins 60% at c=2: said so
    assert len(warnings) == 1 and "at concurrency 1 the fastest" in warnings[0]
    measured[7] = [lv(1, 12), lv(2, 26)]
    warnings.clear()
    wins = T.winners(measured, warnings)
    assert wins == {1: 3, 2: 0} and not warnings
    assert T.lengths_for({1: 7, 4: 3, 8: 0}, 10) == [7, 3, 3, 3, 0, 0, 0, 0, 0, 0]


def test_tune_endpoint_records_which_arm_won(bundle, capsys):
    """--mtp-endpoint: the three arms per concurrency, written into the manifest's plan.arms (the
    bundle still verifies); the same embedded server stands in for each arm."""
    from dflash_trt.runtime import load_bundle
    from dflash_trt.serve import ServerThread, create_app

    app = create_app(load_bundle(bundle), "tiny", max_batch=4)
    with ServerThread(app) as srv:
        assert run(["tune", str(bundle), "--endpoint", srv.url, "--baseline", srv.url, "--mtp-endpoint", srv.url,
                    "--concurrency", "1", "--max-tokens", "4", "--requests", "2", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["arms_written"] and [a["concurrency"] for a in r["arms"]] == [1]
    arms = ingest.open_bundle(bundle).manifest.plan.arms
    assert [a.model_dump() for a in arms.measured] == r["arms"]
    assert arms.measured[0].winner in ("dflash", "mtp", "autoregressive")
    check_trtllm_bundle(bundle)
