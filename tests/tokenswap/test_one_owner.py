"""The one-owner rows of docs/architecture.md that a grep can hold (as tests/tokenswap/test_ranks.py does)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*(ROOT / "tokenswap").rglob("*.py"), *(ROOT / "recipes").glob("*.py")])


def _grep(pattern: str, allowed: set[str] = frozenset()) -> list[str]:
    found = []
    for path in SOURCES:
        rel = path.relative_to(ROOT).as_posix()
        if rel in allowed:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(pattern, line):
                found.append(f"{rel}:{n}: {line.strip()}")
    return found


def test_local_or_hub_is_decided_in_inputs_only():
    # a second rule (a recipe's own "looks local") took `gpt2` for a missing folder while `tokenswap eval` loaded it
    assert _grep(r"def _?looks_(local|like_path)\b", {"tokenswap/inputs.py"}) == []
    assert _grep(r"\blooks_like_path\(", {"tokenswap/inputs.py", "tokenswap/store/build.py"}) == []
