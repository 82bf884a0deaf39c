"""Section ``closed_reader`` of benchmarks/faults.py: the reader of stdout or stderr gone before the first write
(a pipe whose read end is closed: every write fails with EPIPE): ``tokenswap --help`` and ``--version``, a recipe
under ``PYTHONUNBUFFERED=1`` whose imports print (DeepSpeed's notice) and whose config is wrong, DeepSpeed's logger
made inside the streams, an error line with its reader gone. Each: a quiet 141 or the command's own status, never a
traceback nor ``--- Logging error ---``.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

from ._common import ENV, PY, REPO, Tally

OUTCOME = ("--help, --version, a recipe's imports under PYTHONUNBUFFERED=1, DeepSpeed's logger, an error line, each "
           "to a reader gone: a quiet 141 or the command's own status, no traceback")

IMPORTS_PRINT = textwrap.dedent('''
    import sys, runpy
    sys.argv = ["recipes/post_train.py", "--config", "tiny/post_text.yaml", "nope.key=1"]
    import tokenswap.start
    import deepspeed
    from deepspeed.accelerator import get_accelerator
    get_accelerator()
    print("an import's notice")
    runpy.run_path("recipes/post_train.py", run_name="__main__")
''')
LOGGER_INSIDE = textwrap.dedent('''
    from tokenswap.script import run_script

    def main():
        import deepspeed
        from deepspeed.utils import logger
        logger.warning("a notice on stdout")

    run_script(main)
''')


def _closed(cmd: list[str], closed: str, **env) -> tuple[int, str]:
    read, write = os.pipe()
    os.close(read)
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, closed: write}
    try:
        proc = subprocess.run(cmd, cwd=REPO, env={**ENV, **env}, timeout=600, **streams)
    except subprocess.TimeoutExpired:
        return 124, "timed out after 600 s"
    finally:
        os.close(write)
    return proc.returncode, ((proc.stdout or b"") + (proc.stderr or b"")).decode(errors="replace")


def section_closed_reader(t: Tally, work: Path) -> None:
    cases = [
        ("tokenswap --help", [PY, "-m", "tokenswap.cli", "--help"], "stdout", {141}, {}),
        ("tokenswap --version", [PY, "-m", "tokenswap.cli", "--version"], "stdout", {141}, {}),
        ("an error line (leaderboard of a missing folder): the error's 2", [PY, "-m", "tokenswap.cli", "leaderboard",
                                                                           str(work / "no-such-run")], "stderr", {2}, {}),
        ("a recipe's imports print under PYTHONUNBUFFERED=1, then its config error: 2 with its line",
         [PY, "-c", IMPORTS_PRINT], "stdout", {2}, {"PYTHONUNBUFFERED": "1"}),
        ("DeepSpeed's logger made inside the streams: 141", [PY, "-c", LOGGER_INSIDE], "stdout", {141},
         {"PYTHONUNBUFFERED": "1"}),
    ]
    for what, cmd, closed, statuses, env in cases:
        code, said = _closed(cmd, closed, **env)
        quiet = "Traceback" not in said and "Logging error" not in said
        if "config error" in what:
            quiet = quiet and "unknown key `nope`" in said
        t.add("closed_reader", f"{closed} closed: {what}", code in statuses and quiet, f"rc={code} {said[-300:]}")
