"""The OpenAI-compatible client with many requests in flight: the limit, back-pressure, the cache under load.

Real sockets against :class:`tests.support.LoadLLMServer` on 127.0.0.1, which counts what is in flight.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.support import LoadLLMServer
from tokenswap.inference import LLMRequestError, OpenAIChatModel, ResponseCache, map_ordered

REPO = Path(__file__).resolve().parents[2]


def ask(model: OpenAIChatModel, questions, threads: int) -> list[str]:
    return [o.result() for o in map_ordered(lambda q: model.chat([{"role": "user", "content": q}]), questions, threads)]


def echo(payload: dict) -> str:
    return "re: " + payload["messages"][-1]["content"]


@pytest.mark.integration
def test_requests_run_concurrently_up_to_the_limit_and_come_back_in_order():
    with LoadLLMServer(echo, latency=0.3) as server:
        model = OpenAIChatModel(server.base_url, "m", concurrency=8)
        questions = [f"q{i}" for i in range(40)]
        t0 = time.monotonic()
        answers = ask(model, questions, threads=32)  # more callers than the client lets through
        elapsed = time.monotonic() - t0
        assert answers == [f"re: q{i}" for i in range(40)]
        assert server.max_in_flight == 8 == model.stats.max_in_flight
        assert elapsed < 40 * 0.3 / 4  # 5 rounds of 0.3 s, not 40 in a row
        stats = model.stats.as_dict()
        assert (stats["requests"], stats["replies"], stats["errors"], stats["in_flight"]) == (40, 40, 0, 0)
        assert stats["prompt_tokens"] == 400 and stats["completion_tokens"] == 200  # from `usage`
        json.dumps(stats)


@pytest.mark.integration
def test_concurrency_one_is_one_request_at_a_time():
    with LoadLLMServer(echo, latency=0.05) as server:
        model = OpenAIChatModel(server.base_url, "m", concurrency=1)
        assert ask(model, [f"q{i}" for i in range(12)], threads=6)[-1] == "re: q11"
        assert server.max_in_flight == 1


@pytest.mark.integration
def test_429_lowers_the_number_in_flight_honours_retry_after_and_climbs_back():
    # The API serves 4 at once and answers 429 "Retry-After: 0.6" beyond that.
    with LoadLLMServer(echo, latency=0.05, rate_limit=4, retry_after=0.6) as server:
        model = OpenAIChatModel(server.base_url, "m", concurrency=16, max_retries=8, max_backoff=2.0)
        answers = ask(model, [f"q{i}" for i in range(60)], threads=16)
        assert answers == [f"re: q{i}" for i in range(60)]  # nothing lost to the rate limit
        assert model.stats.throttled == server.rejected > 0
        assert model.stats.limit < 16  # lowered, and only climbing back with successes
        # Retry-After holds for every request, not only the rejected one: after a 429 the server hears
        # nothing until it has passed (the 0.05 s grace covers requests already on the wire).
        rejections = [t for t, status in server.arrivals if status == 429]
        for t in rejections:
            early = [a for a, _ in server.arrivals if t + 0.05 < a < t + 0.6 - 0.05]
            assert early == [], f"{len(early)} requests within Retry-After of a 429"
        # Not hammered: beyond the first burst's 12 refusals (16 sent, 4 allowed) few more; a client keeping
        # 16 in flight would be refused ~3 times for every answer.
        assert server.rejected < 60 // 2

        server.rate_limit = None  # the API lifts its limit: back to `concurrency` after successes
        server.max_in_flight = 0
        ask(model, [f"r{i}" for i in range(300)], threads=16)
        assert model.stats.limit == 16 and server.max_in_flight == 16


@pytest.mark.integration
def test_503_without_retry_after_lowers_the_limit_too():
    with LoadLLMServer(echo, latency=0.05, rate_limit=0, retry_after=None, reject_status=503) as server:
        model = OpenAIChatModel(server.base_url, "m", concurrency=8, max_retries=3, max_backoff=0.05)
        with pytest.raises(LLMRequestError, match=r"failed after 4 attempts.*HTTP 503"):
            model.chat([{"role": "user", "content": "x"}])
        assert model.stats.limit == 1 and model.stats.errors == 1 and model.stats.throttled == 4
        server.rate_limit = None  # the server recovers
        ask(model, [f"q{i}" for i in range(60)], threads=8)
        assert model.stats.limit == 8


@pytest.mark.integration
def test_the_cache_under_concurrency_has_every_answer_once(tmp_path):
    path = tmp_path / "cache.jsonl"
    with LoadLLMServer(echo, latency=0.05) as server:
        model = OpenAIChatModel(server.base_url, "m", concurrency=16, cache_path=path)
        questions = [f"q{i % 50}" for i in range(200)]  # each asked 4 times, often at the same moment
        assert ask(model, questions, threads=32) == [f"re: {q}" for q in questions]
        assert len(server.requests) == 50  # concurrent askers of one question share its request
    lines = path.read_text().splitlines()
    keys = [json.loads(line)["key"] for line in lines]
    assert len(keys) == len(set(keys)) == 50
    again = OpenAIChatModel("http://127.0.0.1:9/v1", "m", cache_path=path)  # nothing listens there
    assert ask(again, questions, threads=8) == [f"re: {q}" for q in questions] and again.num_requests == 0


def test_a_torn_last_line_does_not_swallow_the_next_entry(tmp_path):
    path = tmp_path / "c.jsonl"
    ResponseCache(path).put("k1", "v1")
    with open(path, "a") as f:
        f.write('{"key": "k2", "resp')  # a process killed mid-append
    cache = ResponseCache(path)
    cache.put("k3", "v3")
    cache.close()
    again = ResponseCache(path)
    assert (again.get("k1"), again.get("k2"), again.get("k3")) == ("v1", None, "v3")
    assert all(json.loads(line) for line in path.read_text().splitlines())


CHILD = textwrap.dedent(
    """
    import sys
    from tokenswap.inference import OpenAIChatModel, map_ordered
    model = OpenAIChatModel(sys.argv[1], "m", concurrency=16, cache_path=sys.argv[2])
    for o in map_ordered(lambda q: model.chat([{"role": "user", "content": q}]), [f"q{i}" for i in range(300)], 16):
        o.result()
    print("done")
    """
)


@pytest.mark.integration
def test_a_kill_under_concurrency_cannot_tear_the_cache(tmp_path):
    path = tmp_path / "cache.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with LoadLLMServer(echo, latency=0.02) as server:
        cmd = [sys.executable, "-c", CHILD, server.base_url, str(path)]
        for _ in range(3):
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            before = len(path.read_bytes().splitlines()) if path.exists() else 0
            deadline = time.monotonic() + 60
            while proc.poll() is None and time.monotonic() < deadline:
                if path.exists() and len(path.read_bytes().splitlines()) >= before + 40:
                    break
                time.sleep(0.005)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert out.stdout.strip() == "done", out.stderr[-2000:]
    rows = [json.loads(line) for line in path.read_text().splitlines()]  # every line whole
    assert sorted(r["key"] for r in rows) == sorted({r["key"] for r in rows}) and len(rows) == 300
    assert {r["response"] for r in rows} == {f"re: q{i}" for i in range(300)}


@pytest.mark.integration
def test_the_deadline_holds_while_the_headers_drip_and_under_load():
    from tests.support import ScriptedLLMServer

    def drip_headers(h) -> None:  # the status line, then one header byte every 0.1 s: no read ever times out
        h.wfile.write(b"HTTP/1.1 200 OK\r\n")
        h.wfile.flush()
        for byte in b"X-Slow: " + b"z" * 300:
            h.wfile.write(bytes([byte]))
            h.wfile.flush()
            time.sleep(0.1)

    with ScriptedLLMServer() as server:
        server.script = [drip_headers] * 8
        model = OpenAIChatModel(server.base_url, "m", timeout=1.0, max_retries=0, concurrency=8)
        t0 = time.monotonic()
        outcomes = list(map_ordered(lambda q: model.chat([{"role": "user", "content": q}]), ["a", "b", "c", "d"], 4))
        assert time.monotonic() - t0 < 3.0  # 4 attempts at once, each cut at its 1 s deadline
        assert all(isinstance(o.error, LLMRequestError) and "1s deadline" in str(o.error) for o in outcomes)
        assert model.stats.errors == 4 and model.stats.in_flight == 0


@pytest.mark.integration
def test_request_returns_reasoning_usage_and_the_first_tokens_logprobs(tmp_path):
    import base64

    from PIL import Image

    from tests.support import ScriptedLLMServer, llm_reply

    body = json.dumps({
        "choices": [{
            "message": {"role": "assistant", "content": " B", "reasoning_content": "think"},
            "finish_reason": "length",
            "logprobs": {"content": [{"token": " B", "logprob": -0.1,
                                      "top_logprobs": [{"token": " B", "logprob": -0.1}, {"token": " A", "logprob": -2.5}]},
                                     {"token": "!", "logprob": -3.0, "top_logprobs": []}]},
        }],
        "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8},
    }).encode()
    with ScriptedLLMServer() as server:
        server.script = [llm_reply(body)]
        model = OpenAIChatModel(server.base_url, "m", cache_path=tmp_path / "c.jsonl")
        url = "data:image/png;base64," + base64.b64encode(b"not decoded by the client").decode()
        messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                  {"type": "image", "image": Image.new("RGB", (2, 2))},
                                                  {"type": "text", "text": "A or B?"}]}]
        reply = model.request(messages, max_tokens=1, top_logprobs=2, extra_body={"seed": 3})
        assert (reply.text, reply.reasoning, reply.finish_reason, reply.cached) == (" B", "think", "length", False)
        assert reply.top_logprobs == [(" B", -0.1), (" A", -2.5)] and reply.usage["prompt_tokens"] == 7
        again = model.request(messages, max_tokens=1, top_logprobs=2, extra_body={"seed": 3})
        assert again.cached and again.top_logprobs == reply.top_logprobs and again.reasoning == "think"
        assert len(server.headers) == 1  # answered from the cache
        other = model.request(messages, max_tokens=1)  # other settings: another question
        assert len(server.headers) == 2 and other.text == "fine"
    stats = model.stats.as_dict()
    assert (stats["requests"], stats["cached"], stats["prompt_tokens"], stats["completion_tokens"]) == (2, 1, 7, 1)


@pytest.mark.integration
def test_the_payload_carries_logprobs_extra_body_and_image_urls_unchanged():
    seen = []
    with LoadLLMServer(lambda payload: seen.append(payload) or "ok") as server:
        model = OpenAIChatModel(server.base_url, "m", temperature=0.0)
        url = "data:image/jpeg;base64,AAAA"
        model.request([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}],
                      max_tokens=3, temperature=0.5, top_logprobs=5, extra_body={"chat_template_kwargs": {"x": 1}})
    (payload,) = seen
    assert payload["messages"][0]["content"] == [{"type": "image_url", "image_url": {"url": url}}]
    assert (payload["max_tokens"], payload["temperature"], payload["logprobs"], payload["top_logprobs"]) == (3, 0.5, True, 5)
    assert payload["chat_template_kwargs"] == {"x": 1}


@pytest.mark.integration
def test_closing_the_server_with_a_request_in_flight_logs_no_traceback(caplog):
    # Python 3.11's stream callback calls task.exception() on a cancelled handler and logs a CancelledError
    # traceback per open connection: noise in every fault log that a reader takes for a failure.
    import logging
    import socket

    server = LoadLLMServer(echo, latency=60.0)
    host, port = server.base_url.split("//")[1].split("/")[0].split(":")
    body = json.dumps({"messages": [{"role": "user", "content": "q"}]}).encode()
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        deadline = time.monotonic() + 30
        while server.in_flight == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.in_flight == 1
        with caplog.at_level(logging.DEBUG, logger="asyncio"):
            server.close()
            time.sleep(0.2)  # the loop's last callbacks run as it stops
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio" and r.levelno >= logging.ERROR] == []
