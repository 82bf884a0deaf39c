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

``--forms`` adds the controls that say what the gap is made of (:mod:`tokenswap.eval.forms`): ``both`` (every
concept word kept, its picture after it), ``caption`` (the model's own caption of each picture in its place),
``rendered`` (the word rendered as a picture) and ``recognition`` (per distinct picture, which of 4 concepts it
shows), or ``all``; the default ``text,interleaved`` is the gap alone. The ``recognition`` form brings, on ``hf``,
the log-likelihood naming control too (it is the one recognition switch; ``--recognition`` is refused). Each form is one more request per item (captions and
recognition: per distinct picture), all in flight together (:mod:`tokenswap.eval.form_runs`).

Writes ``records.jsonl`` (one line per request, appended as each finishes: the same command after a
kill resumes where it stopped, and a rerun with more forms asks only the new ones), ``gap.json``
(summary with gap, relative gap and retention, per-image-count breakdown, every form's accuracy and
the decomposition of the gap with bootstrap intervals, per-item and per-picture records, token
usage), ``gap.md`` and ``gap_forms.png``. Failed requests are recorded and counted, never scored;
more than ``--max-error-share`` of them ends with exit status 1. One evaluation at a time per
``--out`` (a folder lock). Under ``accelerate launch`` with several processes the ``hf`` backend shares the
units out by rank (:mod:`tokenswap.eval.shards`): the same records, resume, forms and per-model settings as one
process, and the same ``gap.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from tokenswap.errors import InputError
from tokenswap.files import FolderLock, FolderLockedError, atomic_write, atomic_write_json, atomic_write_text
from tokenswap.inputs import (
    HubMissError,
    from_hub,
    local_or_hub,
    positive_int,
    require_items,
    require_model,
    require_output_dir,
)
from tokenswap.script import CommandParser

__all__ = ["cli_main"]

DEFAULT_MAX_NEW_TOKENS = 2048  # the release's generation_kwargs


class _Retired(argparse.Action):
    """A flag that was removed: one line naming what replaced it (exit 2), not argparse's usage dump."""

    def __call__(self, parser, namespace, values, option_string=None):
        raise InputError(f"{option_string} is gone: add recognition to --forms (e.g. --forms text,interleaved,"
                         "recognition); the form is the one recognition switch")


def _parser() -> argparse.ArgumentParser:
    from tokenswap.eval.forms import ENDS
    from tokenswap.inference.backends import add_backend_arguments

    p = CommandParser(prog="tokenswap eval", description=__doc__.split("\n\n")[0].replace("``", ""))
    p.add_argument("--model", required=True,
                   help="hf: checkpoint folder or hub id (Qwen families); openai: the served model name")
    p.add_argument("--bench", default="dongx1997/TokenSwap-Bench", help="TokenSwap-Bench hub id or local folder")
    p.add_argument("--split", default="test", help="bench split to evaluate")
    p.add_argument("--scorer", choices=["loglik", "generate"], default="generate",
                   help="generate: the release protocol (default); loglik: next-token letter, P('X') + P(' X')")
    p.add_argument("--prompt", choices=["zero_shot", "cot", "k_shot"], default="zero_shot",
                   help="zero_shot: the release's prompt (default); cot: a reasoning instruction in place of the final 'Answer: ' (needs "
                        "--scorer generate); "
                        "k_shot: --k solved examples from the bench's dev split first")
    p.add_argument("--k", type=positive_int, default=5, help="shots for --prompt k_shot (from the bench's dev split)")
    p.add_argument("--limit", type=positive_int, default=None, help="evaluate the first N items")
    p.add_argument("--batch-size", type=positive_int, default=8, help="hf: conversations per generate/forward call")
    p.add_argument("--max-new-tokens", type=positive_int, default=None,
                   help=f"generate budget (default: the release's, {DEFAULT_MAX_NEW_TOKENS}; 128 for Qwen2.5-VL)")
    p.add_argument("--forms", type=_forms, default=ENDS,
                   help="forms to ask, a comma list of text, interleaved, both, caption, rendered, recognition, or "
                        "all (default text,interleaved: the gap alone)")
    p.add_argument("--recognition", nargs=0, action=_Retired, default=None,
                   help="gone (refused): add recognition to --forms, the one recognition switch")
    p.add_argument("--out", default="gap_eval", help="output folder for records.jsonl, gap.json and gap.md")
    add_backend_arguments(p)
    return p


def _forms(text: str) -> tuple[str, ...]:
    from tokenswap.eval.forms import parse_forms

    return parse_forms(text)


def max_new_tokens(args, settings) -> int:
    """The budget: ``--max-new-tokens``, else the release's per-model one, else the release's default."""
    return args.max_new_tokens or settings.max_new_tokens or DEFAULT_MAX_NEW_TOKENS


def _check(args) -> None:
    from tokenswap.data.tokenswap_bench import BENCH_HOLDS
    from tokenswap.eval.forms import check_plan
    from tokenswap.inference.backends import check_backend_arguments

    check_backend_arguments(args)
    args.forms = check_plan(args.forms, args.prompt, args.scorer)
    # Every input is checked before a model loads or a request leaves, and the output folder before hours of work.
    if args.backend == "hf":
        require_model(args.model)  # for openai, --model is the served name
    local_or_hub(args.bench, "--bench", BENCH_HOLDS)
    require_output_dir(args.out)


def cli_main(argv: list[str] | None = None) -> int:
    """Entry point of ``tokenswap eval``; refusals raise InputError (exit 2), too many failed requests
    ErrorShareExceeded (exit 1), both mapped by :func:`tokenswap.cli.main`."""
    args = _parser().parse_args(argv)
    _check(args)
    return _evaluate_records(args)


def _world_size() -> int:
    from tokenswap.ranks import rank_and_world

    return rank_and_world()[1]


class EvalLockedError(FolderLockedError):
    """Another ``tokenswap eval`` holds the ``--out`` folder (exit status 1, as for a busy build or training run)."""


@contextlib.contextmanager
def _lock(out: Path, rank: int = 0):
    """The folder lock of one evaluation (the store build's ``flock``: a killed holder drops it at once)."""
    lock = FolderLock(out, rank, prefix=".eval-lock", doing="being evaluated", error=EvalLockedError,
                      what="evaluation")
    try:
        lock.acquire()
    except EvalLockedError as e:
        raise EvalLockedError(str(e).replace("another output folder", "another --out")) from None
    try:
        yield
    finally:
        lock.release()


def _datasets_read_error() -> tuple[type[BaseException], ...]:
    """``datasets``' error for a file it cannot read, once something imported it (a hub bench): a local bench folder
    is read without ``datasets``, whose import alone takes seconds of the command's start."""
    errors = sys.modules.get("datasets.exceptions")
    return (errors.DatasetGenerationError,) if errors is not None else ()


def _load_pairs(bench: str, split: str, limit: int | None = None) -> list:
    """The bench's paired items; a bench whose rows are malformed or missing is an InputError naming it."""
    from tokenswap.data.tokenswap_bench import BENCH_HOLDS, load_tokenswap_bench_pairs

    try:
        with from_hub(bench, "--bench", BENCH_HOLDS, repo_type="dataset"):
            # Pictures checked now, decoded when a request needs them: the first request does not wait for them all.
            pairs = load_tokenswap_bench_pairs(bench, split, limit, decode=False)
    except HubMissError:  # already one line naming --bench and the fix
        raise
    except (KeyError, ValueError) as e:  # a missing field, an answer out of range, the two configs disagreeing
        raise InputError(f"--bench {bench!r}: {e.args[0] if isinstance(e, KeyError) else e}") from None
    except _datasets_read_error() as e:  # a damaged parquet file; datasets' own message names no file
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
    atomic_write_json(out / "gap.json", payload, ensure_ascii=False)
    atomic_write_text(out / "gap.md", markdown)
    print(markdown)


def _run_shards(shards, backend, log, plan, args, budget: int, naming: bool):
    """Each rank asks its share of the units into its part file; rank 0 merges after each round. The caption
    form's items wait for a second round, when every rank's captions are in the merged log."""
    from tokenswap.eval.form_runs import run_plan
    from tokenswap.eval.gap import naming_records
    from tokenswap.eval.shards import merge_parts
    from tokenswap.inference.runs import RecordLog

    out = Path(args.out)
    mine = shards.owner(plan.all_units())
    later = {u.key for u in plan.caption_form_units()}
    progress = f"tokenswap eval (hf, {shards.world} processes)" if shards.main else None
    for keep in (lambda u: mine(u) and u.key not in later, mine):
        part = shards.part(out, log)
        shards.together(lambda keep=keep, part=part: run_plan(
            backend, part, plan, args.scorer, budget, progress=progress, max_error_share=args.max_error_share,
            keep=keep))
        shards.together(lambda log=log: merge_parts(out, log), main_only=True)
        if not shards.main:
            log = RecordLog(out / "records.jsonl")
    if naming:  # per distinct picture, a few batches: rank 0 alone
        shards.together(lambda: naming_records(backend, log, plan, progress=progress), main_only=True)
    return log


def _form_lines(result) -> str:
    """gap.md's lines for the forms that lost items (each form's n, and its first reason)."""
    from tokenswap.eval.form_runs import skip_reasons

    lines = []
    for form, c in result.form_counts.items():
        if c["failed"] or c["skipped"]:
            first = next((f"{e['id']}: {r}" for e in (*result.excluded, *result.items)
                          for f, r in skip_reasons(e).items() if f == form), None)
            lines.append(f"{form}: n {c['n']}, {c['failed']} failed, {c['skipped']} skipped (first: {first})")
    return "\nPer form:\n" + "\n".join(f"- {line}" for line in lines) + "\n" if lines else ""


def _refuse_empty_forms(result) -> None:
    """Exit status 1 when a form run rests on no item: that form's number would be a mean over nothing."""
    from tokenswap.errors import IncompleteRunError

    empty = result.empty_forms()
    if empty:
        raise IncompleteRunError(f"{empty[0]}; gap.json counts each form's n and skips (form_counts); rerun "
                                 "without that form, or fix what its reason names")


def _identity(args, settings, budget: int) -> dict:
    # What makes two runs' records comparable; --limit, --forms, --concurrency and caps may change between resumes.
    return {
        "model": str(args.model), "backend": args.backend, "bench": str(args.bench), "split": args.split,
        "scorer": args.scorer, "prompt": args.prompt, "k": args.k if args.prompt == "k_shot" else None,
        "max_new_tokens": budget if args.scorer == "generate" else None, "model_settings": settings.as_dict(),
        # The pictures as sent: another format or size would be other questions under the same record keys.
        "image_format": args.image_format if args.backend == "openai" else None, "max_pixels": args.max_pixels,
    }


# Added to the identity after runs were written without them: such a run.json is not checked on them (it did not
# record what it sent), and the resume records them from then on.
_LATER_KEYS = ("image_format", "max_pixels")


def check_run_identity(out: Path, identity: dict, command: str) -> None:
    """Refuse to mix two runs' records in one folder (exit 2); write ``run.json`` for the first."""
    from tokenswap.files import read_json
    from tokenswap.inference.backends import BackendConfigError

    path = out / "run.json"
    fix = (f"delete it and rerun with the flags of the run that wrote {out / 'records.jsonl'} (or move the folder "
           "away and start afresh)")
    if path.exists():
        before = read_json(path, f"{command}'s run settings", fix)
        if not isinstance(before, dict):
            raise InputError(f"{command}'s run settings {str(path)!r} hold a JSON {type(before).__name__}, not an "
                             f"object; {fix}")
        changed = {k: (before.get(k), v) for k, v in identity.items()
                   if before.get(k) != v and not (k in _LATER_KEYS and k not in before)}
        if changed:
            detail = "; ".join(f"{k}: {a!r} before, {b!r} now" for k, (a, b) in changed.items())
            raise BackendConfigError(
                f"{out} holds a {command} run with other settings ({detail}); rerun with the same flags to resume "
                "or pick another --out"
            )
        if all(k in before for k in identity):
            return
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(path, (json.dumps(identity, indent=2) + "\n").encode())


def _evaluate_records(args) -> int:
    from tokenswap.eval.form_runs import FormPlan, plot_forms, run_plan, skip_reasons
    from tokenswap.eval.gap import naming_records, plan_result
    from tokenswap.eval.mc import shots_for
    from tokenswap.inference.backends import describe_arguments, model_family_source, open_backend, resolve_settings
    from tokenswap.inference.runs import RecordLog, check_error_share, tally

    settings = resolve_settings(args, "tokenswap", args.scorer)
    budget = max_new_tokens(args, settings)
    out = Path(args.out)
    shards = None
    if args.backend == "hf" and _world_size() > 1:
        from tokenswap.eval.shards import Shards

        shards = Shards()

    def together(step, main_only=False):
        return step() if shards is None else shards.together(step, main_only=main_only)

    def plan_run():
        # Inputs first: a bench that cannot be loaded leaves no run.json that would then refuse the fixed command.
        pairs = _load_pairs(args.bench, args.split, args.limit)
        shots = _shots(args)
        chosen = [shots_for({t.subject: shots.get(t.subject, [])}, t.subject, args.k) if shots else []
                  for t, _ in pairs]
        try:
            plan = FormPlan(pairs, args.forms, args.prompt,
                            [(tuple(t for t, _ in c), tuple(i for _, i in c)) for c in chosen])
        except ValueError as e:  # fewer than 4 distinct concepts: no 4-way recognition item
            raise InputError(f"--bench {args.bench!r}: {e}; drop recognition from --forms") from None
        return pairs, plan

    def open_log():
        from tokenswap.eval.shards import merge_parts

        check_run_identity(out, _identity(args, settings, budget), "tokenswap eval")
        log = RecordLog(out / "records.jsonl")
        merge_parts(out, log)  # what the ranks of a killed launch had answered
        return log

    with _lock(out) if shards is None else shards.lock(lambda: _lock(out)):
        pairs, plan = together(plan_run)
        log = together(open_log, main_only=True)
        if log is None:  # the other ranks read the log rank 0 has just merged
            log = RecordLog(out / "records.jsonl")
        naming = args.backend == "hf" and plan.recognition
        units = plan.all_units()
        missing_naming = naming and any(f"naming|{pid}" not in log.records for pid in plan.recognition_items)
        left = sum(not plan.done(log, u) for u in units)
        if log.records and left:  # a rerun after a kill, a Ctrl-C or a failed request: say it is not a fresh run
            print(f"tokenswap eval: resuming {out}: {len(units) - left} answers kept, {left} left to ask",
                  file=sys.stderr, flush=True)
        if left or missing_naming:
            backend = open_backend(args, settings, batch_size=args.batch_size)
            if shards is None or shards.main:
                for line in settings.applied:
                    print(f"tokenswap eval: release setting: {line}", file=sys.stderr)
            try:
                if shards is None:
                    run_plan(backend, log, plan, args.scorer, budget, progress=f"tokenswap eval ({args.backend})",
                             max_error_share=args.max_error_share)
                    if naming:
                        naming_records(backend, log, plan, progress="tokenswap eval (hf)")
                else:
                    log = _run_shards(shards, backend, log, plan, args, budget, naming)
            finally:
                backend.close()
        if shards is not None and not shards.main:
            return 0  # rank 0 writes the results
        rows = [log.records[u.key] for u in units if u.key in log.records]
        counts = tally(rows)
        result = plan_result(plan, log.records, args.scorer, args.prompt)
        items, excluded = result.items, result.excluded
        n_failed = sum(any(why.failed for why in skip_reasons(e).values()) for e in excluded)
        left_out = {"failed": n_failed, "skipped": len(excluded) - n_failed}
        payload = {"model": str(args.model), "bench": str(args.bench), "split": args.split, **result.to_dict()}
        family, source = model_family_source(args)
        payload.update(
            backend=args.backend, max_new_tokens=budget if args.scorer == "generate" else None,
            model_settings=settings.as_dict(), family_source=source if family is not None else None,
            n_pairs=len(pairs), n_failed=left_out["failed"], n_skipped=left_out["skipped"], excluded=excluded,
            n_failed_requests=counts["failed"], n_skipped_requests=counts["skipped"], usage=counts["usage"],
        )
        payload["backend_info"] = describe_arguments(args)
        outside = [r[k] for r in items for k in r if k.startswith("outside_mass_")]
        if outside:
            payload["loglik_outside_mass"] = {"mean": sum(outside) / len(outside), "max": max(outside)}
        check_error_share(counts, args.max_error_share, "requests")
        markdown = result.to_markdown()
        if excluded:
            first = next(iter(excluded[0]["forms"].values()))
            markdown += f"\n{len(excluded)} of {len(pairs)} items left out: {left_out['failed']} with a failed " \
                        f"request, {left_out['skipped']} skipped (first: {excluded[0]['id']}: {first})\n"
        usage = counts["usage"]
        markdown += f"\nTokens: {usage['prompt_tokens']:,} prompt, {usage['completion_tokens']:,} completion " \
                    f"over {usage['requests']:,} requests\n"
        _write(out, payload, markdown + _form_lines(result))
        if result.decomposition is not None:
            plot_forms(payload, out / "gap_forms.png")
        _refuse_empty_forms(result)
    return 0
