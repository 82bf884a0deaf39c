"""The doors around the one sink: a secret on a command line, a library's log handler, two threads printing at
once, a forked worker, a reader gone at any moment. Each case runs as a user runs it (a subprocess where the
process's own streams matter) and checks the exit status, the absence of a traceback and of every secret."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tokenswap import redaction
from tokenswap.redaction import RedactingStream, remember

ROOT = Path(__file__).resolve().parents[2]
SECRET = "hf_PathsPlanted0a1b2c3d4e5f6"


def env(**extra) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_TOKEN": SECRET, **extra}


def run(argv: list[str], closed: str = "", timeout: int = 300, **extra) -> tuple[int, str, str]:
    """``argv``'s status, stdout and stderr; ``closed`` ("stdout"/"stderr"): that stream is a pipe whose reader is
    already gone (every write to it fails with EPIPE, as after `| head` has quit)."""
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    fds = []
    if closed:
        read, write = os.pipe()
        os.close(read)
        streams[closed] = write
        fds.append(write)
    try:
        p = subprocess.run(argv, **streams, env=env(**extra), cwd=ROOT, timeout=timeout)
    finally:
        for fd in fds:
            os.close(fd)
    return p.returncode, (p.stdout or b"").decode(), (p.stderr or b"").decode()


class _Writes(io.StringIO):
    def __init__(self):
        super().__init__()
        self.writes: list[str] = []

    def write(self, text):
        self.writes.append(text)
        return super().write(text)


# ---------------------------------------------------------------------------- threads and forks
def test_two_threads_printing_at_once_give_every_line_whole():
    sink = _Writes()
    stream = RedactingStream(sink)

    def lines(tag):
        for i in range(2000):
            print(tag, "line", i, "end", file=stream)  # four writes and an end: the pieces of one line

    threads = [threading.Thread(target=lines, args=(tag,)) for tag in "AB"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out = sink.getvalue().splitlines()
    assert len(out) == 4000 and all(re.fullmatch(r"[AB] line \d+ end", line) for line in out)


def test_a_secret_in_four_pieces_beside_a_printing_thread_is_masked_whole():
    key = "sk-four-pieces-0123456789abcdef"
    remember(key, "API key")
    sink = _Writes()
    stream = RedactingStream(sink)
    stop = threading.Event()

    def chatter():
        while not stop.is_set():
            print("progress", file=stream)

    other = threading.Thread(target=chatter)
    other.start()
    try:
        for _ in range(50):
            for piece in (key[:7], key[7:14], key[14:21], key[21:]):  # each shorter than MIN_CUT
                stream.write(piece)
                time.sleep(0)
            stream.write("\n")
    finally:
        stop.set()
        other.join()
    text = sink.getvalue()
    assert text.count("[API key]\n") == 50 and key[7:14] not in text and key[14:21] not in text


@pytest.mark.integration
def test_a_worker_forked_while_a_parent_thread_holds_the_module_lock_prints_and_exits():
    read, write = os.pipe()
    stream = RedactingStream(os.fdopen(write, "w", buffering=1))
    held, release = threading.Event(), threading.Event()

    def hold():
        with redaction._lock:  # as a thread inside redact() holds it
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(30)
    pid = os.fork()
    if pid == 0:  # the child: redact() takes the module lock at its first print
        try:
            print(f"child {SECRET}", file=stream, flush=True)
        finally:
            os._exit(0)
    release.set()
    holder.join()
    deadline = time.monotonic() + 30
    while (done := os.waitpid(pid, os.WNOHANG)) == (0, 0) and time.monotonic() < deadline:
        time.sleep(0.01)
    if done == (0, 0):
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    stream._inner.close()
    with os.fdopen(read) as pipe:
        said = pipe.read()
    assert done != (0, 0) and done[1] == 0 and said.startswith("child ")


# ---------------------------------------------------------------------------- a secret on the command line
@pytest.mark.integration
@pytest.mark.parametrize("argv, variable", [
    (["recipes/post_train.py", "--config", "tiny/post_text.yaml", f"train.hub_token={SECRET}"], "HF_TOKEN"),
    (["recipes/pretrain.py", "--config", "tiny/pretrain_text.yaml",
      "train.hub_model_id=https://ann:pw-Planted-4242@huggingface.co/org/m"], "HF_TOKEN"),
    (["recipes/grpo.py", "wandb.api_key=wandb-Planted-0123456789"], "WANDB_API_KEY"),
    (["-m", "tokenswap.cli", "eval", "--backend", "openai", "--api-key-env", "MY_KEY",
      "--base-url", "http://bob:pw-Planted-4242@localhost:9/v1", "--model", "m"], "MY_KEY"),
    (["-m", "tokenswap.cli", "build-store", "--api-key", "sk-Planted-0123456789"], "OPENAI_API_KEY"),
])
def test_a_secret_on_the_command_line_is_refused_in_one_line_that_names_the_variable(argv, variable):
    code, out, err = run([sys.executable, *argv], timeout=120)
    said = out + err
    assert code == 2 and "Traceback" not in said, said[-2000:]
    lines = [line for line in err.splitlines() if "error: " in line]
    assert len(lines) == 1 and "on the command line" in lines[0] and f"set {variable}" in lines[0], err
    assert not re.search(r"Planted|hf_Paths", said)


# ---------------------------------------------------------------------------- library log handlers
NAMES = ("transformers.trainer", "datasets.x", "huggingface_hub.x", "DeepSpeed", "accelerate.x")
LIBRARY_LOGS = textwrap.dedent('''
    import logging, sys
    import deepspeed, accelerate, accelerate.logging, datasets, huggingface_hub.utils.logging as hub_logging
    import transformers
    transformers.logging.set_verbosity_warning()
    transformers.logging.get_logger("transformers").warning("made at import")  # their handlers: the real stderr
    datasets.logging.get_logger("datasets").warning("made at import")
    hub_logging.get_logger("huggingface_hub").warning("made at import")
    loggers = [transformers.logging.get_logger("transformers.trainer"), datasets.logging.get_logger("datasets.x"),
               hub_logging.get_logger("huggingface_hub.x"), logging.getLogger("DeepSpeed"),
               accelerate.logging.get_logger("accelerate.x", log_level="WARNING")]
    secret = sys.argv[1]

    def log_all():
        for logger in loggers:
            logger.warning("the key is %s (from %s)", secret, logger.name)

    logging.basicConfig()  # accelerate's logger propagates to the root: a handler on the real stderr
    accelerate.PartialState()  # accelerate's logger refuses to log before it
''')


@pytest.mark.integration
def test_every_library_handler_writes_through_the_redacting_streams_in_a_recipe_run(tmp_path):
    script = tmp_path / "recipe_logs.py"
    script.write_text("import tokenswap.start\n" + LIBRARY_LOGS + textwrap.dedent('''
        from tokenswap.training import run_recipe
        from dataclasses import dataclass

        @dataclass
        class Cfg:
            steps: int = 1

        sys.argv = sys.argv[:1]
        run_recipe(lambda cfg: log_all(), Cfg)
    '''))
    code, out, err = run([sys.executable, str(script), SECRET], timeout=300)
    assert code == 0, err[-3000:]
    assert SECRET not in out + err and SECRET[:12] not in out + err
    assert all(f"the key is [hub token] (from {name})" in out + err for name in NAMES), out + err


@pytest.mark.integration
def test_every_library_handler_writes_through_the_redacting_streams_in_tokenswap_eval(tmp_path):
    script = tmp_path / "eval_logs.py"
    script.write_text(LIBRARY_LOGS + textwrap.dedent('''
        import tokenswap.eval.cli as eval_cli
        from tokenswap.cli import main
        real = eval_cli.cli_main

        def logging_cli_main(argv):
            log_all()
            return real(argv)

        eval_cli.cli_main = logging_cli_main
        try:
            code = main(["eval", "--help"])
        except SystemExit as e:  # argparse's --help
            code = e.code
        for logger in loggers:  # after the command: each handler back on the stream it had
            logger.warning("after %s", logger.name)
        sys.exit(code)
    '''))
    code, out, err = run([sys.executable, str(script), SECRET], timeout=300)
    said = out + err
    assert code == 0 and "usage:" in out, err[-3000:]
    assert SECRET not in said, said[-3000:]
    assert all(f"the key is [hub token] (from {name})" in said and f"after {name}" in said for name in NAMES), said


# ---------------------------------------------------------------------------- a reader gone
@pytest.mark.integration
@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_help_and_version_to_a_reader_gone_end_quietly(flag):
    code, out, err = run([sys.executable, "-m", "tokenswap.cli", flag], closed="stdout", timeout=60)
    assert code == 141 and err == "", err


@pytest.mark.integration
def test_an_error_line_whose_reader_left_keeps_the_errors_status(tmp_path):
    code, out, err = run([sys.executable, "-m", "tokenswap.cli", "leaderboard", str(tmp_path / "none")],
                         closed="stderr", timeout=120)
    assert code == 2, out


@pytest.mark.integration
@pytest.mark.parametrize("argv", [["eval", "--no-such-flag"], ["leaderboard", "--resamples", "x"], ["compare", "--bogus"],
                                  ["crossmath", "generate", "--bogus"], ["rest", "eval", "--bogus"],
                                  ["probe", "--bogus"], ["no-such-command"]],
                         ids=["eval", "leaderboard", "compare", "crossmath", "rest", "probe", "unknown-command"])
def test_a_usage_error_whose_reader_left_keeps_status_2(argv):
    # argparse prints the usage, then exits 2: that print to a reader gone ended the command 141 (cut off mid-work).
    code, out, err = run([sys.executable, "-m", "tokenswap.cli", *argv], closed="stderr", timeout=120)
    assert code == 2, out


@pytest.mark.integration
def test_a_recipe_whose_reader_left_during_its_imports_still_says_its_config_error(tmp_path):
    # DeepSpeed prints its accelerator notice to stdout at import (through its logger), as transformers may.
    code, out, err = run([sys.executable, "-c", textwrap.dedent('''
        import sys, runpy
        sys.argv = ["recipes/post_train.py", "--config", "tiny/post_text.yaml", "nope.key=1"]
        import tokenswap.start
        import deepspeed
        from deepspeed.accelerator import get_accelerator
        get_accelerator()
        print("an import's notice")
        runpy.run_path("recipes/post_train.py", run_name="__main__")
    ''')], closed="stdout", timeout=300, PYTHONUNBUFFERED="1")
    assert code == 2 and "Traceback" not in err and "Logging error" not in err, err[-3000:]
    assert [line for line in err.splitlines() if line.startswith("error: ")][0].endswith("unknown key `nope` for "
                                                                                         "PostTrainConfig (valid: "
                                                                                         "run, model, data, "
                                                                                         "image_store, collator, "
                                                                                         "train, gap_eval, wandb, "
                                                                                         "throughput)")


@pytest.mark.integration
def test_a_library_logger_made_inside_the_streams_to_a_reader_gone_is_a_quiet_141():
    code, out, err = run([sys.executable, "-c", textwrap.dedent('''
        from tokenswap.script import run_script

        def main():
            import deepspeed  # its logger is made here, on the redacting stdout
            from deepspeed.utils import logger
            logger.warning("a notice on stdout")
            return 0

        run_script(main)
    ''')], closed="stdout", timeout=300, PYTHONUNBUFFERED="1")
    assert code == 141 and "Traceback" not in err and "Logging error" not in err, err[-3000:]


@pytest.mark.integration
def test_unsetting_a_secret_on_the_command_line_and_naming_its_variable_are_no_secret():
    from tokenswap.redaction import command_line_secret

    assert command_line_secret(["train.hub_token=null", "extractor.llm.api_key_env=MY_KEY", "--api-key-env", "K",
                                "run.max_new_tokens=8", "--base-url", "http://localhost:8000/v1"]) is None
