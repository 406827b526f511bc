"""The tokenizer check passes every valid kind and refuses only a broken one (issue 41): byte-level
BPE, SentencePiece with and without byte fallback, word-level and a normalising WordPiece, each a
real tokenizer trained here (``tests.tokenizer_kinds``), through the probe, ``inspect``, ``build``
(``--dry-run`` and a written bundle), ``generate`` and the server's door (a built bundle loaded
and answering a completion)."""

from __future__ import annotations

import json
import shutil

import pytest

from dflash_trt import ingest
from dflash_trt.cli import run
from dflash_trt.errors import CheckpointError, CompatibilityError
from dflash_trt.ingest.tokenizer import probe, probe_light
from tests.tokenizer_kinds import BROKEN, VALID, fast, save_kind_pair


@pytest.fixture(scope="module", params=list(VALID))
def kind_pair(request, tmp_path_factory):
    return request.param, save_kind_pair(tmp_path_factory.mktemp("kind"), VALID[request.param])


@pytest.fixture(scope="module", params=list(BROKEN))
def broken_pair(request, tmp_path_factory):
    build, needle = BROKEN[request.param]
    return needle, save_kind_pair(tmp_path_factory.mktemp("broken"), build)


def _one_line(capsys, code) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("name", list(VALID))
def test_every_valid_kind_passes_both_probes(name, tmp_path):
    tok = fast(VALID[name]())
    tok.save_pretrained(tmp_path)
    vocab = max(tok.get_vocab().values()) + 1
    assert probe(tmp_path, vocab) is None
    assert probe_light(tmp_path, vocab) is None


def test_the_normalising_kind_is_one_the_old_sentence_probe_refused(tmp_path):
    """What the issue reported: a lower-casing tokenizer does not give an English sentence back."""
    tok = fast(VALID["normalising WordPiece"]())
    sentence = "Hello, world!\ndef f(x):"
    assert tok.decode(tok(sentence, add_special_tokens=False)["input_ids"]) != sentence


@pytest.mark.parametrize("name", list(BROKEN))
def test_a_broken_decoder_is_refused_by_both_probes(name, tmp_path):
    build, needle = BROKEN[name]
    tok = fast(build())
    tok.save_pretrained(tmp_path)
    vocab = max(tok.get_vocab().values()) + 1
    assert needle in (probe(tmp_path, vocab) or "")
    assert needle in (probe_light(tmp_path, vocab) or "")


def test_an_id_outside_the_targets_vocabulary_is_refused(tmp_path):
    tok = fast(VALID["byte-level BPE"]())
    tok.save_pretrained(tmp_path)
    vocab = max(tok.get_vocab().values())  # one row short: <mask> has no embedding row
    for why in (probe(tmp_path, vocab), probe_light(tmp_path, vocab)):
        assert why and "'<mask>' has id" in why and f"vocabulary of {vocab}" in why


def test_valid_kinds_pass_inspect_build_generate(kind_pair, tmp_path, capsys):
    name, (t, d) = kind_pair
    assert run(["inspect", str(d), "--target", str(t)]) == 0, capsys.readouterr().err
    assert run(["build", "-t", str(t), "-d", str(d), "--gpu", "cpu", "--dry-run"]) == 0, capsys.readouterr().err
    assert run(["generate", "-t", str(t), "-d", str(d), "-p", "the quick brown fox", "-n", "6"]) == 0, (
        capsys.readouterr().err
    )
    assert run(["build", "-t", str(t), "-d", str(d), "--gpu", "cpu", "-o", str(tmp_path / "b")]) == 0, (
        capsys.readouterr().err
    )


def test_valid_kinds_pass_the_servers_door(kind_pair, tmp_path, capsys):
    from fastapi.testclient import TestClient

    from dflash_trt.runtime.pair import load_bundle
    from dflash_trt.serve.app import create_app

    name, (t, d) = kind_pair
    assert run(["build", "-t", str(t), "-d", str(d), "--gpu", "cpu", "-o", str(tmp_path / "b")]) == 0, (
        capsys.readouterr().err
    )
    pair = load_bundle(tmp_path / "b")
    with TestClient(create_app(pair, name, max_batch=2, max_model_len=64)) as client:
        r = client.post("/v1/completions", json={"prompt": "the quick brown fox", "max_tokens": 4})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] > 0


def test_broken_kinds_are_refused_at_every_door(broken_pair, tmp_path, capsys):
    from dflash_trt.runtime.pair import load_bundle

    needle, (t, d) = broken_pair
    for argv in (
        ["inspect", str(d), "--target", str(t)],
        ["build", "-t", str(t), "-d", str(d), "--gpu", "cpu", "--dry-run"],
        ["build", "-t", str(t), "-d", str(d), "--gpu", "cpu", "-o", str(tmp_path / "b")],
        ["generate", "-t", str(t), "-d", str(d), "-p", "the quick brown fox", "-n", "6"],
    ):
        assert needle in _one_line(capsys, run(argv)), argv
    assert not (tmp_path / "b").exists()
    # the server's door: a bundle whose tokenizer was swapped for the broken one after it was built
    good = save_kind_pair(tmp_path / "good", VALID["byte-level BPE"])
    assert run(["build", "-t", str(good[0]), "-d", str(good[1]), "--gpu", "cpu", "-o", str(tmp_path / "g")]) == 0
    bundle_target = tmp_path / "g" / "target"
    for f in t.glob("tokenizer*"):
        shutil.copy(f, bundle_target / f.name)
    with pytest.raises(CheckpointError, match="sha256 differs from the manifest"):  # the load check sees it first
        load_bundle(tmp_path / "g")
    manifest = json.loads((tmp_path / "g" / "manifest.json").read_text())  # a swap that rewrote the hashes too
    manifest["files"] = ingest.bundle_hashes(tmp_path / "g")
    (tmp_path / "g" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CompatibilityError, match=needle):
        load_bundle(tmp_path / "g")
