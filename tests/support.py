"""The tests' own servers and fixtures (not shipped with the package; benchmarks and docs scripts of a checkout
import them too).

:class:`ScriptedLLMServer` is a misbehaving OpenAI-compatible server on 127.0.0.1 for the LLM client's tests
(:func:`llm_reply` / :func:`llm_answer` make its behaviours); :class:`LoadLLMServer` one with a latency, a capacity
and a rate limit, that counts what is in flight (:func:`concept_reply`: the store build's scripted extractor and
judge); :func:`png_bomb` a decompression bomb made without its pixels; :func:`process_group_left` the pids left in a
process group (from ``/proc``). The tiny checkpoints, store and bench are the package's own kit,
:mod:`tokenswap.testing`.
"""

from __future__ import annotations

import json
import os


def llm_answer(text: str | None = "fine") -> bytes:
    """The body of an OpenAI chat-completions reply whose one choice says ``text`` (``None``: a null content)."""
    return json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()



def llm_reply(body: bytes, status: int = 200, headers: dict | None = None, length: int | None = None):
    """A :class:`ScriptedLLMServer` behaviour: answer ``status`` with ``headers`` and ``body``.

    ``length`` is the ``Content-Length`` to announce (default the body's own; another value makes a reply
    cut short or one announcing more than it sends).
    """

    def send(h) -> None:
        h.send_response(status)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body) if length is None else length))
        # The server closes every connection after its answer; saying so keeps a pooled client from sending the next
        # request down a socket that is being closed (which fails it at random, as a dropped connection).
        h.send_header("Connection", "close")
        h.end_headers()
        h.wfile.write(body)
        h.wfile.flush()

    return send



class ScriptedLLMServer:
    """An HTTP server on 127.0.0.1 (a free port, real sockets) that answers each POST with the next behaviour of
    :attr:`script`, to test an OpenAI-compatible client against servers that misbehave.

    A behaviour is a function of the ``http.server.BaseHTTPRequestHandler`` that writes the answer (see
    :func:`llm_reply`; a custom one can drip, flood or stall). With the script used up, each POST gets
    ``llm_reply(llm_answer("fine"))``. An ``OSError`` inside a behaviour (the client hung up on purpose: a
    deadline, a size limit) is swallowed, and every connection is closed after one request. Use as a context
    manager, or call :meth:`close`.

    Attributes:
        base_url: ``http://127.0.0.1:PORT/v1``, the client's base URL.
        script: behaviours still to play, first first.
        headers: the request headers of every POST received so far, in order (``len`` counts the requests).
    """

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.script: list = []
        self.headers: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                self.rfile.read(int(self.headers["Content-Length"]))
                server.headers.append(dict(self.headers))
                behaviour = server.script.pop(0) if server.script else llm_reply(llm_answer())
                try:
                    behaviour(self)
                except OSError:
                    pass  # the client gave up on purpose
                self.close_connection = True

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        """Stop serving and release the port."""
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> ScriptedLLMServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()



def concept_reply(payload: dict) -> str:
    """A deterministic answer of the store build's LLM extractor or validity judge, for :class:`LoadLLMServer`.

    Extraction (a system turn first): the first three distinct words of 5+ letters of the text between
    ``<<<`` and ``>>>``, with their offsets. Judge (image parts): valid unless the concept's name has a
    length divisible by 3. The same request always gets the same answer, whatever the order they arrive in.
    """
    import re

    messages = payload["messages"]
    content = messages[-1]["content"]
    if messages[0]["role"] == "system":
        text = content.split("\n\n<<<", 1)[1].rsplit(">>>", 1)[0]  # the prompt names <<< once before
        spans, seen = [], set()
        for m in re.finditer(r"[A-Za-z]{5,}", text):
            word = m.group(0).lower()
            if word not in seen:
                seen.add(word)
                spans.append({"text": m.group(0), "start": m.start(), "end": m.end()})
            if len(spans) == 3:
                break
        return json.dumps({"concepts": spans})
    question = next(p["text"] for p in content if p["type"] == "text")
    concept = re.search(r'The phrase was "([^"]*)"', question).group(1)
    return json.dumps({"valid": len(concept) % 3 != 0, "reason": "scripted"})



class LoadLLMServer:
    """An OpenAI-compatible server on 127.0.0.1 with a latency, a capacity and a rate limit, counting requests in flight.

    Each POST is answered after ``latency(payload)`` seconds (a number, or a function of the request payload
    for random delays) with ``{"choices": [{"message": {"content": reply(payload)}}], "usage": ...}``; a
    ``reply`` that raises makes the server hang up without an answer (a dropped connection).
    At most ``capacity`` requests are served at once; the rest queue (as a serving engine's batch is
    full), so throughput is at most ``capacity / latency``. With ``rate_limit=K``, a request arriving
    while K are already in flight is answered ``reject_status`` (429) with ``Retry-After: retry_after``
    (none when it is None): a rate-limited API. ``respond(payload, headers)``, when given, sees each request first
    (``headers`` with lower-case names) and may answer it itself with ``(status, body bytes)`` (a body no
    ``reply`` can make: an error quoting the ``Authorization`` header, JSON nested 100,000 deep); ``None`` leaves
    the request to ``reply``. Keep-alive HTTP/1.1 on one ``asyncio`` loop (a thread per connection costs more CPU
    than the client it measures), with a deep listen backlog.

    Attributes:
        base_url: ``http://127.0.0.1:PORT/v1``.
        requests: payloads served (200), in arrival order.
        in_flight: requests being handled now (queued ones included).
        max_in_flight: the most requests ever being handled at once (queued ones included).
        rejected: 429 (``reject_status``) answers given.
        arrivals: ``(monotonic time, status)`` of every POST.
    """

    def __init__(self, reply=None, latency=0.0, capacity: int | None = None, rate_limit: int | None = None,
                 retry_after: float | None = 1.0, reject_status: int = 429, respond=None) -> None:
        import asyncio
        import threading

        self.reply = reply or (lambda payload: "fine")
        self.respond = respond
        self.latency = latency
        self.capacity = capacity
        self.rate_limit = rate_limit
        self.retry_after = retry_after
        self.reject_status = reject_status
        self.requests: list[dict] = []
        self.arrivals: list[tuple[float, int]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.rejected = 0
        self._loop = asyncio.new_event_loop()
        started = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(self._loop)
            self._slots = asyncio.Semaphore(capacity) if capacity else None
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._handle, "127.0.0.1", 0, backlog=1024)
            )
            started.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, daemon=True, name="load-llm-server")
        self._thread.start()
        started.wait()
        self.base_url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/v1"

    async def _handle(self, reader, writer) -> None:
        import asyncio
        import time

        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
                payload = json.loads(await reader.readexactly(int(headers.get("content-length", "0"))))
                limited = self.rate_limit is not None and self.in_flight >= self.rate_limit
                self.arrivals.append((time.monotonic(), self.reject_status if limited else 200))
                if limited:
                    self.rejected += 1
                    after = {} if self.retry_after is None else {"Retry-After": f"{self.retry_after:g}"}
                    await self._send(writer, self.reject_status, b'{"error": "rate limited"}', after)
                    continue
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
                try:
                    if self._slots is not None:
                        await self._slots.acquire()
                    try:
                        delay = self.latency(payload) if callable(self.latency) else self.latency
                        await asyncio.sleep(delay)
                        try:
                            own = self.respond(payload, headers) if self.respond is not None else None
                            text = self.reply(payload) if own is None else None
                        except Exception:  # noqa: BLE001 - a reply function that raises drops the connection
                            return
                    finally:
                        if self._slots is not None:
                            self._slots.release()
                    self.requests.append(payload)
                finally:
                    self.in_flight -= 1
                status, body = own if own is not None else (200, json.dumps({
                    "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                }).encode())
                await self._send(writer, status, body)
                if headers.get("connection", "").lower() == "close":
                    return
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
            return  # the client hung up (or sent something this test server does not speak)
        except asyncio.CancelledError:
            # close() ends open connections by cancelling them; ending normally here keeps Python 3.11's stream
            # callback from logging a CancelledError traceback per connection (it calls task.exception()).
            return
        finally:
            writer.close()

    @staticmethod
    async def _send(writer, status: int, body: bytes, headers: dict | None = None) -> None:
        from http import HTTPStatus

        head = f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        head += f"Content-Length: {len(body)}\r\n\r\n"
        writer.write(head.encode("latin-1") + body)
        await writer.drain()

    def close(self) -> None:
        """Stop serving and release the port."""
        import asyncio

        async def stop() -> None:
            self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:  # open keep-alive connections: end them here, not when the loop is gone
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._loop.is_running():
            # Closed here, not left to the garbage collector: its "unclosed event loop" ResourceWarning would land in
            # whatever code runs next, and a check that counts warnings (faults' bad_replies) would count it.
            self._loop.close()

    def __enter__(self) -> LoadLLMServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()



def png_bomb(width: int, height: int, rows: int | None = None) -> bytes:
    """A valid grey PNG whose header says ``width`` x ``height``, made without allocating its pixels.

    ``rows=None`` stores every row of zeros (zlib keeps it tiny: ~2 MB for 30000x30000), so it decodes in
    full if nothing refuses it; ``rows=64`` stores only the first rows, for checks that must refuse it from
    the header alone.
    """
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    z = zlib.compressobj(9)
    row = b"\x00" * (width + 1)  # filter byte + one byte per pixel
    body = b"".join(z.compress(row) for _ in range(height if rows is None else min(height, rows))) + z.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", body) + chunk(b"IEND", b"")



def process_group_left(pgid: int) -> list[int]:
    """The pids still in process group ``pgid``, zombies included (an unreaped worker is still there): what a
    test or fault trial asserts is empty once a job that ran in its own session has ended."""
    left = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == pgid:
                    left.append(int(entry))
            except ProcessLookupError:
                continue
    return left


def ctrl_c_reaches_it() -> None:
    """``preexec_fn`` of a process a test interrupts with SIGINT: Ctrl-C's default disposition, whatever the caller's.

    A shell without job control starts a background job (``nohup make test &``, some CI runners) with SIGINT
    ignored, and an ignored signal stays ignored across ``exec``: Python then installs no KeyboardInterrupt handler
    and the interrupt the test sends does nothing (the command ends 0). A terminal's Ctrl-C is what is tested.
    """
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
