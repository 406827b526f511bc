"""A fuzzing harness over every input surface (issue 27), with hypothesis.

Surfaces: recipe YAML and ``--set``; checkpoint configs, safetensors headers, shard indexes and
tokenizer files (through ``inspect`` of the pair); bundle manifests (``verify``); prompt text and
prompt files (``generate``, ``bench``); calibration reports (``plan --calibration``); and the
embedded server's request bodies (in-process, through FastAPI's TestClient).

Properties. CLI (in-process ``dflash_trt.cli.run``): exit 0, or exit 2 with one line on stderr and
no traceback; nothing in the working directory but the output changes. Server: a 2xx, or a 4xx
whose body is an OpenAI error object; never a 5xx, never a hang (every request has a timeout).

Budgets: ``small`` runs in the default suite; the ``large`` budget is marked slow (ten times more
examples per surface). Both are derandomized: a commit's CI run sees the same examples every time,
so a failure there is reproducible and never a coin toss. ``DFLASH_FUZZ_EXPLORE=1`` draws fresh
random examples instead, for hunting (``python -m pytest -m slow tests/test_fuzz*.py``, repeated):
what it finds goes into ``tests/test_bad_input.py`` as a fixed case.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflash_trt.cli import run
from dflash_trt.ingest import embedded_dir
from dflash_trt.plan import recipe as R

BUDGETS = [pytest.param(6, id="small"), pytest.param(60, id="large", marks=pytest.mark.slow)]

# JSON-ish values, the odd ones a hostile file holds: wrong types, huge / negative / non-finite numbers
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, 1, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["", "auto", "../x", "/etc", "\ud800", "1e999", "nan"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=6,
)


def fuzz(budget: int, strategy, check) -> None:
    """Run ``check`` on ``budget`` examples of ``strategy`` (no example database: nothing written);
    the same examples every run unless ``DFLASH_FUZZ_EXPLORE=1``."""
    explore = os.environ.get("DFLASH_FUZZ_EXPLORE") == "1"

    @settings(
        max_examples=budget,
        deadline=None,
        database=None,
        derandomize=not explore,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def inner(example):
        check(example)

    inner()


def _tree(root: Path, skip: Path | None = None) -> dict[str, bytes | None]:
    out = {}
    for p in sorted(root.rglob("*")):
        if skip is not None and (p == skip or skip in p.parents):
            continue
        out[str(p.relative_to(root))] = p.read_bytes() if p.is_file() and not p.is_symlink() else None
    return out


def cli_ok(argv: list[str], watch: Path, output: Path | None = None, verdicts: tuple[int, ...] = ()) -> int:
    """The CLI property for ``argv``: exit 0 (or one of ``verdicts``: verify's 1 is "checks
    failed"), or exit 2 with one line and no traceback; ``watch`` unchanged outside ``output``."""
    before = _tree(watch, output)
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = run(argv)
    text = err.getvalue().strip()
    assert code in (0, 2, *verdicts), (argv, code, text[-2000:])
    if code == 2:
        assert len(text.splitlines()) == 1 and "Traceback" not in text, (argv, text[-2000:])
    assert _tree(watch, output) == before, argv
    return code


@pytest.fixture
def work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ---- recipes and --set --------------------------------------------------------------------
TINY = yaml.safe_load(R.bundled_recipes()["tiny"].read_text())
KEYS = sorted({f"{s}.{k}" for s, sec in TINY.items() if isinstance(sec, dict) for k in sec} | set(TINY))


@st.composite
def recipe_edits(draw):
    edits = draw(
        st.lists(st.tuples(st.sampled_from(KEYS + ["speculative.per_position_acceptance", "x.y"]), values), max_size=3)
    )
    sets = draw(st.lists(st.tuples(st.sampled_from(KEYS), st.text(max_size=10)), max_size=2))
    return edits, [f"{k}={v}" for k, v in sets]


@pytest.mark.parametrize("budget", BUDGETS)
def test_fuzz_recipes_and_set(work, budget):
    def check(example):
        edits, sets = example
        data = json.loads(json.dumps(TINY))
        for key, value in edits:
            node, *rest = key.split(".")
            if rest and isinstance(data.get(node), dict):
                data[node][rest[0]] = value
            else:
                data[key] = value
        f = work / "r.yaml"
        try:
            f.write_text(yaml.safe_dump(data, allow_unicode=False))
        except (yaml.YAMLError, UnicodeEncodeError):
            return
        cli_ok(["plan", str(f), *[a for s in sets for a in ("--set", s)]], work)

    fuzz(budget, recipe_edits(), check)


@pytest.mark.parametrize("budget", BUDGETS)
def test_fuzz_recipe_bytes(work, budget):
    def check(raw):
        (work / "r.yaml").write_bytes(raw)
        cli_ok(["plan", str(work / "r.yaml")], work)

    base = R.bundled_recipes()["tiny"].read_bytes()
    fuzz(
        budget,
        st.one_of(
            st.binary(max_size=200),
            st.builds(
                lambda i, b: base[:i] + b + base[i:], st.integers(0, len(base)), st.binary(min_size=1, max_size=8)
            ),
        ),
        check,
    )


# ---- checkpoints: configs, safetensors headers, shard indexes, tokenizer files ------------------
@pytest.fixture(scope="module")
def pair_copy(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzzpair")
    for role in ("target", "drafter"):
        shutil.copytree(embedded_dir("tiny") / role, root / role)
    return root


def _inspect_with(pair_copy: Path, work: Path, mutate) -> None:
    with tempfile.TemporaryDirectory(dir=work) as d:
        t, dr = Path(d) / "target", Path(d) / "drafter"
        shutil.copytree(pair_copy / "target", t)
        shutil.copytree(pair_copy / "drafter", dr)
        if mutate(t, dr) is False:
            return
        cli_ok(["inspect", str(dr), "--target", str(t)], work, output=Path(d))


@pytest.mark.parametrize("budget", BUDGETS)
def test_fuzz_checkpoint_configs(work, pair_copy, budget):
    cfg = json.loads((pair_copy / "target" / "config.json").read_text())

    def check(example):
        role, key, value = example

        def mutate(t, d):
            f = (t if role == "target" else d) / "config.json"
            c = json.loads(f.read_text())
            c[key] = value
            f.write_text(json.dumps(c))

        _inspect_with(pair_copy, work, mutate)

    fuzz(budget, st.tuples(st.sampled_from(["target", "drafter"]), st.sampled_from(sorted(cfg)), values), check)


@pytest.mark.parametrize("budget", BUDGETS)
def test_fuzz_safetensors_headers_and_indexes(work, pair_copy, budget):
    def check(example):
        kind, blob = example

        def mutate(t, d):
            f = t / "model.safetensors"
            data = f.read_bytes()
            (n,) = struct.unpack("<Q", data[:8])
            if kind == "header":
                raw = json.dumps(blob).encode() if not isinstance(blob, bytes) else blob
                f.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n :])
            elif kind == "length":
                f.write_bytes(struct.pack("<Q", blob if isinstance(blob, int) and 0 <= blob < 2**64 else 7) + data[8:])
            else:  # a shard index beside the shard
                f.rename(t / "model-00001-of-00001.safetensors")
                (t / "model.safetensors.index.json").write_text(json.dumps(blob))

        _inspect_with(pair_copy, work, mutate)

    fuzz(
        budget,
        st.one_of(
            st.tuples(st.just("header"), st.one_of(values, st.binary(max_size=40))),
            st.tuples(st.just("length"), st.integers(0, 2**64 - 1)),
            st.tuples(
                st.just("index"),
                st.one_of(
                    values,
                    st.fixed_dictionaries({"weight_map": st.dictionaries(st.text(max_size=20), values, max_size=3)}),
                ),
            ),
        ),
        check,
    )


@pytest.mark.parametrize("budget", BUDGETS)
def test_fuzz_tokenizer_files(work, pair_copy, budget):
    tok = json.loads((pair_copy / "target" / "tokenizer.json").read_text())

    def check(example):
        name, blob = example

        def mutate(t, d):
            f = t / name
            if isinstance(blob, bytes):
                f.write_bytes(blob)
            elif name == "tokenizer.json" and isinstance(blob, tuple):  # one key of the real file replaced
                f.write_text(json.dumps({**tok, blob[0]: blob[1]}))
            else:
                f.write_text(json.dumps(blob))

        _inspect_with(pair_copy, work, mutate)

    fuzz(
        budget,
        st.tuples(
            st.sampled_from(["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]),
            st.one_of(st.binary(max_size=60), values, st.tuples(st.sampled_from(sorted(tok)), values)),
        ),
        check,
    )


# ---- bundle manifests, prompts, calibration reports --------------------------------------------
@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("fuzzbundle") / "b"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert run(["build", "-o", str(out)]) == 0
    return out


@pytest.mark.parametrize("budget", BUDGETS)
def test_fuzz_manifests(work, built, budget):
    manifest = json.loads((built / "manifest.json").read_text())

    def check(example):
        key, value = example
        b = work / "b"
        shutil.rmtree(b, ignore_errors=True)
        shutil.copytree(built, b)
        (b / "manifest.json").write_text(json.dumps({**manifest, key: value}) if key else json.dumps(value))
        cli_ok(["verify", str(b)], work, verdicts=(1,))

    fuzz(budget, st.tuples(st.one_of(st.none(), st.sampled_from(sorted(manifest))), values), check)


@pytest.mark.parametrize("budget", BUDGETS)
def test_fuzz_prompt_text(work, budget):
    def check(prompt):
        cli_ok(["generate", "-p", prompt, "-n", "2"], work)

    fuzz(budget, st.one_of(st.text(max_size=40), st.sampled_from(["", "\ud800", "\x00", "word " * 3000])), check)


@pytest.mark.parametrize("budget", BUDGETS)
def test_fuzz_prompt_files(work, budget):
    def check(raw):
        (work / "p.txt").write_bytes(raw)
        cli_ok(["bench", "--prompts", str(work / "p.txt"), "-n", "2"], work)

    line = st.one_of(st.binary(max_size=30), st.builds(lambda v: json.dumps({"prompt": v}).encode(), values))
    fuzz(budget, st.lists(line, max_size=3).map(lambda ls: b"\n".join(ls)), check)


@pytest.mark.parametrize("budget", BUDGETS)
def test_fuzz_calibration_reports(work, budget):
    level = st.fixed_dictionaries(
        {},
        optional={
            k: values
            for k in ("concurrency", "draft_len", "tokens_per_second_per_user", "acceptance_length", "ttft_ms")
        },
    )

    def check(report):
        f = work / "c.json"
        f.write_text(json.dumps(report)) if not isinstance(report, bytes) else f.write_bytes(report)
        cli_ok(["plan", "--calibration", str(f)], work)

    fuzz(
        budget,
        st.one_of(
            values,
            st.binary(max_size=40),
            st.fixed_dictionaries(
                {"endpoint": st.fixed_dictionaries({"levels": st.lists(level, max_size=3)})},
                optional={"baseline": st.fixed_dictionaries({"levels": st.lists(level, max_size=2)})},
            ),
        ),
        check,
    )


# ---- the server's request bodies ----------------------------------------------------------------
@pytest.fixture(scope="module")
def client():
    from fastapi.testclient import TestClient

    from dflash_trt.runtime.pair import load_pair
    from dflash_trt.serve.app import create_app

    pair = load_pair("embedded:tiny/target", "embedded:tiny/drafter")
    app = create_app(pair, "tiny", max_batch=4, max_model_len=48)  # a small context bounds every request
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


FIELDS = [
    "model",
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "n",
    "stop",
    "stream",
    "stream_options",
    "ignore_eos",
    "echo",
    "logprobs",
    "best_of",
    "return_token_ids",
    "add_generation_prompt",
]
sane = {
    "prompt": st.one_of(st.text(max_size=20), st.lists(st.integers(-2, 600), max_size=4)),
    "messages": st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "system", "x"]), "content": st.one_of(st.text(max_size=20), values)}
        ),
        max_size=2,
    ),
    "max_tokens": st.integers(-2, 60),
    "temperature": st.floats(-1, 3),
    "top_p": st.floats(-0.5, 1.5),
    "top_k": st.integers(-3, 1000),
    "stream": st.booleans(),
}
bodies = st.tuples(
    st.fixed_dictionaries({}, optional=sane), st.dictionaries(st.sampled_from(FIELDS), values, max_size=4)
).map(lambda p: {**p[0], **p[1]})


@pytest.mark.parametrize("budget", BUDGETS)
def test_fuzz_request_bodies(client, budget):
    def check(example):
        path, body, raw, ctype = example
        content = raw if raw is not None else json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")
        r = client.post(path, content=content, headers={"content-type": ctype})
        assert r.status_code < 500, (body, raw, r.status_code, r.text[:300])
        if r.status_code >= 400:
            err = r.json()["error"]
            assert err["message"] and err["type"], r.text
        elif not (body or {}).get("stream"):
            assert r.json()["choices"], r.text

    fuzz(
        budget,
        st.tuples(
            st.sampled_from(["/v1/completions", "/v1/chat/completions"]),
            bodies,
            st.one_of(st.none(), st.none(), st.binary(max_size=30)),
            st.sampled_from(["application/json", "application/json", "text/plain"]),
        ),
        check,
    )
