"""TokenSwapCollator throughput vs the naive processor path, cold and warm cache, and the copy floor.

    python benchmarks/collator_throughput.py [--batches 12] [--warm-passes 3] [--repeats 3] [--threads 1]

Setup (outside every timing): a byte-level BPE tokenizer (vocabulary 8000) trained on English
docstrings of the Python standard library, so token counts per character are realistic; the
real Qwen2-VL image processor with ``max_pixels = 256*28*28`` (a 512-px image becomes 16x16
merged patches = 256 visual tokens); an :class:`ImageStore` of 40 concepts with 1-2 distinct
512x512 drawn pictures each (shapes on a gradient plus sensor-like noise, stored as PNG, so PNG
decoding is part of every uncached path); Magpie-like samples (user query of ~150-300 tokens
mentioning 1-2 concepts, assistant answer of ~900 tokens), 8 per batch, all concepts swapped
(1.75 images per sample on average).

Modes, each over the same batches:

* ``naive``: what TRL's ``DataCollatorForVisionLanguageModeling`` does per batch: interleaved
  messages built from the store with freshly decoded PIL images, ``apply_chat_template``, one
  ``processor(text=..., images=..., padding=True)`` call, labels = ids with padding and image
  tokens masked. The collator's own helpers (``interleaved_messages``) are not used: they share
  its cache.
* ``cold``: a fresh collator (empty pixel cache) for every batch: nothing it needs was seen.
* ``cold_prepared``: the same with the store's prepared copy (``tokenswap.store.prepare``: images
  kept at the processor's target size as uint8, so no PNG decode and no resize on a miss).
* ``first_pass``: one fresh collator over the whole stream of batches (a first epoch: the 60
  store images miss once, then hit).
* ``warm``: one collator after one untimed pass over the batches.
* ``floor``: ``torch.clone`` of every tensor of the warm outputs: the cost of merely producing
  that many bytes.

Every measured collator batch is checked against the naive batch (``input_ids``,
``attention_mask``, ``mm_token_type_ids``, ``pixel_values``, ``image_grid_thw`` identical).
Headline numbers are the best of ``--repeats`` (the CPU is shared; the minimum is the least
disturbed estimate); every repeat is in ``benchmarks/results/collator_throughput.json``.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import platform
import random
import re
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image, ImageDraw  # noqa: E402

from tokenswap.collator import TokenSwapCollator  # noqa: E402
from tokenswap.concepts import Concept, validate_concepts  # noqa: E402
from tokenswap.store.image_store import ImageStore, StoreWriter  # noqa: E402
from tokenswap.swap import SwapPolicy, interleave  # noqa: E402
from tokenswap.testing import build_tiny_qwen2vl  # noqa: E402

MAX_PIXELS = 256 * 28 * 28
IMAGE_SIDE = 512
BATCH_SIZE = 8
CONCEPTS = (
    "apple", "banana", "bicycle", "bridge", "butterfly", "camera", "candle", "castle", "cathedral", "chair",
    "clock", "cloud", "compass", "dolphin", "elephant", "feather", "guitar", "hammer", "helicopter", "island",
    "kettle", "ladder", "lantern", "lighthouse", "microscope", "mountain", "mushroom", "octopus", "owl", "piano",
    "pineapple", "pyramid", "rainbow", "sailboat", "satellite", "telescope", "tiger", "tractor", "umbrella",
    "volcano",
)  # fmt: skip
# Docstring sources for the tokenizer corpus and the sample text: long, plain English prose.
CORPUS_MODULES = (
    "argparse", "asyncio.events", "collections", "concurrent.futures", "configparser", "contextlib", "csv",
    "dataclasses", "datetime", "decimal", "difflib", "email.message", "enum", "fractions", "functools", "gzip",
    "heapq", "http.client", "inspect", "json", "logging", "multiprocessing.pool", "os", "pathlib", "pickle",
    "random", "shutil", "socket", "statistics", "string", "subprocess", "tarfile", "tempfile", "textwrap",
    "threading", "typing", "unittest.case", "urllib.parse", "uuid", "zipfile",
)  # fmt: skip
USER_OPENERS = (
    "I have been reading about the {a} for a while and I am still confused.",
    "My daughter asked me a question about a {a} yesterday and I could not answer it.",
    "For a school project I need to write about the {a}.",
    "I am designing a small exhibition around a {a} and need some help.",
)
USER_LINKS = (
    "It also mentions a {b} in the same context, which surprised me.",
    "Somebody told me the {b} works in a similar way.",
    "How does this compare with a {b}?",
)
USER_CLOSERS = (
    "Could you explain it step by step, with examples, and tell me what I should read next?",
    "Please give me a detailed answer with a short summary at the end.",
)


# ---------------------------------------------------------------------------- data
def english_sentences() -> list[str]:
    """Plain-English sentences from standard-library docstrings (deterministic order)."""
    sentences: list[str] = []
    for name in CORPUS_MODULES:
        module = importlib.import_module(name)
        docs = [inspect.getdoc(module) or ""]
        for _, obj in sorted(vars(module).items()):
            if getattr(obj, "__module__", None) == module.__name__:
                docs.append(inspect.getdoc(obj) or "")
        for doc in docs:
            text = " ".join(doc.split())
            for s in re.split(r"(?<=[.!?])\s+", text):
                # Keep prose, drop signatures, doctests and tables.
                if 40 <= len(s) <= 300 and sum(ch.isalpha() or ch == " " for ch in s) > 0.9 * len(s):
                    sentences.append(s)
    return sentences


def make_samples(n: int, sentences: list[str], tokenizer, seed: int = 0) -> list[dict]:
    """Magpie-like conversations: 1-2 concept mentions in the user turn, a ~900-token answer."""
    rng = random.Random(seed)

    def fill(text: str, target_tokens: int) -> str:
        while len(tokenizer(text, add_special_tokens=False)["input_ids"]) < target_tokens:
            text += " " + rng.choice(sentences)
        return text

    samples = []
    for i in range(n):
        # 1, 2, 2, 2, ... concepts: 1.75 swapped images per sample on average (swap_prob 1).
        n_concepts = 1 if i % 4 == 0 else 2
        a, b = rng.sample(CONCEPTS, 2)
        user = rng.choice(USER_OPENERS).format(a=a)
        if n_concepts == 2:
            user += " " + rng.choice(USER_LINKS).format(b=b)
        user = fill(user, rng.randint(150, 280)) + " " + rng.choice(USER_CLOSERS)
        assistant = fill(f"Great question about the {a}.", rng.randint(800, 1000))
        concepts = []
        for word in (a, b)[:n_concepts]:
            start = user.index(f" {word}") + 1
            concepts.append({"message": 0, "start": start, "end": start + len(word), "key": word})
        messages = [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
        samples.append({"id": f"magpie-{i}", "messages": messages, "concepts": concepts})
    return samples


def draw_picture(rng: np.random.Generator) -> Image.Image:
    """A 512x512 drawing with photo-like noise (PNG-compresses like a photo, not like flat colour)."""
    y, x = np.mgrid[0:IMAGE_SIDE, 0:IMAGE_SIDE] / IMAGE_SIDE
    c0, c1 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    base = c0 * (1 - y[..., None]) + c1 * x[..., None]
    im = Image.fromarray(base.astype(np.uint8))
    draw = ImageDraw.Draw(im)
    for _ in range(8):
        x0, y0 = rng.integers(0, IMAGE_SIDE - 64, 2)
        w, h = rng.integers(32, 256, 2)
        box = [int(x0), int(y0), int(x0 + w), int(y0 + h)]
        fill = tuple(int(v) for v in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=fill)
    noisy = np.asarray(im, dtype=np.float32) + rng.normal(0, 6, (IMAGE_SIDE, IMAGE_SIDE, 3))
    return Image.fromarray(noisy.clip(0, 255).astype(np.uint8))


def build_store(root: Path) -> ImageStore:
    rng = np.random.default_rng(0)
    with StoreWriter(root, info={"source": "benchmarks/collator_throughput.py"}) as w:
        for i, concept in enumerate(CONCEPTS):
            for j in range(1 + i % 2):  # 1-2 distinct images per concept
                w.add(concept, draw_picture(rng), source="drawn", score=1.0 - 0.1 * j)
    return ImageStore(root)


# ---------------------------------------------------------------------------- the naive path
def naive_collate(processor, store: ImageStore, policy: SwapPolicy, examples: list[dict]) -> dict[str, torch.Tensor]:
    """TRL-style VLM collation: template + one processor call, images decoded fresh from the store."""
    conversations, images = [], []
    for ex in examples:
        texts = [m["content"] for m in ex["messages"]]
        concepts = validate_concepts([Concept.from_dict(c) for c in ex["concepts"]], texts, ex["id"])
        swap = policy.decide(ex["id"], concepts, [m["role"] for m in ex["messages"]])
        spans: list[list[tuple[int, int, Image.Image]]] = [[] for _ in texts]
        for k, (c, s) in enumerate(zip(concepts, swap)):
            candidates = store.get(c.key)
            if s and candidates:
                image = candidates[policy.pick(ex["id"], k, len(candidates))].load()
                spans[c.message].append((c.start, c.end, image))
        conversation = []
        for m, sp in zip(ex["messages"], spans):
            conversation.append({"role": m["role"], "content": interleave(m["content"], sp)})
            images += [image for _, _, image in sp]
        conversations.append(conversation)
    texts = processor.apply_chat_template(conversations, tokenize=False)
    out = processor(text=texts, images=images or None, padding=True, padding_side="right", return_tensors="pt")
    labels = out["input_ids"].clone()
    labels[out["attention_mask"] == 0] = -100
    labels[out["input_ids"] == processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")] = -100
    out["labels"] = labels
    return dict(out)


# ---------------------------------------------------------------------------- timing
def timed(fn, batches: list[list[dict]]) -> tuple[float, list]:
    outs = []
    t0 = time.perf_counter()
    for batch in batches:
        outs.append(fn(batch))
    return time.perf_counter() - t0, outs


def check_same(ours: dict, ref: dict, what: str) -> None:
    for key in ("input_ids", "attention_mask", "mm_token_type_ids", "pixel_values", "image_grid_thw"):
        if not torch.equal(ours[key], ref[key]):
            raise AssertionError(f"{what}: collator `{key}` differs from the processor's")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=12, help="distinct batches of 8 samples")
    parser.add_argument("--warm-passes", type=int, default=3, help="timed passes over the batches, warm cache")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of every mode; the best one is reported")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the processor path uses torch)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "collator_throughput.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    # ------------------------------------------------------------------ setup (untimed)
    t_setup = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="collator-bench-"))
    sentences = english_sentences()
    model_dir = build_tiny_qwen2vl(tmp / "model", corpus=sentences, vocab_size=8000, max_pixels=MAX_PIXELS)
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    store = build_store(tmp / "store")
    samples = make_samples(args.batches * BATCH_SIZE, sentences, processor.tokenizer)
    batches = [samples[i : i + BATCH_SIZE] for i in range(0, len(samples), BATCH_SIZE)]
    policy = SwapPolicy(swap_prob=1.0)

    def new_collator(prepared: Path | None = None) -> TokenSwapCollator:
        return TokenSwapCollator(processor, store, policy, max_length=None,
                                 prepared=None if prepared is None else str(prepared))

    from tokenswap.store.prepare import prepare_store

    prepared = prepare_store(store, processor.image_processor)  # once, like a store build step

    tok = processor.tokenizer
    text_tokens = [
        len(tok(tok.apply_chat_template(ex["messages"], tokenize=False), add_special_tokens=False)["input_ids"])
        for ex in samples
    ]
    setup_s = time.perf_counter() - t_setup
    png_bytes = [len(im.load_bytes()) for im in store]

    # ------------------------------------------------------------------ measure
    runs: dict[str, list[float]] = {"naive": [], "cold": [], "cold_prepared": [], "first_pass": [], "warm": [],
                                    "floor": []}
    n_samples = len(samples)
    for rep in range(args.repeats):
        naive_s, naive_out = timed(lambda b: naive_collate(processor, store, policy, b), batches)
        runs["naive"].append(naive_s)

        # A fresh collator per batch, built outside the clock: every image is a cache miss.
        fresh = [new_collator() for _ in batches]
        t0 = time.perf_counter()
        cold_out = [c(b) for c, b in zip(fresh, batches)]
        runs["cold"].append(time.perf_counter() - t0)

        # The same, reading the prepared copy (target resolution, uint8) instead of decoding PNGs.
        fresh = [new_collator(prepared) for _ in batches]
        t0 = time.perf_counter()
        cold_prepared_out = [c(b) for c, b in zip(fresh, batches)]
        runs["cold_prepared"].append(time.perf_counter() - t0)

        warm = new_collator()
        first_s, first_out = timed(warm, batches)
        runs["first_pass"].append(first_s)
        warm_s, warm_out = 0.0, []
        for _ in range(args.warm_passes):
            s, warm_out = timed(warm, batches)
            warm_s += s
        runs["warm"].append(warm_s / args.warm_passes)

        floor_s, _ = timed(lambda out: {k: torch.clone(v) for k, v in out.items()}, warm_out)
        runs["floor"].append(floor_s)

        for i, ref in enumerate(naive_out):
            check_same(cold_out[i], ref, f"cold batch {i}")
            check_same(cold_prepared_out[i], ref, f"cold prepared batch {i}")
            check_same(first_out[i], ref, f"first-pass batch {i}")
            check_same(warm_out[i], ref, f"warm batch {i}")
        print(f"repeat {rep}: " + ", ".join(f"{k} {v[-1]:.3f}s" for k, v in runs.items()), flush=True)

    best = {k: min(v) for k, v in runs.items()}
    rate = {k: n_samples / v for k, v in best.items()}
    first = warm_out[0]
    n_images = sum(int(o["image_grid_thw"].shape[0]) for o in warm_out)
    result = {
        "setup": {
            "batches": args.batches,
            "batch_size": BATCH_SIZE,
            "samples": n_samples,
            "text_tokens_per_sample_mean": float(np.mean(text_tokens)),
            "tokens_per_sample_mean_with_images": float(
                np.mean([int(o["attention_mask"][i].sum()) for o in warm_out for i in range(len(o["input_ids"]))])
            ),
            "images_per_sample_mean": n_images / n_samples,
            "store_concepts": len(store),
            "store_images": store.num_images,
            "png_kib_mean": float(np.mean(png_bytes) / 1024),
            "image_side": IMAGE_SIDE,
            "max_pixels": MAX_PIXELS,
            "visual_tokens_per_image": int(first["image_grid_thw"][0].prod()) // 4,
            "pixel_values_mib_per_batch": float(np.mean([o["pixel_values"].nbytes for o in warm_out]) / 2**20),
            "warm_passes": args.warm_passes,
            "repeats": args.repeats,
            "torch_threads": args.threads,
            "setup_s": setup_s,
        },
        "samples_per_s": rate,
        "ratios": {
            "warm_over_naive": rate["warm"] / rate["naive"],
            "cold_over_naive": rate["cold"] / rate["naive"],
            "cold_prepared_over_naive": rate["cold_prepared"] / rate["naive"],
            "first_pass_over_naive": rate["first_pass"] / rate["naive"],
            "floor_over_warm": rate["floor"] / rate["warm"],
        },
        "targets": {"warm_over_naive": 30.0, "cold_over_naive": 3.0},
        "runs_s": runs,
        "outputs_identical": True,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__},
    }
    import transformers

    result["machine"]["transformers"] = transformers.__version__

    s = result["setup"]
    print(
        f"\n{n_samples} samples in batches of {BATCH_SIZE}: {s['text_tokens_per_sample_mean']:.0f} text tokens, "
        f"{s['tokens_per_sample_mean_with_images']:.0f} with images, {s['images_per_sample_mean']:.2f} images "
        f"({s['visual_tokens_per_image']} visual tokens, {s['png_kib_mean']:.0f} KiB PNG) per sample"
    )
    print(f"{'mode':<12}{'samples/s':>12}{'ms/batch':>10}")
    for k in ("naive", "cold", "cold_prepared", "first_pass", "warm", "floor"):
        print(f"{k:<12}{rate[k]:>12.1f}{1000 * best[k] / args.batches:>10.1f}")
    r = result["ratios"]
    print(
        f"warm/naive {r['warm_over_naive']:.1f}x (target >= 30), cold/naive {r['cold_over_naive']:.2f}x "
        f"(target >= 3), cold_prepared/naive {r['cold_prepared_over_naive']:.2f}x, first_pass/naive {r['first_pass_over_naive']:.2f}x, floor/warm {r['floor_over_warm']:.2f}x; outputs identical to the processor"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
