"""The request path does each thing once: a picture sent by many requests and forms through an endpoint is
resized and PNG-encoded once per run, under its digest, and every request still carries its very pixels."""

from __future__ import annotations

import base64
import io
import threading
import time

from PIL import Image

from tokenswap.eval.form_runs import FormPlan
from tokenswap.inference.backends import OpenAIBackend
from tokenswap.inference.pictures import picture_digest
from tokenswap.inference.types import Reply, RequestStats


class Endpoint:
    """A client that answers "A" and keeps every image URL it was sent."""

    base_url = "http://127.0.0.1:9/v1"

    def __init__(self):
        self.stats = RequestStats()
        self.urls: list[str] = []
        self.lock = threading.Lock()

    def request(self, messages, **kw) -> Reply:
        with self.lock:
            self.urls += [p["image_url"]["url"] for m in messages if not isinstance(m["content"], str)
                          for p in m["content"] if p["type"] == "image_url"]
        return Reply(text="A")


def test_a_picture_in_many_requests_and_forms_is_encoded_once(make_pairs):
    pairs = make_pairs(12)
    plan = FormPlan(pairs, ("text", "interleaved", "caption", "recognition"))
    units = [*plan.caption_units(), *plan.independent_units()]
    client = Endpoint()
    backend = OpenAIBackend(client, "served", concurrency=8, max_pixels=40 * 40)
    encoded = []
    encode = backend._encode

    def counting(image):
        encoded.append(image.size)
        return encode(image)

    backend._encode = counting
    results = list(backend.generate((plan.conversation(u) for u in units), max_new_tokens=4))

    pictures = {picture_digest(inter.images[t]) for _, inter in pairs for t in inter.images}
    assert len(client.urls) > 2 * len(pictures)  # each picture is sent again and again
    assert len(encoded) == len(pictures) and set(encoded) == {(40, 40)}  # encoded once each, after the cap
    # Every request sent the picture's pixels, scaled down as before, and counted the scaling per request.
    sent = {Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB").tobytes()
            for url in client.urls}
    assert sent == {inter.images[t].resize((40, 40), Image.Resampling.BICUBIC).tobytes()
                    for _, inter in pairs for t in inter.images}
    assert sum(r.resized for r in results) == len(client.urls)


def test_the_streams_of_one_run_share_the_backends_threads(make_pairs, tmp_path):
    """Captions, the item forms and the caption-form items go out at once, on one pool of ``concurrency`` threads
    (a pool per stream left three times the threads waiting on the client's slots)."""
    from tokenswap.eval.form_runs import run_plan
    from tokenswap.inference.runs import RecordLog

    class Counting(Endpoint):
        def __init__(self):
            super().__init__()
            self.threads: set[int] = set()
            self.now = self.most = 0

        def request(self, messages, **kw) -> Reply:
            with self.lock:
                self.threads.add(threading.get_ident())
                self.now += 1
                self.most = max(self.most, self.now)
            try:
                time.sleep(0.002)
                return Reply(text="A photo of a cat.") if kw.get("max_tokens") == 64 else Reply(text="Answer: A")
            finally:
                with self.lock:
                    self.now -= 1

    pairs = make_pairs(12)
    plan = FormPlan(pairs, ("text", "interleaved", "caption", "recognition"))
    client = Counting()
    backend = OpenAIBackend(client, "served", concurrency=4)
    log = RecordLog(tmp_path / "records.jsonl")
    asked = run_plan(backend, log, plan, "generate", 16)
    backend.close()
    assert asked == len(plan.all_units()) == len(log.records)
    assert len(client.threads) <= 4 and client.most <= 4
