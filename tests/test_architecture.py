"""The import floors of docs/architecture.md hold: `lint-imports` checks the contracts in pyproject.toml."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# Every test here starts a process, a server or a training run (make check skips them).
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_every_room_imports_only_the_floors_below_it_and_no_room_has_a_circle():
    run = _lint(ROOT)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "2 kept, 0 broken" in run.stdout


def test_an_arrow_back_up_fails_the_check(tmp_path):
    # The same contracts over a copy of the package with one upward import added: the check must catch it.
    import shutil

    shutil.copytree(ROOT / "tokenswap", tmp_path / "tokenswap", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    files = tmp_path / "tokenswap" / "files.py"
    files.write_text(files.read_text() + textwrap.dedent("""
        def _upward():
            from tokenswap.eval import gap  # noqa: F401
    """))
    env_path = f"{tmp_path}"
    run = subprocess.run([str(LINT), "--no-cache"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"})
    assert run.returncode != 0, run.stdout[-2000:]
    assert "tokenswap.files is not allowed to import tokenswap.eval" in run.stdout
