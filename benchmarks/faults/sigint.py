"""Section ``sigint`` of benchmarks/faults.py: Ctrl-C (SIGINT) at random moments in ``tokenswap eval`` (against a
slow loopback server), in ``tokenswap build-store`` (the LLM extractor and judge, slow answers) and in
``recipes/post_train.py`` (once a checkpoint is complete): exit 130, one line saying what is kept and how to resume,
no traceback; the command (the recipe with ``train.resume_from_checkpoint=latest``) then resumes and ends equal to an
uninterrupted run.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from pathlib import Path

from ._common import (
    ENV,
    PAUSE_ENV,
    PAUSE_LINE,
    REPO,
    Tally,
    _build_reference,
    _eval_answer,
    _eval_cmd,
    _eval_reference,
    _fault_bench,
    _resume_to_end,
    _small_build_cmd,
    _small_build_state,
    _train_reference,
    run,
    train_cmd,
)

OUTCOME = ("Ctrl-C in eval, build-store and a training recipe: exit 130 with one line (what is kept, how to resume), "
           "no traceback; the rerun says it resumes and equals an uninterrupted run")


def _interrupt(cmd: list[str], ready, rng: random.Random, log: Path,
               env: dict | None = None) -> tuple[int | None, str]:
    """Start ``cmd``, wait until ``ready()`` (some work committed), SIGINT it a random moment later."""
    from tests.support import ctrl_c_reaches_it  # a runner started in the background ignores SIGINT

    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=REPO, env={**ENV, **(env or {})}, stdout=f, stderr=subprocess.STDOUT,
                                preexec_fn=ctrl_c_reaches_it)
        deadline = time.monotonic() + 300
        while proc.poll() is None and not ready() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.3))
        if proc.poll() is not None:
            return None, log.read_text()
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return 124, log.read_text()
    return proc.returncode, log.read_text()


def _one_line(code: int | None, said: str) -> str:
    """'' when the interrupt ended as promised, else what was wrong."""
    if code is None:
        return "the command ended before the interrupt landed"
    lines = [x for x in said.splitlines() if "error:" in x]
    if code != 130 or "Traceback" in said or len(lines) != 1 or "interrupted (Ctrl-C)" not in lines[0]:
        return f"rc={code}: {said[-400:]}"
    return ""


def section_sigint(t: Tally, work: Path, rng: random.Random, model: Path, store: Path, kills: int = 2) -> None:
    from tests.support import LoadLLMServer, concept_reply

    bench = _fault_bench(work / "sigint-bench")
    ref = _eval_reference(work, bench, _eval_answer, "sigint-eval-ref")
    for k in range(kills):
        out = work / f"sigint-eval-{k}"
        with LoadLLMServer(_eval_answer, latency=0.3) as server:
            cmd = _eval_cmd(server.base_url, bench, out)

            def ready(out: Path = out) -> bool:
                log = out / "records.jsonl"
                return log.exists() and len(log.read_text().splitlines()) >= 2

            code, said = _interrupt(cmd, ready, rng, work / f"sigint-eval-{k}.log")
            problem = _one_line(code, said)
            if not problem:
                again = run(cmd, 600)
                gap = json.loads((out / "gap.json").read_text()) if (out / "gap.json").exists() else {}
                keys = ("items", "acc_text", "acc_interleaved", "gap")
                if again.returncode != 0 or "resuming" not in again.stderr:
                    problem = f"rerun rc={again.returncode}, said it resumes: {'resuming' in again.stderr}"
                elif {x: gap.get(x) for x in keys} != {x: ref.get(x) for x in keys}:
                    problem = "the resumed run's gap.json differs from an uninterrupted run's"
        t.add("sigint", f"Ctrl-C in tokenswap eval ({k + 1}): 130, one line; the rerun says it resumes and equals an "
              "uninterrupted run", not problem, problem)
    ref_build = _build_reference(work, "sigint-build-ref")
    for k in range(kills):
        out = work / f"sigint-build-{k}"
        with LoadLLMServer(concept_reply, latency=0.05) as server:
            cmd = _small_build_cmd(out, server.base_url)
            code, said = _interrupt(cmd, lambda out=out: any((out / "state" / "candidates").glob("part-*.jsonl")), rng,
                                    work / f"sigint-build-{k}.log")
            problem = _one_line(code, said)
            if not problem:
                again = run(cmd, 600)
                if again.returncode != 0 or "resuming" not in again.stderr:
                    problem = f"rerun rc={again.returncode}, said it resumes: {'resuming' in again.stderr}: " \
                              f"{again.stderr[-300:]}"
                elif _small_build_state(out) != _small_build_state(ref_build):
                    problem = "the resumed build differs from an uninterrupted one"
        t.add("sigint", f"Ctrl-C in tokenswap build-store ({k + 1}): 130, one line; the rerun says it resumes and "
              "equals an uninterrupted build", not problem, problem)
    from tokenswap.training import COMPLETE_MARKER

    ref_train = _train_reference(work, model, store)
    for k in range(kills):
        out = work / f"sigint-train-{k}"
        log = work / f"sigint-train-{k}.log"
        # The tiny run trains its 16 steps in about a second on an idle machine: a save held open keeps it alive for
        # the signal. Even trials land in the held save of step 4 (checkpoint-2 complete, checkpoint-4 partial);
        # odd ones at a random moment after checkpoint-2, before the held save of step 8 ends.
        held = 4 if k % 2 == 0 else 8

        def ready(out: Path = out, log: Path = log, held: int = held) -> bool:
            if held == 4:
                return PAUSE_LINE in log.read_text(errors="replace")
            return (out / "checkpoint-2" / COMPLETE_MARKER).exists()

        code, said = _interrupt(train_cmd(out, model, store), ready, rng, log, {PAUSE_ENV: f"3@{held}"})
        problem = _one_line(code, said)
        if not problem and "train.resume_from_checkpoint=latest" not in said:
            problem = f"the line does not say how to resume: {said[-300:]}"
        if not problem:
            problem = _resume_to_end(out, model, store, ref_train)
        t.add("sigint", f"Ctrl-C in recipes/post_train.py ({k + 1}): 130, one line naming the resume; the resumed run "
              "equals an uninterrupted one", not problem, problem)
