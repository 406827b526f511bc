"""dflash-trt inspect: what a drafter or target checkpoint is, and (with --target) the pair verdict."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from dflash_trt import ingest, plan
from dflash_trt._cli.common import JsonOpt, out, print_json
from dflash_trt.errors import CompatibilityError


def _human_bytes(n: int | None) -> str:
    if not n:
        return "absent"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def _human_count(n: int | None) -> str:
    if n is None:
        return "unknown (weights absent)"
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.2f}{unit} ({n:,})"
    return str(n)


def _rows(info: dict) -> list[tuple[str, str]]:
    rows = [
        ("path", info["path"]),
        ("kind", info["kind"]),
        ("format", info["format"]),
        ("architecture", info["architecture"]),
    ]
    if info["kind"] == "drafter":
        ids = info["target_layer_ids"]
        rows += [
            ("block size", str(info["block_size"])),
            ("target layer ids (z-lab)", str(ids["zlab"])),
            ("target layer ids (output_hidden_states)", str(ids["output_hidden_states"])),
            ("published layer ids", f"{ids['published']} ({ids['published_convention']})"),
            ("mask token id", str(info["mask_token_id"])),
            ("trained target depth", str(info["num_target_layers"] or "not recorded")),
            ("layers x hidden", f"{info['layers']} x {info['hidden_size']}"),
            ("heads", f"{info['heads']} x {info['head_dim']} (kv {info['kv_heads']})"),
            (
                "vocabulary",
                str(info["vocab_size"])
                + (f" (draft head {info['draft_vocab_size']})" if info["draft_vocab_size"] else ""),
            ),
            (
                "attention",
                ", ".join(sorted(set(info["layer_types"] or ["full_attention"])))
                + (f", window {info['sliding_window']}" if info["sliding_window"] else "")
                + ("" if info["causal"] is None else f", causal={info['causal']}"),
            ),
        ]
    else:
        q = info["quantization"]
        rows += [
            ("layers x hidden", f"{info['layers']} x {info['hidden_size']}"),
            ("heads", f"{info['heads']} x {info['head_dim']} (kv {info['kv_heads']})"),
            ("vocabulary", f"{info['vocab_size']} (embedding rows: {info['embedding_rows'] or 'unknown'})"),
            (
                "quantization",
                "none"
                if not q
                else f"{q['quant_algo']} ({q['method']}, {q['source']})"
                + (f", KV cache {q['kv_cache_quant_algo']}" if q.get("kv_cache_quant_algo") else ""),
            ),
            ("tokenizer", ", ".join(info["tokenizer_files"]) or "absent"),
            (
                "hidden-state capture (TensorRT-LLM)",
                {True: "yes", False: "no"}.get(info["hidden_state_capture"], "not known"),
            ),
        ]
    rope = f"theta {info['rope_theta']:g}" if info["rope_theta"] else "?"
    if info["rope_scaling"]:
        rope += f", {info['rope_scaling'].get('rope_type', info['rope_scaling'].get('type'))}"
    rows += [
        ("rope", rope),
        ("parameters", _human_count(info["num_parameters"])),
        ("bytes on disk", _human_bytes(info["bytes_on_disk"])),
        ("dtype", str(info["dtype"])),
    ]
    return rows


def inspect(
    ref: Annotated[
        str,
        typer.Argument(
            metavar="PATH_OR_ID",
            help="Drafter or target: local directory, hub id (org/name or org/name@revision) "
            "or embedded:NAME (embedded:tiny/target, embedded:tiny/drafter).",
        ),
    ],
    target: Annotated[
        str | None,
        typer.Option("--target", "-t", help="Check the drafter against this target (also embedded:tiny/target)."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Describe a checkpoint (format, layer ids, mask id, sizes, quantization); with --target, the pair verdict."""
    report = None
    if target is not None:
        path = ingest.resolve(ref, role="drafter")
        tdir = ingest.resolve(target, role="target")
        report = ingest.validate_pair(tdir, path, require_weights=False, raise_on_error=False)
        _capture_check(report)
        info = report.drafter.to_dict()
        info["pair"] = {"target": str(tdir), **report.to_dict()}
    else:
        path = ingest.resolve(ref, role="checkpoint")
        if ingest.is_drafter(path):
            info = ingest.read_drafter(path, require_weights=False).to_dict()
        else:
            info = ingest.read_target(path, require_weights=False).to_dict()
            info["hidden_state_capture"] = _capture(info["architecture"])[0]
    if as_json:
        print_json(info)
    else:
        t = Table(show_header=False, title=f"{info['kind']}: {ref}", title_justify="left")
        t.add_column(style="bold")
        t.add_column(overflow="fold")
        for k, v in _rows(info):
            t.add_row(k, v)
        out.print(t)
        for w in info.get("warnings") or []:
            out.print(f"[yellow]warning[/yellow]: {w}", markup=True, highlight=False)
        for note in info.get("notes") or []:
            out.print(f"note: {note}", markup=False)
        if report is not None:
            v = Table(title=f"pair with {target}", title_justify="left")
            for col in ("check", "status", "detail"):
                v.add_column(col)
            colour = {"ok": "green", "warn": "yellow", "error": "red", "skip": "dim"}
            for c in report.checks:
                v.add_row(c["check"], f"[{colour[c['status']]}]{c['status']}[/]", c["detail"])
            out.print(v)
            out.print("[green]compatible[/green]" if report.ok else f"[red]{len(report.errors)} problem(s)[/red]")
    if report is not None and not report.ok:
        raise CompatibilityError(report.errors[0])


def _capture(architecture: str | None) -> tuple[bool | None, str]:
    """TensorRT-LLM's verdict for a target architecture (``plan.trtllm_capture``): (supported, detail)."""
    release = plan.DEFAULT_RELEASE
    why = plan.capture_missing(architecture, release)
    ok = plan.capture_supported(architecture, release)
    if ok:
        return True, f"TensorRT-LLM {release} captures hidden states for {architecture}"
    if why:
        return False, (
            f"TensorRT-LLM's {architecture} has no hidden-state capture hook ({why}): build without "
            "--graphs refuses it; the reference runtime (generate, bench, serve) runs the pair"
        )
    return None, (
        f"TensorRT-LLM may not capture hidden states for {architecture} (its source was not read for "
        "it); DFlash there is unverified (the reference runtime works)"
    )


def _capture_check(report) -> None:
    ok, detail = _capture(report.target.architecture)
    report.add("hidden-state capture", "ok" if ok else "warn", detail)


def register(app: typer.Typer) -> None:
    app.command("inspect")(inspect)
