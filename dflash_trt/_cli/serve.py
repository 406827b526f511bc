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
    Server,
    ServerOpt,
    TemplateTimeoutOpt,
    ThreadsOpt,
)

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
    from dflash_trt._cli.common import check_refs

    check_refs(bundle=bundle)  # a bad path is one line before the server's imports (torch)
    from dflash_trt.serve import launch

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
    serve_embedded(
        b,
        host,
        port,
        model_name,
        max_batch,
        max_queue,
        block_size,
        dtype,
        threads,
        backend,
        api_key=api_key,
        max_body_bytes=int(max_body_mb * (1 << 20)),
        kernels=kernels,
        drain_timeout=drain_timeout,
        template_timeout=template_timeout,
        log=(log_level.lower(), log_format.lower()),
    )


def _use_trtllm(server: Server, trtllm: str | None, backend: str, kernels: str) -> bool:
    """Whether trtllm-serve answers: asked for (then --backend/--kernels must be left as they are),
    or ``auto`` with trtllm-serve on PATH and the run spec left at its defaults."""
    from dflash_trt.errors import DFlashError

    as_given = backend == "torch" and kernels == "lean"
    if not as_given and server is Server.trtllm:
        raise DFlashError(
            "--backend/--kernels choose how the embedded server runs the models; --server trtllm "
            "serves with trtllm-serve: use --server embedded (or auto)"
        )
    return server is Server.trtllm or (server is Server.auto and trtllm is not None and as_given)


def _serve_trtllm(b, host: str, port: int, trtllm: str | None, api_key: str | None) -> None:
    """Run the bundle's trtllm-serve command; its exit status passed on, with one line saying whose."""
    from dflash_trt.errors import DFlashError
    from dflash_trt.serve import launch

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
    from dflash_trt.serve import launch

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
    from dflash_trt.deploy import installed_trtllm, judge_trtllm_config, load_trtllm_config
    from dflash_trt.errors import DFlashError

    info = b.manifest.trtllm if b.manifest else None
    if info is None:
        raise DFlashError(f"{b.root}: no manifest naming its TensorRT-LLM release; rebuild with 'dflash-trt build'")
    load_trtllm_config(b.root, info.release)
    have = installed_trtllm()
    if have is None:
        out.print(
            f"trtllm/config.yaml matches dflash-trt's schema of TensorRT-LLM {info.release}; tensorrt_llm is "
            "not installed here, so no installed release judged it",
            markup=False,
        )
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


def serve_embedded(
    b,
    host: str,
    port: int,
    model_name: str | None,
    max_batch: int | None,
    max_queue: int,
    block_size: int | None,
    dtype: str,
    threads: int | None = None,
    backend: str = "torch",
    api_key: str | None = None,
    max_body_bytes: int = 4 << 20,
    kernels: str = "lean",
    drain_timeout: float = 30.0,
    template_timeout: float = 5.0,
    log: tuple[str, str] = ("info", "text"),
) -> int:
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
    check_free(host, port)  # a busy port is one line now, before any model loads
    spec = run_spec(backend, kernels, bundle=b.root, dtype=dtype)
    with err.status("loading models"):
        pair = load_bundle(b.root, spec, dtype=dtype)
    app = create_app(
        pair,
        spec=ServeSpec(
            model_name=model_name or b.name,
            max_queue=max_queue,
            max_batch=max_batch,
            block_size=block_size,
            torch_threads=threads,
            max_model_len=b.serve.max_seq_len,
            api_key=api_key,
            max_body_bytes=max_body_bytes,
            template_timeout_s=template_timeout,
        ),
    )
    if not api_key and host not in ("127.0.0.1", "localhost", "::1"):
        err.print(f"warning: listening on {host} without --api-key: anyone who reaches this port can use the model")
    through = f", {backend} backend" if backend != "torch" else ""
    err.print(
        f"serving {model_name or b.name} on http://{host}:{port} (reference runtime{through}, continuous "
        f"batching, max batch {app.state.batcher.max_batch}, queue {max_queue})"
    )
    return run_server(app, host, port, drain_timeout=drain_timeout, log_level=log[0], log_format=log[1])


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
