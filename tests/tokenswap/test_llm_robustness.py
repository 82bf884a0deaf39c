"""The OpenAI-compatible client against a misbehaving HTTP server on 127.0.0.1 (real sockets, bounded in time)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler

import pytest

from tests.support import ScriptedLLMServer, llm_answer, llm_reply
from tokenswap.inference import LLMRequestError, OpenAIChatModel

MSG = [{"role": "user", "content": "hi"}]


def drip(seconds: float) -> Callable:
    def run(h: BaseHTTPRequestHandler) -> None:
        body = llm_answer()
        h.send_response(200)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        deadline = time.monotonic() + seconds
        for byte in body:
            if time.monotonic() > deadline:
                return
            h.wfile.write(bytes([byte]))
            h.wfile.flush()
            time.sleep(0.1)

    return run


def flood(n_bytes: int) -> Callable:
    def run(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Connection", "close")  # no Content-Length: the body runs until the socket closes
        h.end_headers()
        chunk = b"x" * 65536
        for _ in range(n_bytes // len(chunk)):
            h.wfile.write(chunk)

    return run


@pytest.fixture
def server():
    with ScriptedLLMServer() as s:
        yield s


@pytest.mark.integration
def test_a_redirect_to_another_host_is_refused_and_the_key_never_leaves(server, monkeypatch):
    with ScriptedLLMServer() as other:
        monkeypatch.setenv("TS_KEY", "sk-secret")
        server.script = [llm_reply(b"", 302, {"Location": f"{other.base_url}/chat/completions"})]
        model = OpenAIChatModel(server.base_url, "m", api_key_env="TS_KEY", max_retries=2)
        with pytest.raises(LLMRequestError, match=r"HTTP 302 redirecting to .*base_url to the final address"):
            model.chat(MSG)
        assert other.headers == [] and model.num_requests == 1  # not followed, not retried


@pytest.mark.integration
def test_the_timeout_is_a_deadline_for_the_whole_attempt_not_per_read(server):
    server.script = [drip(30), drip(30)]  # one byte every 0.1 s: no single read ever times out
    model = OpenAIChatModel(server.base_url, "m", timeout=1.0, max_retries=1, max_backoff=0.1)
    t0 = time.monotonic()
    with pytest.raises(LLMRequestError, match=r"failed after 2 attempts.*1s deadline") as err:
        model.chat(MSG)
    assert time.monotonic() - t0 < 4.0
    assert server.base_url in str(err.value)


@pytest.mark.integration
def test_oversized_replies_are_refused_announced_or_not(server):
    model = OpenAIChatModel(server.base_url, "m", max_response_bytes=1 << 20, max_retries=0)
    server.script = [llm_reply(b"", length=300 << 20)]
    with pytest.raises(LLMRequestError, match="announced a 314,572,800-byte reply"):
        model.chat(MSG)
    server.script = [flood(20 << 20)]
    with pytest.raises(LLMRequestError, match="more than max_response_bytes=1,048,576"):
        model.chat(MSG)


@pytest.mark.integration
@pytest.mark.parametrize(
    "bad, error",
    [
        (llm_reply(b"<html>502 Bad Gateway</html>"), "not JSON"),
        (llm_reply(b"\xff\xfe" + llm_answer()), "not UTF-8"),
        (llm_reply(llm_answer()[:20], length=len(llm_answer())), "IncompleteRead"),
        (llm_reply(b'{"choices": []}'), "no choices"),
        (llm_reply(b"oops", 503), "HTTP 503"),
    ],
    ids=["garbage-json", "non-utf8", "cut-body", "no-choices", "http-503"],
)
def test_garbled_replies_are_retried_then_named_with_the_url(server, bad, error):
    server.script = [bad, llm_reply(llm_answer("second try"))]
    model = OpenAIChatModel(server.base_url, "m", max_retries=1, max_backoff=0.05)
    assert model.chat(MSG) == "second try" and model.num_requests == 2
    server.script = [bad, bad]
    with pytest.raises(LLMRequestError, match=error) as err:
        model.chat([{"role": "user", "content": "other"}])
    assert f"{server.base_url}/chat/completions" in str(err.value)


@pytest.mark.integration
def test_retry_after_is_honoured(server):
    server.script = [llm_reply(b"slow down", 429, {"Retry-After": "1"}), llm_reply(llm_answer("now"))]
    model = OpenAIChatModel(server.base_url, "m", max_retries=1, max_backoff=5)
    t0 = time.monotonic()
    assert model.chat(MSG) == "now"
    assert 1.0 <= time.monotonic() - t0 < 3.0


@pytest.mark.integration
def test_a_null_reply_is_a_failed_request_retried_and_never_cached(server, tmp_path):
    server.script = [llm_reply(llm_answer(None)), llm_reply(llm_answer("real answer"))]
    model = OpenAIChatModel(server.base_url, "m", cache_path=tmp_path / "c.jsonl", max_backoff=0.05)
    assert model.chat(MSG) == "real answer" and model.num_requests == 2  # the null one was retried, not returned
    assert model.chat(MSG) == "real answer" and model.num_requests == 2  # now cached
    missing = json.dumps({"choices": [{"message": {"role": "assistant"}, "finish_reason": "stop"}]}).encode()
    server.script = [llm_reply(llm_answer(None)), llm_reply(missing)]
    once_more = OpenAIChatModel(server.base_url, "m", cache_path=tmp_path / "c.jsonl", max_retries=1, max_backoff=0.05)
    with pytest.raises(LLMRequestError, match="failed after 2 attempts.*no choices"):
        once_more.chat([{"role": "user", "content": "other"}])  # null, then no content at all: no answer
    once_more.close()
    cached = [json.loads(line) for line in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert [row["response"] for row in cached] == ["real answer"]  # nothing for the question that got no answer


@pytest.mark.integration
def test_a_null_content_after_the_whole_budget_went_to_reasoning_is_the_empty_answer(server):
    body = {"choices": [{"message": {"role": "assistant", "content": None, "reasoning_content": "Let me think"},
                         "finish_reason": "length"}]}
    server.script = [llm_reply(json.dumps(body).encode())]
    reply = OpenAIChatModel(server.base_url, "m", max_retries=0).request(MSG)
    assert (reply.text, reply.reasoning, reply.finish_reason) == ("", "Let me think", "length")
    body["choices"][0]["finish_reason"] = "stop"  # stopped, yet nothing to say: no answer
    server.script = [llm_reply(json.dumps(body).encode())]
    with pytest.raises(LLMRequestError, match="null message content"):
        OpenAIChatModel(server.base_url, "m", max_retries=0).request(MSG)


def test_unreachable_server_fails_fast_with_the_url():
    model = OpenAIChatModel("http://127.0.0.1:9/v1", "m", timeout=2, max_retries=1, max_backoff=0.05)
    with pytest.raises(LLMRequestError, match=r"127.0.0.1:9/v1/chat/completions failed after 2 attempts"):
        model.chat(MSG)
