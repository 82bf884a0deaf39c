"""The three evaluators through an OpenAI-compatible endpoint: a real ``transformers serve`` of the tiny model on
127.0.0.1 (CPU) against the ``hf`` backend on the same checkpoint, item by item; faults, resume and key hygiene
against loopback servers.

The served checkpoint is the tiny Qwen2-VL with its weights redrawn at a larger scale (seeded), so its greedy
replies are long, varied and change with every image and its position: equal replies mean equal prompts, tokens
and pixels on both paths, which a checkpoint that only ever says "\\n" would not show.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from tests.support import ctrl_c_reaches_it
from tokenswap.cli import main as tokenswap_main
from tokenswap.eval.mc import MCItem

SECRET = "sk-tokenswap-test-3f9a1c"  # must appear in no output file or log
KEY_ENV = "TOKENSWAP_TEST_API_KEY"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def varied_model(tiny_qwen2vl, tmp_path_factory):
    """The tiny Qwen2-VL with redrawn weights (std 0.3, seed 1): greedy replies that depend on every input."""
    import torch

    from tokenswap.families import load_checkpoint

    out = tmp_path_factory.mktemp("varied-qwen2vl")
    model, processor = load_checkpoint(tiny_qwen2vl)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def served(varied_model, tmp_path_factory):
    """``transformers serve`` of :func:`varied_model` on CPU, started once for the module: its ``/v1`` URL."""
    port = _free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    cmd = [sys.executable, "-m", "transformers.cli.transformers", "serve", str(varied_model), "--device", "cpu",
           "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    with open(log, "wb") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"transformers serve did not come up: {log.read_text()[-2000:]}")
            time.sleep(0.5)
        yield {"base_url": f"http://127.0.0.1:{port}/v1", "log": log}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def _image(kind: str, color: str, size=(56, 56)) -> Image.Image | bytes:
    base = Image.new("RGB", size, color)
    if kind == "rgba":
        im = base.convert("RGBA")
        im.putalpha(128)
        return im
    if kind == "palette":
        return base.convert("P", palette=Image.Palette.ADAPTIVE, colors=8)
    buf = io.BytesIO()
    base.save(buf, format="JPEG", quality=80)
    return buf.getvalue()


def _bench(root: Path) -> Path:
    """Five pairs with 1-3 images: repeated and out-of-order tags, images inside choices, RGBA/palette/JPEG."""
    from tokenswap.data.tokenswap_bench import write_tokenswap_bench

    specs = [
        ("Is a <image 1> bigger than a dog?", ["yes", "no", "both", "neither"], {1: ("rgba", "red")}),
        ("Which is heavier, <image 2> or <image 1>?", ["<image 1>", "<image 2>", "same", "unknown"],
         {1: ("palette", "blue"), 2: ("jpeg", "green")}),
        ("Does a <image 1> eat a <image 1>?", ["often", "never", "<image 1>", "sometimes"], {1: ("jpeg", "yellow")}),
        ("What sits between <image 3>, <image 1> and <image 2>?", ["<image 2>", "air", "<image 3>", "water"],
         {1: ("rgba", "purple"), 2: ("jpeg", "orange"), 3: ("palette", "white")}),
        ("Is the sky blue?", ["yes", "no", "at night", "never"], {}),
    ]
    pairs = []
    for i, (question, choices, images) in enumerate(specs):
        plain_q, plain_c = question, list(choices)
        for n in images:
            plain_q = plain_q.replace(f"<image {n}>", f"thing{n}")
            plain_c = [c.replace(f"<image {n}>", f"thing{n}") for c in plain_c]
        text = MCItem(f"p{i}", "tiny_world", plain_q, plain_c, i % 4)
        pics = {n: _image(kind, color, (56 + 28 * n, 56)) for n, (kind, color) in images.items()}
        pairs.append((text, MCItem(f"p{i}", "tiny_world", question, choices, i % 4, pics)))
    write_tokenswap_bench(pairs, root)
    return root


def _records(path: Path, key: str = "key") -> dict[str, dict]:
    return {r[key]: r for r in map(json.loads, path.read_text().splitlines())}


def _openai(served: dict, model: Path) -> list[str]:
    return ["--backend", "openai", "--base-url", served["base_url"], "--model", str(model), "--api-key-env", KEY_ENV,
            "--concurrency", "4"]


def _assert_no_secret(*roots: Path, texts: tuple[str, ...] = ()) -> None:
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file():
                assert SECRET.encode() not in path.read_bytes(), path
    for text in texts:
        assert SECRET not in text


def _same_replies(hf: dict[str, dict], api: dict[str, dict], answer: str, varied: bool = True) -> None:
    assert hf.keys() == api.keys()
    replies = {r["response"] for r in hf.values()}
    assert not varied or len(replies) > len(hf) // 2, f"the checkpoint's replies are too alike to show anything: {replies}"
    for key in hf:
        # The same prompt length: the same template, text and number of image tokens (image sizes) on both paths.
        assert api[key]["usage"]["prompt_tokens"] == hf[key]["usage"]["prompt_tokens"], key
        # Both backends strip the content (transformers serve's Qwen response parser does, so the hf backend
        # does too); without that REST's OCR-first asked the two paths different transcriptions back.
        assert api[key]["response"] == hf[key]["response"], key
        assert api[key][answer] == hf[key][answer], key


@pytest.mark.compat
@pytest.mark.integration
def test_tokenswap_bench_parity_hf_and_served(served, varied_model, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(KEY_ENV, SECRET)
    bench = _bench(tmp_path / "bench")
    common = ["eval", "--bench", str(bench), "--max-new-tokens", "10"]
    # hf in left-padded batches of 8 (the default); the server answers one conversation at a time, unpadded.
    assert tokenswap_main([*common, "--model", str(varied_model), "--out", str(tmp_path / "hf")]) == 0
    assert tokenswap_main([*common, *_openai(served, varied_model), "--out", str(tmp_path / "api")]) == 0
    hf, api = _records(tmp_path / "hf" / "records.jsonl"), _records(tmp_path / "api" / "records.jsonl")
    _same_replies(hf, api, "pred")
    summary = json.loads((tmp_path / "api" / "gap.json").read_text())
    assert summary["n"] == 5 and summary["backend"] == "openai" and summary["n_failed"] == 0
    assert summary["usage"]["completion_tokens"] > 0 and summary["usage"]["requests"] == 10
    same = json.loads((tmp_path / "hf" / "gap.json").read_text())
    assert [r["pred_interleaved"] for r in summary["items"]] == [r["pred_interleaved"] for r in same["items"]]
    captured = capsys.readouterr()
    _assert_no_secret(tmp_path, texts=(captured.out, captured.err))


def _forms_bench(root: Path) -> Path:
    """Five pairs over five concepts: a picture shown by two items, a repeated tag, a picture inside a choice,
    RGBA/palette/JPEG pictures, an item without pictures."""
    from tokenswap.data.tokenswap_bench import write_tokenswap_bench

    pictures = {"cat": _image("rgba", "red"), "dog": _image("jpeg", "green", (84, 56)),
                "apple": _image("palette", "blue", (56, 84)), "tree": _image("jpeg", "yellow", (112, 56)),
                "house": _image("rgba", "purple", (56, 112))}
    specs = [
        ("Is a {cat} bigger than a {dog}?", ["yes", "no", "same", "unknown"]),
        ("Does a {cat} eat an {apple}, or does the {cat} sleep?", ["eat", "sleep", "both", "neither"]),
        ("Which grows on a {tree}?", ["{apple}", "stone", "glass", "iron"]),
        ("Is a {house} taller than a {tree}?", ["yes", "no", "same", "unknown"]),
        ("Is the sky blue?", ["yes", "no", "at night", "never"]),
    ]
    pairs = []
    for i, (question, choices) in enumerate(specs):
        texts = [question, *choices]
        names = list(dict.fromkeys(w for t in texts for w in re.findall(r"\{(\w+)\}", t)))
        tag = {name: n + 1 for n, name in enumerate(names)}
        plain = [t.format(**{n: n for n in names}) for t in texts]
        tagged = [t.format(**{n: f"<image {tag[n]}>" for n in names}) for t in texts]
        text = MCItem(f"f{i}", "tiny_world", plain[0], plain[1:], i % 4)
        pairs.append((text, MCItem(f"f{i}", "tiny_world", tagged[0], tagged[1:], i % 4,
                                   {tag[n]: pictures[n] for n in names})))
    write_tokenswap_bench(pairs, root)
    return root


@pytest.mark.integration
def test_every_form_parity_hf_and_served(served, varied_model, tmp_path):
    """--forms all on the hf backend and through transformers serve: the same requests, replies and scores, every
    distinct picture captioned and identified once (hf adds its log-likelihood naming records)."""
    bench = _forms_bench(tmp_path / "bench")
    common = ["eval", "--bench", str(bench), "--max-new-tokens", "8", "--forms", "all"]
    assert tokenswap_main([*common, "--model", str(varied_model), "--out", str(tmp_path / "hf")]) == 0
    assert tokenswap_main([*common, *_openai(served, varied_model), "--out", str(tmp_path / "api")]) == 0
    hf, api = _records(tmp_path / "hf" / "records.jsonl"), _records(tmp_path / "api" / "records.jsonl")
    forms = Counter(key.split("|")[0] for key in api)
    # 5 items x 5 item forms; 5 distinct pictures (the cat is shown by two items), each captioned and identified once.
    assert forms == {"text": 5, "interleaved": 5, "both": 5, "caption": 5, "rendered": 5, "captioning": 5,
                     "recognition": 5}
    assert set(hf) - set(api) == {k for k in hf if k.startswith("naming|")} and len(set(hf) - set(api)) == 5
    replies = {r["response"] for k, r in api.items()}
    assert len(replies) > len(api) // 2, replies
    for key in api:
        assert api[key]["usage"]["prompt_tokens"] == hf[key]["usage"]["prompt_tokens"], key
        # transformers serve leaves special tokens in the content (<|video_pad|> from this random checkpoint) where
        # the hf backend decodes without them; captions drop them before they go into a prompt.
        reply = re.sub(r"<\|[^<>|\s]{1,40}\|>", "", api[key]["response"]).strip()
        assert (reply, api[key].get("pred")) == (hf[key]["response"], hf[key].get("pred")), key
    a, b = (json.loads((tmp_path / d / "gap.json").read_text()) for d in ("hf", "api"))
    assert a["n"] == b["n"] == 5 and a["excluded"] == b["excluded"] == [] and a["n_pictures"] == b["n_pictures"] == 5
    for field in ("decomposition", "recognition_rate", "acc_both", "acc_caption", "acc_rendered"):
        assert a[field] == b[field], field
    # (the replies themselves were compared above, record by record)
    assert [{k: v for k, v in r.items() if not k.startswith("response_") and k != "recognized_naming"}
            for r in a["items"]] == [
        {k: v for k, v in r.items() if not k.startswith("response_")} for r in b["items"]]
    naming = {"pred_naming", "correct_naming", "loglik_naming"}
    assert [{k: v for k, v in p.items() if k not in naming and k != "response_recognition"} for p in a["pictures"]] \
        == [{k: v for k, v in p.items() if k != "response_recognition"} for p in b["pictures"]]
    assert all(naming <= set(p) for p in a["pictures"]) and all(p["caption"] for p in b["pictures"])


@pytest.mark.compat
@pytest.mark.integration
def test_crossmath_parity_hf_and_served(served, varied_model, tmp_path):
    data = tmp_path / "cm"
    assert tokenswap_main(["crossmath", "generate", "--n", "3", "--out", str(data), "--styles", "original"]) == 0
    for modality in ("image", "text"):
        common = ["crossmath", "eval", "--data", str(data / "Original"), "--modality", modality,
                  "--max-new-tokens", "12"]
        assert tokenswap_main([*common, "--model", str(varied_model), "--out", str(tmp_path / "hf")]) == 0
        assert tokenswap_main([*common, *_openai(served, varied_model), "--out", str(tmp_path / "api")]) == 0
        hf = _records(tmp_path / "hf" / f"predictions_{modality}.jsonl", "id")
        api = _records(tmp_path / "api" / f"predictions_{modality}.jsonl", "id")
        # CrossMath's long instruction drowns the puzzle image for this random checkpoint (its image replies are
        # the same for every puzzle), so here equal replies show equal text paths and equal image token counts;
        # the TokenSwap-Bench test above is the one that shows pixels and image order.
        _same_replies(hf, api, "prediction", varied=modality == "text")
        metrics = json.loads((tmp_path / "api" / f"metrics_{modality}.json").read_text())
        assert metrics["n"] == 3 and metrics["backend"] == "openai" and metrics["usage"]["requests"] == 3


@pytest.mark.compat
@pytest.mark.integration
def test_rest_parity_hf_and_served(served, varied_model, tmp_path):
    data = tmp_path / "soe"
    assert tokenswap_main(["rest", "build", "--source", "soebench", "--n", "2", "--out", str(data)]) == 0
    common = ["rest", "eval", "--data", str(data), "--ocr", "--max-new-tokens", "12"]
    assert tokenswap_main([*common, "--model", str(varied_model), "--out", str(tmp_path / "hf")]) == 0
    assert tokenswap_main([*common, *_openai(served, varied_model), "--out", str(tmp_path / "api")]) == 0
    hf, api = _records(tmp_path / "hf" / "predictions.jsonl"), _records(tmp_path / "api" / "predictions.jsonl")
    assert len(hf) == 2 * 6  # text, image, mixed, ocr_item, ocr_stem, ocr_first
    from tokenswap.rest.extract import extract_answer
    from tokenswap.rest.items import read_items

    items = {i.id: i for i in read_items(data / "items.jsonl")}
    for rows in (hf, api):
        for r in rows.values():
            r["answer"] = extract_answer(r["response"], items[r["item_id"]].answer_type, items[r["item_id"]].options)
    _same_replies(hf, api, "answer")
    a, b = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("hf", "api"))
    assert a["variants"] == b["variants"]


# ----------------------------------------------------------------------------- loopback servers


class Loopback:
    """An OpenAI-compatible server on 127.0.0.1 whose answer to each POST is ``behave(payload, attempt)``.

    ``attempt`` counts the POSTs of the same conversation so far (1 for the first). ``behave`` returns
    ``("json", dict)`` (answered 200), ``("status", code, headers)``, ``("raw", bytes)`` (200 with that body),
    ``("drop",)`` (the connection is closed without an answer) or ``("stall", seconds)`` then answers.
    Records every payload and its headers.
    """

    def __init__(self, behave):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.payloads: list[dict] = []
        self.headers: list[dict] = []
        self.attempts: dict[str, int] = {}
        lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                conv = json.dumps(payload["messages"], sort_keys=True)
                with lock:
                    server.payloads.append(payload)
                    server.headers.append(dict(self.headers))
                    server.attempts[conv] = server.attempts.get(conv, 0) + 1
                    attempt = server.attempts[conv]
                action = behave(payload, attempt)
                self.close_connection = True
                try:
                    if action[0] == "drop":
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    if action[0] == "stall":
                        time.sleep(action[1])
                        action = ("json", answer("B"))
                    if action[0] == "status":
                        self._send(action[1], b'{"error": "try later"}', action[2])
                    elif action[0] == "raw":
                        self._send(200, action[1])
                    else:
                        self._send(200, json.dumps(action[1]).encode())
                except OSError:
                    pass  # the client gave up (a deadline)

            def _send(self, status, body, headers=None):
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")  # it closes after each answer: no pooled reuse to race
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def answer(text: str, top: list[tuple[str, float]] | None = None, reasoning: str | None = None) -> dict:
    message = {"role": "assistant", "content": text}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    if top is not None:
        choice["logprobs"] = {"content": [{"token": top[0][0], "logprob": top[0][1],
                                           "top_logprobs": [{"token": t, "logprob": lp} for t, lp in top]}]}
    return {"choices": [choice], "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}


def _question(payload: dict) -> str:
    return "".join(p["text"] for m in payload["messages"] for p in m["content"] if p["type"] == "text")


def _eval_args(server, bench: Path, out: Path, *extra: str) -> list[str]:
    return ["eval", "--backend", "openai", "--base-url", server.base_url, "--model", "some-vlm", "--bench",
            str(bench), "--api-key-env", KEY_ENV, "--out", str(out), *extra]


@pytest.mark.integration
def test_images_go_in_place_lossless_with_caps(tmp_path, monkeypatch):
    import base64

    import numpy as np

    from tokenswap.data.tokenswap_bench import load_tokenswap_bench_pairs
    from tokenswap.eval.mc import build_conversation

    monkeypatch.setenv(KEY_ENV, SECRET)
    bench = _bench(tmp_path / "bench")
    with Loopback(lambda payload, attempt: ("json", answer("The answer is C."))) as server:
        assert tokenswap_main(_eval_args(server, bench, tmp_path / "out", "--max-images", "3")) == 0
        sent = {_question(p): p for p in server.payloads}
        assert all(h.get("Authorization") == f"Bearer {SECRET}" for h in server.headers)
    summary = json.loads((tmp_path / "out" / "gap.json").read_text())
    # Images per request, a repeated tag counted each time it is sent (as vLLM's --limit-mm-per-prompt counts):
    # p1 sends 4, p3 sends 5. Both are skipped and counted, never cut or sent; the rest is scored.
    assert summary["n_skipped"] == 2 and [e["id"] for e in summary["excluded"]] == ["test/1", "test/3"]
    assert summary["excluded"][0]["skipped"] == "4 images, more than --max-images 3" and summary["n"] == 3
    assert len(server.payloads) == 2 * 5 - 2  # (p4's two forms are the same question: one key in `sent`)
    for text, inter in load_tokenswap_bench_pairs(bench):
        for item in (text, inter):
            if item.id in ("test/1", "test/3") and item is inter:
                continue
            expected = build_conversation(item)[0]["content"]
            got = sent["".join(p["text"] for p in expected if p["type"] == "text")]["messages"][0]["content"]
            # In place and in order (a repeated tag sends its picture again), as PNG with the very pixels.
            assert [p["type"] for p in got] == ["image_url" if p["type"] == "image" else "text" for p in expected]
            for want, part in zip(expected, got):
                if want["type"] == "image":
                    url = part["image_url"]["url"]
                    assert url.startswith("data:image/png;base64,")
                    im = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
                    assert np.array_equal(np.asarray(im), np.asarray(want["image"]))
    assert {p["max_tokens"] for p in server.payloads} == {2048} and {p["temperature"] for p in server.payloads} == {0}
    _assert_no_secret(tmp_path)


@pytest.mark.integration
def test_release_settings_by_served_name_and_overrides(tmp_path):
    import base64

    from tokenswap.inference.model_settings import resize_to_pixels

    bench = _bench(tmp_path / "bench")
    sizes = {}
    with Loopback(lambda payload, attempt: ("json", answer("A"))) as server:
        args = _eval_args(server, bench, tmp_path / "q25", "--limit", "2")
        args[args.index("some-vlm")] = "Qwen/Qwen2.5-VL-7B-Instruct"
        assert tokenswap_main(args) == 0
        assert {p["max_tokens"] for p in server.payloads} == {128}  # the task file's qwen2_5_vl budget
        server.payloads.clear()
        assert tokenswap_main([*args[:-4], "--out", str(tmp_path / "q25b"), "--limit", "2",
                               "--max-new-tokens", "64"]) == 0
        assert {p["max_tokens"] for p in server.payloads} == {64}
        args[args.index("Qwen/Qwen2.5-VL-7B-Instruct")] = "qwen3-vl-8b-instruct"
        for name, extra in (("q3", []), ("q3cap", ["--max-pixels", "40000"]), ("q3off", ["--no-model-settings"])):
            server.payloads.clear()
            run = [*args, *extra]
            run[run.index(str(tmp_path / "q25"))] = str(tmp_path / name)
            assert tokenswap_main(run) == 0
            sizes[name] = {Image.open(io.BytesIO(base64.b64decode(p["image_url"]["url"].split(",", 1)[1]))).size
                           for payload in server.payloads for p in payload["messages"][0]["content"]
                           if p["type"] == "image_url"}
    originals = {(56 + 28 * n, 56) for n in (1, 2)}  # the images of items p0 and p1
    # The task file's Qwen3-VL resize (about 100,352 px, sides multiples of 32, bicubic), then --max-pixels.
    assert sizes["q3"] == {resize_to_pixels(Image.new("RGB", wh), 100_352).size for wh in originals}
    assert all(w % 32 == 0 and h % 32 == 0 and 90_000 < w * h < 125_000 for w, h in sizes["q3"])
    assert sizes["q3cap"] and all(w * h <= 40000 for w, h in sizes["q3cap"])
    assert sizes["q3off"] == originals
    summary = json.loads((tmp_path / "q3" / "gap.json").read_text())
    assert summary["model_settings"]["image_pixels"] == 100_352 and "Qwen3-VL" in summary["model_settings"]["applied"][0]
    assert summary["max_new_tokens"] == 2048


@pytest.mark.integration
def test_faults_are_retried_and_reasoning_is_kept(tmp_path, monkeypatch):
    import math

    monkeypatch.setenv(KEY_ENV, SECRET)
    bench = _bench(tmp_path / "bench")
    faults = [("drop",), ("status", 429, {"Retry-After": "1"}), ("status", 500, {}), ("raw", b"<html>busy</html>"),
              ("stall", 4.0)]
    first_fault: dict[str, tuple] = {}
    times: dict[str, list[float]] = {}

    def behave(payload, attempt):
        q = _question(payload) + str(len(payload["messages"][0]["content"]))
        times.setdefault(q, []).append(time.monotonic())
        if attempt == 1:
            first_fault[q] = faults[len(first_fault) % len(faults)]
            return first_fault[q]
        return ("json", answer("So the answer is B.", reasoning="A looks right at first. Or D?"))

    with Loopback(behave) as server:
        args = _eval_args(server, bench, tmp_path / "out", "--timeout", "1.5", "--max-retries", "4",
                          "--concurrency", "3")
        assert tokenswap_main(args) == 0
    records = _records(tmp_path / "out" / "records.jsonl")
    assert len(records) == 10 and all("error" not in r for r in records.values())
    assert {r["pred"] for r in records.values()} == {"B"}  # from the final content, not the reasoning's A / D
    assert {r["reasoning"] for r in records.values()} == {"A looks right at first. Or D?"}
    # One fault, then one answer: each asked again exactly once (p4's two forms are one conversation: 3 asks).
    assert sorted(map(len, times.values())) == [2] * 8 + [3]
    throttled = [q for q, f in first_fault.items() if f[0] == "status" and f[1] == 429]
    assert throttled and all(times[q][1] - times[q][0] >= 0.95 for q in throttled)  # Retry-After honoured
    summary = json.loads((tmp_path / "out" / "gap.json").read_text())
    assert summary["n_failed"] == 0 and summary["items"][0]["reasoning_interleaved"].startswith("A looks")
    assert summary["usage"] == {"prompt_tokens": 70, "completion_tokens": 30, "requests": 10}
    assert not math.isnan(summary["acc_text"])
    _assert_no_secret(tmp_path)


@pytest.mark.integration
def test_failed_requests_are_counted_never_scored_and_fail_the_run(tmp_path, capsys):
    bench = _bench(tmp_path / "bench")

    def behave(payload, attempt):
        return ("status", 500, {}) if "eat a" in _question(payload) else ("json", answer("A"))

    with Loopback(behave) as server:
        args = _eval_args(server, bench, tmp_path / "out", "--max-retries", "1", "--concurrency", "1")
        # One failure in 10 is over 1%: the run stops there (what was answered is kept) and exits 1.
        assert tokenswap_main(args) == 1
        err = capsys.readouterr().err
        assert "stopped after 1 failed requests: more than --max-error-share 1.0% of the 10" in err
        assert "HTTP 500" in err and not (tmp_path / "out" / "gap.json").exists()
        records = _records(tmp_path / "out" / "records.jsonl")
        assert list(records) == ["text|test/0", "interleaved|test/0", "text|test/1", "interleaved|test/1",
                                 "text|test/2"] and "error" in records["text|test/2"]
        asked = len(server.payloads)
        assert tokenswap_main([*args, "--max-error-share", "0.5"]) == 0
        # The failed one again and the rest once: 2 x 2 attempts for p2's forms, 1 each for p3 and p4.
        assert len(server.payloads) - asked == 2 * 2 + 4
        capsys.readouterr()
        assert tokenswap_main([*args, "--max-error-share", "0.1"]) == 1  # the retried ones fail again: 2 of 10
        assert "stopped after 2 failed requests: more than --max-error-share 10.0%" in capsys.readouterr().err
    summary = json.loads((tmp_path / "out" / "gap.json").read_text())
    # n_failed counts the items left out (issue 31's gap.json contract), n_failed_requests their failed requests.
    assert summary["n"] == 4 and summary["n_failed"] == 1 and summary["n_failed_requests"] == 2
    assert [e["id"] for e in summary["excluded"]] == ["test/2"]
    assert set(summary["excluded"][0]["forms"]) == {"text", "interleaved"}
    # Item p2 (answer C) is out of the scores, not a wrong answer: A is right for p0 and p4 of the remaining four.
    assert summary["acc_text"] == 2 / 4


@pytest.mark.integration
def test_kill_mid_run_then_resume_asks_nothing_twice(tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)
    bench = _bench(tmp_path / "bench")
    out = tmp_path / "out"

    def behave(payload, attempt):
        time.sleep(0.4)
        return ("json", answer("D"))

    with Loopback(behave) as server:
        args = _eval_args(server, bench, out, "--concurrency", "2")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get(
            "PYTHONPATH", "")])}
        with open(tmp_path / "run.log", "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "tokenswap.cli", *args], stdout=log, stderr=log, env=env)
            deadline = time.monotonic() + 120
            while not ((out / "records.jsonl").exists() and
                       len((out / "records.jsonl").read_text().splitlines()) >= 3):
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "run.log").read_text()
                time.sleep(0.05)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        before = _records(out / "records.jsonl")
        asked_before = len(server.payloads)
        assert 3 <= len(before) < 10
        with open(out / "records.jsonl", "a") as f:  # a torn last line, as a kill inside a write leaves
            f.write('{"key": "text|test/4", "resp')
        assert tokenswap_main(args) == 0
        asked_after = [_question(p) for p in server.payloads[asked_before:]]
    final = _records(out / "records.jsonl")
    assert len(final) == 10 and all(r["response"] == "D" for r in final.values())
    from collections import Counter

    from tokenswap.data.tokenswap_bench import load_tokenswap_bench_pairs
    from tokenswap.eval.mc import build_conversation

    def question(item):
        return "".join(p["text"] for p in build_conversation(item)[0]["content"] if p["type"] == "text")

    by_key = {f"{form}|{item.id}": question(item) for pair in load_tokenswap_bench_pairs(bench)
              for form, item in zip(("text", "interleaved"), pair)}
    # Nothing recorded before the kill is asked again, everything else exactly once (requests in flight at the
    # kill had no record yet, so they are asked again).
    assert Counter(asked_after) == Counter(by_key[k] for k in by_key if k not in before)
    _assert_no_secret(tmp_path)


@pytest.mark.integration
def test_ctrl_c_is_one_line_and_130_and_the_rerun_says_it_resumes(tmp_path, monkeypatch, capsys):
    # Ctrl-C used to print a 50-line traceback ending in the redacting streams, and the rerun said nothing about
    # resuming.
    monkeypatch.setenv(KEY_ENV, SECRET)
    bench = _bench(tmp_path / "bench")
    out = tmp_path / "out"

    def behave(payload, attempt):
        time.sleep(0.4)
        return ("json", answer("D"))

    with Loopback(behave) as server:
        args = _eval_args(server, bench, out, "--concurrency", "2")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get(
            "PYTHONPATH", "")])}
        proc = subprocess.Popen([sys.executable, "-m", "tokenswap.cli", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, text=True, preexec_fn=ctrl_c_reaches_it)
        deadline = time.monotonic() + 120
        while not ((out / "records.jsonl").exists() and
                   len((out / "records.jsonl").read_text().splitlines()) >= 3):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 130, stderr
        said = [line for line in (stdout + stderr).splitlines() if line.strip() and "it/s]" not in line]
        assert "Traceback" not in stderr and len([s for s in said if "error" in s or "interrupted" in s]) == 1, stderr
        assert "interrupted (Ctrl-C)" in stderr and "run the same command again" in stderr
        kept = len(_records(out / "records.jsonl"))
        assert 3 <= kept < 10
        capsys.readouterr()
        assert tokenswap_main(args) == 0
        err = capsys.readouterr().err
    assert f"resuming {out}: {kept} answers kept, {10 - kept} left to ask" in err, err
    assert len(_records(out / "records.jsonl")) == 10
    _assert_no_secret(tmp_path)


@pytest.mark.integration
def test_loglik_through_an_endpoint_reads_top_logprobs(tmp_path):
    import math

    bench = _bench(tmp_path / "bench")
    top = [(" B", math.log(0.6)), ("C", math.log(0.2)), ("B", math.log(0.1)), (" x", math.log(0.05))]
    with Loopback(lambda payload, attempt: ("json", answer(" B", top=top))) as server:
        assert tokenswap_main(_eval_args(server, bench, tmp_path / "out", "--scorer", "loglik")) == 0
        assert {(p["max_tokens"], p["logprobs"], p["top_logprobs"]) for p in server.payloads} == {(1, True, 20)}
    summary = json.loads((tmp_path / "out" / "gap.json").read_text())
    assert summary["scorer"] == "loglik" and {r["pred_text"] for r in summary["items"]} == {"B"}
    probs = summary["items"][0]["letter_probs_text"]
    assert probs == pytest.approx([0.0, 0.7, 0.2, 0.0])  # P("B") + P(" B"); the letters outside the top-k get 0
    assert summary["loglik_outside_mass"]["max"] == pytest.approx(0.05)


@pytest.mark.integration
def test_loglik_is_refused_where_the_server_returns_no_logprobs(served, varied_model, tmp_path, capsys):
    bench = _bench(tmp_path / "bench")
    args = ["eval", "--bench", str(bench), "--scorer", "loglik", *_openai(served, varied_model), "--out",
            str(tmp_path / "out")]
    assert tokenswap_main(args) == 2
    err = capsys.readouterr().err
    assert "answered without logprobs" in err and "--scorer generate" in err
    assert not (tmp_path / "out" / "records.jsonl").exists()  # refused at the first item, nothing recorded


@pytest.mark.integration
def test_openai_reasoning_models_get_max_completion_tokens_and_no_temperature(tmp_path):
    # api.openai.com answers 400 to max_tokens or a temperature for o-series / GPT-5 models.
    bench = _bench(tmp_path / "bench")
    with Loopback(lambda payload, attempt: ("json", answer("A"))) as server:
        for name, out in (("gpt-5-mini", "gpt5"), ("gpt-4o", "gpt4o")):
            server.payloads.clear()
            args = _eval_args(server, bench, tmp_path / out, "--limit", "1")
            args[args.index("some-vlm")] = name
            assert tokenswap_main(args) == 0
            fields = [(p.get("max_tokens"), p.get("temperature"), p.get("max_completion_tokens")) for p in server.payloads]
            assert fields and set(fields) == ({(None, None, 2048)} if name == "gpt-5-mini" else {(2048, 0, None)})
            assert all("max_tokens" not in p for p in server.payloads) or name != "gpt-5-mini"


@pytest.mark.parametrize("name", ["hf", "model_settings", "backends"])
def test_inference_doctests(name):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"tokenswap.inference.{name}"))
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.integration
def test_crossmath_and_rest_count_failed_requests_and_leave_them_out(tmp_path, capsys):
    from tokenswap.crossmath.data import load_crossmath

    data = tmp_path / "cm"
    assert tokenswap_main(["crossmath", "generate", "--n", "3", "--out", str(data), "--styles", "original"]) == 0
    bad_table = load_crossmath(data / "Original")[1]["markdown_table"]
    soe = tmp_path / "soe"
    assert tokenswap_main(["rest", "build", "--source", "soebench", "--n", "2", "--out", str(soe)]) == 0

    def behave(payload, attempt):
        texts = [p.get("text", "") for p in payload["messages"][0]["content"]]
        if bad_table in texts:
            return ("status", 503, {})
        if any("Transcribe" in t for t in texts) and attempt == 1 and payload["messages"][0]["content"][0]["type"] \
                == "image_url":
            return ("status", 500, {})
        return ("json", answer("<answer>1 2</answer> A"))

    with Loopback(behave) as server:
        common = ["--backend", "openai", "--base-url", server.base_url, "--model", "m", "--max-retries", "0"]
        cm = ["crossmath", "eval", "--data", str(data / "Original"), "--modality", "text", "--out",
              str(tmp_path / "cm-out"), *common]
        assert tokenswap_main(cm) == 1
        assert "stopped after 1 failed requests: more than --max-error-share 1.0% of the 3" in capsys.readouterr().err
        assert tokenswap_main([*cm, "--max-error-share", "0.5"]) == 0
        metrics = json.loads((tmp_path / "cm-out" / "metrics_text.json").read_text())
        assert (metrics["n"], metrics["n_failed"], metrics["n_puzzles"]) == (2, 1, 3)

        rest = ["rest", "eval", "--data", str(soe), "--ocr", "--out", str(tmp_path / "rest-out"), *common,
                "--max-error-share", "0.5"]
        assert tokenswap_main(rest) == 0
        metrics = json.loads((tmp_path / "rest-out" / "metrics.json").read_text())
        # Both OCR requests of each item failed once (no retries): the items' OCR-first could not be asked either,
        # so both items are left out of the variant, never scored wrong; a rerun asks exactly those again.
        assert metrics["n_failed"] == 4 and metrics["n_skipped"] == 2
        assert metrics["excluded"]["sans_200"] == ["soebench-0-00000", "soebench-0-00001"]
        assert metrics["variants"]["sans_200"]["all"]["n"] == 0
        asked = len(server.payloads)
        assert tokenswap_main(rest) == 0
        assert len(server.payloads) - asked == 4 + 2  # the four OCR requests, then the two OCR-first ones
    metrics = json.loads((tmp_path / "rest-out" / "metrics.json").read_text())
    assert metrics["n_failed"] == metrics["n_skipped"] == 0 and metrics["variants"]["sans_200"]["all"]["n"] == 2


@pytest.mark.integration
def test_a_think_block_left_in_the_content_is_not_the_answer(tmp_path):
    bench = _bench(tmp_path / "bench")
    reply = answer("Maybe A, or D.\n</think>\n\nAnswer: B")  # a server without a reasoning parser
    with Loopback(lambda payload, attempt: ("json", reply)) as server:
        assert tokenswap_main(_eval_args(server, bench, tmp_path / "out", "--limit", "2")) == 0
    records = _records(tmp_path / "out" / "records.jsonl")
    assert {(r["response"], r["reasoning"], r["pred"]) for r in records.values()} == {
        ("Answer: B", "Maybe A, or D.", "B")}


@pytest.mark.integration
def test_qwen3_5_thinking_settings_by_benchmark_and_scorer(tmp_path):
    import math

    bench = _bench(tmp_path / "bench")
    data = tmp_path / "cm"
    assert tokenswap_main(["crossmath", "generate", "--n", "1", "--out", str(data), "--styles", "original"]) == 0
    top = [("B", math.log(0.9))]
    with Loopback(lambda payload, attempt: ("json", answer("<answer>1</answer> B", top=top))) as server:
        def sent(argv) -> set:
            server.payloads.clear()
            assert tokenswap_main(argv) == 0
            return {json.dumps(p.get("chat_template_kwargs"), sort_keys=True) for p in server.payloads}

        base = _eval_args(server, bench, tmp_path / "g", "--limit", "1")
        base[base.index("some-vlm")] = "Qwen/Qwen3.5-9B"
        assert sent(base) == {"null"}  # TokenSwap's task files leave the template's default (thinking on)
        loglik = [*base, "--scorer", "loglik"]
        loglik[loglik.index(str(tmp_path / "g"))] = str(tmp_path / "l")
        assert sent(loglik) == {'{"enable_thinking": false}'}  # the letter is scored where an answer starts
        cm = ["crossmath", "eval", "--backend", "openai", "--base-url", server.base_url, "--model", "Qwen/Qwen3.5-9B",
              "--data", str(data / "Original"), "--modality", "text"]
        assert sent([*cm, "--out", str(tmp_path / "c1")]) == {'{"enable_thinking": false}'}  # CrossMath's default
        assert sent([*cm, "--out", str(tmp_path / "c2"), "--thinking"]) == {'{"enable_thinking": true}'}
        assert {p["max_tokens"] for p in server.payloads} == {16384}  # CrossMath's release budget


@pytest.mark.integration
def test_a_server_echoing_the_key_does_not_put_it_in_the_records(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(KEY_ENV, SECRET)
    bench = _bench(tmp_path / "bench")

    with Loopback(lambda payload, attempt: ("json", answer("A"))) as server:
        # A proxy that answers 401 quoting the Authorization header it got.
        handler = server.httpd.RequestHandlerClass

        def do_post(self):
            body = json.dumps({"error": f"invalid key {self.headers['Authorization']}"}).encode()
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        handler.do_POST = do_post
        args = _eval_args(server, bench, tmp_path / "out", "--max-error-share", "1")
        assert tokenswap_main(args) == 1  # every request failed: the gap rests on 0 items (issue 39), said once
    captured = capsys.readouterr()
    assert "error: the text form rests on 0 items" in captured.err and "invalid key Bearer [API key]" in captured.err
    records = _records(tmp_path / "out" / "records.jsonl")
    assert all("invalid key Bearer [API key]" in r["error"] for r in records.values())
    _assert_no_secret(tmp_path, texts=(captured.out, captured.err))


@pytest.mark.integration
def test_a_folder_holding_another_run_is_refused(tmp_path, capsys):
    bench = _bench(tmp_path / "bench")
    with Loopback(lambda payload, attempt: ("json", answer("A"))) as server:
        args = _eval_args(server, bench, tmp_path / "out", "--limit", "1")
        assert tokenswap_main(args) == 0
        assert tokenswap_main([*args, "--max-new-tokens", "64"]) == 2  # other records would mix into one summary
        assert "max_new_tokens: 2048 before, 64 now" in capsys.readouterr().err
        assert tokenswap_main([*args[:-2], "--limit", "2", "--concurrency", "4"]) == 0  # more items: resumed
    assert len(_records(tmp_path / "out" / "records.jsonl")) == 4
