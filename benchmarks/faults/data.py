"""Section ``data`` of benchmarks/faults.py: malformed Magpie lines with ``skip_malformed`` (counted), and without
(line named); bad spans and torn lines in a swap dataset; empty/edited/odd LLaVA files.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from ._common import Tally, _magpie, run, store_cmd

OUTCOME = (
    "skip_malformed: skipped and counted (`rows_malformed_skipped`); otherwise exit 2 / ValueError naming file "
    "and line or record; edited LLaVA file re-read"
)


def section_data(t: Tally, work: Path) -> None:
    from tokenswap.data.llava import load_llava
    from tokenswap.data.schema import load_samples

    bad_lines = {
        "truncated line": _magpie(100)[:30] + b"\n",
        "non-UTF-8 line": b'{"uuid": "x", "conversations": "\xff\xfe"}\n',
        "list-shaped line": b"[1, 2, 3]\n",
        "number line": b"42\n",
        "row with empty conversations": b'{"uuid": "u9", "conversations": []}\n',
    }
    path = work / "magpie-malformed.jsonl"
    path.write_bytes(b"".join(_magpie(i) + line for i, line in enumerate(bad_lines.values())) + _magpie(99))
    out = work / "store-malformed"
    proc = run(store_cmd(out, f"data.path={path}", "data.skip_malformed=true", "data.max_samples=null"), 300)
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
    ok = proc.returncode == 0 and report.get("rows_malformed_skipped") == len(bad_lines)
    for what in bad_lines:
        t.add("data", f"Magpie {what}, skip_malformed=true", ok,
              f"rc={proc.returncode} skipped={report.get('rows_malformed_skipped')} {proc.stderr[-200:]}")
    strict = run(store_cmd(work / "store-malformed-strict", f"data.path={path}", "data.max_samples=null"), 300)
    t.add("data", "Magpie truncated line, skip_malformed=false", strict.returncode == 2 and f"{path.name}:2" in strict.stderr,
          f"rc={strict.returncode} {strict.stderr[-200:]}")

    def expect_error(what: str, fn: Callable, *needles: str) -> None:
        try:
            fn()
            ok, detail = False, "no error"
        except (ValueError, KeyError, FileNotFoundError) as e:
            ok, detail = all(n in str(e) for n in needles), str(e)[:200]
        except Exception as e:  # noqa: BLE001
            ok, detail = False, f"{type(e).__name__}: {e}"
        t.add("data", what, ok, detail)

    good = {"id": "s0", "messages": [{"role": "user", "content": "a cat"}, {"role": "assistant", "content": "ok"}],
            "concepts": [{"message": 0, "start": 2, "end": 5, "key": "cat"}], "images": []}
    swap = work / "swap-bad-span.jsonl"
    swap.write_text(json.dumps(good) + "\n" + json.dumps({**good, "id": "s1", "concepts": [
        {"message": 0, "start": 2, "end": 50, "key": "cat"}]}) + "\n")
    expect_error("swap dataset span out of range", lambda: load_samples(str(swap)), f"{swap.name}:2", "s1", "out of range")
    torn = work / "swap-torn.jsonl"
    torn.write_text(json.dumps(good) + "\n" + json.dumps(good)[:40] + "\n")
    expect_error("swap dataset torn last line", lambda: load_samples(str(torn)), f"{torn.name}:2", "not valid JSON")
    empty = work / "llava-empty.json"
    empty.write_text("")
    expect_error("empty LLaVA file", lambda: load_llava(empty), "llava-empty.json", "empty")
    odd = work / "llava-odd.json"
    odd.write_text('[{"id": "a", "conversations": [{"from": "human", "value": "hi"}]}, "oops"]')
    expect_error("LLaVA record that is not an object", lambda: load_llava(odd), "record 1")
    edited = work / "llava-edited.json"
    rec = {"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "ok"}]}
    edited.write_text(json.dumps([rec]))
    first = len(load_llava(edited))
    time.sleep(0.01)
    edited.write_text(json.dumps([rec, {**rec, "id": "b"}]))
    second = len(load_llava(edited))
    t.add("data", "LLaVA file edited in place after caching", (first, second) == (1, 2), f"rows {first} then {second}")
