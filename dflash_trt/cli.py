"""The dflash-trt command line. Parse, call one function, print: the logic lives elsewhere.

User errors (``DFlashError`` and bad command-line usage) become one line on stderr and
exit code 2, never a traceback; so do what the machine refuses (a full disk, a file-size limit, a
name too long), input nested past the parsers' recursion, and a library's error that does not
derive from ``Exception``. Ctrl-C is 130 and ``SystemExit`` keeps its code. Anything else is a
bug: one line saying so and naming the file its traceback was written to (outside any output or
bundle), exit code 1; with ``--debug`` (or ``DFLASH_DEBUG=1``) the traceback is also printed above
it. Output the terminal cannot encode is replaced, never fatal.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
import warnings
from typing import Annotated

import typer

try:  # typer >= 0.29 vendors click
    from typer._click import exceptions as click_exc
except ImportError:  # pragma: no cover - older typer on top of click
    from click import exceptions as click_exc

from dflash_trt import __version__
from dflash_trt._cli import bench, build, generate, inspect, recipes, serve, train, tune, verify
from dflash_trt.errors import DFlashError, environment_error
from dflash_trt.logs import write_traceback

logger = logging.getLogger(__name__)

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

for module in (build, serve, generate, bench, tune, verify, inspect, train, recipes):
    module.register(app)


#: ``--debug`` of the command being run (reset by :func:`run`; read by :func:`_bug`)
_debug = {"on": False}


@app.callback()
def _options(
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            envvar="DFLASH_DEBUG",
            help="On an internal error (a bug), also print its full traceback to "
            "stderr (it is always written to a file).",
        ),
    ] = False,
) -> None:
    _debug["on"] = debug


@app.command("version")
def version() -> None:
    """Print the dflash-trt version."""
    print(__version__)


class _HeldLibraryOutput:
    """Python warnings and library loggers (transformers, ModelOpt, ...) held during a command.

    A command that succeeds shows them afterwards; one that fails with a user error drops them, so
    a refusal stays one line on stderr however chatty the libraries were on the way to it.
    """

    LOGGERS = ("transformers", "modelopt", "torch", "huggingface_hub", "onnxscript", "onnx_ir")
    KEEP = 200  # a long command keeps at most this many records

    def __init__(self, argv: list[str] | None):
        # the server runs until stopped: its warnings are shown as they come
        self.active = not (argv or sys.argv[1:])[:1] == ["serve"]
        self.release = lambda: None

    def __enter__(self):
        if not self.active:
            return self
        self._warnings = warnings.catch_warnings(record=True)
        self.caught = self._warnings.__enter__()
        warnings.simplefilter("default")
        self.records: list[logging.LogRecord] = []
        self._handler = logging.Handler(logging.WARNING)
        self._handler.emit = lambda r: len(self.records) < self.KEEP and self.records.append(r)
        self._saved = []
        for name in self.LOGGERS:
            lg = logging.getLogger(name)
            self._saved.append((lg, lg.handlers[:], lg.propagate))
            lg.handlers, lg.propagate = [self._handler], False
        return self

    def __exit__(self, *exc) -> None:
        if not self.active:
            return
        for lg, handlers, propagate in self._saved:
            lg.handlers, lg.propagate = handlers, propagate
        self._warnings.__exit__(*exc)
        self.release = lambda: (
            [warnings.showwarning(w.message, w.category, w.filename, w.lineno) for w in self.caught],
            [print(r.getMessage(), file=sys.stderr) for r in self.records],
        )


def one_line(message: str) -> str:
    """A message as one line: a YAML parser's caret lines, a key holding a newline or a carriage
    return, folded into spaces (the refusal stays one line on stderr)."""
    return " ".join(message.split())


def _degrade_streams() -> None:
    """stdout and stderr replace what their encoding cannot hold (``PYTHONIOENCODING=ascii``, a C
    locale): a command never fails after its work because a ``τ`` cannot be printed."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and getattr(stream, "errors", "strict") == "strict":
            reconfigure(errors="replace")


def run(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (what tests call in-process)."""
    _degrade_streams()
    _debug["on"] = os.environ.get("DFLASH_DEBUG", "").lower() in ("1", "true", "yes", "on")
    held = _HeldLibraryOutput(argv)
    try:
        with held:
            rv = app(args=argv, prog_name="dflash-trt", standalone_mode=False)
        held.release()
    except DFlashError as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except getattr(click_exc, "NoArgsIsHelpError", ()):  # help was printed
        return 0
    except click_exc.UsageError as exc:
        cmd = exc.ctx.command_path if exc.ctx else "dflash-trt"
        print(f"error: {one_line(exc.format_message())} (see '{cmd} --help')", file=sys.stderr)
        return 2
    except _EXIT as exc:
        return exc.exit_code
    except _ABORT:  # click turns Ctrl-C into Abort
        print("interrupted", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (SystemExit, GeneratorExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - translated below, else a bug (said so, its traceback kept)
        said = _translate(exc, environment_error(exc))
        if said is not None:
            print(f"error: {one_line(said)}", file=sys.stderr)
            return 2
        if isinstance(exc, Exception):
            return _bug(exc)
        raise
    # Without standalone mode, typer.Exit(code) comes back as the return value; typer turns
    # Ctrl-C (KeyboardInterrupt) inside a command into 130 the same way.
    if rv == 130:
        print("interrupted", file=sys.stderr)
    return rv if isinstance(rv, int) else 0


def _bug(exc: Exception) -> int:
    """One line saying this is a bug and where its traceback went (``logs.write_traceback``); exit 1.
    With ``--debug`` (``DFLASH_DEBUG``) the traceback is printed to stderr first."""
    where = write_traceback(exc)
    kept = f"the traceback is in {where}" if where else "its traceback could not be written"
    if _debug["on"]:  # --debug: the full traceback here too, above the one line
        sys.stderr.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    print(
        f"internal error (a bug in dflash-trt, not in your input): {type(exc).__name__}: "
        f"{one_line(str(exc))[:200]}; {kept}; please report it",
        file=sys.stderr,
    )
    return 1


def _translate(exc: BaseException, environment: str | None) -> str | None:
    """One line for what is the machine's or the input's doing, not the program's: an OS refusal
    (full disk, file-size limit, a name too long: ``errors.environment_error``), input nested past
    the parsers' recursion, and a library's error that does not derive from ``Exception`` (a Rust
    panic from ``tokenizers``/``safetensors``, torch's ``CheckpointException``), which no handler
    below this one can catch. Anything else is a bug: None (:func:`_bug`). The
    traceback of a translated error goes to the log (``logging.DEBUG``)."""
    if environment is not None:
        said = environment
    elif isinstance(exc, ValueError) and "integer string conversion" in str(exc):  # int("9" * 5000)
        said = (
            f"an input holds a number of more than {sys.get_int_max_str_digits()} digits; no field takes one that large"
        )
    elif isinstance(exc, RecursionError):
        said = "an input is nested too deeply to read (a file or value nested hundreds of levels deep)"
    elif not isinstance(exc, Exception):
        try:
            first = (str(exc).strip().splitlines() or [""])[0][:300]
        except Exception:  # noqa: BLE001 - a library exception whose __str__ fails still gets its line
            first = repr(type(exc))
        said = f"{type(exc).__module__}.{type(exc).__name__}: {first} (a library failed on this input)"
    else:
        return None
    logger.debug("translated to one line", exc_info=exc)
    return said


def main() -> None:
    sys.exit(run())
