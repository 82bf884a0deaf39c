"""``tokenswap eval``: the modality gap of one model on a TokenSwap-Bench-format dataset.

The defaults are the release protocol (the benchmark authors' lmms-eval task files): the
``generate`` scorer (greedy decoding, strict match of the last A-D letter) with ``max_new_tokens``
2048, and the release's per-model settings applied by family (Qwen2.5-VL: 128 new tokens;
Qwen3-VL: images resized to about 100,352 px; see :mod:`tokenswap.inference.model_settings`).
``--scorer loglik`` is the fast scorer: one forward pass, the letter whose next token is most
likely, where a letter's probability is that of "X" plus that of " X" (either can start the reply).
It agrees with ``generate`` on a model that answers with a letter, not on one that reasons first.

Two backends ask the model:

* ``--backend hf`` (default): the checkpoint loaded locally (Qwen families), batches of ``--batch-size``;
* ``--backend openai``: any OpenAI-compatible endpoint (vLLM, SGLang, ``transformers serve``, an API),
  ``--concurrency`` requests in flight. ``loglik`` through an endpoint reads the first token's
  ``top_logprobs`` (and reports the probability mass outside them).

Examples::

    tokenswap eval --model Qwen/Qwen2-VL-7B-Instruct --bench dongx1997/TokenSwap-Bench --out results/qwen2vl
    tokenswap eval --backend openai --base-url http://localhost:8000/v1 --model Qwen/Qwen3-VL-8B-Instruct \\
        --max-images 8 --out results/qwen3vl
    accelerate launch -m tokenswap.cli eval --model ckpt/ --bench data/bench --scorer loglik --out results/ckpt

Writes ``records.jsonl`` (one line per item and form, appended as each finishes: the same command
after a kill resumes where it stopped), ``gap.json`` (summary with gap, relative gap and retention,
per-image-count breakdown, per-item records, token usage) and ``gap.md``. Failed requests are
recorded and counted, never scored; more than ``--max-error-share`` of them ends with exit status 1.
Under ``accelerate launch`` with several processes, or with ``--recognition`` (it needs whole-reply
log-likelihoods), the ``hf`` backend scores with :class:`~tokenswap.eval.gap.GapEvaluator` in one
pass (no per-item resume).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from tokenswap.errors import InputError
from tokenswap.inputs import positive_int, require_items, require_model, require_output_dir

__all__ = ["cli_main"]

DEFAULT_MAX_NEW_TOKENS = 2048  # the release's generation_kwargs


def _parser() -> argparse.ArgumentParser:
    from tokenswap.inference.backends import add_backend_arguments

    p = argparse.ArgumentParser(prog="tokenswap eval", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True,
                   help="hf: checkpoint folder or hub id (Qwen families); openai: the served model name")
    p.add_argument("--bench", default="dongx1997/TokenSwap-Bench", help="TokenSwap-Bench hub id or local folder")
    p.add_argument("--split", default="test", help="bench split to evaluate")
    p.add_argument("--scorer", choices=["loglik", "generate"], default="generate",
                   help="generate: the release protocol (default); loglik: next-token letter, P('X') + P(' X')")
    p.add_argument("--prompt", choices=["zero_shot", "cot", "k_shot"], default="zero_shot")
    p.add_argument("--k", type=positive_int, default=5, help="shots for --prompt k_shot (from the bench's dev split)")
    p.add_argument("--limit", type=positive_int, default=None, help="evaluate the first N items")
    p.add_argument("--batch-size", type=positive_int, default=8, help="hf: conversations per generate/forward call")
    p.add_argument("--max-new-tokens", type=positive_int, default=None,
                   help=f"generate budget (default: the release's, {DEFAULT_MAX_NEW_TOKENS}; 128 for Qwen2.5-VL)")
    p.add_argument("--recognition", action="store_true",
                   help="add the concept-identification controls (naming form and multiple-choice form; hf only)")
    p.add_argument("--out", default="gap_eval", help="output folder for records.jsonl, gap.json and gap.md")
    add_backend_arguments(p)
    return p


def max_new_tokens(args, settings) -> int:
    """The budget: ``--max-new-tokens``, else the release's per-model one, else the release's default."""
    return args.max_new_tokens or settings.max_new_tokens or DEFAULT_MAX_NEW_TOKENS


def _check(args) -> None:
    from tokenswap.inference.backends import BackendConfigError, check_backend_arguments

    check_backend_arguments(args)
    if args.backend == "openai" and args.recognition:
        raise BackendConfigError(
            "--recognition needs the log-likelihood of whole candidate replies, which chat-completions endpoints "
            "do not return; run it with --backend hf"
        )
    if args.prompt == "cot" and args.scorer != "generate":
        raise BackendConfigError("--prompt cot needs --scorer generate (loglik reads one next token)")
    # Every input is checked before a model loads or a request leaves, and the output folder before hours of work.
    if args.backend == "hf":
        require_model(args.model)  # for openai, --model is the served name
    require_output_dir(args.out)


def cli_main(argv: list[str] | None = None) -> int:
    """Entry point of ``tokenswap eval``; refusals raise InputError (exit 2), too many failed requests
    ErrorShareExceeded (exit 1), both mapped by :func:`tokenswap.cli.main`."""
    args = _parser().parse_args(argv)
    _check(args)
    if args.backend == "hf" and (args.recognition or int(os.environ.get("WORLD_SIZE", "1")) > 1):
        return _evaluate_in_one_pass(args)
    return _evaluate_records(args)


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


def _shots(args):
    if args.prompt != "k_shot":
        return None
    shots: dict = {}
    for text, inter in _load_pairs(args.bench, "dev"):
        shots.setdefault(text.subject, []).append((text, inter))
    return shots


def _write(out: Path, payload: dict, markdown: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "gap.json.tmp"
    tmp.write_text(json.dumps(payload, indent=2, ensure_ascii=False))
    os.replace(tmp, out / "gap.json")
    (out / "gap.md").write_text(markdown)
    print(markdown)


def _evaluate_in_one_pass(args) -> int:
    """Today's distributed path: every rank scores a shard with GapEvaluator (hf only)."""
    from accelerate import Accelerator

    from tokenswap.eval.gap import GapEvaluator
    from tokenswap.families import load_checkpoint
    from tokenswap.inference.backends import resolve_settings

    settings = resolve_settings(args, "tokenswap", args.scorer)
    # (loglik's thinking-off is built in: GapEvaluator closes an open think block itself.)
    if settings.image_pixels or (settings.chat_template_kwargs and args.scorer == "generate"):
        from tokenswap.inference.backends import BackendConfigError

        raise BackendConfigError(
            f"the release's settings for this model ({'; '.join(settings.applied)}) need the per-item path, which "
            "runs in one process: drop --recognition / accelerate launch, or pass --no-model-settings"
        )
    state = Accelerator()  # sets up the process group from the launcher's env (ACCELERATE_USE_CPU included)
    pairs = _load_pairs(args.bench, args.split, args.limit)
    shots = _shots(args)
    model, processor = load_checkpoint(args.model)
    model.to(state.device)
    budget = max_new_tokens(args, settings)
    evaluator = GapEvaluator(
        processor, pairs, scorer=args.scorer, prompt=args.prompt, shots=shots, k=args.k,
        batch_size=args.batch_size, max_new_tokens=budget, recognition=args.recognition,
    )
    result = evaluator.evaluate(model)
    if state.is_main_process:
        payload = {"model": str(args.model), "bench": str(args.bench), "split": args.split, **result.to_dict()}
        payload.update(backend="hf", max_new_tokens=budget, model_settings=settings.as_dict())
        _write(Path(args.out), payload, result.to_markdown())
    return 0


def _identity(args, settings, budget: int) -> dict:
    # What makes two runs' records comparable; --limit, --concurrency and caps may change between resumes.
    return {
        "model": str(args.model), "backend": args.backend, "bench": str(args.bench), "split": args.split,
        "scorer": args.scorer, "prompt": args.prompt, "k": args.k if args.prompt == "k_shot" else None,
        "max_new_tokens": budget if args.scorer == "generate" else None, "model_settings": settings.as_dict(),
    }


def check_run_identity(out: Path, identity: dict, command: str) -> None:
    """Refuse to mix two runs' records in one folder (exit 2); write ``run.json`` for the first."""
    from tokenswap.inference.backends import BackendConfigError

    path = out / "run.json"
    if path.exists():
        before = json.loads(path.read_text())
        changed = {k: (before.get(k), v) for k, v in identity.items() if before.get(k) != v}
        if changed:
            detail = "; ".join(f"{k}: {a!r} before, {b!r} now" for k, (a, b) in changed.items())
            raise BackendConfigError(
                f"{out} holds a {command} run with other settings ({detail}); rerun with the same flags to resume "
                "or pick another --out"
            )
        return
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(identity, indent=2) + "\n")


def _evaluate_records(args) -> int:
    from tokenswap.eval.gap import summarize
    from tokenswap.eval.mc import build_conversation, extract_answer, shots_for
    from tokenswap.inference.backends import describe_arguments, open_backend, resolve_settings
    from tokenswap.inference.runs import RecordLog, check_error_share, run_units, tally

    settings = resolve_settings(args, "tokenswap", args.scorer)
    budget = max_new_tokens(args, settings)
    out = Path(args.out)
    check_run_identity(out, _identity(args, settings, budget), "tokenswap eval")
    pairs = _load_pairs(args.bench, args.split, args.limit)
    shots = _shots(args)
    units = []  # (form, item, shots)
    for text, inter in pairs:
        chosen = shots_for({text.subject: shots.get(text.subject, [])}, text.subject, args.k) if shots else []
        units.append(("text", text, tuple(t for t, _ in chosen)))
        units.append(("interleaved", inter, tuple(i for _, i in chosen)))

    def key(unit) -> str:
        return f"{unit[0]}|{unit[1].id}"

    def record(unit, fields: dict) -> dict:
        pred = extract_answer(fields["response"]) if args.scorer == "generate" and fields["response"] is not None \
            else fields["response"]
        return {**fields, "id": unit[1].id, "form": unit[0], "pred": pred}

    log = RecordLog(out / "records.jsonl")
    backend = None
    if any(not log.answered(key(u)) for u in units):
        backend = open_backend(args, settings, batch_size=args.batch_size)
        for line in settings.applied:
            print(f"tokenswap eval: release setting: {line}", file=sys.stderr)
        try:
            run_units(backend, log, units, key, lambda u: build_conversation(u[1], args.prompt, u[2]), record,
                      scorer=args.scorer, max_new_tokens=budget, progress=f"tokenswap eval ({args.backend})",
                      max_error_share=args.max_error_share)
        finally:
            backend.close()
    rows = [log.records[key(u)] for u in units]
    counts = tally(rows)
    items, excluded = [], []
    for i, (text, inter) in enumerate(pairs):
        rt, ri = rows[2 * i], rows[2 * i + 1]
        if any("error" in r or "skipped" in r for r in (rt, ri)):
            excluded.append({"id": text.id, **{k: r[k] for r in (rt, ri) for k in ("error", "skipped") if k in r}})
            continue
        rec = {
            "id": text.id, "subject": text.subject, "answer": text.letter, "num_images": inter.num_images,
            "pred_text": rt["pred"], "pred_interleaved": ri["pred"],
            "correct_text": rt["pred"] == text.letter, "correct_interleaved": ri["pred"] == inter.letter,
        }
        for form, r in (("text", rt), ("interleaved", ri)):
            if args.scorer == "generate":
                rec[f"response_{form}"] = r["response"]
            for extra in ("reasoning", "letter_probs", "outside_mass"):
                if extra in r:
                    rec[f"{extra}_{form}"] = r[extra]
        items.append(rec)
    result = summarize(args.scorer, args.prompt, items)
    payload = {"model": str(args.model), "bench": str(args.bench), "split": args.split, **result.to_dict()}
    payload.update(
        backend=args.backend, max_new_tokens=budget if args.scorer == "generate" else None,
        model_settings=settings.as_dict(), n_pairs=len(pairs), n_failed=counts["failed"],
        n_skipped=counts["skipped"], excluded=excluded, usage=counts["usage"],
    )
    payload["backend_info"] = describe_arguments(args)
    outside = [r[k] for r in items for k in ("outside_mass_text", "outside_mass_interleaved") if k in r]
    if outside:
        payload["loglik_outside_mass"] = {"mean": sum(outside) / len(outside), "max": max(outside)}
    check_error_share(counts, args.max_error_share, "requests")
    markdown = result.to_markdown()
    if excluded:
        markdown += f"\n{len(excluded)} of {len(pairs)} items left out: {counts['failed']} failed requests, " \
                    f"{counts['skipped']} skipped ({counts['first_error'] or counts['first_skip']})\n"
    usage = counts["usage"]
    markdown += f"\nTokens: {usage['prompt_tokens']:,} prompt, {usage['completion_tokens']:,} completion " \
                f"over {usage['requests']:,} requests\n"
    _write(out, payload, markdown)
    return 0
