"""A bug is not the user's error (issue 48): an internal failure injected into a command prints one
line saying it is a bug and where its full traceback was written (outside the working and output
directories), and exits 1; a user error stays one line and exit 2."""

from __future__ import annotations

import pytest

from dflash_trt.cli import run
from dflash_trt.errors import DFlashError


def _boom(*_a, **_k):
    raise KeyError("an internal invariant")


def test_an_internal_failure_is_one_line_naming_its_traceback_file(monkeypatch, capsys, tmp_path):
    from dflash_trt import plan

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(plan, "bundled_recipes", _boom)
    assert run(["recipes", "list"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("internal error (a bug in dflash-trt"), err
    path = err.split("the traceback is in ")[1].split(";")[0]
    text = open(path).read()
    assert "Traceback (most recent call last)" in text and "_boom" in text and "KeyError" in text
    assert not list(tmp_path.iterdir())  # nothing written where the user works


@pytest.mark.parametrize("how", ["flag", "env"])
def test_debug_prints_the_traceback_too(how, monkeypatch, capsys, tmp_path):
    """``--debug`` (or ``DFLASH_DEBUG=1``): the full traceback on stderr, above the same last line
    naming its file; without it, the one line alone (the test above)."""
    from dflash_trt import plan

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(plan, "bundled_recipes", _boom)
    if how == "env":
        monkeypatch.setenv("DFLASH_DEBUG", "1")
    assert run(["--debug", "recipes", "list"] if how == "flag" else ["recipes", "list"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == "Traceback (most recent call last):" and any("_boom" in line for line in err), err
    assert "KeyError: 'an internal invariant'" in err[-2]
    assert err[-1].startswith("internal error (a bug in dflash-trt") and "the traceback is in " in err[-1]


def test_a_user_error_stays_exit_2(monkeypatch, capsys):
    from dflash_trt import plan

    def refuse(*_a, **_k):
        raise DFlashError("a recipe the user can fix")

    monkeypatch.setattr(plan, "bundled_recipes", refuse)
    assert run(["recipes", "list"]) == 2
    assert capsys.readouterr().err.strip() == "error: a recipe the user can fix"


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_logs_keep_the_traceback_in_either_format(fmt, capsys):
    import json
    import logging

    from dflash_trt.logs import configure

    handler = configure("info", fmt)
    try:
        try:
            _boom()
        except KeyError:
            logging.getLogger("dflash_trt.serve.continuous").exception("request 7 failed (step)")
    finally:
        for name in ("dflash_trt", "uvicorn", "uvicorn.error", "uvicorn.access"):
            logging.getLogger(name).handlers = [h for h in logging.getLogger(name).handlers if h is not handler]
            logging.getLogger(name).propagate = True
    err = capsys.readouterr().err
    if fmt == "json":
        rec = json.loads(err)  # one record, one line: the traceback is a field
        assert rec["level"] == "error" and rec["message"] == "request 7 failed (step)" and "_boom" in rec["traceback"]
    else:
        assert "request 7 failed (step)" in err and "Traceback" in err and "_boom" in err
