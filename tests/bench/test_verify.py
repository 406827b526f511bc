"""dflash-trt verify: bundles checked offline, and deployments measured against their plans.

The deployments are real: bundles written by ``dflash-trt build`` from the embedded tiny pair,
served by the embedded server or by a stand-in speaking trtllm-serve's contract
(``tests/bench/trtllm_standin.py``). Those built wrong are built wrong (a drafter not trained for
the target, a server whose verify step samples, a server using more memory than planned), never
edited afterwards, and each is caught by a measurement and named in the report. (A drafter whose
layer ids are off by one is not a collapse on the tiny pair: τ 3.2-3.3 against 3.6 on six of the
prompts; its drafter leans little on the target's hidden states.)
"""

from __future__ import annotations

import json
import shutil

import pytest

from dflash_trt import ingest
from dflash_trt.bench import verify as V
from dflash_trt.bench import verify_lossless as VL
from dflash_trt.cli import run
from dflash_trt.plan.calibrate import read_bench
from dflash_trt.runtime import load_bundle
from dflash_trt.serve.app import ServerThread, create_app
from tests.bench.trtllm_standin import StandIn
from tests.bench.trtllm_standin import create_app as standin_app

FAST = ["--max-tokens", "24", "--concurrency", "1,3", "--requests", "3"]
ONE_LEVEL = ["--max-tokens", "24", "--concurrency", "2", "--requests", "2"]


@pytest.fixture(scope="module")
def four_prompts(tmp_path_factory):
    """One prompt of each kind from the shipped set (the tests that are not about the set itself)."""
    rows, kinds = [], set()
    for line in V.PROMPTS.read_text().splitlines():
        if json.loads(line)["kind"] not in kinds:
            kinds.add(json.loads(line)["kind"])
            rows.append(line)
    path = tmp_path_factory.mktemp("prompts") / "four.jsonl"
    path.write_text("\n".join(rows) + "\n")
    return path


def _build(out, *extra) -> object:
    assert run(["build", "tiny", "-o", str(out), *extra]) == 0
    return out


def _drafter_with(tmp, edit):
    """The tiny drafter as a user would get it wrong before building: its config edited."""
    d = shutil.copytree(ingest.embedded_dir("tiny") / "drafter", tmp / "drafter")
    cfg = json.loads((d / "config.json").read_text())
    edit(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("good") / "tiny")


@pytest.fixture(scope="module")
def other_drafter(tmp_path_factory):
    """Built with a drafter of the right shapes that was not trained for this target (here: untrained)."""
    import torch
    from safetensors.torch import load_file, save_file

    tmp = tmp_path_factory.mktemp("other")
    d = _drafter_with(tmp, lambda cfg: None)
    torch.manual_seed(0)
    state = {
        k: (torch.randn_like(v.float()) * 0.05).to(v.dtype) if v.dim() > 1 else v
        for k, v in load_file(d / "model.safetensors").items()
    }
    save_file(state, d / "model.safetensors")
    return _build(tmp / "tiny", "--drafter", str(d))


def _verify(capsys, *argv) -> tuple[int, dict]:
    code = run(["verify", *map(str, argv), "--json"])
    return code, json.loads(capsys.readouterr().out)


def _by_name(report: dict) -> dict:
    return {c["name"]: c for c in report["checks"]}


# ---- offline --------------------------------------------------------------------------------
def test_offline_holds_for_a_built_bundle_and_names_what_changed(good, tmp_path, capsys):
    code, r = _verify(capsys, good)
    assert code == 0 and r["ok"] and [c["status"] for c in r["checks"]] == ["pass", "pass", "pass"]
    b = shutil.copytree(good, tmp_path / "b")
    cfg = b / "trtllm" / "config.yaml"
    cfg.write_text(cfg.read_text().replace("max_draft_len: 7", "max_draft_len: 5"))
    code, r = _verify(capsys, b)
    checks = _by_name(r)
    assert code == 1 and r["failed"] == ["files", "config"]
    assert checks["files"]["summary"] == "trtllm/config.yaml: sha256 differs from the manifest's"
    assert "speculative_config.max_draft_len is 5, the plan says 7" in checks["config"]["details"]["problems"]
    run(["verify", str(b)])
    assert "2 check(s) failed: files, config" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--endpoint", "http://127.0.0.1:9"], "cannot reach http://127.0.0.1:9"),
        (
            ["--endpoint", "http://127.0.0.1:9", "--prompts", "/nonexistent.jsonl"],
            "--prompts /nonexistent.jsonl: cannot read",
        ),
        (["--baseline", "http://127.0.0.1:9"], "go with --endpoint URL"),
        (["--endpoint", "http://127.0.0.1:9", "--concurrency", "0"], "--concurrency needs positive integers"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(good, argv, needle, capsys):
    assert run(["verify", str(good), "--no-reference", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and "Traceback" not in err


def test_an_older_bundle_is_told_to_rebuild_in_one_line(good, tmp_path, capsys):
    b = shutil.copytree(good, tmp_path / "b")
    m = json.loads((b / "manifest.json").read_text())
    m["format"] = "dflash-trt-bundle/2"
    del m["files"]
    (b / "manifest.json").write_text(json.dumps(m))
    assert run(["verify", str(b)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no per-file hashes" in err and "rebuild the bundle" in err


# ---- the embedded server --------------------------------------------------------------------
def _embedded(bundle):
    return ServerThread(create_app(load_bundle(bundle), "tiny", max_batch=4))


def test_a_good_deployment_passes_and_its_report_calibrates_the_plan(good, tmp_path, capsys):
    with _embedded(good) as srv:
        code, r = _verify(capsys, good, "--endpoint", srv.url, "--report", tmp_path / "v.json", *FAST)
    checks = _by_name(r)
    assert code == 0, r["failed"]
    assert {k: c["status"] for k, c in checks.items()} == {
        "files": "pass",
        "manifest": "pass",
        "config": "pass",
        "lossless": "pass",
        "acceptance": "pass",
        "schedule": "pass",
        "memory": "not measured",
        "trap": "pass",
    }
    lossless = checks["lossless"]["details"]["prompts"]
    assert {p["kind"] for p in lossless} == {"code", "math", "prose", "chat"} and all(p["agree"] for p in lossless)
    acc = checks["acceptance"]["details"]
    assert acc["acceptance_length"] > 2 and len(acc["per_position_acceptance"]) == 7
    assert len(acc["expected_per_position_acceptance"]) == 7
    assert acc["per_position_acceptance"] == sorted(acc["per_position_acceptance"], reverse=True)  # prefix acceptance
    assert {(row["batch_size"], row["draft_len"]) for row in checks["schedule"]["details"]["rows"]} >= {(1, 7)}
    assert r["stack"] == "reference"  # the embedded server runs the reference runtime
    # the report is a bench report: plan --calibration reads its levels, with the draft length measured
    data = read_bench(tmp_path / "v.json")
    assert [lv["concurrency"] for lv in data["endpoint"]["levels"]] == [1, 3]
    assert all(lv["draft_len"] == 7 and lv["acceptance_length"] > 2 for lv in data["endpoint"]["levels"])
    assert run(["plan", "tiny", "--calibration", str(tmp_path / "v.json")]) == 0
    assert "your measurements: v.json" in capsys.readouterr().out


def test_a_drafter_for_another_target_collapses_acceptance(other_drafter, four_prompts, capsys):
    assert run(["verify", str(other_drafter)]) == 0  # self-consistent: every offline check holds
    capsys.readouterr()
    with _embedded(other_drafter) as srv:
        code, r = _verify(capsys, other_drafter, "--endpoint", srv.url, "--prompts", four_prompts, *FAST)
    acc = _by_name(r)["acceptance"]
    assert code == 1 and r["failed"] == ["acceptance"]  # still lossless: only acceptance falls
    assert _by_name(r)["trap"]["status"] == "not measured"  # not blamed on the trap
    assert acc["details"]["acceptance_length"] < 1.5 < acc["details"]["expected_acceptance_length"]
    assert acc["summary"].startswith("acceptance collapsed") and "another target" in acc["summary"]
    assert "layer-id convention" in acc["summary"] and "[1, 7, 13]" in acc["details"]["likely_causes"][0]


# ---- the trtllm-serve stand-in --------------------------------------------------------------
def _standin(bundle, **kw):
    return ServerThread(standin_app(StandIn(bundle, **kw)))


def test_a_speculating_server_that_diverges_is_named_with_position_and_margin(good, four_prompts, capsys):
    with _standin(good, argmax=False) as srv, _standin(good, speculative=False, name="baseline") as base:
        code, r = _verify(
            capsys, good, "--endpoint", srv.url, "--baseline", base.url, "--prompts", four_prompts, *ONE_LEVEL
        )
    checks = _by_name(r)
    assert code == 1 and "lossless" in r["failed"]
    bugs = [p for p in checks["lossless"]["details"]["prompts"] if p.get("verdict") == "bug"]
    assert bugs and all(p["margin"] >= VL.NEAR_TIE and p["margin_source"] == "baseline logprobs" for p in bugs)
    assert all(p["endpoint_token"] != p["baseline_token"] for p in bugs)
    summary = checks["lossless"]["summary"]
    assert f"at token {bugs[0]['position']}" in summary and "a bug" in summary
    # what the stand-in reports through trtllm-serve's iteration stats is read
    assert r["stack"] == "trtllm" and checks["memory"]["status"] == "pass" and checks["schedule"]["status"] == "pass"
    assert checks["acceptance"]["details"]["source"] == "trtllm server metrics"  # sampled drafts: τ falls too


@pytest.mark.slow
def test_a_good_trtllm_deployment_passes_with_acceptance_files(good, tmp_path, capsys):
    stats = tmp_path / "accept"
    with _standin(good, accept_stats_dir=stats) as srv, _standin(good, speculative=False, name="b") as base:
        code, r = _verify(capsys, good, "--endpoint", srv.url, "--baseline", base.url, "--accept-stats", stats, *FAST)
    checks = _by_name(r)
    assert code == 0, r["failed"]
    acc = checks["acceptance"]["details"]
    assert acc["source"] == "acceptance files" and len(acc["per_position_acceptance"]) == 7
    assert acc["acceptance_length"] == pytest.approx(r["endpoint"]["levels"][0]["acceptance_length"], rel=0.5)
    assert checks["memory"]["status"] == "pass" and checks["memory"]["details"]["gpu_memory"] > 0


@pytest.mark.slow
def test_trtllm_acceptance_files_show_the_collapse_per_position(other_drafter, tmp_path, capsys):
    stats = tmp_path / "accept"
    with _standin(other_drafter, accept_stats_dir=stats) as srv, _standin(other_drafter, speculative=False) as base:
        code, r = _verify(
            capsys, other_drafter, "--endpoint", srv.url, "--baseline", base.url, "--accept-stats", stats, *FAST
        )
    acc = _by_name(r)["acceptance"]
    assert code == 1 and r["failed"] == ["acceptance"] and acc["details"]["source"] == "acceptance files"
    assert acc["details"]["per_position_acceptance"][0] < 0.3


@pytest.mark.slow
def test_a_server_using_more_memory_than_planned_is_named(good, capsys):
    """A deployment whose GPU memory in use exceeds the plan's (e.g. a draft KV cache the plan did not count)."""
    with _standin(good, gpu_memory=1 << 40) as srv, _standin(good, speculative=False, name="b") as base:
        code, r = _verify(capsys, good, "--endpoint", srv.url, "--baseline", base.url, *FAST)
    assert code == 1 and r["failed"] == ["memory"] and "under-counts" in _by_name(r)["memory"]["summary"]


# ---- the measurements' rules, on their own ---------------------------------------------------
def test_first_divergence_and_margins():
    assert VL.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert VL.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert VL.first_divergence([1, 2], [1, 2, 3]) == 2
    assert VL.margins({"top_logprobs": [{"a": -0.1, "b": -2.1}, {"a": -0.5}]}) == [2.0, None]


def test_a_near_tie_is_numerics_a_clear_margin_a_bug():
    class Tok:
        eos_token_id = None

    p = VL.Prompt("code", "x", [1, 2])
    a = VL.Answer([5, 6, 7], None, "", [3.0, 0.1, 3.0])
    tie = VL.compare(p, a, VL.Answer([5, 9, 7], None, "", [3.0, 0.1, 3.0]), Tok(), None)
    assert tie["verdict"] == "numerics" and tie["position"] == 1 and tie["margin"] == 0.1
    bug = VL.compare(p, a, VL.Answer([5, 6, 9], None, "", [3.0, 0.1, 3.0]), Tok(), None)
    assert bug["verdict"] == "bug" and bug["position"] == 2
    unknown = VL.compare(p, VL.Answer([5, 6], None, "", None), VL.Answer([8], None, "", None), Tok(), None)
    assert unknown["verdict"] == "not measured" and unknown["position"] == 0
    # token strings one side (trtllm-serve's logprobs), ids the other (the reference runtime): texts compared
    same = VL.compare(p, VL.Answer(None, ["a", "bc"], "abc"), VL.Answer([5, 6], None, "abc"), Tok(), None)
    assert same["agree"] and same["tokens"] == 2


def test_schedule_and_memory_rules():
    from dflash_trt import deploy
    from dflash_trt import plan as P
    from dflash_trt.bench.verify_server import Window

    tiny = deploy.plan_resolved(deploy.resolve_recipe(P.load_recipe("tiny", [])))  # a real plan, its rows then set
    runs = [ingest.DraftRun(batch_from=a, batch_to=b, draft_len=n) for a, b, n in ((1, 2, 7), (3, 4, 3))]
    plan = tiny.model_copy(update={"max_draft_len": 7, "draft_lengths": runs})
    ok = Window("trtllm", draft_rounds={(1, 7): 5, (4, 3): 2})
    assert V.check_served_schedule([{"concurrency": 4}], [ok], plan)["status"] == "pass"
    bad = V.check_served_schedule([{"concurrency": 4}], [Window("trtllm", draft_rounds={(4, 7): 2})], plan)
    assert bad["status"] == "fail" and "drafts 7 tokens with 4 live rows; the plan says 3" in bad["summary"]
    assert V.check_served_schedule([{"concurrency": 1}], [Window()], plan)["status"] == "not measured"
    mem = tiny.model_copy(
        update={
            "memory": ingest.PlanMemory(
                weights=20 << 30,
                drafter=0,
                drafter_arena=0,
                kv_cache=10 << 30,
                activations=0,
                reserve=0,
                capacity=80 << 30,
                total=30 << 30,
                fits=True,
                missing=0,
            )
        }
    )
    cfg = {"kv_cache_config": {"free_gpu_memory_fraction": 0.5}}
    # rest 20 GiB + a pool of half of the 60 GiB free = 50 GiB expected
    assert V.check_memory(Window(gpu_memory=52 << 30), mem, cfg)["status"] == "pass"
    assert V.check_memory(Window(gpu_memory=60 << 30), mem, cfg)["status"] == "fail"
    assert V.check_memory(Window(), mem, cfg)["status"] == "not measured"


def test_trtllm_iterations_that_draft_nothing_count_as_draft_length_0():
    """trtllm-serve's iteration rows (``py_executor.py::_update_iter_stats``): a speculating server's
    iteration whose generation requests drafted nothing reports ``specDecodingStats`` with every
    count 0; those rows ran at draft length 0 (the zero-draft trap's signature), so the served
    schedule names them instead of leaving that batch size unseen."""
    from dflash_trt import deploy
    from dflash_trt import plan as P
    from dflash_trt.bench import verify_server

    def row(gen: int, spec: dict | None) -> dict:
        return {
            "attentionDpRank": 0,
            "inflightBatchingStats": {"numGenRequests": gen},
            **({"specDecodingStats": spec} if spec is not None else {}),
        }

    zero = {"numDraftTokens": 0, "numAcceptedTokens": 0, "numRequestsWithDraftTokens": 0}
    rows = [
        row(2, {"numDraftTokens": 14, "numAcceptedTokens": 6, "numRequestsWithDraftTokens": 2}),  # 2 rows at 7
        row(9, zero),  # 9 live rows, drafting off
        row(0, zero),  # a context-only iteration: no generation step
        row(3, None),  # speculation not configured: not a round of this server's
    ]
    w = verify_server.window("[]", json.dumps(rows))
    assert dict(w.draft_rounds) == {(2, 7): 2, (9, 0): 9}
    assert (w.rounds, w.committed) == (11, 2 + 6 + 9)
    tiny = deploy.plan_resolved(deploy.resolve_recipe(P.load_recipe("tiny", [])))
    plan = tiny.model_copy(
        update={"max_draft_len": 7, "draft_lengths": [ingest.DraftRun(batch_from=1, batch_to=16, draft_len=7)]}
    )
    served = V.check_served_schedule([{"concurrency": 9}], [w], plan)
    assert served["status"] == "fail" and "drafts 0 tokens with 9 live rows; the plan says 7" in served["summary"]


# ---- the zero-draft trap ----------------------------------------------------------------------
TRAP_ARGS = ["--max-tokens", "16", "--concurrency", "1", "--requests", "2"]


def test_the_trap_probe_names_a_server_that_walks_into_the_zero_draft_trap(good, four_prompts, capsys):
    """A stand-in that stops drafting above 2 requests in flight (a release without the floor) and
    whose requests that lived through it draft from unwritten context rows afterwards."""
    from tests.bench.trap_standin import TrapStandIn

    standin = TrapStandIn(good, top=2)
    with ServerThread(standin_app(standin)) as srv:
        code, r = _verify(capsys, good, "--endpoint", srv.url, "--prompts", four_prompts, *TRAP_ARGS)
    trap = _by_name(r)["trap"]
    assert code == 1 and "trap" in r["failed"], trap
    assert trap["status"] == "fail" and "zero-draft trap" in trap["summary"] and "PR #16888" in trap["summary"]
    d = trap["details"]
    assert d["load_concurrency"] == 9 and standin.zero_steps > 0  # it stopped drafting under the load
    assert d["low_acceptance_length"] - 1 < 0.5 * (d["expected_acceptance_length"] - 1)
    assert _by_name(r)["lossless"]["status"] == "pass"  # output stays correct: only acceptance falls


def test_the_trap_probe_passes_the_fixed_release_and_the_embedded_server(good, four_prompts):
    """The same stand-in with the floor (PR #16888 merged), and the embedded server with a schedule that
    stops drafting above 2 live rows: it feeds the drafter every committed token, so it recovers. (The
    probe alone: the first test runs it through verify.)"""
    import dataclasses

    import yaml

    from dflash_trt.bench import verify_trap
    from tests.bench.trap_standin import TrapStandIn

    b = ingest.open_bundle(good)
    plan, config = b.manifest.plan, yaml.safe_load(b.trtllm_config.read_text())
    prompts = [
        json.loads(line)["prompt"] for line in four_prompts.read_text().splitlines() if "prompt" in json.loads(line)
    ]
    with ServerThread(standin_app(TrapStandIn(good, top=2, floor=1))) as srv:
        trap = verify_trap.probe(srv.url, plan, config, prompts=prompts, max_tokens=16)
    assert trap["status"] == "pass", trap
    pair = dataclasses.replace(load_bundle(good), draft_len_schedule={2: 7})
    with ServerThread(create_app(pair, "tiny", max_batch=4)) as srv:
        trap = verify_trap.probe(srv.url, plan, config, prompts=prompts, max_tokens=16)
    assert trap["status"] == "pass", trap
    assert any(k.endswith(":0") for k in trap["details"]["load_draft_rounds"])  # it did stop drafting


@pytest.mark.parametrize(
    "argv",
    [
        ["verify", "{b}", "--endpoint", "http://127.0.0.1:9"],
        ["bench", "{b}", "--endpoint", "http://127.0.0.1:9"],
        ["tune", "{b}"],
    ],
)
def test_a_config_with_the_speculation_gate_is_not_measured(good, tmp_path, argv, capsys):
    """acceptance_rate_threshold switches speculation off server-wide for good: no measurement run has it."""
    b = shutil.copytree(good, tmp_path / "b")
    cfg = b / "trtllm" / "config.yaml"
    gate = "speculative_config:\n  acceptance_rate_threshold: 0.3\n"
    cfg.write_text(cfg.read_text().replace("speculative_config:\n", gate))
    assert run([a.format(b=b) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "acceptance_rate_threshold is 0.3" in err and "permanently" in err
