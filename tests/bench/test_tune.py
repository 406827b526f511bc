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
    assert (
        run(
            [
                "tune",
                str(bundle),
                "--concurrency",
                "1,2,4",
                "--draft-lens",
                "7,3,1",
                "--max-tokens",
                "8",
                "--requests",
                "4",
                "--repeats",
                "2",
                "--warmup",
                "1",
                "--json",
                "--plot",
                str(tmp_path / "tune.png"),
            ]
        )
        == 0
    )
    _png(tmp_path / "tune.png")
    r = json.loads(capsys.readouterr().out)
    spec = yaml.safe_load((bundle / "trtllm/config.yaml").read_text())["speculative_config"]
    sched = {int(k): v for k, v in spec["draft_len_schedule"].items()}
    assert "max_concurrency" not in spec and spec["max_draft_len"] == r["max_draft_len"] == r["winners"]["1"]
    measured = {int(L): levels for L, levels in r["measured"].items()}
    assert sorted(measured) == [0, 1, 3, 7]
    assert all(
        lv["repeats"] == 2 and len(lv["spread"]["output_tokens_per_second"]["values"]) == 2
        for levels in measured.values()
        for lv in levels
    )
    # the schedule is the decision on what was measured (beyond noise; no zero on this release), read back
    assert {str(c): L for c, L in T.winners(measured, shortest=1).items()} == r["winners"]
    drafted = [trtllm_draft_len(sched, b) for b in range(1, 5)]
    assert drafted == sorted(drafted, reverse=True) and min(drafted) >= 1 and max(sched) >= 4
    assert sched[min(sched)] == spec["max_draft_len"]
    for c in (1, 2, 4):
        assert trtllm_draft_len(sched, c) == r["winners"][str(c)]
    # atomically: the previous config and manifest kept beside them, nothing half-written left
    for rel in (ingest.Layout.TRTLLM_CONFIG, ingest.Layout.MANIFEST):
        assert (bundle / f"{rel}.prev").read_bytes() == before[Path(rel)]
    assert not [p for p in bundle.rglob(".*tune-*")]
    plan = json.loads((bundle / "manifest.json").read_text())["plan"]
    assert {int(k): v for k, v in plan["draft_len_schedule"].items()} == sched
    assert plan["max_draft_len"] == spec["max_draft_len"] and plan["tuned"]["winners"] == r["winners"]
    check_trtllm_bundle(bundle)  # still a bundle TensorRT-LLM's schema accepts
    assert ingest.check_files(ingest.open_bundle(bundle)) == []  # and every file as the manifest records


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

    def progress(L, c):  # the user presses Ctrl-C once the first level is measured
        seen.append((L, c))
        os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        T.measure_embedded(t, [0, 3], [1, 2], requests=2, max_tokens=4, prompts=None, progress=progress)
    assert seen == [(0, 1)]
    assert _files(bundle) == before


def test_commit_holds_ctrl_c_until_every_file_is_in_place(tmp_path, monkeypatch):
    from dflash_trt.deploy import swap

    root = tmp_path / "bundle"
    root.mkdir()
    a, b = root / "a.yaml", root / "b.json"
    a.write_text("old a")
    b.write_text("old b")

    def interrupt(step):  # Ctrl-C between the two files coming in
        if step == "moved in a.yaml":
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(swap, "_step", interrupt)
    with pytest.raises(KeyboardInterrupt):
        T.commit(root, {a: "new a", b: "new b"})
    assert (a.read_text(), b.read_text()) == ("new a", "new b")
    assert ((root / "a.yaml.prev").read_text(), (root / "b.json.prev").read_text()) == ("old a", "old b")
    assert sorted(p.name for p in root.iterdir()) == ["a.yaml", "a.yaml.prev", "b.json", "b.json.prev"]
    assert [p.name for p in tmp_path.iterdir()] == ["bundle"]  # no partial left beside it


def test_tune_endpoint_measures_and_refits_without_writing(bundle, capsys):
    from dflash_trt.runtime import load_bundle
    from dflash_trt.serve import ServerThread, create_app

    before = _files(bundle)
    app = create_app(load_bundle(bundle), "tiny", max_batch=4)
    with ServerThread(app) as srv:
        assert (
            run(
                [
                    "tune",
                    str(bundle),
                    "--endpoint",
                    srv.url,
                    "--concurrency",
                    "1,2",
                    "--max-tokens",
                    "8",
                    "--requests",
                    "4",
                    "--json",
                ]
            )
            == 0
        )
        r = json.loads(capsys.readouterr().out)
        # bench --plot with the bundle: its plan's predicted curves beside the measured ones
        png = bundle.parent / "bench.png"
        assert (
            run(
                [
                    "bench",
                    str(bundle),
                    "--endpoint",
                    srv.url,
                    "--concurrency",
                    "1,2",
                    "--max-tokens",
                    "4",
                    "--requests",
                    "2",
                    "--plot",
                    str(png),
                ]
            )
            == 0
        )
        _png(png)
        capsys.readouterr()
    assert [lv["concurrency"] for lv in r["endpoint"]["levels"]] == [1, 2]
    assert r["calibration"]["source"].startswith("tune of tiny") and len(r["predicted_vs_measured"]) == 2
    assert _files(bundle) == before


def test_tune_never_writes_a_zero_on_a_release_without_the_floor(bundle):
    t = T.read(bundle)
    assert T.shortest_length(t) == 1  # every release in the table lacks PR #16888's floor
    assert T.lengths_for({1: 7, 4: 3, 8: 1}, 10) == [7, 3, 3, 3, 1, 1, 1, 1, 1, 1]


def test_tune_endpoint_records_which_arm_won(bundle, capsys):
    """--mtp-endpoint: the three arms per concurrency, written into the manifest's plan.arms (the
    bundle still verifies); the same embedded server stands in for each arm."""
    from dflash_trt.runtime import load_bundle
    from dflash_trt.serve import ServerThread, create_app

    app = create_app(load_bundle(bundle), "tiny", max_batch=4)
    with ServerThread(app) as srv:
        assert (
            run(
                [
                    "tune",
                    str(bundle),
                    "--endpoint",
                    srv.url,
                    "--baseline",
                    srv.url,
                    "--mtp-endpoint",
                    srv.url,
                    "--concurrency",
                    "1",
                    "--max-tokens",
                    "4",
                    "--requests",
                    "2",
                    "--json",
                ]
            )
            == 0
        )
    r = json.loads(capsys.readouterr().out)
    assert r["arms_written"] and [a["concurrency"] for a in r["arms"]] == [1]
    arms = ingest.open_bundle(bundle).manifest.plan.arms
    assert [a.model_dump() for a in arms.measured] == r["arms"]
    assert arms.measured[0].leader in ("dflash", "mtp", "autoregressive")
    assert arms.measured[0].winner in ("dflash", "mtp", "autoregressive", "indistinguishable")
    check_trtllm_bundle(bundle)


# ---- issue 39: tune is an exclusive, crash-safe writer ----------------------------------------------------


class _Killed(BaseException):
    """Stands in for SIGKILL at one step of the swap (nothing in it catches a BaseException)."""


def _tuned_files(t: T.Tunable) -> dict:
    return T.arms_files(t, [{"concurrency": 1, "winner": "dflash"}], "test")


def test_tune_killed_at_any_step_of_its_write_leaves_old_or_new(bundle, tmp_path, monkeypatch):
    from dflash_trt.deploy import output, swap

    seen: list[str] = []
    fresh = shutil.copytree(bundle, tmp_path / "count")
    monkeypatch.setattr(swap, "_step", seen.append)
    T.commit(fresh, _tuned_files(T.read(fresh)))
    new = _files(fresh)
    assert seen and ingest.check_files(ingest.open_bundle(fresh)) == []
    for i, step in enumerate(seen):
        b = shutil.copytree(bundle, tmp_path / str(i))
        old = _files(b)

        def kill(name, step=step):
            if name == step:
                raise _Killed(name)

        monkeypatch.setattr(swap, "_step", kill)
        with pytest.raises(_Killed):
            T.commit(b, _tuned_files(T.read(b)))
        monkeypatch.setattr(swap, "_step", lambda name: None)
        assert output.recover(b)  # said, in one sentence
        now, man = _files(b), Path(ingest.Layout.MANIFEST)
        if now != old:  # else the new files, every one: the arms recorded, the previous manifest kept as .prev
            assert set(now) == set(new) and "arms" in json.loads(now[man])["plan"], step
            assert now[Path(f"{man}.prev")] == old[man], step
        assert ingest.check_files(ingest.open_bundle(b)) == [], step
        assert sorted(p.name for p in b.parent.iterdir() if p.name.startswith(f".{b.name}")) == [], step


def test_tune_holds_the_lock_from_its_first_measurement_to_its_last_write(bundle, monkeypatch, capsys):
    real, refused = T.measure_embedded, []

    def measure(*a, **k):  # a build --force of the same bundle while tune measures
        refused.append(run(["build", "-o", str(bundle), "--force"]))
        refused.append(capsys.readouterr().err)
        return real(*a, **k)

    monkeypatch.setattr(T, "measure_embedded", measure)
    assert (
        run(
            [
                "tune",
                str(bundle),
                "--concurrency",
                "1",
                "--draft-lens",
                "1",
                "--max-tokens",
                "4",
                "--requests",
                "1",
                "--json",
            ]
        )
        == 0
    )
    assert refused[0] == 2 and "another dflash-trt writer holds it" in refused[1] and "tune" in refused[1]
    assert ingest.check_files(ingest.open_bundle(bundle)) == []
