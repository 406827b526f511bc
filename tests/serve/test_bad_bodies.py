"""Every malformed body gets an OpenAI error object (4xx) and is counted in
``dflash_requests_total{status}`` (issue 27): wrong content type, bytes that are not JSON or not
UTF-8, a body that is not an object, wrong types, values out of range, non-finite numbers, text
the tokenizer cannot encode (before: a plain-text 500, uncounted)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from dflash_trt.runtime.pair import load_bundle
from dflash_trt.serve.app import create_app
from tests.serve.test_app import metric

BAD = [
    ("text/plain", b'{"prompt": "hi"}'),
    ("application/json", b"not json"),
    ("application/json", b"\xff\xfe"),
    ("application/json", b""),
    ("application/json", b"[1, 2]"),
    ("application/json", b'"x"'),
    ("application/json", b'{"prompt": "hi", "max_tokens": 1e999}'),
    ("application/json", b'{"prompt": "hi", "temperature": NaN}'),
    ("application/json", b'{"prompt": "hi", "top_p": 0}'),
    ("application/json", b'{"prompt": "hi", "top_k": -2}'),
    ("application/json", b'{"prompt": [-1]}'),
    ("application/json", b'{"prompt": "hi", "max_tokens": 99999999}'),
    ("application/json", b'{"prompt": "\\ud800"}'),
    ("application/json", b'{"prompt": {"a": 1}}'),
    ("application/json", b'{"prompt": "hi", "stream_options": [1]}'),
]


@pytest.fixture(scope="module")
def client(bundle_dir):
    app = create_app(load_bundle(bundle_dir), "tiny", max_batch=2)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def test_every_bad_body_is_an_openai_4xx_and_counted(client):
    before = metric(client.get("/metrics").text, "dflash_requests_total", status="400")
    for ctype, body in BAD:
        r = client.post("/v1/completions", content=body, headers={"content-type": ctype})
        assert 400 <= r.status_code < 500, (body, r.status_code, r.text)
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["message"], (body, r.text)
    after = metric(client.get("/metrics").text, "dflash_requests_total", status="400")
    assert after - before == len(BAD)
