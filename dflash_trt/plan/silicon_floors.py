"""The smallest sizes aiconfigurator-core's tables collected for the ops a target decode step uses,
and whether a planned step lies below them.

Invariant: the tables interpolate between collected points and extrapolate beyond them, and their
per-operation error is large below the smallest collected size (FACTS §15). A planned step whose
GEMM rows or per-rank widths (``m``, ``n``, ``k``), attention batch or context, or MoE token count
lies below the smallest point the library's own table files hold for that op, dtype, GPU, stack
and version is not priced by the tables: :func:`below` says which size and where, and
:class:`~dflash_trt.plan.silicon.SiliconStepModel` prices that step with the calibrated model.

The floors are read from the library's per-op table files
(``aiconfigurator_core/systems/data/<system>/<op>/<framework>/<version>/<table>.parquet``, the
files its database loads), for the table version the plan uses, else the newest one at or below it
holding that op (a version directory may hold only some ops). Reading them needs ``pyarrow``
(a dependency of ``aiconfigurator-core``), imported on first use like the library itself.
"""

from __future__ import annotations

import importlib.util
import logging
import re
from functools import lru_cache
from pathlib import Path

from dflash_trt.plan.model_shapes import TargetShape

logger = logging.getLogger(__name__)

# op directory, table file, the columns that are sizes (column -> the name a plan prints), dtype column
TABLES = (
    ("gemm", "gemm_perf", {"m": "GEMM m", "n": "GEMM n", "k": "GEMM k"}, "gemm_dtype"),
    (
        "attention",
        "generation_attention_perf",
        {"batch_size": "attention batch", "step": "attention context"},
        "kv_cache_dtype",
    ),
    ("moe", "moe_perf", {"num_tokens": "MoE tokens"}, "moe_dtype"),
)


def table_version_key(v: str) -> tuple:
    """A table version directory's name (``1.3.0rc20``) as a sortable key: a pre-release sorts
    below its release."""
    parts = re.findall(r"\d+|rc|a|b", v)
    return tuple(int(p) if p.isdigit() else {"a": -3, "b": -2, "rc": -1}[p] for p in parts) + (0,)


def _root() -> Path | None:
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "systems" / "data"


def _version_dir(op_dir: Path, table: str, version: str | None) -> Path | None:
    held = [p for p in op_dir.iterdir() if (p / f"{table}.parquet").is_file()] if op_dir.is_dir() else []
    if version is not None:
        held = [p for p in held if table_version_key(p.name) <= table_version_key(version)]
    return max(held, key=lambda p: table_version_key(p.name)) if held else None


@lru_cache(maxsize=64)
def floors(system: str, framework: str, version: str | None, gemm_dtype: str | None, kv_dtype: str) -> dict[str, int]:
    """The smallest collected value of each size column the target step uses ({} where the
    library or an op's table is absent), for ``gemm_dtype``/``kv_dtype`` where the table holds
    that dtype (else over every dtype it holds)."""
    root = _root()
    if root is None:
        return {}
    # aiconfigurator-core's own dependency, loaded only with its tables (pyarrow alone: pandas would
    # add a third of a second to a plan)
    import pyarrow.compute as pc  # optional: pyarrow
    import pyarrow.parquet as pq  # optional: pyarrow

    out: dict[str, int] = {}
    for op, table, columns, dtype_col in TABLES:
        where = _version_dir(root / system / op / framework, table, version)
        if where is None:
            continue
        data = pq.read_table(where / f"{table}.parquet", columns=[*columns, dtype_col])
        want = gemm_dtype if op == "gemm" else kv_dtype if op == "attention" else None
        mine = data.filter(pc.equal(data[dtype_col], want)) if want is not None else data
        data = mine if mine.num_rows else data
        out.update({name: int(pc.min(data[col]).as_py()) for col, name in columns.items()})
    logger.debug("aiconfigurator-core floors for %s/%s %s: %s", system, framework, version, out)
    return out


def step_sizes(t: TargetShape, tp: int, b: int, width: int, ctx: int) -> dict[str, int]:
    """The smallest size of each kind in one target forward over ``b`` rows x ``width`` tokens:
    the GEMMs' rows (every token), their per-rank widths (the attention projections, a dense
    MLP's up and down), the attention's batch and context, an MoE's tokens."""
    widths = [t.hidden, t.heads * t.head_dim // tp, (t.heads + 2 * t.kv_heads) * t.head_dim // tp]
    if not t.experts:
        widths += [t.intermediate // tp]
    sizes = {
        "GEMM m": b * width,
        "GEMM n": min(widths),
        "GEMM k": min(widths),
        "attention batch": b,
        "attention context": ctx,
    }
    if t.experts:
        sizes["MoE tokens"] = b * width
    return sizes


def below(floor: dict[str, int], t: TargetShape, tp: int, b: int, width: int, ctx: int) -> str | None:
    """Which of the step's sizes lies below the tables' smallest collected one (None: none)."""
    low = [
        f"{name} {v} < {floor[name]}"
        for name, v in step_sizes(t, tp, b, width, ctx).items()
        if name in floor and v < floor[name]
    ]
    return ", ".join(low) or None
