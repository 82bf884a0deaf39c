"""Section ``llm`` of benchmarks/faults.py: a misbehaving HTTP server on 127.0.0.1
(``tests.support.ScriptedLLMServer``, the tests' own): redirect to another host, slow drip, huge replies,
garbage/non-UTF-8/cut bodies, null reply, 429 with Retry-After, 500 storm, no server.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from tests.support import ScriptedLLMServer, llm_answer, llm_reply

from ._common import Tally

OUTCOME = (
    "refused (redirect, oversize) or retried with backoff/Retry-After and recovered; deadline per attempt holds; "
    "errors name the URL; null reply retried, never returned or cached"
)


def _drip(h) -> None:
    body = llm_answer("slow")
    h.send_response(200)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    for byte in body:
        h.wfile.write(bytes([byte]))
        h.wfile.flush()
        time.sleep(0.1)


def _flood(h) -> None:
    h.send_response(200)
    h.send_header("Connection", "close")
    h.end_headers()
    for _ in range(400):  # 25 MB without Content-Length
        h.wfile.write(b"x" * 65536)


def section_llm(t: Tally, work: Path) -> None:
    from tokenswap.inference import LLMRequestError, OpenAIChatModel

    server, other = ScriptedLLMServer(), ScriptedLLMServer()
    msg = [{"role": "user", "content": "hi"}]
    os.environ["TS_FAULTS_KEY"] = "sk-faults-secret"

    def client(**kw) -> OpenAIChatModel:
        kw.setdefault("max_backoff", 0.1)
        return OpenAIChatModel(server.base_url, "m", api_key_env="TS_FAULTS_KEY", **kw)

    def check(what: str, script: list[Callable], fn: Callable[[], tuple[bool, str]]) -> None:
        server.script = list(script)
        try:
            ok, detail = fn()
        except Exception as e:  # noqa: BLE001
            ok, detail = False, f"{type(e).__name__}: {e}"
        t.add("llm", what, ok, detail)

    def raises(model: OpenAIChatModel, *needles: str, within: float = 30.0) -> tuple[bool, str]:
        t0 = time.monotonic()
        try:
            model.chat(msg)
            return False, "no error"
        except LLMRequestError as e:
            dt = time.monotonic() - t0
            return all(n in str(e) for n in needles) and dt < within and "sk-faults" not in str(e), f"{dt:.1f}s {e}"

    def recovers(model: OpenAIChatModel, answer: str = "fine", min_s: float = 0.0) -> tuple[bool, str]:
        t0 = time.monotonic()
        got = model.chat(msg)
        dt = time.monotonic() - t0
        return got == answer and dt >= min_s, f"{got!r} after {dt:.1f}s"

    check("302 redirect to another host", [llm_reply(b"", 302, {"Location": f"{other.base_url}/chat/completions"})],
          lambda: (raises(client(), "HTTP 302")[0] and not other.headers, f"other host hits={len(other.headers)}"))
    check("server drips one byte per 0.1 s (timeout=1 s, 1 retry)", [_drip, _drip],
          lambda: raises(client(timeout=1.0, max_retries=1), "deadline", server.base_url, within=4.0))
    check("reply announcing 300 MB", [llm_reply(b"", length=300 << 20)],
          lambda: raises(client(max_response_bytes=1 << 20), "max_response_bytes"))
    check("reply streaming 25 MB without Content-Length", [_flood],
          lambda: raises(client(max_response_bytes=1 << 20), "max_response_bytes"))
    for what, bad in [("garbage JSON", llm_reply(b"<html>oops</html>")),
                      ("non-UTF-8 body", llm_reply(b"\xff\xfe" + llm_answer("x"))),
                      ("body cut short", llm_reply(llm_answer("fine")[:15], length=len(llm_answer("fine")))),
                      ("HTTP 500", llm_reply(b"boom", 500))]:
        check(f"{what}, then a good reply", [bad, llm_reply(llm_answer("fine"))],
              lambda: recovers(client(max_retries=2)))
    check("429 with Retry-After: 1",
          [llm_reply(b"slow down", 429, {"Retry-After": "1"}), llm_reply(llm_answer("fine"))],
          lambda: recovers(client(max_retries=1, max_backoff=5), min_s=1.0))
    check("500 on every attempt", [llm_reply(b"boom", 500)] * 3,
          lambda: raises(client(max_retries=2), "failed after 3 attempts", server.base_url))

    def null_not_cached() -> tuple[bool, str]:
        cache = work / "llm-cache.jsonl"
        model = client(cache_path=cache)
        first = model.chat(msg)  # the null reply is a failed attempt: retried, never returned as ""
        second = model.chat(msg)
        # Not the attempt count: a pooled connection the server closed is retried, and that is no cache hit.
        served = model.stats.as_dict()
        return (first, second, served["cached"], served["replies"]) == ("real", "real", 1, 1), \
            f"{first!r}, {second!r}, {served}"

    check("null reply", [llm_reply(llm_answer(None)), llm_reply(llm_answer("real"))], null_not_cached)
    check("no server listening", [], lambda: raises(
        OpenAIChatModel("http://127.0.0.1:9/v1", "m", max_retries=1, max_backoff=0.05, timeout=2), "127.0.0.1:9"))
    server.close()
    other.close()
