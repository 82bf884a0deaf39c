"""Every refusal of a busy folder names its holder's PID, from the first instant the lock is held (issue 38).

Two processes take the same folder's lock at the same instant, 50 times for each kind of job (a store build, a
training run, an evaluation's ``--out``), with two busy loops beside them: the kernel then often runs the loser
between the winner's ``flock`` and the moment a lock written in two steps gets its holder's tag. Each worker
takes the lock through the code its entry point runs (``build_lock``, ``hold_output_dir``, the eval's ``_lock``);
the gate that starts both is a file the test holds an exclusive ``flock`` on and the workers wait on with a shared
one, so both wake in the same instant when it is closed. The refusal of each real command (``tokenswap
build-store``, ``recipes/post_train.py``'s ``main``, ``tokenswap eval``) is checked against a held folder too.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tokenswap.errors import BusyError

# Every test here starts a process, a server or a training run (make check skips them).
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
       "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
ROUNDS = 50

# argv: kind, base folder, rounds. Round i: wait at <base>/gate-<i>, take the lock of <base>/round-<i>, print what
# happened as one JSON line; the lock taken is held until the next round's gate opens (the other worker has
# answered by then). After the last round, hold what is held until stdin closes.
WORKER = r"""
import contextlib, fcntl, io, json, os, sys
from pathlib import Path
from tokenswap.errors import BusyError

kind, base, rounds = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
if kind == "store":
    from tokenswap.store.coordination import build_lock

    def take(out):
        return build_lock(out, 0).acquire().release
elif kind == "train":
    from tokenswap.training import run_folder

    def take(out):
        run_folder.hold_output_dir(str(out))
        return run_folder._HELD.pop(os.path.realpath(out)).release  # held for the process's life otherwise
else:
    from tokenswap.eval.cli import _lock

    def take(out):
        held = _lock(out)
        held.__enter__()
        return lambda: held.__exit__(None, None, None)

print("ready", flush=True)
release = None
for i in range(rounds):
    with open(base / f"gate-{i}") as gate:
        fcntl.flock(gate, fcntl.LOCK_SH)
    if release is not None:
        release()
        release = None
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            release = take(base / f"round-{i}")
        answer = {"held": os.getpid()}
    except SystemExit as e:  # hold_output_dir's refusal: "error: ..." on stderr, exit 1
        answer = {"refused": said.getvalue(), "code": e.code}
    except BusyError as e:
        answer = {"refused": str(e), "code": 1}
    print(json.dumps(answer), flush=True)
sys.stdin.read()
"""


def _start_workers(kind: str, base: Path, rounds: int, n: int) -> list[subprocess.Popen]:
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, kind, str(base), str(rounds)], cwd=base, env=ENV,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(n)]
    for p in procs:
        line = p.stdout.readline()
        assert line.strip() == "ready", f"worker did not start: {line!r} {p.stderr.read()[-2000:] if not line else ''}"
    return procs


def _answer(p: subprocess.Popen) -> dict:
    line = p.stdout.readline()
    if not line:
        p.wait(timeout=60)
        raise AssertionError(f"worker {p.pid} ended (rc {p.returncode}): {p.stderr.read()[-2000:]}")
    return json.loads(line)


def _gates(base: Path, rounds: int) -> list:
    gates = []
    for i in range(rounds):
        gate = open(base / f"gate-{i}", "w")  # noqa: SIM115 - closed one by one, each opening a round
        fcntl.flock(gate, fcntl.LOCK_EX)
        gates.append(gate)
    return gates


def _end(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.stdin.close()
    for p in procs:
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@contextlib.contextmanager
def _busy_loops(n: int = 2):
    """Processes that never sleep, beside the workers (2 cores: the workers are preempted at any point)."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in loops:
            p.kill()
            p.wait()


@pytest.mark.parametrize("kind", ["store", "train", "eval"])
def test_two_jobs_started_together_50_times_every_refusal_names_the_holder(kind, tmp_path):
    gates = _gates(tmp_path, ROUNDS)
    workers = _start_workers(kind, tmp_path, ROUNDS, 2)  # imported before the load starts: the race is the point
    unnamed = []
    try:
        with _busy_loops():
            for i, gate in enumerate(gates):
                gate.close()  # both workers wait on it: they take round i's lock in the same instant
                answers = [_answer(p) for p in workers]
                held = [a["held"] for a in answers if "held" in a]
                refused = [a for a in answers if "refused" in a]
                assert len(held) == 1 and len(refused) == 1, f"round {i}: {answers}"
                assert refused[0]["code"] == 1, f"round {i}: {answers}"
                if f"(pid {held[0]} on host " not in refused[0]["refused"]:
                    unnamed.append(f"round {i}: {refused[0]['refused'].strip()}")
    finally:
        for gate in gates:
            gate.close()
        _end(workers)
    assert not unnamed, f"{len(unnamed)} of {ROUNDS} refusals do not name the holder's pid:\n" + "\n".join(unnamed)


def _holder(kind: str, base: Path) -> tuple[subprocess.Popen, Path]:
    """A worker holding ``<base>/round-0`` through the entry point's lock code, until stdin closes."""
    gate = _gates(base, 1)[0]
    worker = _start_workers(kind, base, 1, 1)[0]
    gate.close()
    assert "held" in _answer(worker)
    return worker, base / "round-0"


def _refusal(run, capsys) -> tuple[int, str]:
    """The exit status and the message of a refused real command (its error reaches stderr, or is raised)."""
    try:
        code = run()
    except SystemExit as e:
        code = e.code
    except BusyError as e:
        return 1, str(e)
    return code, capsys.readouterr().err


def test_a_real_build_on_a_held_folder_names_the_holder(tmp_path, capsys):
    from tokenswap.cli import main

    worker, out = _holder("store", tmp_path)
    try:
        code, err = _refusal(lambda: main(["build-store", "--config", "store_embedded.yaml", f"output_dir={out}",
                                           "data.max_samples=10", "progress=false"]), capsys)
    finally:
        _end([worker])
    assert code == 1 and f"{out} is being built by another process (pid {worker.pid} on host " in err, err
    assert not (out / "state").exists()  # refused before writing anything


def test_a_real_evaluation_on_a_held_out_names_the_holder(tmp_path, capsys):
    from tokenswap.cli import main

    bench = tmp_path / "bench"  # the lock is taken before the bench is read: an empty one in its layout will do
    (bench / "text").mkdir(parents=True)
    (bench / "img").mkdir()
    worker, out = _holder("eval", tmp_path)
    try:
        code, err = _refusal(lambda: main(["eval", "--backend", "openai", "--base-url", "http://127.0.0.1:9/v1",
                                           "--model", "m", "--bench", str(bench), "--out", str(out)]), capsys)
    finally:
        _end([worker])
    assert code == 1 and f"{out} is being evaluated by another process (pid {worker.pid} on host " in err, err


def test_a_real_training_run_on_a_held_folder_names_the_holder(tiny_qwen2vl, tiny_store, tmp_path, capsys):
    import importlib.util

    from tokenswap.config import load_config

    spec = importlib.util.spec_from_file_location("recipe_post_train_lock", ROOT / "recipes" / "post_train.py")
    post = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = post  # dataclasses resolve string annotations through sys.modules
    spec.loader.exec_module(post)
    assets = ROOT / "tests" / "assets"
    worker, out = _holder("train", tmp_path)
    cfg = load_config(post.PostTrainConfig, "tiny/post_tokenswap.yaml", [
        f"run.output_dir={out}", f"model.name_or_path={tiny_qwen2vl}", f"data.swap_dataset={assets / 'swap_tiny.jsonl'}",
        f"data.llava_json={assets / 'llava_tiny.json'}", f"data.llava_image_root={assets / 'images'}",
        f"image_store={tiny_store.root}", "gap_eval.bench=null"])
    try:
        code, err = _refusal(lambda: post.main(cfg), capsys)
    finally:
        _end([worker])
    assert code == 1 and f"{out} is used by a training run by another process (pid {worker.pid} on host " in err, err
    assert not (out / "tokenswap_config.json").exists()  # refused before writing anything
