"""A local transformers checkpoint as a chat model (the store build's and bench builder's offline option).

It generates through :func:`tokenswap.inference.hf.generate_batch`, the one local generate path, so a reply's
think block is split off (``Reply.reasoning``) exactly as the ``hf`` evaluation backend splits it.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from tokenswap.inference.cache import ResponseCache, cache_key
from tokenswap.inference.types import Reply, RequestStats

if TYPE_CHECKING:
    from tokenswap.inference.hf import Completion

__all__ = ["TransformersChatModel"]


class TransformersChatModel:
    """A local transformers checkpoint answering greedily.

    Text-only checkpoints load with ``AutoTokenizer`` + ``AutoModelForCausalLM``; checkpoints
    whose architecture is an image-text-to-text model (Qwen2-VL, LLaVA, ...) load with
    ``AutoProcessor`` + ``AutoModelForImageTextToText`` and accept image parts. The model is
    loaded on first use.

    Args:
        model_path: folder or hub id of the checkpoint (no download happens if offline).
        max_new_tokens: generation length.
        cache_path: JSONL response cache; ``None`` disables caching.
        device: torch device; default CUDA when available, else CPU.

    Attributes:
        stats: its :class:`~tokenswap.inference.types.RequestStats` (one request in flight at most).
    """

    def __init__(
        self,
        model_path: str | os.PathLike,
        max_new_tokens: int = 256,
        cache_path: str | os.PathLike | None = None,
        device: str | None = None,
    ):
        self.model_path = str(model_path)
        self.max_new_tokens = max_new_tokens
        self.cache = ResponseCache(cache_path) if cache_path is not None else None
        self.device = device
        self._model = None
        self._processor = None
        self.is_vlm: bool | None = None
        self.stats = RequestStats(limit=1)
        # One model on one device: concurrent callers (map_ordered's threads) take turns.
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"TransformersChatModel({self.model_path!r})"

    def _load(self) -> None:
        import torch
        from transformers import AutoConfig
        from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

        from tokenswap.inputs import require_model

        require_model(self.model_path, "chat model checkpoint")
        config = AutoConfig.from_pretrained(self.model_path)
        self.is_vlm = config.model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        if self.is_vlm:
            from transformers import AutoModelForImageTextToText, AutoProcessor

            self._processor = AutoProcessor.from_pretrained(self.model_path)
            self._model = AutoModelForImageTextToText.from_pretrained(self.model_path)
        else:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            self._processor = AutoTokenizer.from_pretrained(self.model_path)
            self._model = AutoModelForCausalLM.from_pretrained(self.model_path)
        self._model.to(device).eval()

    def chat(self, messages: list[dict]) -> str:
        """The assistant's reply text to ``messages`` (``request(messages).text``)."""
        return self.request(messages).text

    def request(
        self,
        messages: list[dict],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_logprobs: int | None = None,
        extra_body: dict | None = None,
        use_cache: bool = True,
    ) -> Reply:
        """Answer greedily; thread-safe (calls take turns on the one model).

        Raises:
            ValueError: sampling (``temperature > 0``), ``top_logprobs`` or ``extra_body`` was asked for;
                this backend only decodes greedily (use the ``openai`` backend behind vLLM for those).
        """
        if (temperature or 0.0) > 0 or top_logprobs is not None or extra_body:
            raise ValueError(
                f"{self!r} decodes greedily only: temperature > 0, top_logprobs and extra_body need an "
                "OpenAI-compatible server (backend: openai)"
            )
        new_tokens = self.max_new_tokens if max_tokens is None else max_tokens
        key = cache_key(self.model_path, messages, max_new_tokens=new_tokens, greedy=True)
        cache = self.cache if use_cache else None
        if cache is not None and (hit := cache.get(key)) is not None:
            self.stats.add(cached=1)
            return Reply(text=hit, cached=True)
        with self._lock:
            self.stats._start()
            try:
                done = self._generate(messages, new_tokens)
            except BaseException:
                self.stats.add(errors=1)
                raise
            finally:
                self.stats._end()
        self.stats.add(replies=1, prompt_tokens=done.prompt_tokens, completion_tokens=done.completion_tokens)
        if cache is not None and done.text:
            cache.put(key, done.text)
        return Reply(text=done.text, reasoning=done.reasoning, finish_reason=done.finish_reason,
                     usage={"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens})

    def _generate(self, messages: list[dict], max_new_tokens: int) -> Completion:
        from tokenswap.inference.hf import OPEN_THINK, generate_batch

        if self._model is None:
            self._load()
        if self.is_vlm:
            # Processor chat templates expect list content everywhere.
            msgs = [
                {"role": m["role"], "content": [{"type": "text", "text": m["content"]}]}
                if isinstance(m["content"], str)
                else m
                for m in messages
            ]
        else:
            msgs = []
            for m in messages:
                content = m["content"]
                if not isinstance(content, str):
                    if any(p.get("type") == "image" for p in content):
                        raise ValueError(
                            f"{self.model_path} is a text-only model but a message contains an image part; "
                            "use a vision-language checkpoint or send text only"
                        )
                    content = "".join(p["text"] for p in content)
                msgs.append({"role": m["role"], "content": content})
        inputs = self._processor.apply_chat_template(
            msgs, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
        )
        opened = self._processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False).endswith(
            OPEN_THINK)
        tokenizer = self._processor.tokenizer if self.is_vlm else self._processor
        return generate_batch(self._model, tokenizer, inputs, max_new_tokens, [opened])[0]
