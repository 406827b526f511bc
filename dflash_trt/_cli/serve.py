"""dflash-trt serve: trtllm-serve where TensorRT-LLM is installed, else the embedded server; or
write a multi-node launch file (--emit slurm|k8s)."""

from __future__ import annotations

import shlex
from enum import Enum
from pathlib import Path
from typing import Annotated, Literal

import typer

from dflash_trt._cli.common import (
    BackendOpt,
    BlockSizeOpt,
    DtypeOpt,
    KernelsOpt,
    err,
    out,
    run_spec,
)
from dflash_trt._cli.port import check_free


class Server(str, Enum):
    """What answers HTTP: trtllm-serve, or the embedded server on the reference runtime."""

    auto = "auto"
    trtllm = "trtllm"
    embedded = "embedded"


#: Why ``--api-key`` is refused where trtllm-serve would answer. Read in NVIDIA/TensorRT-LLM:
#: ``tensorrt_llm/commands/serve.py::serve`` has no key option and ``launch_server`` builds
#: ``OpenAIServer`` without one; ``tensorrt_llm/serve/openai_server.py::OpenAIServer.__init__``
#: adds only ``ServerArrivalTimeMiddleware`` and ``register_routes`` mounts /v1 with no auth
#: dependency. Its only request signatures (``serve/runtime_control_auth.py::
#: validate_runtime_control_request``) guard the runtime-control endpoints, not /v1. So a key
#: passed on would be a value the server never reads: refused rather than an open server.
NO_KEY_IN_TRTLLM = ("--api-key (or DFLASH_API_KEY) cannot guard trtllm-serve: it checks no API key on /v1; "
                    "put an authenticating proxy in front of it, or use --server embedded")


LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["text", "json"]


class Emit(str, Enum):
    slurm = "slurm"
    k8s = "k8s"


# Over 60 lines only because the signature is the command's option list (Typer reads it);
# the body is short and calls one stage per branch.
def serve(
    bundle: Annotated[Path, typer.Argument(help="Bundle directory written by 'dflash-trt build'.")],
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on.")] = 8000,
    server: Annotated[Server, typer.Option("--server", case_sensitive=False,
                                           help="What answers HTTP: trtllm (trtllm-serve), embedded "
                                           "(the embedded server on the reference runtime), or auto: trtllm-serve "
                                           "when it is on PATH and --backend/--kernels are left as they are, else "
                                           "embedded.")] = Server.auto,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the trtllm-serve command and exit.")] = False,
    check: Annotated[bool, typer.Option("--check", help="Validate the bundle's trtllm/config.yaml with the "
                                        "installed TensorRT-LLM's own LLM-API classes (what serve.sh does before "
                                        "it serves) and exit: 2 naming a key that release rejects.")] = False,
    emit: Annotated[Emit | None, typer.Option(
        case_sensitive=False, help="Write a multi-node launch file instead of serving.")] = None,
    nodes: Annotated[int, typer.Option(min=1, help="Nodes for --emit.")] = 1,
    gpus_per_node: Annotated[int | None, typer.Option("--gpus-per-node", min=1, help="GPUs per node for --emit "
                                                         "(default: the manifest's, else 8).")] = None,
    image: Annotated[str | None, typer.Option(help="Container image for --emit (default: TensorRT-LLM's "
                                                 "release image).")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="File --emit writes (default: "
                                                   "NAME.slurm.sh / NAME.lws.yaml here).")] = None,
    pvc: Annotated[str, typer.Option(
        help="k8s: PersistentVolumeClaim holding the bundle (mounted at /bundles).")] = "dflash-bundles",
    model_name: Annotated[str | None, typer.Option("--model-name", help="Model id clients send "
                                                      "(default: the bundle's name).")] = None,
    max_batch: Annotated[int | None, typer.Option(
        "--max-batch", min=1, help="Embedded server: requests per runtime batch (default: the bundle's planned "
                                   "max_batch_size, else 8).")] = None,
    max_queue: Annotated[int, typer.Option(
        "--max-queue", min=0, help="Embedded server: waiting requests before 429.")] = 64,
    block_size: BlockSizeOpt = None,
    threads: Annotated[int | None, typer.Option(min=1, help="Embedded server: torch threads for generation "
                                                   "(default: all cores but one, left to the event loop).")] = None,
    dtype: DtypeOpt = "auto",
    backend: BackendOpt = "torch",
    kernels: KernelsOpt = "lean",
    api_key: Annotated[str | None, typer.Option("--api-key", envvar="DFLASH_API_KEY", help="Embedded server: "
                                                   "answer 401 to requests without 'Authorization: Bearer KEY' "
                                                   "(env DFLASH_API_KEY). trtllm-serve checks no key: with it, "
                                                   "--api-key is refused.")] = None,
    max_body_mb: Annotated[float, typer.Option("--max-body-mb", min=0.001, help="Embedded server: largest request "
                                               "body in MiB (413 above it).")] = 4.0,
    drain_timeout: Annotated[float, typer.Option("--drain-timeout", min=0.0, help="Embedded server: on SIGTERM, "
                                                 "seconds in-flight requests may still run before what is left is "
                                                 "failed and the server stops.")] = 30.0,
    template_timeout: Annotated[float, typer.Option("--template-timeout", min=0.01, help="Embedded server: "
                                                    "seconds one chat-template render may take (it runs in a "
                                                    "child process; 400 past it).")] = 5.0,
    log_level: Annotated[LogLevel, typer.Option("--log-level", case_sensitive=False, help="Embedded server: "
                                                "the least severe log record shown (uvicorn's too).")] = "info",
    log_format: Annotated[LogFormat, typer.Option("--log-format", case_sensitive=False, help="Embedded server: "
                                                  "text lines, or one JSON object per record (tracebacks "
                                                  "included; never the API key, headers or prompts).")] = "text",
) -> None:
    """Serve a bundle: OpenAI-compatible /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics."""
    from dflash_trt._cli.common import check_refs
    from dflash_trt.errors import DFlashError

    check_refs(bundle=bundle)  # a bad path is one line before the server's imports (torch)
    from dflash_trt.serve import launch

    b = launch.read_bundle(bundle)
    if check:
        return _check_trtllm(b)
    _warn_chat(b)
    if emit is not None:
        path = launch.emit(b, emit.value, nodes, output, gpus_per_node=gpus_per_node, image=image, port=port,
                           pvc=pvc)
        out.print(f"wrote {path} ({emit.value}, {nodes} node(s))")
        return
    trtllm = launch.find_trtllm_serve()
    if dry_run:
        return _print_dry_run(b, host, port, trtllm, server)
    if (backend != "torch" or kernels != "lean") and server is Server.trtllm:
        raise DFlashError("--backend/--kernels choose how the embedded server runs the models; --server trtllm "
                          "serves with trtllm-serve: use --server embedded (or auto)")
    if server is Server.trtllm or (server is Server.auto and trtllm is not None and backend == "torch"
                                   and kernels == "lean"):
        if trtllm is None:
            raise DFlashError("trtllm-serve is not on PATH: install TensorRT-LLM >= 1.3 (PyTorch backend with DFlash) "
                              "or use --server embedded")
        if api_key:
            raise DFlashError(NO_KEY_IN_TRTLLM)
        check_free(host, port)   # a busy port is one line now, not after trtllm-serve loads the models
        argv = launch.trtllm_argv(b, host, port)
        err.print(f"[dim]running {shlex.join(argv)}[/dim]")
        code = launch.run(argv, host, port)
        if code != 0:  # pass the server's exit status on, with one line saying whose it is
            exc = DFlashError(f"{argv[1]} exited with status {code}")
            exc.exit_code = code if code > 0 else 128 - code  # killed by a signal: 128 + signum
            raise exc
        return
    serve_embedded(b, host, port, model_name, max_batch, max_queue, block_size, dtype, threads, backend,
                   api_key=api_key, max_body_bytes=int(max_body_mb * (1 << 20)), kernels=kernels,
                   drain_timeout=drain_timeout, template_timeout=template_timeout,
                   log=(log_level.lower(), log_format.lower()))


def _print_dry_run(b, host: str, port: int, trtllm: str | None, server: Server) -> None:
    """What ``serve`` would run: the bundle's trtllm-serve command (and what serve.sh execs)."""
    from dflash_trt.serve import launch

    out.print(shlex.join(launch.trtllm_argv(b, host, port)), markup=False)
    inner = launch.script_command(b)
    if inner:
        out.print(f"# {b.serve_sh} runs: {inner} --host {host} --port {port}", markup=False)
    if trtllm is None and server is not Server.trtllm:
        out.print("# trtllm-serve is not on PATH here: 'serve' would use the embedded server "
                  "on the reference runtime", markup=False)


def _check_trtllm(b) -> None:
    """``serve --check``: the planned release's schema, then the installed release's own classes."""
    from dflash_trt.deploy import installed_trtllm, judge_trtllm_config, load_trtllm_config
    from dflash_trt.errors import DFlashError

    info = b.manifest.trtllm if b.manifest else None
    if info is None:
        raise DFlashError(f"{b.root}: no manifest naming its TensorRT-LLM release; rebuild with 'dflash-trt build'")
    load_trtllm_config(b.root, info.release)
    have = installed_trtllm()
    if have is None:
        out.print(f"trtllm/config.yaml matches dflash-trt's schema of TensorRT-LLM {info.release}; tensorrt_llm is "
                  "not installed here, so no installed release judged it", markup=False)
        return
    code, lines = judge_trtllm_config(info.release, b.root)
    if code:
        raise DFlashError(lines[0])
    for line in lines:
        err.print(line, markup=False)
    out.print(f"TensorRT-LLM {have} accepts trtllm/config.yaml (planned for {info.release})", markup=False)


def _warn_chat(b) -> None:
    """One line when the bundle serves a thinking setting its drafter was not trained with."""
    from dflash_trt.ingest import chat_mismatch

    chat = chat_mismatch(b.serve.drafter_chat, b.serve.model_dump())
    if chat:
        err.print(f"[yellow]warning:[/yellow] {chat}")


def serve_embedded(b, host: str, port: int, model_name: str | None, max_batch: int | None, max_queue: int,
                   block_size: int | None, dtype: str, threads: int | None = None, backend: str = "torch",
                   api_key: str | None = None, max_body_bytes: int = 4 << 20,
                   kernels: str = "lean", drain_timeout: float = 30.0, template_timeout: float = 5.0,
                   log: tuple[str, str] = ("info", "text")) -> int:
    """The embedded server on the reference runtime, its pair loaded under the resolved run spec
    (the block size and the engines' profile are the scheduler's to check: ``runtime.Scheduler``)."""
    from dflash_trt.errors import require
    from dflash_trt.runtime import load_bundle, parse_dtype
    from dflash_trt.serve import ServeSpec, check_fits_cpu, create_app
    from dflash_trt.serve import serve as run_server

    require("fastapi", "serve", "the embedded server")
    require("uvicorn", "serve", "the embedded server")
    from dflash_trt.logs import configure

    configure(*log)
    itemsize = parse_dtype(dtype).itemsize
    check_fits_cpu(b.name, [b.target, b.drafter], itemsize)
    check_free(host, port)   # a busy port is one line now, before any model loads
    spec = run_spec(backend, kernels, bundle=b.root, dtype=dtype)
    with err.status("loading models"):
        pair = load_bundle(b.root, spec, dtype=dtype)
    app = create_app(pair, spec=ServeSpec(model_name=model_name or b.name, max_queue=max_queue, max_batch=max_batch,
                                          block_size=block_size, torch_threads=threads,
                                          max_model_len=b.serve.max_seq_len, api_key=api_key,
                                          max_body_bytes=max_body_bytes, template_timeout_s=template_timeout))
    if not api_key and host not in ("127.0.0.1", "localhost", "::1"):
        err.print(f"warning: listening on {host} without --api-key: anyone who reaches this port can use the model")
    through = f", {backend} backend" if backend != "torch" else ""
    err.print(f"serving {model_name or b.name} on http://{host}:{port} (reference runtime{through}, continuous "
              f"batching, max batch {app.state.batcher.max_batch}, queue {max_queue})")
    return run_server(app, host, port, drain_timeout=drain_timeout, log_level=log[0], log_format=log[1])


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
