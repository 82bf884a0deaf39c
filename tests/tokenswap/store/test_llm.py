"""tokenswap.inference: the OpenAI-compatible client against a local server, the cache, JSON parsing."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from tokenswap.inference import OpenAIChatModel, ResponseCache, TransformersChatModel, cache_key
from tokenswap.inference.parsing import parse_json_response


@pytest.mark.integration
def test_openai_chat_sends_images_as_png_data_urls_and_key_only_in_header(fake_openai, tmp_path, monkeypatch):
    monkeypatch.setenv("TS_TEST_KEY", "sk-secret")
    fake_openai.reply = lambda payload: "hello"
    model = OpenAIChatModel(fake_openai.base_url, "m1", api_key_env="TS_TEST_KEY", cache_path=tmp_path / "c.jsonl")
    image = Image.new("RGB", (4, 4), "red")
    messages = [{"role": "user", "content": [{"type": "text", "text": "what?"}, {"type": "image", "image": image}]}]
    assert model.chat(messages) == "hello"
    sent = fake_openai.requests[0]
    assert sent["model"] == "m1" and sent["temperature"] == 0.0
    part = sent["messages"][0]["content"][1]
    assert part["type"] == "image_url" and part["image_url"]["url"].startswith("data:image/png;base64,")
    decoded = Image.open(io.BytesIO(base64.b64decode(part["image_url"]["url"].split(",", 1)[1])))
    assert decoded.size == (4, 4) and decoded.format == "PNG"
    assert fake_openai.headers[0]["Authorization"] == "Bearer sk-secret"
    assert "sk-secret" not in (tmp_path / "c.jsonl").read_text()
    # A second model over the same cache file answers without a request; another image misses.
    again = OpenAIChatModel(fake_openai.base_url, "m1", api_key_env="TS_TEST_KEY", cache_path=tmp_path / "c.jsonl")
    assert again.chat(messages) == "hello" and again.num_requests == 0
    other = [{"role": "user", "content": [{"type": "image", "image": Image.new("RGB", (4, 4), "blue")}]}]
    again.chat(other)
    assert again.num_requests == 1


@pytest.mark.integration
def test_openai_chat_retries_transient_errors_and_raises_on_client_errors(fake_openai):
    calls = iter([500, 429, "ok"])
    fake_openai.reply = lambda payload: next(calls)
    model = OpenAIChatModel(fake_openai.base_url, "m", max_retries=3)
    assert model.chat([{"role": "user", "content": "x"}]) == "ok"
    assert model.num_requests == 3
    fake_openai.reply = lambda payload: 400
    with pytest.raises(RuntimeError, match="HTTP 400"):
        model.chat([{"role": "user", "content": "y"}])
    fake_openai.reply = lambda payload: 503
    with pytest.raises(RuntimeError, match="after 2 attempts"):
        OpenAIChatModel(fake_openai.base_url, "m", max_retries=1).chat([{"role": "user", "content": "z"}])


def test_cache_key_depends_on_pixels_model_and_settings():
    a = [{"role": "user", "content": [{"type": "image", "image": Image.new("RGB", (2, 2), "red")}]}]
    b = [{"role": "user", "content": [{"type": "image", "image": Image.new("RGB", (2, 2), "blue")}]}]
    assert cache_key("m", a) == cache_key("m", a)
    assert cache_key("m", a) != cache_key("m", b) != cache_key("n", b)
    assert cache_key("m", a, temperature=0.0) != cache_key("m", a, temperature=1.0)


def test_response_cache_skips_a_torn_last_line(tmp_path):
    cache = ResponseCache(tmp_path / "c.jsonl")
    cache.put("k1", "v1")
    with open(tmp_path / "c.jsonl", "a") as f:
        f.write('{"key": "k2", "resp')  # a process killed mid-append
    again = ResponseCache(tmp_path / "c.jsonl")
    assert again.get("k1") == "v1" and again.get("k2") is None and len(again) == 1


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"a": 1}', {"a": 1}),
        ('```json\n{"concepts": []}\n```', {"concepts": []}),
        ('Here you go:\n```\n{"a": {"b": 2}}\n```\nDone.', {"a": {"b": 2}}),
        ('Sure. {"x": "y"} Anything else?', {"x": "y"}),
        ('[1, 2] then {"k": [1]}', {"k": [1]}),
    ],
)
def test_parse_json_response(text, expected):
    assert parse_json_response(text) == expected


def test_parse_json_response_names_the_reply_when_there_is_no_object():
    with pytest.raises(ValueError, match="no JSON object"):
        parse_json_response("I cannot help with that.")


def test_transformers_chat_model_answers_with_a_tiny_vlm(tiny_qwen2vl, tmp_path):
    model = TransformersChatModel(tiny_qwen2vl, max_new_tokens=3, cache_path=tmp_path / "c.jsonl")
    messages = [
        {"role": "user", "content": [{"type": "image", "image": Image.new("RGB", (56, 56))}, {"type": "text", "text": "hi"}]}
    ]
    reply = model.chat(messages)
    assert isinstance(reply, str) and model.is_vlm
    assert TransformersChatModel(tiny_qwen2vl, max_new_tokens=3, cache_path=tmp_path / "c.jsonl").chat(messages) == reply
