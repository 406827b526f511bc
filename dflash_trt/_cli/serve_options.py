"""``dflash-trt serve``'s options, one Annotated alias each (the command's signature reads them).

Invariant: a flag's spelling, help and bounds are defined here once; ``_cli/serve.py`` only
names them with their defaults, and ``scripts/gen_docs.py`` reads them back from --help. What the
command parsed travels as one :class:`ServeOptions`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Literal

import typer


class Server(str, Enum):
    """What answers HTTP: trtllm-serve, or the embedded server on the reference runtime."""

    auto = "auto"
    trtllm = "trtllm"
    embedded = "embedded"


class Emit(str, Enum):
    slurm = "slurm"
    k8s = "k8s"


LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["text", "json"]

BundlePathArg = Annotated[Path, typer.Argument(help="Bundle directory written by 'dflash-trt build'.")]
HostOpt = Annotated[str, typer.Option("--host", help="Address to listen on.")]
PortOpt = Annotated[int, typer.Option("--port", min=0, max=65535, help="Port to listen on.")]
ServerOpt = Annotated[
    Server,
    typer.Option(
        "--server",
        case_sensitive=False,
        help="What answers HTTP: trtllm (trtllm-serve), embedded (the embedded server "
        "on the reference runtime), or auto: trtllm-serve when it is on PATH and --backend/--kernels are left as they "
        "are, else embedded.",
    ),
]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Print the trtllm-serve command and exit.")]
CheckOpt = Annotated[
    bool,
    typer.Option(
        "--check",
        help="Validate the bundle's trtllm/config.yaml with the installed TensorRT-LLM's own LLM-API classes "
        "(what serve.sh does before it serves) and exit: 2 naming a key that release rejects.",
    ),
]
EmitOpt = Annotated[
    Emit | None, typer.Option("--emit", case_sensitive=False, help="Write a multi-node launch file instead of serving.")
]
NodesOpt = Annotated[int, typer.Option("--nodes", min=1, help="Nodes for --emit.")]
EmitGpusOpt = Annotated[
    int | None,
    typer.Option("--gpus-per-node", min=1, help="GPUs per node for --emit (default: the manifest's, else 8)."),
]
ImageOpt = Annotated[
    str | None, typer.Option("--image", help="Container image for --emit (default: TensorRT-LLM's release image).")
]
EmitOutputOpt = Annotated[
    Path | None,
    typer.Option("--output", "-o", help="File --emit writes (default: NAME.slurm.sh / NAME.lws.yaml here)."),
]
PvcOpt = Annotated[
    str, typer.Option("--pvc", help="k8s: PersistentVolumeClaim holding the bundle (mounted at /bundles).")
]
ModelNameOpt = Annotated[
    str | None, typer.Option("--model-name", help="Model id clients send (default: the bundle's name).")
]
MaxBatchOpt = Annotated[
    int | None,
    typer.Option(
        "--max-batch",
        min=1,
        help="Embedded server: requests per runtime batch (default: the bundle's planned max_batch_size, else 8).",
    ),
]
MaxQueueOpt = Annotated[int, typer.Option("--max-queue", min=0, help="Embedded server: waiting requests before 429.")]
ThreadsOpt = Annotated[
    int | None,
    typer.Option(
        "--threads",
        min=1,
        help="Embedded server: torch threads for generation (default: all cores but one, left to the event loop).",
    ),
]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        envvar="DFLASH_API_KEY",
        help="Embedded server: answer 401 to requests without 'Authorization: "
        "Bearer KEY' (env DFLASH_API_KEY). trtllm-serve checks no key: with it, --api-key is refused.",
    ),
]
MaxBodyOpt = Annotated[
    float, typer.Option("--max-body-mb", min=0.001, help="Embedded server: largest request body in MiB (413 above it).")
]
DrainTimeoutOpt = Annotated[
    float,
    typer.Option(
        "--drain-timeout",
        min=0.0,
        help="Embedded server: on SIGTERM, seconds in-flight requests may still run before "
        "what is left is failed and the server stops.",
    ),
]
TemplateTimeoutOpt = Annotated[
    float,
    typer.Option(
        "--template-timeout",
        min=0.01,
        help="Embedded server: seconds one chat-template render may take (it runs in a child process; 400 past it).",
    ),
]
LogLevelOpt = Annotated[
    LogLevel,
    typer.Option(
        "--log-level", case_sensitive=False, help="Embedded server: the least severe log record shown (uvicorn's too)."
    ),
]
LogFormatOpt = Annotated[
    LogFormat,
    typer.Option(
        "--log-format",
        case_sensitive=False,
        help="Embedded server: text lines, or one JSON object per record "
        "(tracebacks included; never the API key, headers or prompts).",
    ),
]


@dataclass(frozen=True)
class ServeOptions:
    """``serve``'s options as typer parsed them (one field per parameter of ``_cli.serve.serve``,
    same name, same type: tests/test_cli_conventions.py holds that), handed whole to the embedded server."""

    bundle: Path
    host: str
    port: int
    server: Server
    dry_run: bool
    check: bool
    emit: Emit | None
    nodes: int
    gpus_per_node: int | None
    image: str | None
    output: Path | None
    pvc: str
    model_name: str | None
    max_batch: int | None
    max_queue: int
    block_size: int | None
    threads: int | None
    dtype: str
    backend: str
    kernels: str
    api_key: str | None
    max_body_mb: float
    drain_timeout: float
    template_timeout: float
    log_level: LogLevel
    log_format: LogFormat

    @property
    def max_body_bytes(self) -> int:
        """--max-body-mb in bytes."""
        return int(self.max_body_mb * (1 << 20))
