"""``tokenswap crossmath``: generate puzzles, evaluate a model on them, or compare with the release.

Generate 300 puzzles (the released easy/medium/hard mix) in all four styles::

    tokenswap crossmath generate --n 300 --seed 0 --difficulty mixed --out data/crossmath

This writes ``<out>/<Style>/crossmath.jsonl`` in the released record format plus the puzzle
and solved PNGs under the released names (``<Style>/test_images_blank_hr/<id>_blank.png``, ...).
Evaluate a model greedily in one modality, locally or through any OpenAI-compatible endpoint::

    tokenswap crossmath eval --model Qwen/Qwen2-VL-7B-Instruct --data data/crossmath/Original \\
        --modality image --out runs/crossmath
    tokenswap crossmath eval --backend openai --base-url http://localhost:8000/v1 --model Qwen/Qwen3.5-9B \\
        --data data/crossmath/Original --modality image --out runs/crossmath-qwen35

The release's budget is 16,384 new tokens, and Qwen3.5 runs with thinking off unless ``--thinking``
(its ``batch_inference_qwen35.py``); the release samples 4 runs with the model's own sampling
settings, where tokenswap decodes greedily once. This writes ``predictions_<modality>.jsonl`` (one
line per puzzle, appended as each finishes), ``metrics_<modality>.json`` (with token usage and the
failed / skipped counts) and ``metrics_<modality>.md``. Both commands resume: finished puzzles are
skipped (failed requests are asked again), and a rerun
with different generator flags (or another model, for eval) into the same folder is refused.
Compare our generator and renderer with a checkout of the released test set::

    tokenswap crossmath fidelity --released path/to/CrossMath --n 250
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

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
from tokenswap.errors import InputError
from tokenswap.families import check_checkpoint
from tokenswap.files import atomic_write, read_json_object
from tokenswap.inference.backends import add_backend_arguments
from tokenswap.inputs import (
    local_or_hub,
    non_negative_int,
    positive_int,
    require_items,
    require_model,
    require_output_dir,
)
from tokenswap.script import CommandParser

__all__ = ["cli_main", "evaluate"]

JSONL_NAME = "crossmath.jsonl"
RELEASE_MAX_NEW_TOKENS = 16384  # batch_inference_qwen35.py --max_new_tokens




def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="tokenswap crossmath", description=__doc__.split("\n")[0].replace("``", ""))
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate puzzles: JSONL in the released format + PNG per style")
    gen.add_argument("--n", type=positive_int, required=True, help="number of puzzles (>= 1)")
    gen.add_argument("--seed", type=int, default=0, help="collection seed; puzzle i depends only on (seed, i)")
    gen.add_argument("--difficulty", choices=[*DIFFICULTIES, "mixed"], default="mixed",
                     help="puzzle difficulty; mixed: the released easy/medium/hard mix (default)")
    gen.add_argument("--out", required=True, help="output folder; one subfolder per style")
    gen.add_argument("--styles", nargs="+", choices=sorted(STYLES), default=list(STYLES),
                     help="rendering styles, one subfolder each (default: all four)")
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
    ev.add_argument("--model", required=True,
                    help="hf: model folder or hub id (Qwen families); openai: the served model name")
    ev.add_argument("--data", required=True, help="a CrossMath JSONL or its style folder")
    ev.add_argument("--modality", choices=MODALITIES, required=True,
                    help="how the puzzle is shown: text (markdown), image (the puzzle PNG) or image+text (both)")
    ev.add_argument("--n", type=positive_int, default=None, help="evaluate the first N puzzles (default: all)")
    ev.add_argument("--max-new-tokens", type=positive_int, default=RELEASE_MAX_NEW_TOKENS,
                    help=f"generation budget (default: the release's {RELEASE_MAX_NEW_TOKENS})")
    ev.add_argument("--batch-size", type=positive_int, default=8, help="hf: puzzles per generate call")
    ev.add_argument("--out", required=True, help="output folder for predictions and metrics")
    add_backend_arguments(ev)

    fid = sub.add_parser("fidelity", help="statistics and pixel parity against the released test set")
    fid.add_argument("--released", required=True, help="a checkout of github.com/xuyige/CrossMath or its data folder")
    fid.add_argument("--n", type=positive_int, default=250, help="puzzles to generate for the comparison")
    fid.add_argument("--seed", type=int, default=0, help="generator seed")
    fid.add_argument(
        "--pixel-limit", type=positive_int, default=None, help="compare only the first N images per style"
    )
    return parser


def _write_image(image, path: Path) -> None:
    # Through files.atomic_write (the writer's own temporary, fsynced, renamed), so a killed job never leaves a
    # truncated PNG behind a finished record and two writers of one picture never share a temporary.
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    atomic_write(path, buf.getvalue())


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
        raise InputError(str(err)) from None
    require_output_dir(out)
    params_path = out / "generate_params.json"
    if params_path.exists():
        fix = ("it records the flags the folder's puzzles were generated with: restore it, or pick another --out "
               "(deleting it lets flags change and mixes two collections)")
        saved = read_json_object(params_path, "--out file", fix)
        if saved != params:
            raise InputError(
                f"{out} already holds puzzles generated with {json.dumps(saved)}, not {params}; "
                "resume with the same flags (--n and --styles may change) or pick another --out"
            )
    atomic_write(params_path, (json.dumps(params) + "\n").encode())
    done: dict[str, set[str]] = {}
    for style in args.styles:
        jsonl = out / STYLES[style].folder / JSONL_NAME
        records = read_jsonl(jsonl, repair=True) if jsonl.exists() else []
        for number, record in enumerate(records, start=1):
            if not isinstance(record.get("img_blank"), str):
                raise InputError(f"{jsonl}: record {number} has no img_blank file name, so it is no record "
                                 "`tokenswap crossmath generate` wrote; delete that line or pick another --out")
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

    print(fidelity_report(args.released, n=args.n, seed=args.seed, pixel_limit=args.pixel_limit))
    return 0


def _check_records(records: list[dict], data: Path, modality: str) -> None:
    """Refuse, before any model loads, what would make the run wrong or stop it at the end: one id twice (its
    second record would be taken as answered by the first and scored twice), gold answers and hop labels that
    cannot be scored, and a picture that is not there for an image modality."""
    seen: dict[str, int] = {}
    for index, record in enumerate(records):
        if record["id"] in seen:
            raise InputError(f"--data {str(data)!r}: records {seen[record['id']]} and {index} are both puzzle "
                             f"{record['id']!r} (the same img_blank); each puzzle is evaluated once, so drop one")
        seen[record["id"]] = index
        try:
            answers, hops = gold_answer(record), gold_hops(record)
        except ValueError as e:
            raise InputError(f"--data {str(data)!r} record {index}: {e}; fix or drop that record") from None
        if len(answers) != len(hops):
            raise InputError(f"--data {str(data)!r} record {index}: markdown_answer has {len(answers)} cells but "
                             f"markdown_answer_step {len(hops)}; each answer needs its hop label, so fix or drop "
                             "that record")
    if modality == "text":
        return
    for record in records:
        if "image_path" not in record or not Path(record["image_path"]).is_file():
            load_image(record)  # raises, naming the record or the missing file and the fix


def evaluate(
    model: str,
    data: str,
    modality: str,
    out: str,
    *,
    n: int | None = None,
    max_new_tokens: int = RELEASE_MAX_NEW_TOKENS,
    batch_size: int = 8,
    **backend: Any,
) -> dict:
    """``tokenswap crossmath eval`` as a function: evaluate ``model`` greedily on the puzzles of ``data`` in one
    modality, writing ``predictions_<modality>.jsonl`` and ``metrics_<modality>.{json,md}`` into ``out``.

    Args:
        model, data, modality, out, n, max_new_tokens, batch_size: the command's flags of the same names.
        backend: the model-backend flags by their argument names (``backend="openai"``, ``base_url=...``,
            ``max_error_share=...``); the command's defaults otherwise.

    Returns:
        The report written to ``metrics_<modality>.json``.

    Raises:
        InputError: the command's exit-2 refusals (missing data, a record that cannot be scored, another model's
            predictions in ``out``, ...).
    """
    defaults = CommandParser(add_help=False)
    add_backend_arguments(defaults)
    args = defaults.parse_args([])
    unknown = sorted(set(backend) - set(vars(args)))
    if unknown:
        raise TypeError(f"evaluate() got unknown backend arguments {unknown}; known: {sorted(vars(args))}")
    vars(args).update(backend, model=model, data=data, modality=modality, out=out, n=n,
                      max_new_tokens=max_new_tokens, batch_size=batch_size)
    return _evaluate(args)


def _eval_command(args: argparse.Namespace) -> int:
    evaluate(**{k: v for k, v in vars(args).items() if k != "command"})
    return 0


def _evaluate(args: argparse.Namespace) -> dict:
    from tokenswap.inference.backends import (
        check_backend_arguments,
        describe_arguments,
        open_backend,
        resolve_settings,
    )
    from tokenswap.inference.runs import RecordLog, check_error_share, run_units, tally

    check_backend_arguments(args)
    local_or_hub(args.data, "--data", "a CrossMath --data is a puzzle JSONL or the style folder holding one, as "
                 "`tokenswap crossmath generate --out DIR` writes DIR/Original/", hub=False, kind="file or folder")
    data = find_jsonl(args.data)
    records = load_crossmath(data)[: args.n]
    require_items(records, f"--data {str(data)!r}", "puzzles", "pass a CrossMath JSONL with at least one record "
                  "(`tokenswap crossmath generate` writes one)")
    _check_records(records, data, args.modality)
    if args.backend == "hf":
        require_model(args.model)  # for openai, --model is the served name
        if os.path.isdir(args.model):
            check_checkpoint(args.model, "--model")
    out = require_output_dir(args.out)
    pred_path = out / f"predictions_{args.modality}.jsonl"
    log = RecordLog(pred_path, key_field="id")
    other_models = {p["model"] for p in log.records.values()} - {args.model}
    if other_models:
        raise InputError(
            f"{pred_path} holds predictions of {sorted(other_models)}, not {args.model!r}; pick another --out"
        )
    settings = resolve_settings(args, "crossmath")
    todo = [r for r in records if not log.answered(r["id"])]
    backend = None
    if todo:
        backend = open_backend(args, settings, batch_size=args.batch_size)
        for line in settings.applied:
            print(f"tokenswap crossmath eval: release setting: {line}", file=sys.stderr)

        def conversation(record: dict) -> list[dict]:
            image = load_image(record) if args.modality != "text" else None
            return build_messages(args.modality, record["markdown_table"], image)

        def make_record(record: dict, fields: dict) -> dict:
            response = fields.pop("response")
            return {
                "id": record["id"],
                "model": args.model,
                "modality": args.modality,
                "difficulty": record.get("difficulty"),
                "response": response,
                "prediction": extract_answer(response) if response is not None else None,
                "answer": record["markdown_answer"],
                "answer_step": record["markdown_answer_step"],
                "backend": args.backend,
                **{k: v for k, v in fields.items() if k != "id"},
            }

        try:
            run_units(backend, log, records, lambda r: r["id"], conversation, make_record,
                      max_new_tokens=args.max_new_tokens, progress=f"crossmath eval {args.modality}",
                      max_error_share=args.max_error_share)
        finally:
            backend.close()
    rows = [log.records[r["id"]] for r in records]
    counts = tally(rows)
    scored = [(r, p) for r, p in zip(records, rows) if "error" not in p and "skipped" not in p]
    preds = [p["prediction"] for _, p in scored]
    run = score_run(preds, [gold_answer(r) for r, _ in scored], [gold_hops(r) for r, _ in scored])
    summary = aggregate_runs([run])
    report = {
        "model": args.model,
        "data": str(data),
        "modality": args.modality,
        "n": len(scored),
        "no_answer": sum(p is None for p in preds),
        "metrics": run,
        "backend": args.backend,
        "max_new_tokens": args.max_new_tokens,
        "model_settings": settings.as_dict(),
        "n_puzzles": len(records),
        "n_failed": counts["failed"],
        "n_skipped": counts["skipped"],
        "usage": counts["usage"],
    }
    report["backend_info"] = describe_arguments(args)
    check_error_share(counts, args.max_error_share, "requests")
    atomic_write(out / f"metrics_{args.modality}.json", (json.dumps(report, indent=2) + "\n").encode())
    table = format_metrics_table({args.modality: summary})
    atomic_write(out / f"metrics_{args.modality}.md", (table + "\n").encode())
    print(table)
    if counts["failed"] or counts["skipped"]:
        print(f"{counts['failed']} failed and {counts['skipped']} skipped puzzles left out of the scores "
              f"({counts['first_error'] or counts['first_skip']})")
    usage = counts["usage"]
    print(f"tokens: {usage['prompt_tokens']:,} prompt, {usage['completion_tokens']:,} completion over "
          f"{usage['requests']:,} requests")
    return report


def cli_main(argv: list[str]) -> int:
    """Entry point of ``tokenswap crossmath``.

    Args:
        argv: the arguments after ``crossmath`` (``generate ...`` or ``eval ...``).

    Returns:
        The exit status.
    """
    args = _parser().parse_args(argv)
    return {"generate": _generate, "eval": _eval_command, "fidelity": _fidelity}[args.command](args)

