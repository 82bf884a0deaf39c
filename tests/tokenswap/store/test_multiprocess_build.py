"""The store build sharded over two processes (accelerate launch) equals the single-process build."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tokenswap.store import ImageStore

# Every test here starts a process, a server or a training run (make check skips them).
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]


def _rows(out: Path) -> list[dict]:
    rows = [json.loads(line) for f in sorted((out / "dataset").glob("*.jsonl")) for line in f.read_text().splitlines()]
    return sorted(rows, key=lambda r: r["id"])


def test_two_rank_build_matches_single_process(free_port, tmp_path):
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    common = ["-m", "tokenswap.cli", "build-store", "--config", "store_embedded.yaml", "data.max_samples=120"]
    single, double = tmp_path / "one", tmp_path / "two"
    subprocess.run([sys.executable, *common, f"output_dir={single}"], cwd=ROOT, env=env, check=True,
                   capture_output=True, timeout=300)
    proc = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
         str(ROOT / "configs/accelerate/cpu_2proc.yaml"), "--main_process_port", str(free_port), *common, f"output_dir={double}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    shards = {p.name.split("-")[1] for p in (double / "store" / "shards").glob("*.arrow")}
    assert shards == {"r000", "r001"}  # both ranks wrote images
    a, b = ImageStore(single / "store"), ImageStore(double / "store")
    assert sorted(a.keys()) == sorted(b.keys()) and len(a) > 10
    assert sorted(im.image_id for im in a) == sorted(im.image_id for im in b)
    assert _rows(single) == _rows(double)
