"""`tokenswap eval --backend hf` under `accelerate launch`: the one-process engine with its units shared by rank.

Real launches of the real command on two CPU processes (gloo), against one process on the same tiny checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
FORMS = "text,interleaved,caption,recognition"


def _env() -> dict:
    return {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _eval_args(model, bench, out, *extra) -> list[str]:
    return ["-m", "tokenswap.cli", "eval", "--model", str(model), "--bench", str(bench), "--forms", FORMS,
            "--out", str(out), *extra]


def _one(model, bench, out, *extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *_eval_args(model, bench, out, *extra)], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=600)


def _two_cmd(port, model, bench, out, *extra) -> list[str]:
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
            str(ROOT / "configs/accelerate/cpu_2proc.yaml"), "--main_process_port", str(port),
            *_eval_args(model, bench, out, *extra)]


def _two(port, model, bench, out, *extra) -> subprocess.CompletedProcess:
    return subprocess.run(_two_cmd(port, model, bench, out, *extra), cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=600)


def _kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it at once, as a preemption does."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo.extend(children.get(tree[-1], []))
    for p in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


def _lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines() if line.strip()]


def _same_records(a: Path, b: Path) -> None:
    one = {r["key"]: r for r in _lines(a)}
    two = {r["key"]: r for r in _lines(b)}
    assert set(one) == set(two)
    for key, row in one.items():
        other = two[key]
        assert set(row) == set(other), key
        for field, value in row.items():
            if field == "letter_probs":  # a batch of other neighbours pads otherwise: float noise, same order
                assert other[field] == pytest.approx(value, rel=1e-4), key
            else:
                assert other[field] == value, (key, field)


def _summary(out: Path) -> dict:
    payload = json.loads((out / "gap.json").read_text())
    return {k: v for k, v in payload.items() if k not in ("items", "pictures")}


def test_two_processes_give_the_records_and_result_of_one(tiny_qwen2vl, tiny_bench, free_port, tmp_path):
    one = _one(tiny_qwen2vl, tiny_bench, tmp_path / "one", "--scorer", "loglik")
    two = _two(free_port, tiny_qwen2vl, tiny_bench, tmp_path / "two", "--scorer", "loglik")
    # The tiny model's captions are empty, so the caption form rests on no item: exit 1 in both, after every
    # other form is written (the caption round ran, its items were skipped with the reason).
    assert one.returncode == 1, one.stderr[-3000:]
    assert two.returncode == 1, two.stderr[-3000:]
    assert "the caption form rests on 0 items" in two.stderr
    assert f"{ROOT / 'tokenswap'}" not in two.stderr  # no traceback through our code (the launcher has its own)
    _same_records(tmp_path / "one", tmp_path / "two")
    assert _summary(tmp_path / "one") == _summary(tmp_path / "two")
    assert not list((tmp_path / "two").glob("records.part*.jsonl"))  # rank 0 merged every part
    # Each unit was asked once, by one rank: no key twice in the merged file.
    keys = [r["key"] for r in _lines(tmp_path / "two")]
    assert len(keys) == len(set(keys))


def test_a_killed_launch_resumes_without_asking_again(tiny_qwen2vl, tiny_bench, free_port, tmp_path):
    out = tmp_path / "run"
    slow = ("--scorer", "generate", "--max-new-tokens", "192", "--batch-size", "1")
    proc = subprocess.Popen(_two_cmd(free_port, tiny_qwen2vl, tiny_bench, out, *slow), cwd=ROOT, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, )
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and proc.poll() is None:
            parts = list(out.glob("records.part*.jsonl"))
            if sum(p.read_text().count("\n") for p in parts) >= 3:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the launch ended before it could be killed"
    finally:
        _kill_tree(proc.pid)  # the launcher and its workers (torch's launcher starts them in sessions of their own)
        proc.wait()
    kept = {}
    for part in out.glob("records.part*.jsonl"):
        for line in part.read_text().splitlines():
            if line.endswith("}"):
                row = json.loads(line)
                kept[row["key"]] = row
    assert len(kept) >= 3
    # Resumed with another number of processes: the parts are merged first and their units not asked again.
    again = _one(tiny_qwen2vl, tiny_bench, out, *slow)
    assert again.returncode == 1, again.stderr[-3000:]  # the tiny model's empty captions, as above
    rows = _lines(out)
    keys = [r["key"] for r in rows]
    assert len(keys) == len(set(keys)), "a unit answered before the kill was asked again"
    final = {r["key"]: r for r in rows}
    for key, row in kept.items():
        assert final[key] == row
    assert not list(out.glob("records.part*.jsonl"))
    fresh = _one(tiny_qwen2vl, tiny_bench, tmp_path / "fresh", *slow)
    assert set(final) == {r["key"] for r in _lines(tmp_path / "fresh")}
    assert fresh.returncode == 1
