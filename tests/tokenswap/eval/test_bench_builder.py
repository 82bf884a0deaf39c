"""Bench builder filters on constructed cases, resume, an HTTP judge, and the output schema."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from PIL import Image

from tokenswap.concepts import LexiconExtractor
from tokenswap.data.tokenswap_bench import load_tokenswap_bench_pairs
from tokenswap.eval.bench_builder import BenchBuilder
from tokenswap.eval.mc import MCItem
from tokenswap.inference import OpenAIChatModel
from tokenswap.store.image_store import ImageStore, StoreWriter
from tokenswap.testing import ScriptedChatModel

COLORS = {"horse": "red", "heart": "blue", "moon": "white", "sun": "yellow", "lemon": "green"}
CAPTIONS = {(255, 0, 0): "a horse", (0, 0, 255): "a heart", (255, 255, 255): "the moon"}
CAPTIONS |= {(255, 255, 0): "the sun", (0, 128, 0): "a tennis ball"}  # the lemon picture reads as a ball
# Proxy rules per item marker: words the prompt must contain for a correct answer, and a forced wrong answer.
RULES = {
    "k0": {"needs": ["horse"]},
    "k1": {"needs": []},
    "k2": {"needs": ["moon"]},
    "k3": {"needs": ["sun"], "text_wrong": True},
    "k4": {"needs": []},  # answerable without its concept: fails the importance filter
    "k5": {"needs": ["lemon"]},
    "k6": {"needs": ["horse"]},
}
QUESTIONS = {
    "k0": "[k0] Does a horse have a heart?",
    "k1": "[k1] What is 2 + 2?",
    "k2": "[k2] Is the moon bright?",
    "k3": "[k3] Is the sun hot?",
    "k4": "[k4] Is the sun a star?",
    "k5": "[k5] Is a lemon sour?",
    "k6": "[k6] Is the moon near the horse?",
}
EXPECTED_DROPS = {"k1": "no_concepts", "k2": "validity", "k3": "importance", "k4": "importance", "k5": "caption"}


def _text(messages: list[dict]) -> str:
    content = messages[-1]["content"]
    return content if isinstance(content, str) else "".join(p["text"] for p in content if p["type"] == "text")


class FakeProxy(ScriptedChatModel):
    """Answers B (correct) iff every needed word is in the prompt; counts calls."""

    def __init__(self, fail_on: str | None = None):
        super().__init__()
        self.calls: list[str] = []
        self.fail_on = fail_on

    def answer(self, messages: list[dict]) -> str:
        prompt = _text(messages)
        marker = re.search(r"\[(k\d)\]", prompt).group(1)
        if marker == self.fail_on:
            raise RuntimeError("simulated crash")
        self.calls.append(marker)
        rule = RULES[marker]
        ok = not rule.get("text_wrong") and all(w in prompt for w in rule["needs"])
        return "The answer is B." if ok else "The answer is C."


class FakeJudge(ScriptedChatModel):
    """Rejects the moon picture; records what it was shown."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[str, int, str]] = []

    def answer(self, messages: list[dict]) -> str:
        parts = messages[0]["content"]
        concept = re.search(r"the concept '([^']+)'", parts[0]["text"]).group(1)
        n_images = sum(p["type"] == "image" for p in parts)
        self.seen.append((concept, n_images, _text(messages)))
        return '```json\n{"valid": false}\n```' if concept == "moon" else '{"valid": true}'


class FakeCaptioner(ScriptedChatModel):
    def answer(self, messages: list[dict]) -> str:
        image = next(p["image"] for p in messages[0]["content"] if p["type"] == "image")
        return CAPTIONS[image.getpixel((0, 0))] + "\n"


@pytest.fixture()
def store(tmp_path):
    with StoreWriter(tmp_path / "store") as w:
        for concept, color in COLORS.items():
            w.add(concept, Image.new("RGB", (32, 32), color), source="test")
    return ImageStore(tmp_path / "store")


def _items() -> list[MCItem]:
    return [MCItem(k, "astronomy", q, ["w", "x", "y", "z"], 1) for k, q in QUESTIONS.items()]


def _builder(store, out, judge=None, proxy=None, filters=("validity", "importance", "caption")):
    return BenchBuilder(
        extractor=LexiconExtractor(store.keys()),
        store=store,
        judge=judge or FakeJudge(),
        proxy=proxy or FakeProxy(),
        captioner=FakeCaptioner(),
        out_dir=out,
        filters=filters,
    )


def test_each_filter_drops_exactly_its_items(store, tmp_path):
    judge = FakeJudge()
    summary = _builder(store, tmp_path / "bench", judge=judge).run(_items())
    dropped = [json.loads(line) for line in (tmp_path / "bench" / "dropped.jsonl").read_text().splitlines()]
    assert {d["id"]: d["reason"] for d in dropped} == EXPECTED_DROPS
    assert summary["kept"] == 2 and summary["swaps"] == 3
    # One-at-a-time restoration: one image per judge call, the other concept still written out.
    assert ("horse", 1) in {(c, n) for c, n, _ in judge.seen}
    k0_heart = next(t for c, _, t in judge.seen if c == "heart" and "[k0]" in t)
    assert "Does a horse have a " in k0_heart

    pairs = load_tokenswap_bench_pairs(tmp_path / "bench")
    assert [t.question for t, _ in pairs] == [QUESTIONS["k0"], QUESTIONS["k6"]]
    (t0, i0), (t6, i6) = pairs
    assert i0.question == "[k0] Does a <image 1> have a <image 2>?" and i0.concepts == {1: "horse", 2: "heart"}
    assert [i0.images[n].convert("RGB").getpixel((0, 0)) for n in (1, 2)] == [(255, 0, 0), (0, 0, 255)]
    assert i6.question == "[k6] Is the moon near the <image 1>?" and sorted(i6.images) == [1]
    assert t0.answer == i0.answer == 1 and t0.subject == "astronomy"


def test_filters_can_be_switched_off(store, tmp_path):
    summary = _builder(store, tmp_path / "b", filters=("validity",)).run(_items())
    assert summary["dropped"] == {"no_concepts": 1, "validity": 1}


def test_resume_does_not_redo_finished_items(store, tmp_path):
    out = tmp_path / "bench"
    crashing = FakeProxy(fail_on="k4")
    with pytest.raises(RuntimeError, match="simulated crash"):
        _builder(store, out, proxy=crashing).run(_items())
    done = [json.loads(line)["id"] for line in (out / "results.jsonl").read_text().splitlines()]
    assert done == ["k0", "k1", "k2", "k3"]
    proxy = FakeProxy()
    _builder(store, out, proxy=proxy).run(_items())
    assert set(proxy.calls) == {"k4", "k5", "k6"}
    again = FakeProxy()
    _builder(store, out, proxy=again).run(_items())
    assert again.calls == []
    dropped = [json.loads(line) for line in (out / "dropped.jsonl").read_text().splitlines()]
    assert {d["id"]: d["reason"] for d in dropped} == EXPECTED_DROPS


class _JudgeHandler(BaseHTTPRequestHandler):
    requests: list[dict] = []

    def do_POST(self):  # noqa: N802 (http.server API)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        parts = body["messages"][0]["content"]
        concept = re.search(r"the concept '([^']+)'", parts[0]["text"]).group(1)
        reply = json.dumps({"valid": concept != "moon"})
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": reply}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.mark.integration
def test_validity_filter_through_openai_chat_model(store, tmp_path):
    server = HTTPServer(("127.0.0.1", 0), _JudgeHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        judge = OpenAIChatModel(f"http://127.0.0.1:{server.server_port}/v1", model="judge", max_retries=0)
        summary = _builder(store, tmp_path / "bench", judge=judge).run(_items())
    finally:
        server.shutdown()
        thread.join()
    assert summary["dropped"] == {"no_concepts": 1, "validity": 1, "importance": 2, "caption": 1}
    image_parts = [p for r in _JudgeHandler.requests for p in r["messages"][0]["content"] if p["type"] == "image_url"]
    assert image_parts and all(p["image_url"]["url"].startswith("data:image/png;base64,") for p in image_parts)
    assert judge.num_requests == len(_JudgeHandler.requests)


def _served(payload: dict) -> str:
    """The fakes above as one HTTP server: the model name picks judge, proxy or captioner."""
    import base64
    import io

    messages = payload["messages"]
    parts = messages[0]["content"]
    if payload["model"] == "captioner":
        url = next(p["image_url"]["url"] for p in parts if p["type"] == "image_url")
        image = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB")
        return CAPTIONS[image.getpixel((0, 0))]
    if payload["model"] == "judge":
        concept = re.search(r"the concept '([^']+)'", parts[0]["text"]).group(1)
        return json.dumps({"valid": concept != "moon"})
    prompt = messages[-1]["content"]
    prompt = prompt if isinstance(prompt, str) else "".join(p.get("text", "") for p in prompt)
    rule = RULES[re.search(r"\[(k\d)\]", prompt).group(1)]
    ok = not rule.get("text_wrong") and all(w in prompt for w in rule["needs"])
    return "The answer is B." if ok else "The answer is C."


def _http_builder(store, out, base_url: str, concurrency: int) -> BenchBuilder:
    def model(name: str) -> OpenAIChatModel:
        return OpenAIChatModel(base_url, name, max_retries=1, max_backoff=0.05, concurrency=concurrency,
                               cache_path=out / "cache" / f"{name}.jsonl")

    return BenchBuilder(extractor=LexiconExtractor(store.keys()), store=store, judge=model("judge"),
                        proxy=model("proxy"), captioner=model("captioner"), out_dir=out, concurrency=concurrency)


def _bench_files(out) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.name != "requests.json" and "cache" not in p.relative_to(out).parts}


@pytest.mark.integration
def test_items_in_flight_write_the_same_bench_as_one_at_a_time(store, tmp_path):
    import random

    from tests.support import LoadLLMServer
    from tokenswap.eval.bench_builder import BenchRequestsFailed

    items = [MCItem(f"{k}-{n}", "astronomy", q, ["w", "x", "y", "z"], 1) for n in range(4) for k, q in QUESTIONS.items()]
    with LoadLLMServer(_served, latency=lambda payload: random.uniform(0.0, 0.03)) as server:
        one = _http_builder(store, tmp_path / "one", server.base_url, 1).run(items)
        assert server.max_in_flight == 1
        many = _http_builder(store, tmp_path / "many", server.base_url, 8).run(items)
        assert server.max_in_flight > 2
        assert one == many and one["kept"] == 8
        assert _bench_files(tmp_path / "one") == _bench_files(tmp_path / "many")
        requests = json.loads((tmp_path / "many" / "requests.json").read_text())
        assert requests["proxy"]["replies"] > 0 and requests["failed_items"] == []

        # The proxy's server drops every request about [k4]: those items are named and not recorded.
        def dropping(payload):
            if "[k4]" in json.dumps(payload):
                raise ConnectionError("scripted drop")
            return _served(payload)

        server.reply = dropping
        out = tmp_path / "failing"
        with pytest.raises(BenchRequestsFailed, match=r"4 item\(s\) had a request that failed for good"):
            _http_builder(store, out, server.base_url, 8).run(items)
        recorded = {json.loads(line)["id"] for line in (out / "results.jsonl").read_text().splitlines()}
        assert recorded == {it.id for it in items} - {f"k4-{n}" for n in range(4)}
        assert not (out / "summary.json").exists()
        server.reply = _served  # the server recovers: the rerun fills them in
        assert _http_builder(store, out, server.base_url, 8).run(items) == one
    ref = _bench_files(tmp_path / "one")
    got = _bench_files(out)
    assert {k: v for k, v in got.items() if k != "results.jsonl"} == {k: v for k, v in ref.items() if k != "results.jsonl"}
