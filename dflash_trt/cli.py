"""The dflash-trt command line. Parse, call one function, print: the logic lives elsewhere.

User errors (``DFlashError`` and bad command-line usage) become one line on stderr and
exit code 2, never a traceback.
"""

from __future__ import annotations

import sys

import typer

try:  # typer >= 0.29 vendors click
    from typer._click import exceptions as click_exc
except ImportError:  # pragma: no cover - older typer on top of click
    from click import exceptions as click_exc

from dflash_trt import __version__
from dflash_trt._cli import bench, build, generate, inspect, recipes, serve, train

# Exception classes that differ between typer's vendored click and click itself.
_EXIT = tuple({typer.Exit, *(c for c in (getattr(click_exc, "Exit", None),) if c)})
_ABORT = tuple({typer.Abort, *(c for c in (getattr(click_exc, "Abort", None),) if c)})

app = typer.Typer(
    name="dflash-trt",
    help="DFlash speculative decoding: build TensorRT-LLM deployments from Hugging Face checkpoints, "
    "serve them, and prove them lossless and faster.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

for module in (build, serve, generate, bench, inspect, train, recipes):
    module.register(app)


@app.command("version")
def version() -> None:
    """Print the dflash-trt version."""
    print(__version__)


def run(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (what tests call in-process)."""
    from dflash_trt.errors import DFlashError

    try:
        rv = app(args=argv, prog_name="dflash-trt", standalone_mode=False)
    except DFlashError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except getattr(click_exc, "NoArgsIsHelpError", ()):  # help was printed
        return 0
    except click_exc.UsageError as exc:
        cmd = exc.ctx.command_path if exc.ctx else "dflash-trt"
        print(f"error: {exc.format_message()} (see '{cmd} --help')", file=sys.stderr)
        return 2
    except _EXIT as exc:
        return exc.exit_code
    except _ABORT:
        print("aborted", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    # Without standalone mode, typer.Exit(code) comes back as the return value.
    return rv if isinstance(rv, int) else 0


def main() -> None:
    sys.exit(run())
