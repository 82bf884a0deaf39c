"""Every chat model keeps the ChatModel contract (chat, request, stats), and a local checkpoint generates one way."""

from __future__ import annotations

import pytest

from tokenswap.inference import OpenAIChatModel, RequestStats, TransformersChatModel
from tokenswap.testing import ScriptedChatModel

MESSAGES = [{"role": "user", "content": "What is shown?"}]


def test_every_chat_model_has_chat_request_and_stats(tiny_qwen2vl, tmp_path):
    local = TransformersChatModel(tiny_qwen2vl, max_new_tokens=3, cache_path=tmp_path / "c.jsonl")
    scripted = ScriptedChatModel(lambda messages: "a cat")
    for model in (OpenAIChatModel("http://127.0.0.1:9/v1", "m"), local, scripted):
        assert callable(model.chat) and callable(model.request) and isinstance(model.stats, RequestStats), model
    reply = local.request(MESSAGES)
    assert local.chat(MESSAGES) == reply.text  # the second answer comes from the cache
    counts = local.stats.as_dict()
    assert (counts["requests"], counts["replies"], counts["cached"], counts["in_flight"]) == (1, 1, 1, 0)
    assert counts["prompt_tokens"] == reply.usage["prompt_tokens"] > 0
    assert 0 < counts["completion_tokens"] == reply.usage["completion_tokens"] <= 3
    assert scripted.chat(MESSAGES) == "a cat" and scripted.stats.replies == 1
    assert RequestStats.merge([local.stats, scripted.stats])["replies"] == 2


def test_a_local_chat_model_splits_a_think_block_as_the_hf_backend_does(tiny_family):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from tokenswap.inference.backends import HFBackend
    from tokenswap.inference.hf import prompt_opens_think

    path = tiny_family("qwen3_5")
    processor = AutoProcessor.from_pretrained(path)
    conversation = [{"role": "user", "content": [{"type": "text", "text": "What is shown?"}]}]
    assert prompt_opens_think(processor, conversation)  # Qwen3.5's template opens a think block
    reply = TransformersChatModel(path, max_new_tokens=6).request(conversation)
    model = AutoModelForImageTextToText.from_pretrained(path).eval()
    (generation,) = HFBackend(model, processor, "tiny").generate([conversation], max_new_tokens=6)
    # A random model never closes the block: the whole generation is reasoning, with no final content.
    assert reply.reasoning is not None and reply.text == ""
    assert (generation.text, generation.reasoning, generation.finish_reason) == ("", reply.reasoning,
                                                                                 reply.finish_reason)


@pytest.mark.parametrize("fails", [False, True])
def test_a_scripted_model_counts_its_calls_and_failures(fails):
    def answer(messages):
        if fails:
            raise RuntimeError("down")
        return "ok"

    model = ScriptedChatModel(answer)
    if fails:
        with pytest.raises(RuntimeError):
            model.chat(MESSAGES)
    else:
        assert model.request(MESSAGES).text == "ok"
    assert (model.stats.requests, model.stats.replies, model.stats.errors, model.stats.in_flight) == (
        1, int(not fails), int(fails), 0)
