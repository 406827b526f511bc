"""dflash-trt serve: trtllm-serve where TensorRT-LLM is installed, else the embedded server; or
write a multi-node launch file (--emit slurm|k8s)."""

from __future__ import annotations

import shlex

import typer

from dflash_trt._cli.common import (
    BackendOpt,
    BlockSizeOpt,
    DtypeOpt,
    KernelsOpt,
    check_refs,
    err,
    out,
    run_spec,
)
from dflash_trt._cli.port import check_free
from dflash_trt._cli.serve_options import (
    ApiKeyOpt,
    BundlePathArg,
    CheckOpt,
    DrainTimeoutOpt,
    DryRunOpt,
    EmitGpusOpt,
    EmitOpt,
    EmitOutputOpt,
    HostOpt,
    ImageOpt,
    LogFormatOpt,
    LogLevelOpt,
    MaxBatchOpt,
    MaxBodyOpt,
    MaxQueueOpt,
    ModelNameOpt,
    NodesOpt,
    PortOpt,
    PvcOpt,
    ServeOptions,
    Server,
    ServerOpt,
    TemplateTimeoutOpt,
    ThreadsOpt,
)
from dflash_trt.errors import DFlashError, require
from dflash_trt.ingest import chat_mismatch
from dflash_trt.logs import configure

#: Why ``--api-key`` is refused where trtllm-serve would answer. Read in NVIDIA/TensorRT-LLM:
#: ``tensorrt_llm/commands/serve.py::serve`` has no key option and ``launch_server`` builds
#: ``OpenAIServer`` without one; ``tensorrt_llm/serve/openai_server.py::OpenAIServer.__init__``
#: adds only ``ServerArrivalTimeMiddleware`` and ``register_routes`` mounts /v1 with no auth
#: dependency. Its only request signatures (``serve/runtime_control_auth.py::
#: validate_runtime_control_request``) guard the runtime-control endpoints, not /v1. So a key
#: passed on would be a value the server never reads: refused rather than an open server.
NO_KEY_IN_TRTLLM = (
    "--api-key (or DFLASH_API_KEY) cannot guard trtllm-serve: it checks no API key on /v1; "
    "put an authenticating proxy in front of it, or use --server embedded"
)


def serve(
    bundle: BundlePathArg,
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8000,
    server: ServerOpt = Server.auto,
    dry_run: DryRunOpt = False,
    check: CheckOpt = False,
    emit: EmitOpt = None,
    nodes: NodesOpt = 1,
    gpus_per_node: EmitGpusOpt = None,
    image: ImageOpt = None,
    output: EmitOutputOpt = None,
    pvc: PvcOpt = "dflash-bundles",
    model_name: ModelNameOpt = None,
    max_batch: MaxBatchOpt = None,
    max_queue: MaxQueueOpt = 64,
    block_size: BlockSizeOpt = None,
    threads: ThreadsOpt = None,
    dtype: DtypeOpt = "auto",
    backend: BackendOpt = "torch",
    kernels: KernelsOpt = "lean",
    api_key: ApiKeyOpt = None,
    max_body_mb: MaxBodyOpt = 4.0,
    drain_timeout: DrainTimeoutOpt = 30.0,
    template_timeout: TemplateTimeoutOpt = 5.0,
    log_level: LogLevelOpt = "info",
    log_format: LogFormatOpt = "text",
) -> None:
    """Serve a bundle: OpenAI-compatible /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics."""
    opts = ServeOptions(**locals())  # first statement: locals() is exactly the parameters
    check_refs(bundle=bundle)  # a bad path is one line before the server's imports (torch)
    from dflash_trt.serve import launch  # start-up: torch (after check_refs: a bad path is one line)

    b = launch.read_bundle(bundle)
    if check:
        return _check_trtllm(b)
    _warn_chat(b)
    if emit is not None:
        path = launch.emit(b, emit.value, nodes, output, gpus_per_node=gpus_per_node, image=image, port=port, pvc=pvc)
        out.print(f"wrote {path} ({emit.value}, {nodes} node(s))")
        return
    trtllm = launch.find_trtllm_serve()
    if dry_run:
        return _print_dry_run(b, host, port, trtllm, server)
    if _use_trtllm(server, trtllm, backend, kernels):
        return _serve_trtllm(b, host, port, trtllm, api_key)
    serve_embedded(b, opts)


def _use_trtllm(server: Server, trtllm: str | None, backend: str, kernels: str) -> bool:
    """Whether trtllm-serve answers: asked for (then --backend/--kernels must be left as they are),
    or ``auto`` with trtllm-serve on PATH and the run spec left at its defaults."""
    as_given = backend == "torch" and kernels == "lean"
    if not as_given and server is Server.trtllm:
        raise DFlashError(
            "--backend/--kernels choose how the embedded server runs the models; --server trtllm "
            "serves with trtllm-serve: use --server embedded (or auto)"
        )
    return server is Server.trtllm or (server is Server.auto and trtllm is not None and as_given)


def _serve_trtllm(b, host: str, port: int, trtllm: str | None, api_key: str | None) -> None:
    """Run the bundle's trtllm-serve command; its exit status passed on, with one line saying whose."""
    from dflash_trt.serve import launch  # start-up: torch

    if trtllm is None:
        raise DFlashError(
            "trtllm-serve is not on PATH: install TensorRT-LLM >= 1.3 (PyTorch backend with DFlash) "
            "or use --server embedded"
        )
    if api_key:
        raise DFlashError(NO_KEY_IN_TRTLLM)
    check_free(host, port)  # a busy port is one line now, not after trtllm-serve loads the models
    argv = launch.trtllm_argv(b, host, port)
    err.print(f"[dim]running {shlex.join(argv)}[/dim]")
    code = launch.run(argv, host, port)
    if code != 0:
        exc = DFlashError(f"{argv[1]} exited with status {code}")
        exc.exit_code = code if code > 0 else 128 - code  # killed by a signal: 128 + signum
        raise exc


def _print_dry_run(b, host: str, port: int, trtllm: str | None, server: Server) -> None:
    """What ``serve`` would run: the bundle's trtllm-serve command (and what serve.sh execs)."""
    from dflash_trt.serve import launch  # start-up: torch

    out.print(shlex.join(launch.trtllm_argv(b, host, port)), markup=False)
    inner = launch.script_command(b)
    if inner:
        out.print(f"# {b.serve_sh} runs: {inner} --host {host} --port {port}", markup=False)
    if trtllm is None and server is not Server.trtllm:
        out.print(
            "# trtllm-serve is not on PATH here: 'serve' would use the embedded server on the reference runtime",
            markup=False,
        )


def _check_trtllm(b) -> None:
    """``serve --check``: the planned release's schema, then the installed release's own classes."""
    from dflash_trt import deploy  # start-up: the pipeline (~0.1 s), loaded by the commands that use it

    info = b.manifest.trtllm if b.manifest else None
    if info is None:
        raise DFlashError(f"{b.root}: no manifest naming its TensorRT-LLM release; rebuild with 'dflash-trt build'")
    deploy.load_trtllm_config(b.root, info.release)
    have = deploy.installed_trtllm()
    if have is None:
        out.print(
            f"trtllm/config.yaml matches dflash-trt's schema of TensorRT-LLM {info.release}; tensorrt_llm is "
            "not installed here, so no installed release judged it",
            markup=False,
        )
        return
    code, lines = deploy.judge_trtllm_config(info.release, b.root)
    if code:
        raise DFlashError(lines[0])
    for line in lines:
        err.print(line, markup=False)
    out.print(f"TensorRT-LLM {have} accepts trtllm/config.yaml (planned for {info.release})", markup=False)


def _warn_chat(b) -> None:
    """One line when the bundle serves a thinking setting its drafter was not trained with."""
    chat = chat_mismatch(b.serve.drafter_chat, b.serve.model_dump())
    if chat:
        err.print(f"[yellow]warning:[/yellow] {chat}")


def serve_embedded(b, opts: ServeOptions) -> int:
    """The embedded server on the reference runtime, its pair loaded under the resolved run spec
    (the block size and the engines' profile are the scheduler's to check: ``runtime.Scheduler``)."""
    from dflash_trt.runtime import load_bundle, parse_dtype  # start-up: torch
    from dflash_trt.serve import ServeSpec, check_fits_cpu, create_app  # start-up: torch
    from dflash_trt.serve import serve as run_server  # start-up: torch

    require("fastapi", "serve", "the embedded server")
    require("uvicorn", "serve", "the embedded server")
    host, port, name, api_key = opts.host, opts.port, opts.model_name or b.name, opts.api_key
    log_level, log_format = opts.log_level.lower(), opts.log_format.lower()
    configure(log_level, log_format)
    itemsize = parse_dtype(opts.dtype).itemsize
    check_fits_cpu(b.name, [b.target, b.drafter], itemsize)
    check_free(host, port)  # a busy port is one line now, before any model loads
    spec = run_spec(opts.backend, opts.kernels, bundle=b.root, dtype=opts.dtype)
    with err.status("loading models"):
        pair = load_bundle(b.root, spec, dtype=opts.dtype)
    app = create_app(
        pair,
        spec=ServeSpec(
            model_name=name,
            max_queue=opts.max_queue,
            max_batch=opts.max_batch,
            block_size=opts.block_size,
            torch_threads=opts.threads,
            max_model_len=b.serve.max_seq_len,
            api_key=api_key,
            max_body_bytes=opts.max_body_bytes,
            template_timeout_s=opts.template_timeout,
        ),
    )
    if not api_key and host not in ("127.0.0.1", "localhost", "::1"):
        err.print(f"warning: listening on {host} without --api-key: anyone who reaches this port can use the model")
    through = f", {opts.backend} backend" if opts.backend != "torch" else ""
    err.print(
        f"serving {name} on http://{host}:{port} (reference runtime{through}, continuous "
        f"batching, max batch {app.state.batcher.max_batch}, queue {opts.max_queue})"
    )
    return run_server(app, host, port, drain_timeout=opts.drain_timeout, log_level=log_level, log_format=log_format)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
