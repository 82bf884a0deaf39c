"""The evaluators' model backends: ``hf`` (a local checkpoint) and ``openai`` (any OpenAI-compatible endpoint).

The three evaluators (``tokenswap eval``, ``crossmath eval``, ``rest eval``) build the release's
conversations (text and ``image`` parts, in the item's order) and hand them to a backend, which
answers each with a :class:`Generation`, in input order, one at a time as they finish:

* :meth:`Backend.generate`: greedy decoding (temperature 0) with the release's token budget; the
  answer is the final content, the reasoning of a thinking model is kept apart.
* :meth:`Backend.score_letters`: the probability of each answer letter A-D as the reply's first
  token, ``P("X") + P(" X")`` (the ``loglik`` scorer). The ``hf`` backend reads the whole
  next-token distribution; the ``openai`` backend reads the first generated token's ``top_logprobs``
  (vLLM returns them) and reports the probability mass outside that top-k. A server that returns no
  logprobs (``transformers serve`` ignores the field) raises :class:`NoLogprobsError` at the first item.

Both return the final content stripped of surrounding whitespace: servers differ there
(``transformers serve``'s Qwen response parser strips it, vLLM returns it as generated), no extractor
reads it, and REST's OCR-first asks a transcription back, which must not depend on the server.

Both apply the same caps before anything is sent: an item with more than ``max_images`` images is
skipped and counted (never cut), images above ``max_pixels`` are scaled down, and the release's
per-model image resize (:mod:`tokenswap.inference.model_settings`) is applied to every image. A
request that fails for good (after the client's retries) becomes a :class:`Generation` with
``error`` set: the evaluators record and count it and never score it as a wrong answer.

A new engine (vLLM's offline ``LLM``, say) is one more :class:`Backend` subclass here.
"""

from __future__ import annotations

import base64
import io
import math
import threading
import urllib.parse
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from PIL import Image

from tokenswap.errors import InputError
from tokenswap.images import StoredPicture
from tokenswap.inference.model_settings import ModelSettings, resize_to_pixels
from tokenswap.inference.ordered import map_ordered
from tokenswap.inference.types import LLMRequestError
from tokenswap.redaction import public_url

__all__ = [
    "LETTERS",
    "Backend",
    "BackendConfigError",
    "Generation",
    "HFBackend",
    "NoLogprobsError",
    "OpenAIBackend",
    "add_backend_arguments",
    "check_backend_arguments",
    "describe_arguments",
    "letter_probs_from_top_logprobs",
    "model_family",
    "model_family_source",
    "open_backend",
    "public_url",
    "resolve_settings",
]

LETTERS = "ABCD"
TOP_LOGPROBS = 20  # the most the OpenAI API and vLLM's default --max-logprobs allow


class BackendConfigError(InputError):
    """Flags that cannot make a backend (reported as one line, exit status 2, before anything loads)."""


class NoLogprobsError(InputError):
    """The endpoint answered without ``logprobs``, so the ``loglik`` scorer cannot run through it (exit status 2)."""


@dataclass
class Generation:
    """One conversation's answer, or why there is none.

    Attributes:
        text: the final content (None when the request failed or the item was skipped).
        reasoning: a thinking model's reasoning, when the backend separated one.
        usage: ``prompt_tokens`` / ``completion_tokens`` of this request.
        finish_reason: ``stop`` / ``length`` when known.
        error: the request failed for good (after retries); the message names the URL, never a key.
        skipped: the item was not sent (e.g. more images than ``max_images``).
        letter_probs: ``loglik``: probability of each letter A-D as the first reply token.
        outside_mass: ``loglik`` through an endpoint: probability mass outside the returned top-k.
        resized: images scaled down to ``max_pixels`` before sending.
    """

    text: str | None = None
    reasoning: str | None = None
    usage: dict = field(default_factory=dict)
    finish_reason: str | None = None
    error: str | None = None
    skipped: str | None = None
    letter_probs: list[float] | None = None
    outside_mass: float | None = None
    resized: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None and self.skipped is None

    def record(self) -> dict:
        """The fields an evaluator stores per item (empty ones left out, so old readers see old records)."""
        out: dict = {"response": self.text}
        for name in ("reasoning", "finish_reason", "error", "skipped", "letter_probs", "outside_mass"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.usage:
            out["usage"] = self.usage
        if self.resized:
            out["images_resized"] = self.resized
        return out


def _scaled_to(image: Image.Image, max_pixels: int) -> Image.Image:
    width, height = image.size
    if width * height <= max_pixels:
        return image
    scale = math.sqrt(max_pixels / (width * height))
    size = (max(1, math.floor(width * scale)), max(1, math.floor(height * scale)))
    return image.resize(size, resample=Image.Resampling.BICUBIC)


class Backend:
    """What the evaluators call. Subclasses implement :meth:`_generate` and :meth:`_score_letters`.

    Args:
        name: the model's name as results record it.
        settings: the release's per-model settings (image resize, template variables).
        max_images: the most images one request may carry; more: skipped and counted.
        max_pixels: images with more pixels are scaled down (aspect kept) before sending.
    """

    kind = "base"

    def __init__(
        self,
        name: str,
        settings: ModelSettings | None = None,
        max_images: int | None = None,
        max_pixels: int | None = None,
    ):
        self.name = name
        self.settings = settings or ModelSettings()
        self.max_images = max_images
        self.max_pixels = max_pixels

    # The release's per-model resize first (it is the protocol), then the caps of this deployment.
    def _prepare(self, conversation: Sequence[dict]) -> tuple[list[dict] | None, int, str | None]:
        n_images = sum(
            1 for m in conversation if not isinstance(m["content"], str) for p in m["content"] if p["type"] == "image"
        )
        if self.max_images is not None and n_images > self.max_images:
            return None, 0, f"{n_images} images, more than --max-images {self.max_images}"
        resized = 0
        out = []
        for message in conversation:
            if isinstance(message["content"], str):
                out.append(dict(message))
                continue
            parts = []
            for part in message["content"]:
                if part["type"] == "image":
                    part, capped = self._image_part(part)
                    resized += capped
                parts.append(part)
            out.append({**message, "content": parts})
        return out, resized, None

    def _image_part(self, part: dict) -> tuple[dict, bool]:
        image, capped = self._image(part["image"])
        return {"type": "image", "image": image}, capped

    def _image(self, image: Image.Image | StoredPicture) -> tuple[Image.Image, bool]:
        if isinstance(image, StoredPicture):  # left stored by the request builder: decoded here, where it is needed
            image = image.rgb()
        if self.settings.image_pixels:
            image = resize_to_pixels(image, self.settings.image_pixels, self.settings.image_factor)
        if self.max_pixels is not None:
            capped = _scaled_to(image, self.max_pixels)
            return capped, capped is not image
        return image, False

    def prepare_image(self, image: Image.Image) -> Image.Image:
        """One picture as a request sends it: the release's per-model resize, then ``max_pixels``."""
        return self._image(image)[0]

    def generate(
        self, conversations: Iterable[Sequence[dict]], max_new_tokens: int, chat_template_kwargs: dict | None = None
    ) -> Iterator[Generation]:
        """Greedy answers, one per conversation, in input order, each as soon as it (and all before it) finished."""
        kwargs = {**self.settings.chat_template_kwargs, **(chat_template_kwargs or {})}
        return self._generate(self._prepared(conversations), max_new_tokens, kwargs)

    def score_letters(
        self, conversations: Iterable[Sequence[dict]], chat_template_kwargs: dict | None = None
    ) -> Iterator[Generation]:
        """Letter probabilities (``letter_probs``; ``text`` is the most likely letter), one per conversation."""
        kwargs = {**self.settings.chat_template_kwargs, **(chat_template_kwargs or {})}
        return self._score_letters(self._prepared(conversations), kwargs)

    def _prepared(self, conversations: Iterable[Sequence[dict]]) -> Iterator[tuple[list[dict] | None, int, str | None]]:
        for conversation in conversations:
            yield self._prepare(conversation)

    def _generate(self, prepared, max_new_tokens: int, kwargs: dict) -> Iterator[Generation]:
        raise NotImplementedError

    def _score_letters(self, prepared, kwargs: dict) -> Iterator[Generation]:
        raise NotImplementedError

    def stats(self) -> dict:
        """Request counters of this run (an endpoint's requests, retries, errors); empty for a local model."""
        return {}

    def close(self) -> None:
        pass


def _best_letter(probs: Sequence[float]) -> str | None:
    best = max(range(len(probs)), key=lambda i: probs[i])
    return LETTERS[best] if probs[best] > 0 else None


# ----------------------------------------------------------------------------- hf


class HFBackend(Backend):
    """A local transformers checkpoint: batched greedy ``generate`` and one forward per batch for letters.

    Args:
        model: a ``*ForConditionalGeneration`` model (already on its device).
        processor: its processor.
        name: recorded model name (the checkpoint path or hub id).
        batch_size: conversations per ``generate`` / forward call (left padded).
        letter_ids: token ids per letter for :meth:`score_letters` (default from the tokenizer).
    """

    kind = "hf"

    def __init__(self, model, processor, name: str, batch_size: int = 8, letter_ids=None, **kw):
        super().__init__(name, **kw)
        self.model = model
        self.processor = processor
        self.batch_size = batch_size
        self._letter_ids = letter_ids

    def _batches(self, prepared) -> Iterator[list[tuple[list[dict] | None, int, str | None]]]:
        batch = []
        for entry in prepared:
            batch.append(entry)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch:
            yield batch

    def _run(self, prepared, fn) -> Iterator[Generation]:
        for batch in self._batches(prepared):
            convs = [c for c, _, _ in batch if c is not None]
            results = iter(fn(convs) if convs else [])
            for conv, resized, skipped in batch:
                if conv is None:
                    yield Generation(skipped=skipped)
                else:
                    result = next(results)
                    result.resized = resized
                    yield result

    def _generate(self, prepared, max_new_tokens: int, kwargs: dict) -> Iterator[Generation]:
        from tokenswap.inference.hf import build_inputs, generate_batch, prompt_opens_think

        def run(convs: list[list[dict]]) -> list[Generation]:
            batch = build_inputs(self.processor, convs, chat_template_kwargs=kwargs)
            opened = [prompt_opens_think(self.processor, c, kwargs) for c in convs]
            return [
                Generation(text=c.text.strip(), reasoning=c.reasoning, finish_reason=c.finish_reason,
                           usage={"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens})
                for c in generate_batch(self.model, self.processor.tokenizer, batch, max_new_tokens, opened)
            ]

        return self._run(prepared, run)

    def _score_letters(self, prepared, kwargs: dict) -> Iterator[Generation]:
        from tokenswap.inference.hf import build_inputs, letter_logprobs, letter_token_ids

        if self._letter_ids is None:
            self._letter_ids = letter_token_ids(self.processor.tokenizer)

        def run(convs: list[list[dict]]) -> list[Generation]:
            batch = build_inputs(self.processor, convs, close_think=True, chat_template_kwargs=kwargs)
            was_training = self.model.training
            self.model.eval()
            scores = letter_logprobs(self.model, batch, self._letter_ids)
            self.model.train(was_training)
            return [
                Generation(text=_best_letter(row), letter_probs=row, usage={"prompt_tokens": int(mask.sum())})
                for row, mask in zip(scores.exp().tolist(), batch["attention_mask"])
            ]

        return self._run(prepared, run)


# ----------------------------------------------------------------------------- openai


def letter_probs_from_top_logprobs(top: Sequence[tuple[str, float]]) -> tuple[list[float], float]:
    """``P("X") + P(" X")`` per letter from one token's top-k list, and the probability mass outside the top-k.

    A letter absent from the top-k gets 0 (its true probability is at most the outside mass).

    >>> top = [(" B", math.log(0.5)), ("B", math.log(0.25)), ("C", math.log(0.125))]
    >>> probs, outside = letter_probs_from_top_logprobs(top)
    >>> [round(p, 6) for p in probs], round(outside, 6)
    ([0.0, 0.75, 0.125, 0.0], 0.125)
    """
    probs = [0.0] * len(LETTERS)
    for token, logprob in top:
        if token in LETTERS or (token[:1] == " " and token[1:] in LETTERS and len(token) == 2):
            probs[LETTERS.index(token.strip())] += math.exp(logprob)
    inside = sum(math.exp(lp) for _, lp in top)
    return probs, max(0.0, 1.0 - inside)


class OpenAIBackend(Backend):
    """Any OpenAI-compatible chat-completions endpoint, ``concurrency`` requests in flight.

    Images go in place as ``image_url`` parts (lossless PNG data URLs by default), in the
    conversation's order; a repeated ``<image N>`` tag sends its picture again.

    Args:
        client: an :class:`tokenswap.inference.openai_client.OpenAIChatModel`.
        name: the served model name (recorded; the client sends it).
        concurrency: requests in flight (``map_ordered``); the client caps HTTP attempts the same way.
        image_format: ``png`` (lossless, default) or ``jpeg`` / ``jpeg:Q`` (quality Q, default 95).
    """

    kind = "openai"

    def __init__(self, client, name: str, concurrency: int = 32, image_format: str = "png", **kw):
        super().__init__(name, **kw)
        self.client = client
        self.concurrency = concurrency
        kind, _, quality = image_format.partition(":")
        if kind not in ("png", "jpeg") or (quality and (kind != "jpeg" or not quality.isdigit())):
            raise BackendConfigError(f"--image-format must be png, jpeg or jpeg:QUALITY, got {image_format!r}")
        self.image_format = kind
        self.jpeg_quality = int(quality or 95)
        self._logprobs_checked = False
        # digest -> (data URL, scaled down): a picture is resized and encoded once per run, in the first worker
        # thread that sends it, whatever the number of requests and forms that send it again.
        self._urls: dict[str, tuple[str, bool]] = {}
        self._url_locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        # One pool of ``concurrency`` threads for every stream asking through this backend (tokenswap eval runs
        # three at once): a thread that ends a request takes the next one, where a pool per stream left three
        # times the threads waiting on the client's slots, each answer waking one of them (CPU per request).
        self._workers: ThreadPoolExecutor | None = None

    def _encode(self, image: Image.Image) -> str:
        buf = io.BytesIO()
        if self.image_format == "png":
            image.save(buf, format="PNG")
        else:
            image.convert("RGB").save(buf, format="JPEG", quality=self.jpeg_quality)
        return f"data:image/{self.image_format};base64," + base64.b64encode(buf.getvalue()).decode("ascii")

    def _image_part(self, part: dict) -> tuple[dict, bool]:
        if "digest" not in part:
            return super()._image_part(part)
        return part, False  # prepared in the worker (_url), once per digest; counted there

    def _url(self, part: dict) -> tuple[str, bool]:
        """The part's data URL and whether its picture was scaled down (prepared once per digest)."""
        if "digest" not in part:  # prepared by _prepare, counted there
            return self._encode(part["image"]), False
        digest = part["digest"]
        done = self._urls.get(digest)
        if done is not None:
            return done
        with self._locks_lock:
            lock = self._url_locks.setdefault(digest, threading.Lock())
        with lock:  # one encoder per picture; another picture is encoded beside it
            done = self._urls.get(digest)
            if done is None:
                image, capped = self._image(part["image"])
                done = self._urls[digest] = (self._encode(image), capped)
        return done

    def _messages(self, conversation: list[dict]) -> tuple[list[dict], int]:
        out, capped = [], 0
        for message in conversation:
            content = message["content"]
            if not isinstance(content, str):
                parts = []
                for p in content:
                    if p["type"] == "image":
                        url, scaled = self._url(p)
                        capped += scaled
                        parts.append({"type": "image_url", "image_url": {"url": url}})
                    else:
                        parts.append({"type": "text", "text": p["text"]})
                content = parts
            out.append({"role": message["role"], "content": content})
        return out, capped

    def _map(self, prepared, ask) -> Iterator[Generation]:
        def call(entry) -> Generation:
            conv, resized, skipped = entry
            if conv is None:
                return Generation(skipped=skipped)
            messages, capped = self._messages(conv)
            try:
                result = ask(messages)
            except LLMRequestError as err:  # its message is redacted (tokenswap.redaction): no key in the records
                result = Generation(error=str(err))
            result.resized = resized + capped
            return result

        with self._locks_lock:
            if self._workers is None:
                self._workers = ThreadPoolExecutor(self.concurrency, thread_name_prefix="tokenswap-request")
        for outcome in map_ordered(call, prepared, concurrency=self.concurrency, executor=self._workers):
            yield outcome.result()

    def _extra(self, kwargs: dict) -> dict | None:
        return {"chat_template_kwargs": kwargs} if kwargs else None

    def _generate(self, prepared, max_new_tokens: int, kwargs: dict) -> Iterator[Generation]:
        from tokenswap.inference.model_settings import openai_reasoning_fields
        from tokenswap.inference.parsing import split_reasoning

        extra = {**(self._extra(kwargs) or {}), **(openai_reasoning_fields(self.name, max_new_tokens) or {})} or None

        def ask(messages: list[dict]) -> Generation:
            reply = self.client.request(
                messages, max_tokens=max_new_tokens, temperature=0.0, extra_body=extra, use_cache=False
            )
            # A server without a reasoning parser (vLLM without --reasoning-parser) returns the think block in the
            # content: the answer is still what follows the last "</think>".
            text, inline = split_reasoning(reply.text)
            return Generation(text=text.strip(), reasoning=reply.reasoning or inline, usage=dict(reply.usage),
                              finish_reason=reply.finish_reason)

        return self._map(prepared, ask)

    def _score_letters(self, prepared, kwargs: dict) -> Iterator[Generation]:
        def ask(messages: list[dict]) -> Generation:
            reply = self.client.request(
                messages, max_tokens=1, temperature=0.0, top_logprobs=TOP_LOGPROBS, extra_body=self._extra(kwargs),
                use_cache=False,
            )
            if reply.top_logprobs is None:
                raise NoLogprobsError(
                    f"{public_url(self.client.base_url)} answered without logprobs (transformers serve ignores the "
                    "logprobs/top_logprobs fields), so --scorer loglik cannot read letter probabilities through it; "
                    "use --scorer generate, a server that returns top_logprobs (vLLM, SGLang), or --backend hf"
                )
            probs, outside = letter_probs_from_top_logprobs(reply.top_logprobs)
            return Generation(text=_best_letter(probs), letter_probs=probs, outside_mass=outside,
                              usage=dict(reply.usage))

        def checked() -> Iterator[Generation]:
            # The first item alone, so a server without logprobs is refused after one request, not 32.
            prepared_iter = iter(prepared)
            for entry in prepared_iter:
                first = next(self._map([entry], ask))
                yield first
                if first.ok:
                    break
            yield from self._map(prepared_iter, ask)

        return checked()

    def stats(self) -> dict:
        return self.client.stats.as_dict()

    def close(self) -> None:
        workers, self._workers = self._workers, None
        if workers is not None:
            workers.shutdown(wait=True)
        close = getattr(self.client, "close", None)
        if close is not None:
            close()


# ----------------------------------------------------------------------------- command line


def _share(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a share between 0 and 1, got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (0.01 = 1%), got {value}")
    return value


def add_backend_arguments(parser) -> None:
    """The flags every evaluator shares: ``--backend hf|openai`` and what an endpoint run needs.

    ``--model`` stays the evaluator's own flag: a checkpoint for ``hf``, the served model name for ``openai``.
    """
    import argparse

    from tokenswap.inputs import positive_int

    g = parser.add_argument_group("model backend")
    g.add_argument("--backend", choices=["hf", "openai"], default="hf",
                   help="hf: load --model locally; openai: ask an OpenAI-compatible endpoint (vLLM, SGLang, "
                        "transformers serve, an API) serving --model")
    g.add_argument("--base-url", default=None, help="openai: endpoint root, e.g. http://localhost:8000/v1")
    g.add_argument("--api-key-env", default="OPENAI_API_KEY",
                   help="openai: environment variable holding the API key (its value is never written anywhere)")
    g.add_argument("--concurrency", type=positive_int, default=32, help="openai: requests in flight (default 32)")
    g.add_argument("--timeout", type=float, default=600.0, help="openai: seconds per attempt (default 600: long generations)")
    g.add_argument("--max-retries", type=int, default=5, help="openai: retries of a failed request, with backoff (default 5)")
    g.add_argument("--max-images", type=positive_int, default=None,
                   help="most images per request; an item with more is skipped and counted (vLLM: match "
                        "--limit-mm-per-prompt)")
    g.add_argument("--max-pixels", type=positive_int, default=None,
                   help="scale images with more pixels down to this many before sending")
    g.add_argument("--image-format", default="png", help="openai: png (lossless, default) or jpeg[:QUALITY]")
    g.add_argument("--max-error-share", type=_share, default=0.01,
                   help="exit 1 when more than this share of requests failed (default 0.01)")
    g.add_argument("--family", default=None,
                   help="model family for the release's per-model settings (default: from the checkpoint or the "
                        "served name), e.g. qwen2_5_vl, qwen3_vl, qwen3_5")
    g.add_argument("--no-model-settings", action="store_true",
                   help="do not apply the release's per-model settings (budget, image resize, thinking)")
    g.add_argument("--image-pixels", type=positive_int, default=None,
                   help="resize every image to about this many pixels, sides multiples of 32 (overrides the "
                        "release's Qwen3-VL setting)")
    g.add_argument("--thinking", action=argparse.BooleanOptionalAction, default=None,
                   help="send enable_thinking to the chat template (default: the release's choice)")


def check_backend_arguments(args) -> None:
    """Refuse flags that cannot work together, before any data or weights load (exit 2)."""
    from tokenswap.families import FAMILIES

    if args.backend == "openai":
        if not args.base_url:
            raise BackendConfigError(
                "--backend openai needs --base-url (the endpoint root, e.g. http://localhost:8000/v1) and --model "
                "(the served model name)"
            )
        parts = urllib.parse.urlsplit(args.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BackendConfigError(f"--base-url must be an http(s) URL such as http://localhost:8000/v1, "
                                     f"got {public_url(args.base_url)!r}")
        if parts.username or parts.password or parts.query:
            # The URL goes into records, summaries and error messages; a credential in it would go with it.
            raise BackendConfigError(
                f"--base-url must carry no user, password or query ({public_url(args.base_url)!r} without them): "
                "put the key in the environment variable --api-key-env names"
            )
        if not (math.isfinite(args.timeout) and args.timeout > 0):
            raise BackendConfigError(f"--timeout must be a number of seconds > 0, got {args.timeout}")
        if args.max_retries < 0:
            raise BackendConfigError(f"--max-retries must be >= 0, got {args.max_retries}")
        kind, _, quality = args.image_format.partition(":")
        if kind not in ("png", "jpeg") or (quality and (kind != "jpeg" or not quality.isdigit())):
            raise BackendConfigError(f"--image-format must be png, jpeg or jpeg:QUALITY, got {args.image_format!r}")
    elif args.base_url:
        raise BackendConfigError("--base-url is for --backend openai; with --backend hf, --model is loaded locally")
    if args.family is not None and args.family not in FAMILIES:
        raise BackendConfigError(f"--family must be one of {', '.join(FAMILIES)}, got {args.family!r}")


def model_family(args) -> str | None:
    """The family for per-model settings: ``--family``, else the checkpoint's ``model_type`` or the served name."""
    return model_family_source(args)[0]


def _family_of_checkpoint(path) -> str | None:
    from transformers import AutoConfig

    from tokenswap.families import family_of

    return family_of(AutoConfig.from_pretrained(path).model_type).name


def model_family_source(args) -> tuple[str | None, str | None]:
    """``(family, where it came from)``: ``--family``, ``checkpoint`` (its config.json), ``served name`` (a
    component of the name), ``served path`` (a local checkpoint folder at the served name or above it); ``(None,
    None)`` when nothing names one."""
    from pathlib import Path

    from tokenswap.inference.model_settings import family_from_name

    if args.family:
        return args.family, "--family"
    if args.backend == "openai":
        family = family_from_name(args.model)
        if family is not None:
            return family, "served name"
        # `transformers serve /ckpt/run3/checkpoint-500` serves the model under its path: read the checkpoint there.
        for folder in (Path(args.model), *Path(args.model).parents):
            if (folder / "config.json").is_file():
                try:
                    return _family_of_checkpoint(folder), "served path"
                except Exception:  # noqa: BLE001 - a config of another model: no family, said below
                    break
        return None, None
    try:
        return _family_of_checkpoint(args.model), "checkpoint"
    except Exception:  # noqa: BLE001 - the loader raises the real error with its fix a moment later
        return None, None


def resolve_settings(args, benchmark: str, scorer: str = "generate") -> ModelSettings:
    """The release's per-model settings for this run, with the command line's overrides."""
    from dataclasses import replace

    from tokenswap.inference.model_settings import release_settings

    family, _ = model_family_source(args)
    if family is None and args.backend == "openai" and not args.no_model_settings:
        import sys

        from tokenswap.families import FAMILIES

        # Silence here would mean another protocol: a Qwen2.5-VL under an unrecognised name gets 2,048 new tokens.
        print(f"note: no model family recognised in the served name {args.model!r} (no path component names one, "
              "and no checkpoint config.json is at that path): the release's per-model settings are not applied; "
              f"pass --family ({', '.join(FAMILIES)}) if the model is one of them", file=sys.stderr)
    settings = release_settings(benchmark, family, scorer=scorer, thinking=args.thinking,
                                enabled=not args.no_model_settings)
    if args.image_pixels is not None:
        settings = replace(settings, image_pixels=args.image_pixels, image_factor=32,
                           applied=(*[a for a in settings.applied if "resized" not in a],
                                    f"images resized to about {args.image_pixels:,} px (--image-pixels)"))
    return settings


def open_backend(args, settings: ModelSettings, batch_size: int = 8) -> Backend:
    """The backend the flags ask for (``hf`` loads the checkpoint now; ``openai`` connects lazily)."""
    caps = dict(settings=settings, max_images=args.max_images, max_pixels=args.max_pixels)
    if args.backend == "openai":
        from tokenswap.inference.openai_client import OpenAIChatModel

        client = OpenAIChatModel(
            args.base_url, args.model, api_key_env=args.api_key_env, temperature=0.0, timeout=args.timeout,
            max_retries=args.max_retries, concurrency=args.concurrency,
        )
        return OpenAIBackend(client, args.model, concurrency=args.concurrency, image_format=args.image_format, **caps)
    import torch

    from tokenswap.families import load_checkpoint
    from tokenswap.inputs import MODEL_HOLDS, from_hub, require_model

    require_model(args.model)
    with from_hub(args.model, "--model", MODEL_HOLDS):
        model, processor = load_checkpoint(args.model)
    if torch.cuda.is_available():
        model = model.to("cuda")
    return HFBackend(model, processor, args.model, batch_size=batch_size, **caps)


def describe_arguments(args) -> dict:
    """What a result file records about the backend the flags chose: never a key, the same on every resume."""
    info = {"backend": args.backend, "model": str(args.model), "max_images": args.max_images,
            "max_pixels": args.max_pixels}
    if args.backend == "openai":
        info.update(endpoint=public_url(args.base_url), image_format=args.image_format)
    return info
