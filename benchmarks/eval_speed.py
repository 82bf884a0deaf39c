"""Gap-evaluator speed: overhead over the bare model forward (loglik) and loglik vs generate.

    python benchmarks/eval_speed.py [--pairs 32] [--hidden 256] [--layers 4] [--batch-size 8] [--max-new-tokens 16]

Builds a random-weight Qwen2-VL-architecture model (wider than the test model so the forward is
not trivially cheap) in a temp dir, a fixed set of constructed pairs (0-3 images of 112x112 each),
and measures, in one run:

* ``bare_forward_s``: the model forward alone on the evaluator's own pre-built batches, with the
  same call (``use_cache=False, logits_to_keep=1``), summed over batches;
* ``loglik_s``: ``GapEvaluator.evaluate`` with the loglik scorer once inputs are cached (what the
  in-loop callback pays per evaluation), and ``loglik_first_s`` including input building;
* ``generate_s``: the same items with the generate scorer (greedy, ``max_new_tokens``; a random
  model never emits end-of-turn, so every row generates the full budget: an upper bound).

Prints a summary and writes ``benchmarks/results/eval_speed.json``. Headline timings are the
best of ``--repeats`` runs (bare and evaluator runs alternate): on a shared CPU, other processes
inflate single runs several-fold, and the minimum is the least disturbed estimate. Medians and
every run are in the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from PIL import Image  # noqa: E402

from tokenswap.eval.gap import GapEvaluator  # noqa: E402
from tokenswap.eval.mc import MCItem  # noqa: E402
from tokenswap.families import load_checkpoint
from tokenswap.testing import build_tiny_qwen2vl

CONCEPTS = ["cat", "dog", "apple", "car", "tree", "house", "boat", "bird"]


def make_pairs(n: int) -> list[tuple[MCItem, MCItem]]:
    pairs = []
    for i in range(n):
        names = [CONCEPTS[(i + j) % len(CONCEPTS)] for j in range(3)]
        k = i % 4
        question = f"Which is larger, a {names[0]} or a {names[1]}, if the {names[2]} is far away? ({i})"
        text = MCItem(str(i), "miscellaneous", question, [names[0], names[1], "the same", "cannot tell"], i % 4)
        q = question
        for j in range(min(k, 3)):
            q = q.replace(names[j], f"<image {j + 1}>", 1)
        images = {j + 1: Image.new("RGB", (112, 112), (40 * j, 255 - 30 * i % 255, 90)) for j in range(min(k, 3))}
        pairs.append((text, MCItem(text.id, text.subject, q, list(text.choices), text.answer, images)))
    return pairs


def timed(fn, repeats: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=32)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "eval_speed.json"))
    args = p.parse_args()

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_qwen2vl(Path(tmp) / "model", hidden_size=args.hidden, num_layers=args.layers)
        model, processor = load_checkpoint(path)
    model.eval()
    pairs = make_pairs(args.pairs)
    n_params = sum(p.numel() for p in model.parameters())

    loglik = GapEvaluator(processor, pairs, scorer="loglik", batch_size=args.batch_size, progress=False)
    t0 = time.perf_counter()
    loglik.evaluate(model)  # builds and caches the inputs
    loglik_first = time.perf_counter() - t0
    batches = [b for _, b in loglik._batches]

    @torch.no_grad()
    def bare() -> None:
        for b in batches:
            model(**b.to(model.device), use_cache=False, logits_to_keep=1)

    bare()  # warm-up
    # Alternate the two so load from other processes on the machine hits both alike.
    bare_all, loglik_all = [], []
    for _ in range(args.repeats):
        bare_all.append(timed(bare, 1)[0])
        loglik_all.append(timed(lambda: loglik.evaluate(model), 1)[0])
    bare_s, loglik_s = min(bare_all), min(loglik_all)

    gen = GapEvaluator(
        processor,
        pairs,
        scorer="generate",
        batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens,
        progress=False,
    )
    gen.evaluate(model)  # build inputs + warm-up
    generate_all = [timed(lambda: gen.evaluate(model), 1)[0] for _ in range(max(1, args.repeats - 2))]
    generate_s = min(generate_all)

    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    result = {
        "pairs": args.pairs,
        "conversations": len(loglik.units),
        "batch_size": args.batch_size,
        "hidden_size": args.hidden,
        "num_layers": args.layers,
        "parameters": n_params,
        "prompt_tokens": tokens,
        "max_new_tokens": args.max_new_tokens,
        "bare_forward_s": bare_s,
        "loglik_s": loglik_s,
        "loglik_first_s": loglik_first,
        "generate_s": generate_s,
        "loglik_overhead": loglik_s / bare_s - 1.0,
        "generate_over_loglik": generate_s / loglik_s,
        "median_s": {
            "bare_forward": statistics.median(bare_all),
            "loglik": statistics.median(loglik_all),
            "generate": statistics.median(generate_all),
        },
        "runs": {"bare": bare_all, "loglik": loglik_all, "generate": generate_all},
        "torch_threads": torch.get_num_threads(),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, torch {torch.__version__}",
    }
    print(
        f"{len(loglik.units)} conversations ({args.pairs} pairs, {tokens} prompt tokens), model {n_params / 1e6:.1f}M params\n"
        f"bare forward      {bare_s:8.3f} s\n"
        f"loglik evaluate   {loglik_s:8.3f} s  (overhead {100 * result['loglik_overhead']:+.1f}% over bare forward)\n"
        f"loglik first call {loglik_first:8.3f} s  (includes building and caching inputs)\n"
        f"generate evaluate {generate_s:8.3f} s  ({result['generate_over_loglik']:.1f}x loglik, "
        f"{args.max_new_tokens} new tokens per row)"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
