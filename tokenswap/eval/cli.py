"""``tokenswap eval``: the modality gap of one model on a TokenSwap-Bench-format dataset.

The defaults are the release protocol: the ``generate`` scorer (greedy decoding, strict match of
the last A-D letter) with ``max_new_tokens`` 2048 (the release uses 128 for Qwen2.5-VL). ``--scorer
loglik`` is the fast in-loop scorer: one forward pass, the letter whose next token is most likely,
where a letter's probability is that of "X" plus that of " X" (either can start the reply). It
agrees with ``generate`` on a model that answers with a letter, not on one that reasons first.

Examples::

    tokenswap eval --model Qwen/Qwen2-VL-7B-Instruct --bench dongx1997/TokenSwap-Bench --out results/qwen2vl
    tokenswap eval --model Qwen/Qwen2.5-VL-7B-Instruct --max-new-tokens 128 --out results/qwen25vl
    accelerate launch -m tokenswap.cli eval --model ckpt/ --bench data/bench --scorer loglik --out results/ckpt

Writes ``gap.json`` (summary with gap, relative gap and retention, per-image-count breakdown,
per-item records) and ``gap.md``.
"""

from __future__ import annotations

import argparse
import json

from tokenswap.cli import InputError, positive_int, require_items, require_model, require_output_dir

__all__ = ["cli_main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tokenswap eval", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="checkpoint folder or hub id (Qwen2-VL family)")
    p.add_argument("--bench", default="dongx1997/TokenSwap-Bench", help="TokenSwap-Bench hub id or local folder")
    p.add_argument("--split", default="test", help="bench split to evaluate")
    p.add_argument("--scorer", choices=["loglik", "generate"], default="generate",
                   help="generate: the release protocol (default); loglik: next-token letter, P('X') + P(' X')")
    p.add_argument("--prompt", choices=["zero_shot", "cot", "k_shot"], default="zero_shot")
    p.add_argument("--k", type=positive_int, default=5, help="shots for --prompt k_shot (from the bench's dev split)")
    p.add_argument("--limit", type=positive_int, default=None, help="evaluate the first N items")
    p.add_argument("--batch-size", type=positive_int, default=8)
    p.add_argument("--max-new-tokens", type=positive_int, default=2048, help="generate budget (release: 2048; Qwen2.5-VL 128)")
    p.add_argument("--recognition", action="store_true",
                   help="add the concept-identification controls (naming form and multiple-choice form)")
    p.add_argument("--out", default="gap_eval", help="output folder for gap.json and gap.md")
    return p


def _load_pairs(bench: str, split: str, limit: int | None = None) -> list:
    """The bench's paired items; a bench whose rows are malformed or missing is an InputError naming it."""
    from datasets.exceptions import DatasetGenerationError

    from tokenswap.data.tokenswap_bench import load_tokenswap_bench_pairs

    try:
        pairs = load_tokenswap_bench_pairs(bench, split, limit)
    except (KeyError, ValueError) as e:  # a missing field, an answer out of range, the two configs disagreeing
        raise InputError(f"--bench {bench!r}: {e.args[0] if isinstance(e, KeyError) else e}") from None
    except DatasetGenerationError as e:  # a damaged parquet file; datasets' own message names no file
        raise InputError(f"--bench {bench!r}: cannot be read ({e.__cause__ or e}); restore or rebuild it") from None
    require_items(pairs, f"--bench {bench!r} (split {split!r})", "rows",
                  "pass a bench built by `tokenswap build-bench` or the hub's dongx1997/TokenSwap-Bench, and a split "
                  "it has")
    return pairs


def cli_main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from accelerate import Accelerator

    from tokenswap.eval.gap import GapEvaluator
    from tokenswap.testing import load_qwen2vl

    # Every input is checked before the model loads, and the output folder before hours of evaluation.
    require_model(args.model)
    out = require_output_dir(args.out)
    state = Accelerator()  # sets up the process group from the launcher's env (ACCELERATE_USE_CPU included)
    pairs = _load_pairs(args.bench, args.split, args.limit)
    shots = None
    if args.prompt == "k_shot":
        shots = {}
        for text, inter in _load_pairs(args.bench, "dev"):
            shots.setdefault(text.subject, []).append((text, inter))
    model, processor = load_qwen2vl(args.model)
    model.to(state.device)
    evaluator = GapEvaluator(
        processor,
        pairs,
        scorer=args.scorer,
        prompt=args.prompt,
        shots=shots,
        k=args.k,
        batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens,
        recognition=args.recognition,
    )
    result = evaluator.evaluate(model)
    if state.is_main_process:
        payload = {"model": str(args.model), "bench": str(args.bench), "split": args.split, **result.to_dict()}
        (out / "gap.json").write_text(json.dumps(payload, indent=2, ensure_ascii=False))
        (out / "gap.md").write_text(result.to_markdown())
        print(result.to_markdown())
    return 0
