"""``tokenswap crossmath``: generate puzzles, evaluate a model on them, or compare with the release.

Generate 300 puzzles (the released easy/medium/hard mix) in all four styles::

    tokenswap crossmath generate --n 300 --seed 0 --difficulty mixed --out data/crossmath

This writes ``<out>/<Style>/crossmath.jsonl`` in the released record format plus the puzzle
and solved PNGs under the released names (``<Style>/test_images_blank_hr/<id>_blank.png``, ...).
Evaluate a model greedily in one modality::

    tokenswap crossmath eval --model Qwen/Qwen2-VL-7B-Instruct --data data/crossmath/Original \\
        --modality image --max-new-tokens 4096 --out runs/crossmath

This writes ``predictions_<modality>.jsonl`` (one line per puzzle), ``metrics_<modality>.json``
and ``metrics_<modality>.md``. Both commands resume: finished puzzles are skipped, and a rerun
with different generator flags (or another model, for eval) into the same folder is refused.
Compare our generator and renderer with a checkout of the released test set::

    tokenswap crossmath fidelity --released path/to/CrossMath --n 250
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from tokenswap.cli import non_negative_int, positive_int, require_items, require_model, require_output_dir
from tokenswap.crossmath.data import append_jsonl, find_jsonl, load_crossmath, load_image, read_jsonl
from tokenswap.crossmath.generator import DEFAULT_COLS, DEFAULT_ROWS, DIFFICULTIES, Puzzle, generate_puzzles
from tokenswap.crossmath.metrics import (
    aggregate_runs,
    extract_answer,
    format_metrics_table,
    gold_answer,
    gold_hops,
    score_run,
)
from tokenswap.crossmath.prompt import MODALITIES, build_messages
from tokenswap.crossmath.render import STYLES, puzzle_id_from_image, render_grid

__all__ = ["cli_main"]

JSONL_NAME = "crossmath.jsonl"


class _RefusedError(Exception):
    """A run that would corrupt existing output; reported as one line and exit status 2."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokenswap crossmath", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate puzzles: JSONL in the released format + PNG per style")
    gen.add_argument("--n", type=positive_int, required=True, help="number of puzzles (>= 1)")
    gen.add_argument("--seed", type=int, default=0, help="collection seed; puzzle i depends only on (seed, i)")
    gen.add_argument("--difficulty", choices=[*DIFFICULTIES, "mixed"], default="mixed")
    gen.add_argument("--out", required=True, help="output folder; one subfolder per style")
    gen.add_argument("--styles", nargs="+", choices=sorted(STYLES), default=list(STYLES))
    gen.add_argument(
        "--rows", type=positive_int, default=DEFAULT_ROWS, help="canvas rows (odd); puzzles are cropped to their cells"
    )
    gen.add_argument("--cols", type=positive_int, default=DEFAULT_COLS, help="canvas columns (odd)")
    gen.add_argument(
        "--n-equations", type=positive_int, default=None, help="equations per puzzle (default: the released 5-15)"
    )
    gen.add_argument(
        "--range",
        type=non_negative_int,
        nargs=2,
        default=None,
        metavar=("LO", "HI"),
        help="number range (default: LO in 1-5, HI in 51-249 per puzzle, as released)",
    )
    gen.add_argument(
        "--max-hop", type=positive_int, default=None, help="deepest hop per puzzle (default: released distribution)"
    )
    gen.add_argument("--operators", default="+-*/", help="operator set, e.g. +-*/ or +-")

    ev = sub.add_parser("eval", help="greedy evaluation of a model in one modality")
    ev.add_argument("--model", required=True, help="model folder or hub id (Qwen2-VL family)")
    ev.add_argument("--data", required=True, help="a CrossMath JSONL or its style folder")
    ev.add_argument("--modality", choices=MODALITIES, required=True)
    ev.add_argument("--n", type=positive_int, default=None, help="evaluate the first N puzzles (default: all)")
    ev.add_argument("--max-new-tokens", type=positive_int, default=4096)
    ev.add_argument("--batch-size", type=positive_int, default=8)
    ev.add_argument("--out", required=True, help="output folder for predictions and metrics")

    fid = sub.add_parser("fidelity", help="statistics and pixel parity against the released test set")
    fid.add_argument("--released", required=True, help="a checkout of github.com/xuyige/CrossMath or its data folder")
    fid.add_argument("--n", type=positive_int, default=250, help="puzzles to generate for the comparison")
    fid.add_argument("--seed", type=int, default=0, help="generator seed")
    fid.add_argument(
        "--pixel-limit", type=positive_int, default=None, help="compare only the first N images per style"
    )
    return parser


def _write_image(image, path: Path) -> None:
    # Write then rename, so a killed job never leaves a truncated PNG behind a finished record.
    tmp = path.with_suffix(".tmp.png")
    image.save(tmp)
    os.replace(tmp, path)


def _generate(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    out = Path(args.out)
    # Puzzle i is a pure function of these; resuming with other values would mix two collections.
    params = {
        "seed": args.seed,
        "difficulty": args.difficulty,
        "rows": args.rows,
        "cols": args.cols,
        "n_equations": args.n_equations,
        "range": list(args.range) if args.range is not None else None,
        "operators": args.operators,
        "max_hop": args.max_hop,
    }
    kwargs = dict(
        rows=args.rows,
        cols=args.cols,
        n_equations=args.n_equations,
        number_range=tuple(args.range) if args.range is not None else None,
        operators=args.operators,
        max_hop=args.max_hop,
    )
    try:  # bad flags fail here, before anything is written
        generate_puzzles(1, args.seed, args.difficulty, **kwargs)
    except ValueError as err:
        raise _RefusedError(str(err)) from None
    require_output_dir(out)
    params_path = out / "generate_params.json"
    if params_path.exists() and json.loads(params_path.read_text()) != params:
        raise _RefusedError(
            f"{out} already holds puzzles generated with {params_path.read_text().strip()}, not {params}; "
            "resume with the same flags (--n and --styles may change) or pick another --out"
        )
    params_path.write_text(json.dumps(params) + "\n")
    done: dict[str, set[str]] = {}
    for style in args.styles:
        jsonl = out / STYLES[style].folder / JSONL_NAME
        records = read_jsonl(jsonl, repair=True) if jsonl.exists() else []
        done[style] = {puzzle_id_from_image(r["img_blank"]) for r in records}
    written = 0
    for i in tqdm(range(args.n), desc="crossmath generate", unit="puzzle"):
        puzzle_id = f"crossmath_{args.seed}_{i:06d}"
        missing = [style for style in args.styles if puzzle_id not in done[style]]
        if not missing:
            continue
        puzzle: Puzzle = generate_puzzles(1, args.seed, args.difficulty, start=i, **kwargs)[0]
        answers = dict(zip(puzzle.blanks, puzzle.answer))
        for style in missing:
            folder = out / STYLES[style].folder
            record = puzzle.to_record(style)
            for key, image in (("img_blank", render_grid(puzzle.grid, style)), ("img", None)):
                path = folder / record[key]
                path.parent.mkdir(parents=True, exist_ok=True)
                _write_image(image or render_grid(puzzle.grid, style, answers=answers), path)
            append_jsonl(folder / JSONL_NAME, record)
        written += 1
    print(f"wrote {written} puzzles ({args.n - written} already present) to {out} in styles {args.styles}")
    return 0


def _fidelity(args: argparse.Namespace) -> int:
    from tokenswap.crossmath.fidelity import fidelity_report

    try:
        print(fidelity_report(args.released, n=args.n, seed=args.seed, pixel_limit=args.pixel_limit))
    except (FileNotFoundError, KeyError, ValueError) as err:  # a file missing, empty, or not CrossMath records
        raise _RefusedError(err.args[0] if isinstance(err, KeyError) else str(err)) from None
    return 0


def _generate_batch(model, processor, records: list[dict], modality: str, max_new_tokens: int) -> list[str]:
    import torch

    messages = [
        build_messages(modality, record["markdown_table"], load_image(record) if modality != "text" else None)
        for record in records
    ]
    texts = [processor.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in messages]
    images = [part["image"] for m in messages for part in m[0]["content"] if part["type"] == "image"]
    inputs = processor(text=texts, images=images or None, padding=True, return_tensors="pt").to(model.device)
    with torch.inference_mode():
        output = model.generate(
            **inputs,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=processor.tokenizer.pad_token_id,
        )
    return processor.batch_decode(output[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def _evaluate(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    data = find_jsonl(args.data)
    try:
        records = load_crossmath(data)[: args.n]
    except (KeyError, ValueError) as err:  # a record without a field, a line that is not JSON
        raise _RefusedError(f"--data: {err.args[0] if isinstance(err, KeyError) else err}") from None
    require_items(records, f"--data {str(data)!r}", "puzzles", "pass a CrossMath JSONL with at least one record "
                  "(`tokenswap crossmath generate` writes one)")
    require_model(args.model)
    out = require_output_dir(args.out)
    pred_path = out / f"predictions_{args.modality}.jsonl"
    previous = read_jsonl(pred_path, repair=True) if pred_path.exists() else []
    other_models = {p["model"] for p in previous} - {args.model}
    if other_models:
        raise _RefusedError(
            f"{pred_path} holds predictions of {sorted(other_models)}, not {args.model!r}; pick another --out"
        )
    done = {p["id"] for p in previous}
    todo = [r for r in records if r["id"] not in done]
    if todo:
        import torch

        from tokenswap.testing import load_qwen2vl

        model, processor = load_qwen2vl(args.model)
        if torch.cuda.is_available():
            model = model.to("cuda")
        model.eval()
        # Decoder-only batched generation needs the prompts flush against the new tokens.
        processor.tokenizer.padding_side = "left"
        for start in tqdm(range(0, len(todo), args.batch_size), desc=f"crossmath eval {args.modality}", unit="batch"):
            batch = todo[start : start + args.batch_size]
            responses = _generate_batch(model, processor, batch, args.modality, args.max_new_tokens)
            for record, response in zip(batch, responses):
                append_jsonl(
                    pred_path,
                    {
                        "id": record["id"],
                        "model": args.model,
                        "modality": args.modality,
                        "difficulty": record.get("difficulty"),
                        "response": response,
                        "prediction": extract_answer(response),
                        "answer": record["markdown_answer"],
                        "answer_step": record["markdown_answer_step"],
                    },
                )
    by_id = {p["id"]: p for p in read_jsonl(pred_path)}
    preds = [by_id[r["id"]]["prediction"] for r in records]
    run = score_run(preds, [gold_answer(r) for r in records], [gold_hops(r) for r in records])
    summary = aggregate_runs([run])
    report = {
        "model": args.model,
        "data": str(data),
        "modality": args.modality,
        "n": len(records),
        "no_answer": sum(p is None for p in preds),
        "metrics": run,
    }
    (out / f"metrics_{args.modality}.json").write_text(json.dumps(report, indent=2) + "\n")
    table = format_metrics_table({args.modality: summary})
    (out / f"metrics_{args.modality}.md").write_text(table + "\n")
    print(table)
    return 0


def cli_main(argv: list[str]) -> int:
    """Entry point of ``tokenswap crossmath``.

    Args:
        argv: the arguments after ``crossmath`` (``generate ...`` or ``eval ...``).

    Returns:
        The exit status.
    """
    args = _parser().parse_args(argv)
    try:
        return {"generate": _generate, "eval": _evaluate, "fidelity": _fidelity}[args.command](args)
    except _RefusedError as err:
        print(f"tokenswap crossmath {args.command}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(cli_main(sys.argv[1:]))
