"""A resumable evaluation run: one JSONL record per item, appended as it finishes, failures counted, not scored.

Every evaluator asks a backend one question per unit (a bench item in one form, a puzzle in one
modality, a REST task) and appends the unit's record to a JSONL file as soon as the answer is in
(in input order, through :func:`tokenswap.inference.map_ordered`). The same command after a kill
reads the file back and asks only what has no answer yet: a unit is never asked twice and never
lost (a torn last line is simply asked again). A unit whose request failed has ``error`` in its
record; it is asked again by the next run, excluded from every score meanwhile, and counted: a run
whose failed share exceeds ``max_error_share`` ends with exit status 1 and the first error.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from tokenswap.errors import IncompleteRunError
from tokenswap.files import cut_torn_tail
from tokenswap.inference.backends import Backend
from tokenswap.redaction import redact_data

__all__ = ["ErrorShareExceeded", "RecordLog", "check_error_share", "run_units", "tally", "usage_totals"]


class ErrorShareExceeded(IncompleteRunError):
    """More units failed than ``--max-error-share`` allows; the message names the count and the first error (exit 1)."""


class RecordLog:
    """An append-only JSONL file of ``{"key": ..., ...}`` records; the last record of a key wins.

    Args:
        path: the file (created with its folder).
        key_field: the field that names a record's unit (CrossMath's predictions use ``id``).
    """

    def __init__(self, path: str | os.PathLike, key_field: str = "key"):
        self.path = Path(path)
        self.key_field = key_field
        self.records: dict[str, dict] = {}
        if self.path.exists():
            # A killed run's torn last line is cut, so the file stays valid JSONL; its unit is asked again.
            cut_torn_tail(self.path)
            # Lines end at "\n" only: a reply holding U+2028 or U+0085 (json.dumps keeps them raw) is one record.
            for raw_line in self.path.read_bytes().split(b"\n"):
                line = raw_line.decode("utf-8", "replace")
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except (ValueError, RecursionError):  # a line no run of ours writes (not JSON, 100,000-deep
                    continue  # nesting, a 4,300-digit integer): left in place, skipped, its unit asked again
                if isinstance(row, dict) and isinstance(row.get(key_field), (str, int, float)):
                    self.records[row[key_field]] = row  # (a list or object as key would not even hash)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def answered(self, key: str) -> bool:
        """Whether ``key`` has a record that needs no new request (a failed or skipped one is asked again)."""
        row = self.records.get(key)
        return row is not None and "error" not in row and "skipped" not in row

    def append(self, record: dict) -> None:
        """Append ``record``, every known secret in it masked (:func:`tokenswap.redaction.redact_data`)."""
        record = redact_data(record)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            f.flush()  # the OS keeps a flushed line through a killed process
        self.records[record[self.key_field]] = record


def run_units(
    backend: Backend,
    log: RecordLog,
    units: Sequence,
    key: Callable[[object], str],
    conversation: Callable[[object], list[dict]],
    make_record: Callable[[object, dict], dict],
    scorer: str = "generate",
    max_new_tokens: int = 1024,
    chat_template_kwargs: dict | None = None,
    progress: str | None = None,
    max_error_share: float | None = None,
) -> int:
    """Ask ``backend`` about every unit without an answer in ``log``; append each record as it finishes.

    Args:
        backend: the model.
        log: the run's records (resumed).
        units: what to ask, in the order records are written.
        key: a unit's record key.
        conversation: builds a unit's conversation (called lazily, just before it is sent).
        make_record: ``(unit, backend fields) -> record`` (must set the log's key field).
        scorer: ``generate`` or ``loglik`` (:meth:`Backend.score_letters`).
        max_new_tokens: generation budget.
        chat_template_kwargs: template variables on top of the backend's per-model ones.
        progress: a label for a tqdm bar (None: no bar).
        max_error_share: stop as soon as more than this share of ``units`` failed in this call: the run can no
            longer pass, and an unreachable server should not be asked thousands of times (records so far are kept).

    Returns:
        The number of units asked.

    Raises:
        ErrorShareExceeded: ``max_error_share`` was exceeded (the message names the first error).
    """
    from tqdm.auto import tqdm

    todo = [u for u in units if not log.answered(key(u))]
    if not todo:
        return 0
    convs = (conversation(u) for u in todo)
    if scorer == "loglik":
        answers = backend.score_letters(convs, chat_template_kwargs)
    else:
        answers = backend.generate(convs, max_new_tokens, chat_template_kwargs)
    bar = tqdm(total=len(todo), desc=progress, disable=progress is None, unit="item", file=sys.stderr)
    failed, first_error = 0, None
    try:
        for unit, answer in zip(todo, answers):
            log.append(make_record(unit, {log.key_field: key(unit), **answer.record()}))
            bar.update()
            if answer.error is not None:
                failed += 1
                first_error = first_error or answer.error
                if max_error_share is not None and failed > max_error_share * len(units):
                    raise ErrorShareExceeded(
                        f"stopped after {failed} failed requests: more than --max-error-share {max_error_share:.1%} "
                        f"of the {len(units)} requests have failed; first error: {first_error}. What was answered "
                        "is recorded; the same command resumes"
                    )
    finally:
        bar.close()
        if hasattr(answers, "close"):
            answers.close()  # stop the requests still in flight (an early stop), before the caller moves on
    stats = backend.stats()
    if stats and progress is not None:
        print(f"{progress}: " + ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
                                          for k, v in stats.items()), file=sys.stderr)
    return len(todo)


def tally(records: Iterable[dict]) -> dict:
    """Counts of a run's records: ``n``, ``failed`` and ``skipped`` (with the first reason of each), usage."""
    rows = list(records)
    failed = [r for r in rows if "error" in r]
    skipped = [r for r in rows if "skipped" in r]
    return {
        "n": len(rows),
        "failed": len(failed),
        "skipped": len(skipped),
        "first_error": failed[0]["error"] if failed else None,
        "first_skip": skipped[0]["skipped"] if skipped else None,
        "usage": usage_totals(rows),
    }


def usage_totals(records: Iterable[dict]) -> dict:
    """Summed ``prompt_tokens`` / ``completion_tokens`` over records (a resumed run counts every record once)."""
    total = {"prompt_tokens": 0, "completion_tokens": 0, "requests": 0}
    for r in records:
        usage = r.get("usage") or {}
        if usage:
            total["requests"] += 1
        for k in ("prompt_tokens", "completion_tokens"):
            value = usage.get(k)
            if isinstance(value, int):
                total[k] += value
    return total


def check_error_share(counts: dict, max_error_share: float, what: str = "requests") -> None:
    """Raise :class:`ErrorShareExceeded` when ``failed / n`` exceeds ``max_error_share``."""
    n, failed = counts["n"], counts["failed"]
    if n and failed / n > max_error_share:
        raise ErrorShareExceeded(
            f"{failed} of {n} {what} failed ({failed / n:.1%} > --max-error-share {max_error_share:.1%}); "
            f"first error: {counts['first_error']}. The failed ones are recorded and asked again by the same command"
        )
