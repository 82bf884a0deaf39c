"""Section ``malformed`` of benchmarks/faults.py: a Magpie JSONL file with lone surrogates (``"\udcff"`` escapes),
wrong field types, an unknown role, null, truncated and non-UTF-8 rows through ``tokenswap build-store`` with
``data.skip_malformed=true`` (each skipped and counted, every good row kept) and without it (exit 2 naming file and
line).
"""

from __future__ import annotations

import json
from pathlib import Path

from ._common import Tally, _magpie, run, store_cmd

OUTCOME = (
    "skip_malformed: every malformed row (lone surrogates, wrong field types, unknown role, null, "
    "truncated, non-UTF-8) skipped and counted, every good row kept; otherwise exit 2 naming file and line"
)


MALFORMED_ROWS = {
    # json.loads turns the escape into a lone surrogate, which no UTF-8 file can hold.
    "lone low surrogate (\\udcff) in a human turn": b'{"uuid": "bad-1", "conversations": [{"from": "human", '
    b'"value": "a cat \\udcff here"}, {"from": "gpt", "value": "ok"}]}\n',
    "lone high surrogate (\\ud800) in a gpt turn": b'{"uuid": "bad-2", "conversations": [{"from": "human", '
    b'"value": "a cat"}, {"from": "gpt", "value": "\\ud800"}]}\n',
    "lone surrogate in the uuid": b'{"uuid": "bad-\\udcff", "conversations": [{"from": "human", "value": "a cat"}, '
    b'{"from": "gpt", "value": "ok"}]}\n',
    "conversations given as an object": b'{"uuid": "bad-4", "conversations": {"from": "human", "value": "a cat"}}\n',
    "unknown role": b'{"uuid": "bad-5", "conversations": [{"from": "robot", "value": "a cat"}]}\n',
    "turn value that is a number": b'{"uuid": "bad-6", "conversations": [{"from": "human", "value": 7}]}\n',
    "no uuid": b'{"conversations": [{"from": "human", "value": "a cat"}, {"from": "gpt", "value": "ok"}]}\n',
    "no human turn": b'{"uuid": "bad-8", "conversations": [{"from": "gpt", "value": "a cat"}]}\n',
    "null line": b"null\n",
    "truncated line": b'{"uuid": "bad-10", "conversations": [{"from": "hu\n',
    "non-UTF-8 bytes": b'{"uuid": "bad-11", "conversations": [{"from": "human", "value": "a cat \xff\xfe"}]}\n',
}


def section_malformed(t: Tally, work: Path) -> None:
    """Malformed Magpie rows in ``tokenswap build-store`` with ``data.skip_malformed=true``: skipped and counted."""
    path = work / "magpie-hostile.jsonl"
    path.write_bytes(b"".join(_magpie(i) + line for i, line in enumerate(MALFORMED_ROWS.values())) + _magpie(99))
    good = {f"u{i}" for i in range(len(MALFORMED_ROWS))} | {"u99"}
    out = work / "store-hostile-rows"
    proc = run(store_cmd(out, f"data.path={path}", "data.skip_malformed=true", "data.max_samples=null"), 300)
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
    kept = set()
    for shard in sorted((out / "dataset").glob("*.jsonl")):
        kept |= {json.loads(line)["id"] for line in shard.read_text(encoding="utf-8").splitlines() if line.strip()}
    skipped = report.get("rows_malformed_skipped")
    ok = proc.returncode == 0 and skipped == len(MALFORMED_ROWS) and kept == good
    detail = f"rc={proc.returncode} skipped={skipped} of {len(MALFORMED_ROWS)}, kept {len(kept)} of {len(good)} good rows"
    for what in MALFORMED_ROWS:
        t.add("malformed", f"Magpie row: {what}, skip_malformed=true", ok, f"{detail} {proc.stderr[-200:]}")

    # Without skip_malformed the first bad row stops the build, named by file and line, and no message claims
    # what is not true (an earlier build said "nothing was written" next to the state/plan.json it had written).
    out = work / "store-hostile-rows-strict"
    strict = run(store_cmd(out, f"data.path={path}", "data.max_samples=null"), 300)
    named = strict.returncode == 2 and f"{path.name}:2" in strict.stderr
    false_claim = "nothing was written" in strict.stderr and any(p.is_file() for p in out.rglob("*"))
    t.add("malformed", "Magpie lone surrogate, skip_malformed=false: exit 2 naming file and line, no false claim",
          named and not false_claim, f"rc={strict.returncode} {strict.stderr[-300:]}")
