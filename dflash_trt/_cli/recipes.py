"""dflash-trt recipes: list, show, copy and validate recipe files."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from dflash_trt import plan as R
from dflash_trt._cli.common import out
from dflash_trt.errors import RecipeError

recipes_app = typer.Typer(
    help="List, show, copy and validate recipes (one YAML per model pair x GPU x precision).", no_args_is_help=True
)

SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Override a field: KEY.PATH=VALUE (repeatable).")]


@recipes_app.command("list")
def list_(
    reasons: Annotated[bool, typer.Option("--reasons", help="Also print why each recipe is not ready.")] = False,
) -> None:
    """List the bundled recipes and what the project can do with each (derived from their configs)."""
    t = Table(
        caption="status: ready (plans offline) | hub-only (plans from the hub or the local HF cache) | "
        "id-unconfirmed | unsupported (target family not in the runtime's registry); "
        "--reasons says why; recipes show NAME: the full recipe"
    )
    t.add_column("name", no_wrap=True)  # the handle users copy: never split across lines
    t.add_column("gpus", no_wrap=True)
    t.add_column("weights", no_wrap=True)
    t.add_column("status", no_wrap=True)
    why = []  # reasons go under the table, one line each: a fifth column is a few characters wide at 80
    for name, path in R.bundled_recipes().items():
        r = R.load_recipe(path)
        st = R.recipe_status(r)
        t.add_row(name, f"{r.gpu.count * r.gpu.nodes}x {r.gpu.name}", r.precision.weights, st.kind)
        if reasons and st.reason:
            why.append(f"{name}: {st.reason}")
    out.print(t, soft_wrap=False)  # the caption wraps to the table's width
    for line in why:
        out.print(line, markup=False, soft_wrap=False)


@recipes_app.command("show")
def show(name: Annotated[str, typer.Argument(help="Bundled recipe name or YAML file.")], set_: SetOpt = None) -> None:
    """Print a recipe with every default filled in (after --set overrides)."""
    out.print(R.load_recipe(name, set_).to_yaml(), markup=False, end="")


@recipes_app.command("validate")
def validate(
    name: Annotated[str, typer.Argument(help="Bundled recipe name or YAML file.")], set_: SetOpt = None
) -> None:
    """Check a recipe's keys and values; exit 2 naming the first bad key."""
    r = R.load_recipe(name, set_)
    out.print(f"{name}: ok ({r.name})")


@recipes_app.command("copy")
def copy(
    name: Annotated[str, typer.Argument(help="Bundled recipe name.")],
    dest: Annotated[Path, typer.Argument(help="Destination YAML file.")],
) -> None:
    """Copy a bundled recipe to edit it."""
    src = R.load_recipe(name).source
    if os.path.lexists(dest):  # a dangling symlink too: it would be written through, wherever it points
        raise RecipeError(f"{dest} exists; choose another destination")
    try:  # created here, never through a link made meanwhile
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise RecipeError(f"{dest}: cannot write it ({exc.strerror or exc}); choose another destination") from None
    with os.fdopen(fd, "wb") as f:
        f.write(Path(src).read_bytes())
    out.print(f"copied {name} to {dest}")


def register(app: typer.Typer) -> None:
    app.add_typer(recipes_app, name="recipes")
