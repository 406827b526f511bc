"""Hub ids resolve through huggingface_hub's cache, offline; only safe file types are requested.

No test touches the network: HF_HUB_OFFLINE=1 with a temporary cache, or a stand-in for
``snapshot_download`` that records what it was asked.
"""

from __future__ import annotations

import fnmatch
import shutil

import pytest

from dflash_trt import ingest
from dflash_trt.cli import run
from dflash_trt.errors import CheckpointError
from dflash_trt.ingest import hub

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return cache


def _cache_repo(cache, repo_id: str, src, ref: str = "main"):
    """The hub cache layout: models--org--name/{refs/main, snapshots/<commit>/...}."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / ref).write_text(COMMIT)
    shutil.copytree(src, repo / "snapshots" / COMMIT)
    return repo / "snapshots" / COMMIT


@pytest.mark.parametrize(
    "ref,want",
    [
        ("z-lab/Qwen3-8B-DFlash-b16", ("z-lab/Qwen3-8B-DFlash-b16", None)),
        ("Qwen/Qwen3-8B@main", ("Qwen/Qwen3-8B", "main")),
        ("org/name@" + COMMIT, ("org/name", COMMIT)),
        ("/abs/path", None),
        ("./rel/dir", None),
        ("~/models/x", None),
        ("a/b/c", None),
        ("plain", None),
    ],
)
def test_parse_hub_id(ref, want):
    assert hub.parse_hub_id(ref) == want


def test_offline_with_nothing_cached_is_one_clear_line(offline_cache, capsys):
    with pytest.raises(CheckpointError, match="not in the local Hugging Face cache and HF_HUB_OFFLINE is set"):
        ingest.resolve("z-lab/Qwen3-8B-DFlash-b16", role="drafter")
    assert run(["inspect", "z-lab/Qwen3-8B-DFlash-b16"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "HF_HUB_OFFLINE" in err and "Traceback" not in err


def test_cached_snapshots_resolve_offline_by_ref_and_commit(offline_cache, tiny_pair_dir, capsys):
    tdir, ddir = tiny_pair_dir
    t = _cache_repo(offline_cache, "acme/tiny-target", tdir)
    d = _cache_repo(offline_cache, "acme/tiny-drafter", ddir)
    assert ingest.resolve("acme/tiny-target", role="target") == t
    assert ingest.resolve(f"acme/tiny-drafter@{COMMIT}", role="drafter") == d
    assert ingest.resolve("acme/tiny-drafter", role="drafter", revision=COMMIT) == d
    assert ingest.validate_pair(t, d).ok
    assert run(["inspect", "acme/tiny-drafter", "--target", "acme/tiny-target", "--json"]) == 0
    assert '"ok": true' in capsys.readouterr().out
    with pytest.raises(CheckpointError, match="not in the local Hugging Face cache"):
        ingest.resolve("acme/tiny-drafter@v2", role="drafter")


def test_local_directory_wins_over_a_hub_id(tmp_path, monkeypatch, tiny_pair_dir):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_pair_dir[1], tmp_path / "org" / "drafter")
    assert ingest.resolve("org/drafter", role="drafter").resolve() == (tmp_path / "org" / "drafter").resolve()
    # a mistyped local path (its parent exists) is not sent to the hub
    with pytest.raises(CheckpointError, match="no such directory"):
        ingest.resolve("org/drafterr", role="drafter")


class Recorder:
    def __init__(self, result=None, error=None):
        self.calls, self.result, self.error = [], result, error

    def __call__(self, repo_id, **kw):
        self.calls.append((repo_id, kw))
        if self.error is not None:
            raise self.error
        return str(self.result)


def test_only_configs_tokenizers_and_safetensors_are_requested(monkeypatch, tmp_path, tiny_pair_dir):
    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    rec = Recorder(result=tiny_pair_dir[0])
    monkeypatch.setattr(huggingface_hub, "snapshot_download", rec)
    assert ingest.resolve("Qwen/Qwen3-8B@abc", role="target") == tiny_pair_dir[0]
    repo_id, kw = rec.calls[0]
    assert repo_id == "Qwen/Qwen3-8B" and kw["revision"] == "abc" and kw["local_files_only"] is False

    def fetched(name):
        allowed = any(fnmatch.fnmatch(name, p) for p in kw["allow_patterns"])
        return allowed and not any(fnmatch.fnmatch(name, p) for p in kw["ignore_patterns"])

    wanted = [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "model-00001-of-00004.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "tokenizer.model",
        "merges.txt",
        "vocab.json",
        "special_tokens_map.json",
        "chat_template.jinja",
        "hf_quant_config.json",
        "o200k_base.tiktoken",
    ]
    refused = [
        "pytorch_model.bin",
        "pytorch_model-00001-of-00002.bin",
        "model.pt",
        "consolidated.pth",
        "modeling_qwen.py",
        "configuration_x.py",
        "flax_model.msgpack",
        "tf_model.h5",
        "model.gguf",
        "training_args.bin",
        "optimizer.pt",
        "original/consolidated.00.pth",
    ]
    assert all(fetched(n) for n in wanted), [n for n in wanted if not fetched(n)]
    assert not any(fetched(n) for n in refused), [n for n in refused if fetched(n)]


def _http_error(cls, status, msg):
    try:  # huggingface_hub >= 1.0 raises on httpx(2) responses
        import httpx2 as httpx
    except ImportError:
        httpx = pytest.importorskip("httpx")
    response = httpx.Response(status, request=httpx.Request("GET", "https://huggingface.co/api/models/x/y"))
    return cls(msg, response=response)


@pytest.mark.parametrize(
    "make,needle",
    [
        (
            lambda e: _http_error(e.GatedRepoError, 403, "gated"),
            "gated repository; accept its terms at https://huggingface.co/org/model and set HF_TOKEN",
        ),
        (lambda e: _http_error(e.RepositoryNotFoundError, 404, "nope"), "no such repository"),
        (lambda e: _http_error(e.RevisionNotFoundError, 404, "rev"), "revision 'v9' does not exist"),
        (lambda e: _http_error(e.HfHubHTTPError, 401, "unauthorized"), "check HF_TOKEN"),
        (lambda e: ConnectionError("Name or service not known"), "HF_HUB_OFFLINE=1"),
    ],
)
def test_hub_errors_become_one_line(monkeypatch, make, needle, capsys):
    import huggingface_hub
    from huggingface_hub import errors

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", Recorder(error=make(errors)))
    with pytest.raises(CheckpointError, match=needle):
        ingest.resolve("org/model@v9", role="target")
    assert run(["inspect", "org/model@v9"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle.split("'")[0] in err


def test_a_download_the_disk_cannot_hold_is_refused_before_it_starts(monkeypatch, tmp_path, capsys):
    import shutil

    import huggingface_hub
    from huggingface_hub import errors

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    calls = []

    def snapshot(repo_id, **kw):
        calls.append(kw["local_files_only"])
        raise errors.LocalEntryNotFoundError("not cached")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(100 << 30, 99 << 30, 1 << 30))
    with pytest.raises(CheckpointError, match=r"needs 554\.3 GiB of disk, 1\.0 GiB free"):
        ingest.resolve("moonshotai/Kimi-K2.5", role="target", expected_bytes=int(554.3 * (1 << 30)))
    assert calls == [True]  # only the cache was asked; nothing was fetched


def test_an_unreachable_hub_goes_straight_to_the_cache(monkeypatch, tmp_path, capsys):
    """No network and no HF_HUB_OFFLINE: the probe sends huggingface_hub to the cache at once
    (instead of ~25 s of retries), and the line says the hub is unreachable."""
    import huggingface_hub
    from huggingface_hub import errors

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(hub, "reachable", lambda: False)
    rec = Recorder(error=errors.LocalEntryNotFoundError("not cached"))
    monkeypatch.setattr(huggingface_hub, "snapshot_download", rec)
    with pytest.raises(CheckpointError, match=r"is unreachable; download it once"):
        ingest.resolve("org/model", role="target")
    assert rec.calls[0][1]["local_files_only"] is True


def test_the_probe_connects_to_the_endpoint_and_trusts_a_proxy(hub_answers, monkeypatch):
    import socket

    from huggingface_hub import constants

    for var in hub._PROXY_VARS:
        monkeypatch.delenv(var, raising=False)
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    hub_answers.cache_clear()
    assert hub_answers() is True
    server.close()
    hub_answers.cache_clear()
    assert hub_answers() is False  # nothing listens there now
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    hub_answers.cache_clear()
    assert hub_answers() is True  # behind a proxy the endpoint is not probed
    hub_answers.cache_clear()
