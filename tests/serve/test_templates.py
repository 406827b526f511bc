"""Chat templates are bounded (issue 40): a template that loops or explodes in size renders in a
child process, is answered with an OpenAI 400 past its time or size limit, and the requests
beside it are served as if it were not there; SIGTERM stops the server whatever a template does."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import threading
import time

import httpx
import pytest

from dflash_trt.serve.app import ServerThread, create_app
from dflash_trt.serve.protocol import APIError
from dflash_trt.serve.render import ChatRenderer
from tests.serve.helpers import CHAT_TEMPLATE

FOREVER = "{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}"
TWENTYFOLD = "{% for i in range(2000) %}{{ messages[0]['content'] }}{% endfor %}"  # 2000 x the text
BOUNDLESS = (
    "{% for i in range(100000) %}{% for j in range(100000) %}{{ messages[0]['content'] * 1000 }}"
    "{% endfor %}{% endfor %}"
)
HOSTILE = (
    "{% set c = messages[0]['content'] %}"
    f"{{% if c == 'loop' %}}{FOREVER}{{% elif c.startswith('big') %}}{TWENTYFOLD}"
    f"{{% elif c.startswith('boundless') %}}{BOUNDLESS}{{% endif %}}" + CHAT_TEMPLATE
)


def _chat(url: str, content: str, timeout: float = 60) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions",
        timeout=timeout,
        json={"messages": [{"role": "user", "content": content}], "max_tokens": 2, "temperature": 0},
    )


@pytest.fixture(scope="module")
def hostile_pair(bundle_dir):
    import copy

    from dflash_trt.runtime.pair import load_bundle

    pair = load_bundle(bundle_dir)
    tok = copy.deepcopy(pair.tokenizer)
    tok.chat_template = HOSTILE
    return dataclasses.replace(pair, tokenizer=tok)


def test_templates_that_loop_or_explode_get_a_400_beside_ordinary_requests(hostile_pair):
    app = create_app(hostile_pair, "tiny", template_timeout_s=4.0, template_max_chars=100_000)
    done: list[str] = []
    out: dict[str, httpx.Response] = {}

    def send(name: str, call) -> None:
        out[name] = call()
        done.append(name)

    with ServerThread(app) as srv:
        calls = {
            "loop": lambda: _chat(srv.url, "loop"),
            "big": lambda: _chat(srv.url, "big" + "x" * 100),
            "chat": lambda: _chat(srv.url, "hello"),
            **{
                f"completion{i}": (
                    lambda: httpx.post(
                        f"{srv.url}/v1/completions",
                        timeout=60,
                        json={"prompt": "def f", "max_tokens": 2, "temperature": 0},
                    )
                )
                for i in range(2)
            },
        }
        threads = [threading.Thread(target=send, args=item) for item in calls.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        after = _chat(srv.url, "hello again")  # the looping render's child was replaced
        health = httpx.get(f"{srv.url}/health", timeout=10)
    loop, big = out["loop"].json()["error"], out["big"].json()["error"]
    assert out["loop"].status_code == 400 and loop["code"] == "template_timeout", loop
    assert out["big"].status_code == 400 and big["code"] == "template_too_large", big
    assert f"({2000 * 103 + len('<user>' + 'big' + 'x' * 100 + chr(10) + '<assistant>')} characters)" in big["message"]
    for name in ("chat", "completion0", "completion1"):
        assert out[name].status_code == 200, out[name].text
    assert done[-1] == "loop", done  # everything else was answered while the template looped
    assert after.status_code == 200 and health.status_code == 200


def test_a_template_without_bound_stops_at_the_childs_memory_cap(hostile_pair):
    """A text that grows without end fails in the child (its address space is capped), 400, before
    any time limit; the next render gets a fresh child."""
    renderer = ChatRenderer(hostile_pair.tokenizer, workers=1, timeout_s=60, memory_bytes=64 << 20)
    renderer.start()

    async def both():
        with pytest.raises(APIError) as exc:
            await renderer.render([{"role": "user", "content": "boundless"}], True)
        return exc.value, await renderer.render([{"role": "user", "content": "hi"}], True)

    try:
        t0 = time.monotonic()
        err, text = asyncio.run(both())
    finally:
        renderer.close()
    assert err.status == 400 and err.code == "template_too_large", err.message
    assert time.monotonic() - t0 < 60
    assert text == "<user>hi\n<assistant>"


def test_the_child_renders_what_apply_chat_template_renders(bundle_dir):
    """The same text as the tokenizer's own apply_chat_template, special tokens included."""
    from dflash_trt.runtime.pair import load_bundle

    tok = load_bundle(bundle_dir).tokenizer
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi ünïcode"}]
    renderer = ChatRenderer(tok, workers=1)
    renderer.start()
    try:
        for gen in (True, False):
            assert asyncio.run(renderer.render(msgs, gen)) == tok.apply_chat_template(
                msgs, add_generation_prompt=gen, tokenize=False
            )
    finally:
        renderer.close()


@pytest.mark.slow  # a server subprocess (~15 s)
def test_sigterm_stops_the_server_while_a_template_loops(tmp_path):
    """A render that would run for a minute does not hold a SIGTERM'd server past its drain."""
    from transformers import AutoTokenizer

    from tests.serve.helpers import make_bundle, served

    bundle = make_bundle(tmp_path / "hostile")
    tok = AutoTokenizer.from_pretrained(bundle / "target")
    tok.chat_template = HOSTILE
    tok.save_pretrained(bundle / "target")
    with served(bundle, "--template-timeout", "60", "--drain-timeout", "1") as (proc, url):
        out: dict = {}
        t = threading.Thread(target=lambda: out.update(r=_chat(url, "loop", timeout=120)))
        t.start()
        time.sleep(2)  # the render is under way
        assert _chat(url, "hello").status_code == 200 and "r" not in out
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
        t.join(30)
        elapsed = time.monotonic() - t0
    assert code == 0 and elapsed < 15, (code, elapsed)
