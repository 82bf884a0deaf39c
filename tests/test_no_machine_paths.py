"""No tracked file names a development machine's paths (a worktree under /work/, a home folder): docs and code are
for users, and such a path is a work log's or a machine's, never the product's."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:work|root|home)/")
# Files that must spell such a path: this test (its pattern and probe) only.
ALLOWED = {"tests/test_no_machine_paths.py"}


def machine_paths(root: Path, names: list[str]) -> list[str]:
    found = []
    for name in names:
        if name in ALLOWED:
            continue
        try:
            text = (root / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # a binary (figures, parquet) or a file deleted in the work tree
        found += [f"{name}:{n}: {line.strip()[:120]}" for n, line in enumerate(text.splitlines(), 1)
                  if MACHINE_PATH.search(line)]
    return found


@pytest.mark.integration  # runs `git ls-files`
def test_no_tracked_file_holds_a_machine_path():
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout (a source archive): nothing is tracked")
    assert machine_paths(ROOT, [n for n in listed.stdout.split("\0") if n]) == []


def test_the_check_sees_a_worktree_path_and_a_home_folder_but_not_a_module_path(tmp_path):
    (tmp_path / "a.md").write_text("ran in /work/wt/x\nsee tokenswap/training/workers.py\n~/.cache/x\n")
    (tmp_path / "b.py").write_text('OUT = "/root/out"\nHOME = "/home/me/x"\n')
    assert [f.split(": ")[0] for f in machine_paths(tmp_path, ["a.md", "b.py"])] == ["a.md:1", "b.py:1", "b.py:2"]
