"""The OpenAI-compatible client against a misbehaving HTTP server on 127.0.0.1 (real sockets, bounded in time)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tokenswap.llm import LLMRequestError, OpenAIChatModel

MSG = [{"role": "user", "content": "hi"}]


def _ok(text: str | None = "fine") -> bytes:
    return json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()


class Server:
    """Answers each POST with the next behaviour of ``script`` (a handler -> None function)."""

    def __init__(self) -> None:
        self.script: list[Callable] = []
        self.headers: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                self.rfile.read(int(self.headers["Content-Length"]))
                server.headers.append(dict(self.headers))
                behaviour = server.script.pop(0) if server.script else reply(_ok())
                try:
                    behaviour(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up on purpose
                self.close_connection = True

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def reply(body: bytes, status: int = 200, headers: dict | None = None, length: int | None = None) -> Callable:
    def run(h: BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body) if length is None else length))
        h.end_headers()
        h.wfile.write(body)
        h.wfile.flush()

    return run


def drip(seconds: float) -> Callable:
    def run(h: BaseHTTPRequestHandler) -> None:
        body = _ok()
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
    s = Server()
    yield s
    s.close()


def test_a_redirect_to_another_host_is_refused_and_the_key_never_leaves(server, monkeypatch):
    other = Server()
    try:
        monkeypatch.setenv("TS_KEY", "sk-secret")
        server.script = [reply(b"", 302, {"Location": f"{other.base_url}/chat/completions"})]
        model = OpenAIChatModel(server.base_url, "m", api_key_env="TS_KEY", max_retries=2)
        with pytest.raises(LLMRequestError, match=r"HTTP 302 redirecting to .*base_url to the final address"):
            model.chat(MSG)
        assert other.headers == [] and model.num_requests == 1  # not followed, not retried
    finally:
        other.close()


def test_the_timeout_is_a_deadline_for_the_whole_attempt_not_per_read(server):
    server.script = [drip(30), drip(30)]  # one byte every 0.1 s: no single read ever times out
    model = OpenAIChatModel(server.base_url, "m", timeout=1.0, max_retries=1, max_backoff=0.1)
    t0 = time.monotonic()
    with pytest.raises(LLMRequestError, match=r"failed after 2 attempts.*1s deadline") as err:
        model.chat(MSG)
    assert time.monotonic() - t0 < 4.0
    assert server.base_url in str(err.value)


def test_oversized_replies_are_refused_announced_or_not(server):
    model = OpenAIChatModel(server.base_url, "m", max_response_bytes=1 << 20, max_retries=0)
    server.script = [reply(b"", length=300 << 20)]
    with pytest.raises(LLMRequestError, match="announced a 314,572,800-byte reply"):
        model.chat(MSG)
    server.script = [flood(20 << 20)]
    with pytest.raises(LLMRequestError, match="more than max_response_bytes=1,048,576"):
        model.chat(MSG)


@pytest.mark.parametrize(
    "bad, error",
    [
        (reply(b"<html>502 Bad Gateway</html>"), "not JSON"),
        (reply(b"\xff\xfe" + _ok()), "not UTF-8"),
        (reply(_ok()[:20], length=len(_ok())), "IncompleteRead"),
        (reply(b'{"choices": []}'), "no choices"),
        (reply(b"oops", 503), "HTTP 503"),
    ],
    ids=["garbage-json", "non-utf8", "cut-body", "no-choices", "http-503"],
)
def test_garbled_replies_are_retried_then_named_with_the_url(server, bad, error):
    server.script = [bad, reply(_ok("second try"))]
    model = OpenAIChatModel(server.base_url, "m", max_retries=1, max_backoff=0.05)
    assert model.chat(MSG) == "second try" and model.num_requests == 2
    server.script = [bad, bad]
    with pytest.raises(LLMRequestError, match=error) as err:
        model.chat([{"role": "user", "content": "other"}])
    assert f"{server.base_url}/chat/completions" in str(err.value)


def test_retry_after_is_honoured(server):
    server.script = [reply(b"slow down", 429, {"Retry-After": "1"}), reply(_ok("now"))]
    model = OpenAIChatModel(server.base_url, "m", max_retries=1, max_backoff=5)
    t0 = time.monotonic()
    assert model.chat(MSG) == "now"
    assert 1.0 <= time.monotonic() - t0 < 3.0


def test_a_null_reply_is_returned_empty_but_not_cached(server, tmp_path):
    server.script = [reply(_ok(None)), reply(_ok("real answer"))]
    model = OpenAIChatModel(server.base_url, "m", cache_path=tmp_path / "c.jsonl")
    assert model.chat(MSG) == ""
    assert not (tmp_path / "c.jsonl").exists() or (tmp_path / "c.jsonl").read_text() == ""
    assert model.chat(MSG) == "real answer" and model.num_requests == 2
    assert model.chat(MSG) == "real answer" and model.num_requests == 2  # now cached


def test_unreachable_server_fails_fast_with_the_url():
    model = OpenAIChatModel("http://127.0.0.1:9/v1", "m", timeout=2, max_retries=1, max_backoff=0.05)
    with pytest.raises(LLMRequestError, match=r"127.0.0.1:9/v1/chat/completions failed after 2 attempts"):
        model.chat(MSG)
