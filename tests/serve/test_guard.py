"""The embedded server's front door (issue 16): API key, body limit, OpenAI error objects for
unknown routes and methods, and odd-but-valid sampling values that must not become a 500."""

from __future__ import annotations

import pytest

fastapi = pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from dflash_trt.serve.app import create_app  # noqa: E402
from tests.helpers import OracleDrafter  # noqa: E402,F401


@pytest.fixture(scope="module")
def pair(tiny_pair_dir):
    from dflash_trt.runtime import load_pair

    t, d = tiny_pair_dir
    return load_pair(t, d)


def _error(r, status):
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def test_api_key(pair):
    with TestClient(create_app(pair, "m", api_key="s3cret")) as c:
        assert c.get("/health").status_code == 200  # probes need no key
        assert _error(c.get("/v1/models"), 401)["code"] == "invalid_api_key"
        assert (
            _error(
                c.post(
                    "/v1/completions", json={"prompt": "a", "max_tokens": 1}, headers={"Authorization": "Bearer wrong"}
                ),
                401,
            )["code"]
            == "invalid_api_key"
        )
        ok = c.post(
            "/v1/completions", json={"prompt": "a", "max_tokens": 1}, headers={"Authorization": "Bearer s3cret"}
        )
        assert ok.status_code == 200, ok.text
        assert c.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200


def test_body_limit_and_routes_answer_openai_errors(pair):
    with TestClient(create_app(pair, "m", max_body_bytes=2048)) as c:
        big = {"prompt": "x" * 5000, "max_tokens": 1}
        assert _error(c.post("/v1/completions", json=big), 413)["code"] == "request_too_large"
        assert _error(c.get("/nowhere"), 404)["type"] == "NotFoundError"
        assert _error(c.get("/v1/completions"), 405)
        assert _error(
            c.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"}), 400
        )
        assert _error(c.post("/v1/completions", json={"prompt": {"nested": ["x"]}}), 400)
        assert c.get("/health").status_code == 200


@pytest.mark.parametrize(
    "extra",
    [
        {"temperature": 1e-30},
        {"temperature": 1e-30, "top_p": 1e-9},
        {"seed": 2**70},
        {"seed": -(2**70)},
        {"temperature": 2.0, "seed": 2**63},
    ],
)
def test_odd_sampling_values_are_answered_never_500(pair, extra):
    with TestClient(create_app(pair, "m")) as c:
        r = c.post("/v1/completions", json={"prompt": "def f", "max_tokens": 3, **extra})
        assert r.status_code in (200, 400), r.text
        if r.status_code == 400:
            _error(r, 400)


def test_health_answers_while_a_large_body_is_being_tokenised(pair, monkeypatch):
    """An ordering, not a time limit: the tokeniser is held until /health has answered; were it run
    on the event loop, /health could not answer and its request would fail."""
    import threading

    import httpx

    from dflash_trt.serve.app import ServerThread

    started, release = threading.Event(), threading.Event()
    real = type(pair).encode  # a pair is frozen: hold its class's tokeniser

    def held_encode(self, text, chat=False):
        started.set()
        release.wait(30)
        return real(self, text, chat=chat)

    monkeypatch.setattr(type(pair), "encode", held_encode)
    app = create_app(pair, "m", max_body_bytes=8 << 20)
    result: dict = {}
    with ServerThread(app) as srv:
        big = {"prompt": "def f(x):\n    return x\n" * 50_000, "max_tokens": 1}  # about 1.2 MB
        t = threading.Thread(
            target=lambda: result.update(r=httpx.post(f"{srv.url}/v1/completions", json=big, timeout=60))
        )
        t.start()
        assert started.wait(30), "the large request never reached the tokeniser"
        try:
            health = httpx.get(f"{srv.url}/health", timeout=10)
        finally:
            release.set()
        t.join(60)
    assert health.status_code == 200
    assert result["r"].status_code in (200, 400)  # 400: longer than the context, still answered


def test_max_queue_zero_still_serves_an_idle_server(pair):
    """--max-queue 0 means no waiting room, not no service: an idle server admits into the batch."""
    with TestClient(create_app(pair, "m", max_queue=0)) as c:
        for _ in range(3):
            r = c.post("/v1/completions", json={"prompt": "def f", "max_tokens": 2, "temperature": 0})
            assert r.status_code == 200, r.text


def test_head_health_answers_like_get(pair):
    """Load balancers probe with HEAD: the same status as GET, no key needed, no body."""
    from dflash_trt.serve.app import ServerThread

    app = create_app(pair, "m", api_key="s3cret")
    with ServerThread(app) as srv:
        import httpx

        get, head = httpx.get(f"{srv.url}/health", timeout=10), httpx.head(f"{srv.url}/health", timeout=10)
        assert get.status_code == head.status_code == 200 and head.content == b""
        app.state.drain()
        assert httpx.head(f"{srv.url}/health", timeout=10).status_code == 503  # draining, as GET says
        assert httpx.head(f"{srv.url}/v1/models", timeout=10).status_code == 401  # only /health is open


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m" * 1_000_000, "prompt": "a"},  # an unknown model's name
        {"prompt": "a", "x" * 1_000_000: 1},  # an unknown field's name
        {"messages": [{"role": "r" * 1_000_000, "content": "hi"}]},  # a role
        {"prompt": "a", "logit_bias": {str(i): 1 for i in range(100_000)}},  # an unsupported value
    ],
)
def test_error_bodies_quote_a_bounded_prefix_of_any_value(pair, body):
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    with TestClient(create_app(pair, "m", max_body_bytes=8 << 20)) as c:
        r = c.post(path, json=body)
    err = _error(r, 404 if "model" in body else 400)
    assert len(r.content) < 2000, (len(r.content), err["message"][:200])
    assert "characters)" in err["message"] + (err["param"] or "")
