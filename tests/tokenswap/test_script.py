"""tokenswap.script.run_script: the one way a recipe, the demo and the tiny kit end (besides ``tokenswap.cli.main``)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ctrl_c_reaches_it

ROOT = Path(__file__).resolve().parents[2]
SECRET = "sk-planted-0123456789abcdef"


def run(body: str) -> subprocess.CompletedProcess:
    code = "\n".join(["from tokenswap.errors import InputError", "from tokenswap.redaction import remember",
                      "from tokenswap.script import run_script", f"remember({SECRET!r})", body])
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.integration
def test_an_input_error_is_one_masked_line_and_exit_2():
    done = run(f"def main():\n    raise InputError('bad key {SECRET}: pass another')\nrun_script(main)")
    assert done.returncode == 2
    assert done.stderr.splitlines() == ["error: bad key [secret]: pass another"]


@pytest.mark.integration
def test_a_bug_is_a_traceback_with_the_secret_masked_and_exit_1():
    # The interpreter prints an uncaught exception after the redacting streams are gone: the hook masks it.
    done = run(f"def main():\n    raise RuntimeError('crashed holding {SECRET}')\nrun_script(main)")
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr and "RuntimeError: crashed holding" in done.stderr
    assert SECRET not in done.stderr and SECRET[:12] not in done.stderr


@pytest.mark.integration
def test_success_is_exit_0_and_the_status_of_main_is_kept():
    assert run("run_script(lambda: print('done'))").returncode == 0
    assert run("run_script(lambda: 3)").returncode == 3


@pytest.mark.integration
def test_ranks_sharing_one_unbuffered_stderr_never_cut_into_each_others_lines():
    """Two processes (as the ranks of a launch) print long lines through run_script to one pipe with
    PYTHONUNBUFFERED=1, where every piece print() writes is a write(2) of its own: each line arrives whole."""
    code = ("import sys\nfrom tokenswap.script import run_script\n"
            "def main():\n    for i in range(400):\n"
            "        print('error:', sys.argv[1] * 300, i, file=sys.stderr)\nrun_script(main)")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    read, write = os.pipe()
    ranks = [subprocess.Popen([sys.executable, "-c", code, tag], cwd=ROOT, env=env, stderr=write) for tag in "ab"]
    os.close(write)
    with os.fdopen(read) as pipe:
        lines = pipe.read().splitlines()
    assert [rank.wait(timeout=120) for rank in ranks] == [0, 0]
    whole = {f"error: {tag * 300} {i}" for tag in "ab" for i in range(400)}
    assert [line for line in lines if line not in whole] == [] and len(lines) == 800


@pytest.mark.integration
def test_a_reader_that_goes_away_ends_the_command_quietly_with_141():
    """``tokenswap leaderboard ... | head -1``: the reader closes the pipe; the command ends as a shell tool ends on
    SIGPIPE (141), with no traceback and no "Exception ignored" line (before: a BrokenPipeError traceback, exit 1)."""
    code = ("from tokenswap.script import run_script\n"
            "def main():\n    for i in range(200000):\n        print('line', i)\nrun_script(main)")
    for unbuffered in ("", "1"):
        env = {**os.environ, "PYTHONUNBUFFERED": unbuffered}
        proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        assert proc.stdout.readline() == "line 0\n"
        proc.stdout.close()
        assert (proc.wait(timeout=120), proc.stderr.read()) == (141, "")


@pytest.mark.integration
def test_a_reader_gone_before_the_last_half_line_costs_no_traceback():
    code = ("import sys\nfrom tokenswap.script import run_script\n"
            "def main():\n    print('first', flush=True)\n    sys.stdin.readline()\n"
            "    sys.stdout.write('no newline at the end')\nrun_script(main)")
    for unbuffered in ("", "1"):
        env = {**os.environ, "PYTHONUNBUFFERED": unbuffered}
        proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout.readline() == "first\n"
        proc.stdout.close()
        proc.stdin.write("go\n")
        proc.stdin.close()
        assert (proc.wait(timeout=120), proc.stderr.read()) == (0, "")


@pytest.mark.integration
def test_a_broken_pipe_that_is_not_the_output_stays_a_bug():
    done = run("def main():\n    raise BrokenPipeError(32, 'Broken pipe (a server connection)')\nrun_script(main)")
    assert done.returncode == 1 and "BrokenPipeError: [Errno 32] Broken pipe (a server connection)" in done.stderr


def test_no_other_module_of_the_package_exits():
    """Only tokenswap/script.py raises SystemExit and only cli.py's console entry calls sys.exit."""
    found = []
    for path in sorted((ROOT / "tokenswap").rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if ("raise SystemExit" in code or "sys.exit(" in code) and path.name not in ("script.py", "cli.py"):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert found == []


def _interrupted(body: str) -> subprocess.CompletedProcess:
    import signal

    code = "\n".join(["import sys, time", body])
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=ctrl_c_reaches_it)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.integration
def test_ctrl_c_in_a_script_is_one_line_and_130():
    # Ctrl-C used to be a traceback through the redacting streams.
    done = _interrupted("from tokenswap.script import run_script\n"
                        "def main():\n    print('ready', flush=True)\n    time.sleep(60)\nrun_script(main)")
    assert done.returncode == 130, done.stderr
    assert done.stderr.splitlines() == ["error: interrupted (Ctrl-C): every file and answer written so far is kept "
                                        "whole; run the same command again to resume from them"]


@pytest.mark.integration
def test_ctrl_c_in_a_recipe_says_how_to_resume_from_its_checkpoints():
    done = _interrupted("from dataclasses import dataclass\nfrom tokenswap.training.entry import run_recipe\n"
                        "@dataclass\nclass Config:\n    steps: int = 1\n"
                        "def main(cfg):\n    print('ready', flush=True)\n    time.sleep(60)\n"
                        "run_recipe(main, Config, [])")
    assert done.returncode == 130, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: interrupted (Ctrl-C): the run's complete checkpoints are kept") and \
        "train.resume_from_checkpoint=latest" in line
