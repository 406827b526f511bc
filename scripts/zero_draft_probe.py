"""Repeat ``verify``'s zero-draft probe (``dflash_trt.bench.verify_trap``) five times against each of
three servers of the tiny bundle and print the rows ``bench/results/*-zero-draft-probe.json`` records:
the trtllm-serve stand-in that walks into the trap (``tests/bench/trap_standin.py``), the same with
the floor, and the embedded server with a schedule that stops drafting above 2 live rows.

    dflash-trt build tiny -o /tmp/tiny && PYTHONPATH=. python scripts/zero_draft_probe.py /tmp/tiny
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys

import yaml

from dflash_trt import ingest
from dflash_trt.bench import verify_trap
from dflash_trt.runtime import load_bundle
from dflash_trt.serve.app import ServerThread, create_app
from tests.bench.trap_standin import TrapStandIn
from tests.bench.trtllm_standin import create_app as standin_app

REPEATS = 5


def main(bundle: str) -> None:
    b = ingest.open_bundle(bundle)
    cfg, plan = yaml.safe_load(b.trtllm_config.read_text()), b.manifest.plan
    lines = [json.loads(line) for line in open("dflash_trt/assets/verify/prompts.jsonl")]
    prompts = [row["prompt"] for row in lines if "prompt" in row][:4]
    servers = {
        "trap stand-in (no floor, stops drafting above 2 in flight)": lambda: standin_app(TrapStandIn(bundle, top=2)),
        "fixed stand-in (floor 1)": lambda: standin_app(TrapStandIn(bundle, top=2, floor=1)),
        "embedded server (schedule {2: 7}, max_batch 4)": lambda: create_app(
            dataclasses.replace(load_bundle(bundle), draft_len_schedule={2: 7}), "tiny", max_batch=4
        ),
    }
    rows = []
    for name, make in servers.items():
        checks = []
        for _ in range(REPEATS):
            with ServerThread(make()) as srv:
                checks.append(verify_trap.probe(srv.url, plan, cfg, prompts=prompts, max_tokens=16))
        lows = [c["details"]["low_acceptance_length"] for c in checks]
        rows.append(
            {
                "server": name,
                "repeats": REPEATS,
                "statuses": [c["status"] for c in checks],
                "low_phase_tau": lows,
                "low_phase_tau_median": statistics.median(lows),
                "low_phase_tau_min": min(lows),
                "low_phase_tau_max": max(lows),
                "expected_tau": checks[0]["details"]["expected_acceptance_length"],
            }
        )
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main(sys.argv[1])
