"""``tokenswap rest build | eval``: build a REST/REST+ dataset folder, then evaluate a model on it.

Examples::

    tokenswap rest build --source mmlu --data cais/mmlu --n 500 --out rest/mmlu
    tokenswap rest build --source soebench --n 500 --out rest/soebench
    tokenswap rest eval --model Qwen/Qwen2-VL-7B-Instruct --data rest/mmlu --out runs/rest-mmlu --ocr
    tokenswap rest eval --model PATH --data rest/mmlu --out runs/rest-plus --perturbations   # all 10 variants
    tokenswap rest eval --model PATH --data rest/mmlu --out runs/x --perturbations mono_50,color_red
    tokenswap rest eval --backend openai --base-url http://localhost:8000/v1 --model Qwen/Qwen2.5-VL-7B-Instruct \\
        --data rest/mmlu --out runs/rest-vllm --ocr

Both commands are resumable: rerun the same command after an interruption.
"""

from __future__ import annotations

import argparse
import os

from tokenswap.errors import InputError
from tokenswap.families import check_checkpoint
from tokenswap.inference.backends import add_backend_arguments
from tokenswap.inputs import (
    check_output_dir,
    from_hub,
    local_or_hub,
    non_negative_int,
    positive_int,
    require_model,
    require_output_dir,
    require_path,
)
from tokenswap.script import CommandParser

__all__ = ["cli_main"]

# What valid --data values hold, for the message that refuses a missing or mistyped one.
SOURCE_HOLDS = ("a source is a parquet/JSONL/JSON/CSV file of its rows, a folder of such files, or a hub id such as "
                "cais/mmlu")
REST_HOLDS = ("a REST dataset folder holds meta.json, items.jsonl and images/, as `tokenswap rest build ... --out "
              "FOLDER` writes it")


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="tokenswap rest", description=__doc__.split("\n\n")[0].replace("``", ""))
    sub = parser.add_subparsers(dest="command", required=True)

    build = sub.add_parser("build", help="write items and all renderings (REST + 10 REST+ variants)")
    build.add_argument("--source", required=True, choices=["mmlu", "arc", "gsm", "soebench"],
                       help="row schema of --data (mmlu, arc, gsm); soebench: generated systems of equations, no --data")
    build.add_argument("--data", help="hub id or local file/folder (not used for soebench)")
    build.add_argument("--n", type=positive_int, default=None, help="number of items (required for soebench)")
    build.add_argument("--out", required=True, help="dataset folder")
    build.add_argument("--split", default=None, help="dataset split (default: test)")
    build.add_argument("--config", default=None, help="hub config (default: all / ARC-Challenge / main)")
    build.add_argument("--seed", type=non_negative_int, default=0, help="soebench generation seed")
    build.add_argument("--color", default="red", help="colour of the coloured variant: name or R,G,B")

    ev = sub.add_parser("eval", help="generate in every modality, score RER/CFR/MMC, write report")
    ev.add_argument("--model", required=True,
                    help="hf: checkpoint folder or hub id (Qwen families); openai: the served model name")
    ev.add_argument("--data", required=True, help="folder written by `tokenswap rest build`")
    ev.add_argument("--out", required=True, help="output folder (predictions.jsonl is resumed)")
    ev.add_argument(
        "--perturbations",
        nargs="?",
        const="all",
        default=None,
        help="also evaluate REST+ variants: all (flag alone) or a comma list such as mono_50,color_red",
    )
    ev.add_argument("--ocr", action="store_true", help="OCR control (CER, OCR-correct subset) and OCR-first")
    ev.add_argument("--n", type=positive_int, default=None, help="evaluate the first N items only")
    ev.add_argument("--max-new-tokens", type=positive_int, default=None, help="default 1024 (2048 for soebench)")
    ev.add_argument("--batch-size", type=positive_int, default=8, help="hf: conversations per generate call")
    add_backend_arguments(ev)
    return parser


def _build(args: argparse.Namespace) -> int:
    from tokenswap.rest.build import build_rest_dataset
    from tokenswap.rest.render import parse_color

    try:
        parse_color(args.color)
    except ValueError as e:
        raise InputError(f"--color: {e}") from None

    extra: dict = {"data": args.data}
    if args.source == "soebench":
        from tokenswap.rest.soebench import soebench_items

        if args.n is None:
            raise InputError("--n is required for --source soebench (it generates that many systems)")
        items = soebench_items(args.n, seed=args.seed)
        extra = {"seed": args.seed}
    else:
        from tokenswap.rest.items import load_source

        if not args.data:
            raise InputError(f"--data (a hub id or a local file or folder) is required for --source {args.source}")
        local_or_hub(args.data, "--data", SOURCE_HOLDS, kind="file or folder")
        with from_hub(args.data, "--data", SOURCE_HOLDS, kind="file or folder", repo_type="dataset"):
            items, counts = load_source(args.source, args.data, n=args.n, split=args.split, config=args.config)
        extra["filter_counts"] = dict(counts)
    if not items:
        raise InputError(f"{args.source} data {args.data!r} gave no items after the REST filters "
                         f"({dict(extra.get('filter_counts', {}))}); nothing written: pass data with items REST keeps "
                         "(at most 800 characters, no LaTeX)")
    require_output_dir(args.out)
    stats = build_rest_dataset(items, args.out, source=args.source, color=args.color, extra_meta=extra)
    print(f"rest build: {stats['written']} written, {stats['skipped']} already there, {stats['total']} in {args.out}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from tokenswap.inference.backends import (
        check_backend_arguments,
        describe_arguments,
        open_backend,
        resolve_settings,
    )
    from tokenswap.rest.build import BASE_VARIANT, read_meta
    from tokenswap.rest.evaluate import load_rest_data, run_rest_eval

    check_backend_arguments(args)
    local_or_hub(args.data, "--data", REST_HOLDS, hub=False)
    require_path(args.data, "--data", kind="dir")
    require_path(os.path.join(args.data, "meta.json"), "--data (a folder written by `tokenswap rest build`) file")
    if args.backend == "hf":
        require_model(args.model)  # for openai, --model is the served name
        if os.path.isdir(args.model):
            check_checkpoint(args.model, "--model")
    meta = os.path.join(args.data, "meta.json")
    built = read_meta(meta)["variants"]
    variants = [BASE_VARIANT]
    if args.perturbations == "all":
        variants += [v for v in built if v != BASE_VARIANT]
    elif args.perturbations:
        variants += [v for v in args.perturbations.split(",") if v and v != BASE_VARIANT]
    unknown = [v for v in variants if v not in built]
    if unknown:
        raise InputError(f"variants {unknown} were not built in {meta!r} (built: {built}); pick --perturbations "
                         "among those, or rebuild the folder with `tokenswap rest build`")
    check_output_dir(args.out)
    load_rest_data(args.data, variants, args.n)  # a damaged folder is refused before the output folder is made
    require_output_dir(args.out)
    settings = resolve_settings(args, "rest")
    metrics = run_rest_eval(
        None,
        None,
        args.data,
        args.out,
        variants=variants,
        ocr=args.ocr,
        n=args.n,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        progress=True,
        model_name=args.model,
        backend=lambda: open_backend(args, settings, batch_size=args.batch_size),
        max_error_share=args.max_error_share,
        run_info={"backend_info": describe_arguments(args), "model_settings": settings.as_dict()},
    )
    base = metrics["variants"][BASE_VARIANT]["all"]
    shown = [base["accuracy"][m] for m in ("text", "image", "mixed")] + [base["rer"]]
    text_acc, image_acc, mixed_acc, rer = ("n/a" if v is None else f"{v:.3f}" for v in shown)
    print(
        f"rest eval: {metrics['n_items']} items, acc text/image/mixed = {text_acc}/{image_acc}/{mixed_acc}, "
        f"RER {rer}; report in {args.out}/report.md"
    )
    usage = metrics["usage"]
    print(f"rest eval: {metrics['n_failed']} failed and {metrics['n_skipped']} skipped requests left out; tokens: "
          f"{usage['prompt_tokens']:,} prompt, {usage['completion_tokens']:,} completion")
    return 0


def cli_main(argv: list[str] | None = None) -> int:
    """Entry point of ``tokenswap rest``."""
    args = _parser().parse_args(argv)
    return _build(args) if args.command == "build" else _eval(args)
