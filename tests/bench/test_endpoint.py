"""bench --endpoint against the embedded server (DFlash vs autoregressive), and the /metrics parsers."""

from __future__ import annotations

import json

import pytest

from dflash_trt.bench.endpoint import compare, parse_spec_metrics, tau_between
from dflash_trt.cli import run
from dflash_trt.runtime.pair import load_bundle
from dflash_trt.serve.app import ServerThread, create_app


@pytest.fixture(scope="module")
def servers(bundle_dir):
    pair = load_bundle(bundle_dir)
    dflash = create_app(pair, "tiny", max_batch=8)
    ar = create_app(pair, "tiny-ar", max_batch=8, block_size=1)  # the same target without drafting
    with ServerThread(dflash) as a, ServerThread(ar) as b:
        yield a, b


def test_bench_endpoint_with_baseline_and_plot(servers, tmp_path, capsys):
    dflash, ar = servers
    png = tmp_path / "speed.png"
    code = run(
        [
            "bench",
            "--endpoint",
            dflash.url + "/v1",
            "--baseline",
            ar.url,
            "--concurrency",
            "1,4",
            "--max-tokens",
            "12",
            "--requests",
            "6",
            "--repeats",
            "2",
            "--warmup",
            "1",
            "--ignore-eos",
            "--json",
            "--plot",
            str(png),
        ]
    )
    assert code == 0
    r = json.loads(capsys.readouterr().out)
    assert r["endpoint"]["model"] == "tiny" and r["baseline"]["model"] == "tiny-ar"
    for side in ("endpoint", "baseline"):
        levels = r[side]["levels"]
        assert [lv["concurrency"] for lv in levels] == [1, 4]
        for lv in levels:
            assert lv["ok"] == lv["requests"] == 2 * 6 and lv["failed"] == 0 and lv["repeats"] == 2
            assert lv["output_tokens"] == 2 * 6 * 12  # usage from the server, ignore_eos honoured
            assert lv["tokens_from"] == ["usage spread over chunks by text"]  # the embedded server's final usage
            assert lv["output_tokens_per_second"] > 0 and lv["tokens_per_second_per_user"] > 0
            for key in ("ttft_ms", "tpot_ms", "itl_ms", "itl_per_token_ms", "e2el_ms"):
                assert 0 < lv[key]["median"] <= lv[key]["p90"] <= lv[key]["p99"], key
            iv = lv["spread"]["output_tokens_per_second"]
            assert len(iv["values"]) == 2 and iv["min"] <= lv["output_tokens_per_second"] <= iv["max"]
    # τ comes from the servers' /metrics: ≥ 1 with a drafter, exactly 1 without one.
    assert all(lv["acceptance_length"] >= 1.0 for lv in r["endpoint"]["levels"])
    assert all(lv["acceptance_length"] == 1.0 for lv in r["baseline"]["levels"])
    assert [row["concurrency"] for row in r["comparison"]["speedup"]] == [1, 4]
    for row, a, b in zip(r["comparison"]["speedup"], r["endpoint"]["levels"], r["baseline"]["levels"], strict=True):
        assert row["speedup"] == pytest.approx(a["output_tokens_per_second"] / b["output_tokens_per_second"], rel=1e-3)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image as mpimg

    img = mpimg.imread(png)
    assert img.shape[0] > 100 and img.shape[1] > 100


def test_bench_endpoint_table_output(servers, capsys):
    dflash, _ = servers
    assert run(["bench", "--endpoint", dflash.url, "--concurrency", "2", "--max-tokens", "4", "--requests", "2"]) == 0
    out = capsys.readouterr().out
    assert "tok/s" in out and "TTFT" in out and "τ" in out


def test_bench_endpoint_errors_are_one_line(tmp_path, capsys):
    assert run(["bench", "--endpoint", "http://127.0.0.1:9", "--concurrency", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot reach" in err
    assert run(["bench", "--endpoint", "http://127.0.0.1:9", "--concurrency", "1,x"]) == 2
    assert "--concurrency" in capsys.readouterr().err


def test_tau_from_trtllm_serve_iteration_stats():
    # trtllm-serve /metrics (PyTorch backend, enable_iter_perf_stats): the rows since the last scrape.
    rows = [
        {
            "iter": 7,
            "iterLatencyMS": 12.0,
            "specDecodingStats": {
                "numDraftTokens": 30,
                "numAcceptedTokens": 12,
                "numRequestsWithDraftTokens": 2,
                "acceptanceLength": 7.0,
            },
        },
        {
            "iter": 8,
            "iterLatencyMS": 11.0,
            "specDecodingStats": {
                "numDraftTokens": 30,
                "numAcceptedTokens": 6,
                "numRequestsWithDraftTokens": 2,
                "acceptanceLength": 4.0,
            },
        },
        {
            "iter": 9,
            "attentionDpRank": 1,
            "specDecodingStats": {"numAcceptedTokens": 99, "numRequestsWithDraftTokens": 1},
        },
        {"iter": 10, "iterLatencyMS": 3.0},
    ]
    after = parse_spec_metrics(json.dumps(rows))
    assert tau_between(None, after) == pytest.approx((12 + 6 + 4) / 4)
    assert parse_spec_metrics(json.dumps([{"iter": 1, "gpuMemUsage": 5}])) is None


def test_tau_from_prometheus_counters():
    before = parse_spec_metrics(
        'vllm:spec_decode_num_drafts_total{model_name="m"} 10\n'
        'vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 25\n'
    )
    after = parse_spec_metrics(
        '# HELP x\nvllm:spec_decode_num_drafts_total{model_name="m"} 30\n'
        'vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 85\n'
    )
    assert tau_between(before, after) == pytest.approx(1 + 60 / 20)
    d0 = parse_spec_metrics("dflash_spec_rounds_total 10.0\ndflash_spec_committed_tokens_total 30.0\n")
    d1 = parse_spec_metrics("dflash_spec_rounds_total 20.0\ndflash_spec_committed_tokens_total 55.0\n")
    assert tau_between(d0, d1) == 2.5
    assert tau_between(None, parse_spec_metrics('sglang:spec_accept_length{x="y"} 3.5\n')) == 3.5
    assert parse_spec_metrics("process_cpu_seconds_total 1.0\n") is None


def _levels(tps: dict[int, list[float]]) -> dict:
    """Levels with repeats: the figure is the mean, the spread the repeats' interval."""
    from dflash_trt.bench.spread import interval

    return {
        "levels": [
            {
                "concurrency": c,
                "output_tokens_per_second": sum(v) / len(v),
                "spread": {"output_tokens_per_second": interval(v)},
            }
            for c, v in tps.items()
        ]
    }


def test_where_drafting_stops_paying_is_said_only_beyond_noise():
    # the run: one noisy level read as "stops paying at 4" while 32 read 1.56x
    dflash = _levels({1: [300, 310, 305], 4: [500, 700, 610], 32: [800, 810, 805]})
    base = _levels({1: [100, 104, 102], 4: [560, 640, 600], 32: [1000, 1010, 1005]})
    c = compare(dflash, base)
    assert [r["verdict"] for r in c["speedup"]] == ["pays", "indistinguishable", "does not pay"]
    assert c["stops_paying_at"] == 32
    row = c["speedup"][1]
    assert row["interval"]["min"] < 1 < row["interval"]["max"]
    assert row["interval"]["min"] <= row["speedup"] <= row["interval"]["max"]
    # measured once, nothing is beyond noise
    once = compare(_levels({1: [300]}), _levels({1: [100]}))
    assert once["speedup"][0]["verdict"] == "indistinguishable" and once["stops_paying_at"] is None


def test_a_plot_the_filesystem_refuses_keeps_the_results(servers, tmp_path, capsys, monkeypatch):
    """Issue 27: the results are saved before the figure; a refused plot is one line, exit 2."""
    import errno

    import matplotlib.figure

    def full(self, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", full)
    png = tmp_path / "speed.png"
    argv = [
        "bench",
        "--endpoint",
        servers[0].url,
        "--concurrency",
        "1",
        "--max-tokens",
        "4",
        "--requests",
        "2",
        "--json",
        "--plot",
    ]
    assert run([*argv, str(png)]) == 2
    cap = capsys.readouterr()
    errors = [line for line in cap.err.splitlines() if not line.startswith("benchmarking")]  # progress lines aside
    assert len(errors) == 1 and "No space left" in errors[0] and "Traceback" not in cap.err
    printed = json.loads(cap.out)
    saved = json.loads(png.with_suffix(".json").read_text())
    assert saved["endpoint"]["levels"] == printed["endpoint"]["levels"] and printed["plot"] is None
    # nowhere to write at all: the results are still printed
    assert run([*argv, str(tmp_path / "missing" / "speed.png")]) == 2
    cap = capsys.readouterr()
    assert json.loads(cap.out)["endpoint"]["levels"]
    assert len([line for line in cap.err.splitlines() if not line.startswith("benchmarking")]) == 1


def test_prompt_categories_give_tau_and_speedup_per_category(servers, capsys):
    from dflash_trt.bench.verify import PROMPTS as CATEGORIZED  # code, math, prose and chat prompts ("kind")

    dflash, ar = servers
    assert (
        run(
            [
                "bench",
                "--endpoint",
                dflash.url,
                "--baseline",
                ar.url,
                "--prompts",
                str(CATEGORIZED),
                "--concurrency",
                "2",
                "--max-tokens",
                "6",
                "--requests",
                "12",
                "--repeats",
                "1",
                "--warmup",
                "0",
                "--ignore-eos",
                "--json",
            ]
        )
        == 0
    )
    r = json.loads(capsys.readouterr().out)
    cats = r["endpoint"]["levels"][0]["categories"]
    assert set(cats) == {"code", "math", "prose", "chat"} and all(c["requests"] == 3 for c in cats.values())
    assert all(c["acceptance_length"] >= 1.0 for c in cats.values())  # the server's τ per request
    row = r["comparison"]["speedup"][0]
    assert set(row["category_speedup"]) == set(cats) and all(v > 0 for v in row["category_speedup"].values())
    recs = r["endpoint"]["levels"][0]["records"]
    assert sorted({x["category"] for x in recs}) == sorted(cats)
