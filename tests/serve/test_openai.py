"""The embedded server against the OpenAI Python client on 127.0.0.1: stop sequences (streamed and
not, across a speculative round's and a stream chunk's boundary), and every field honoured or
refused by name."""

from __future__ import annotations

import httpx
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dflash_trt.runtime.pair import Pair, load_bundle
from dflash_trt.serve.app import ServerThread, create_app
from dflash_trt.serve.stops import TextStream, held_back
from tests.helpers import OracleDrafter, hf_greedy

openai = pytest.importorskip("openai")

PROMPT, N = "def stop_me(x", 24


@pytest.fixture(scope="module")
def pair(bundle_dir):
    return load_bundle(bundle_dir, dtype="float64")


@pytest.fixture(scope="module")
def server(pair):
    """A drafter that proposes PROMPT's true greedy continuation: every round commits B tokens, so a
    stop string's match falls inside a round's accepted tokens (the tiny drafter accepts ~none)."""
    ids = pair.encode(PROMPT)
    oracle = OracleDrafter(pair.drafter.cfg, [ids + hf_greedy(pair.target.model, ids, N + 16)]).to(torch.float64)
    with ServerThread(
        create_app(Pair(pair.target, oracle, pair.tokenizer, pair.stop_token_ids, "tiny"), "tiny", max_batch=1)
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120)


def stream_text(stream) -> tuple[list[str], str | None]:
    """The streamed chunks' texts (completions or chat) and the last finish_reason."""
    texts, reason = [], None
    for ev in stream:
        if not ev.choices:
            continue
        c = ev.choices[0]
        t = c.text if hasattr(c, "text") else c.delta.content
        if t:
            texts.append(t)
        reason = c.finish_reason or reason
    return texts, reason


def greedy(client, **kw):
    return client.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=N,
        temperature=0,
        extra_body={"ignore_eos": True, "return_token_ids": True, **kw},
    )


def test_stop_string_across_a_round_boundary_ends_the_output_before_it(client, pair):
    full = greedy(client)
    ids, text = full.choices[0].token_ids, full.choices[0].text
    assert ids == hf_greedy(pair.target.model, pair.encode(PROMPT), N)
    # without stop strings every streamed chunk is one commit: its boundaries are the rounds'
    chunks, _ = stream_text(
        client.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=N, temperature=0, stream=True, extra_body={"ignore_eos": True}
        )
    )
    assert "".join(chunks) == text and 3 < len(chunks) < N / 2  # rounds of several tokens
    bounds = [sum(map(len, chunks[:k])) for k in range(2, len(chunks))]
    # a stop string of the 2 characters before a boundary and 2 after, found first right there
    at = next(b for b in bounds if len(text[b - 2 : b + 2]) == 4 and text.find(text[b - 2 : b + 2]) == b - 2)
    stop = text[at - 2 : at + 2]
    never = "\x07never"
    cut = greedy(client, stop=[never, stop])
    c = cut.choices[0]
    assert c.finish_reason == "stop" and c.text == text[: at - 2]
    # the row ended at the token that completed the match: a prefix of the target's greedy tokens
    assert c.token_ids == ids[: len(c.token_ids)] and cut.usage.completion_tokens == len(c.token_ids)
    assert stop in pair.decode(c.token_ids) and stop not in pair.decode(c.token_ids[:-1])

    streamed, reason = stream_text(
        client.completions.create(
            model="tiny",
            prompt=PROMPT,
            max_tokens=N,
            temperature=0,
            stream=True,
            stop=stop,
            extra_body={"ignore_eos": True},
        )
    )
    assert "".join(streamed) == text[: at - 2] and reason == "stop"
    # a stop string that starts to match at a chunk's end but never completes: held back, then released
    near = text[at - 2 : at] + "\x07"
    streamed, reason = stream_text(
        client.completions.create(
            model="tiny",
            prompt=PROMPT,
            max_tokens=N,
            temperature=0,
            stream=True,
            stop=near,
            extra_body={"ignore_eos": True},
        )
    )
    assert "".join(streamed) == text and reason == "length"


def test_chat_stop_sequences_streamed_and_not(client):
    msgs = [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    kw = dict(model="tiny", messages=msgs, max_completion_tokens=16, temperature=0, extra_body={"ignore_eos": True})
    text = client.chat.completions.create(**kw).choices[0].message.content
    stop = text[5:8]
    want = text[: text.find(stop)]
    c = client.chat.completions.create(**kw, stop=stop).choices[0]
    assert (c.message.content, c.finish_reason) == (want, "stop")
    streamed, reason = stream_text(
        client.chat.completions.create(**kw, stop=[stop], stream=True, stream_options={"include_usage": True})
    )
    assert ("".join(streamed), reason) == (want, "stop")


def test_text_stream_never_sends_a_possible_match_and_cuts_at_the_first():
    ts = TextStream(Chars(), ("cde", "bcx"))
    sent = []
    for piece in ("ab", "c", "d", "ezz"):
        cut = ts.feed([ord(ch) for ch in piece])
        sent.append(ts.pop())
    assert sent == ["a", "", "b", ""] and cut == 1 and ts.text == "ab"  # "c" (of "cde") never sent
    assert held_back("xxab", ("abc",)) == 2 and held_back("abc", ("abc",)) == 0


class Chars:
    """A tokenizer whose token i is chr(i)."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(map(chr, ids))


@settings(max_examples=300, deadline=None)
@given(
    text=st.text("abc", max_size=30),
    stops=st.lists(st.text("abc", min_size=1, max_size=4), max_size=4),
    cuts=st.lists(st.integers(1, 5), max_size=30),
)
def test_text_stream_sends_exactly_the_text_before_the_first_match(text, stops, cuts):
    ts = TextStream(Chars(), tuple(stops))
    pos, sent, kept = 0, "", 0
    for n in [*cuts, len(text)]:  # commits of random sizes, as rounds and chunks fall
        piece = [ord(ch) for ch in text[pos : pos + n]]
        pos += n
        took = ts.feed(piece)
        kept += len(piece) if took is None else took
        sent += ts.pop()
        if took is not None:
            break
    ts.finish()
    sent += ts.pop()
    hits = [i for i in (text[:kept].find(s) for s in stops) if i >= 0]
    want = text[: min(hits)] if hits else text
    assert sent == want
    # the row kept tokens exactly up to the one that completed the first match
    assert kept == (min(text.find(s) + len(s) for s in stops if s in text) if hits else len(text))


REFUSED = [  # (endpoint, body fields, the param named)
    ("completions", {"presence_penalty": 0.5}, "presence_penalty"),
    ("completions", {"frequency_penalty": 1}, "frequency_penalty"),
    ("completions", {"logit_bias": {"5": 2}}, "logit_bias"),
    ("completions", {"n": 2}, "n"),
    ("completions", {"best_of": 2}, "best_of"),
    ("completions", {"logprobs": 1}, "logprobs"),
    ("completions", {"echo": True}, "echo"),
    ("completions", {"suffix": "}"}, "suffix"),
    ("completions", {"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ("completions", {"stop": ["a", ""]}, "stop"),
    ("completions", {"stream_options": {"include_usage": True}}, "stream_options"),
    ("completions", {"repetition_penalty": 1.1}, "repetition_penalty"),
    ("completions", {"temperature": "0"}, "temperature"),
    ("completions", {"echo": 0}, "echo"),
    ("completions", {"stream": "true"}, "stream"),
    ("completions", {"max_tokens": 2.0}, "max_tokens"),
    ("chat", {"logprobs": True}, "logprobs"),
    ("chat", {"n": 3}, "n"),
    ("chat", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ("chat", {"response_format": {"type": "json_object"}}, "response_format"),
    ("chat", {"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ("chat", {"messages": [{"role": "tool", "content": "1", "tool_call_id": "x"}]}, "messages[0].role"),
]


def test_unimplemented_values_and_wrong_types_are_refused_by_name(server):
    with httpx.Client(base_url=f"{server.url}/v1", timeout=60) as c:
        for endpoint, extra, param in REFUSED:
            if endpoint == "chat":
                path, body = "/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}
            else:
                path, body = "/completions", {"prompt": "hi"}
            r = c.post(path, json={**body, "max_tokens": 2, **extra})
            assert r.status_code == 400, (extra, r.text)
            err = r.json()["error"]
            assert err["param"] == param and err["type"] == "invalid_request_error", (extra, err)


def test_the_openai_client_gets_param_and_no_op_defaults_pass(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="hi", max_tokens=2, presence_penalty=0.3)
    assert e.value.param == "presence_penalty"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2, logprobs=True, top_logprobs=2
        )
    assert e.value.param == "logprobs"
    r = client.completions.create(
        model="tiny",
        prompt="hi",
        max_tokens=2,
        temperature=0,
        presence_penalty=0,
        frequency_penalty=0,
        logit_bias={},
        n=1,
        best_of=1,
        echo=False,
        suffix=None,
        logprobs=None,
        user="u-1",
        seed=3,
        stop=None,
    )
    assert r.choices[0].finish_reason in ("stop", "length")
    r = client.chat.completions.create(
        model="tiny",
        messages=[
            {"role": "system", "content": "s"},
            {"role": "user", "content": "hi", "name": "u"},
            {"role": "assistant", "content": "yo", "tool_calls": []},
            {"role": "user", "content": [{"type": "text", "text": "more"}]},
        ],
        max_tokens=2,
        temperature=0,
        presence_penalty=0,
        frequency_penalty=0,
        logit_bias=None,
        n=1,
        logprobs=False,
        user="u-1",
        metadata={"k": "v"},
        store=False,
        response_format={"type": "text"},
        tool_choice="none",
        parallel_tool_calls=True,
        service_tier="auto",
        modalities=["text"],
    )
    assert r.choices[0].message.role == "assistant"
