"""Render ``bench/results/*.json`` into the performance page (``docs/reference/performance.md``).

Invariant: the page holds every result file and nothing else; each figure on it is a value of
one file's ``results``. A file has the top-level keys ``date``, ``machine``, ``commit``,
``command`` and ``results`` (file name ``YYYY-MM-DD-<topic>.json``), optionally ``title`` and
``notes``; any other top-level key is shown under the file's section. ``results`` may be a list
of flat objects (a table), an object (one line per key, nested objects dotted, lists of objects
as tables) or a scalar. Re-measuring adds a file: the newest of a topic comes first.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

REQUIRED = ("date", "machine", "commit", "command", "results")
NAME = re.compile(r"^(\d{4}-\d{2}-\d{2})-([\w.-]+)\.json$")


def cell(v: object) -> str:
    s = json.dumps(v, ensure_ascii=False) if isinstance(v, (dict, list)) else str(v)
    return re.sub(r"\s+", " ", s).replace("|", "\\|")


def table(rows: list[dict]) -> list[str]:
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    out = ["| " + " | ".join(cell(k) for k in keys) + " |", "|" + "---|" * len(keys)]
    out += ["| " + " | ".join(cell(r.get(k, "")) for k in keys) + " |" for r in rows]
    return out


def _is_table(v: object) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(r, dict) for r in v)


def results(v: object, prefix: str = "") -> list[str]:
    if _is_table(v):
        return table(v)  # type: ignore[arg-type]
    if isinstance(v, dict):
        lines: list[str] = []
        for k, x in v.items():
            if _is_table(x):
                lines += ["", f"*{prefix}{k}*", "", *table(x), ""]
            elif isinstance(x, dict):
                lines += results(x, f"{prefix}{k}.")
            else:
                lines.append(f"- `{prefix}{k}`: {cell(x)}")
        return lines
    return [f"- {cell(v)}"]


def load(path: Path) -> dict:
    data = json.loads(path.read_text())
    missing = [k for k in REQUIRED if k not in data]
    if missing or not NAME.match(path.name):
        raise ValueError(
            f"{path}: a result file needs the name YYYY-MM-DD-<topic>.json and the keys "
            f"{', '.join(REQUIRED)} (missing: {', '.join(missing) or 'none'})"
        )
    return data


def section(path: Path, data: dict) -> list[str]:
    topic = NAME.match(path.name).group(2)  # type: ignore[union-attr]
    title = data.get("title") or topic
    lines = [
        f"## {cell(title)} {{#{path.stem}}}",
        "",
        f"`{path.name}` · {cell(data['date'])} · commit `{cell(data['commit'])}` · {cell(data['machine'])}",
        "",
        f"```\n{data['command']}\n```",
        "",
    ]
    lines += results(data["results"])
    extra = {k: v for k, v in data.items() if k not in (*REQUIRED, "title", "notes")}
    if extra:
        lines += ["", *results(extra)]
    if data.get("notes"):
        lines += ["", cell(data["notes"])]
    return lines + [""]


def render(directory: Path) -> str:
    files = sorted(Path(directory).glob("*.json"), key=lambda p: (NAME.match(p.name) or p).__str__())
    by_topic: dict[str, list[Path]] = {}
    for f in files:
        m = NAME.match(f.name)
        by_topic.setdefault(m.group(2) if m else f.stem, []).append(f)
    lines = [
        "# Performance",
        "",
        "Every figure the documentation quotes, one section per file of `bench/results/` (newest first "
        "within a topic). A figure is re-measured by adding a file, never by editing this page: "
        "`python scripts/gen_docs.py` renders it. Each section names the machine it was measured on; "
        "the GPU figures the planner is calibrated on are published runs, each with its source "
        "(`dflash_trt/assets/perf/measurements.json`).",
        "",
    ]
    lines += ["| file | date | commit | title |", "|---|---|---|---|"]
    ordered = [f for topic in sorted(by_topic) for f in sorted(by_topic[topic], reverse=True)]
    loaded = {f: load(f) for f in ordered}
    lines += [
        f"| [{f.stem}](#{f.stem}) | {d['date']} | `{d['commit']}` | {cell(d.get('title', ''))} |"
        for f, d in loaded.items()
    ]
    lines.append("")
    for f, d in loaded.items():
        lines += section(f, d)
    return "\n".join(lines).rstrip() + "\n"
