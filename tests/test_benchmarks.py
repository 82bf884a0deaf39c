"""Every benchmark script runs, in its smallest setting, and ends with its documented closing line.

The figures are not checked (a 2-core CI machine measures nothing useful in a few seconds); what is
checked is that the scripts still run against the library as it is now. A benchmark that breaks when
the library changes (a source wrapper missing an attribute the build started to read) used to be
found only by the next person who measured.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
RATIO = r"\d+(\.\d+)?x"

# script, smallest arguments, the closing line it must print (regex), whether it writes --out JSON
CASES = [
    ("collator_throughput.py", ["--batches", "1", "--repeats", "1"],
     rf"collator: warm {RATIO}, cold {RATIO}, cold_prepared {RATIO} naive", True),
    ("packing.py", ["--samples", "4", "--padding-samples", "16"],
     rf"packing: padding \d+\.\d% -> \d+\.\d%, non-pad tokens/s packed/padded {RATIO}", True),
    ("store_build.py", ["--source-ms", "1", "--lookups", "1000"], r"wrote \S+result\.json", True),
    ("crossmath_gen.py", ["--n", "2"], r"wrote \S+result\.json", True),
    ("eval_speed.py", ["--pairs", "4", "--repeats", "1", "--hidden", "64", "--layers", "2"],
     r"generate evaluate +\d+\.\d+ s +\(\d+\.\dx loglik, \d+ new tokens per row\)", True),
    ("gpu_packing.py", ["--shape", "tiny", "--device", "cpu", "--attn", "auto", "--steps", "1"],
     rf"gpu_packing: non-pad tokens/s packed/padded {RATIO}", True),
    ("llm_throughput.py", ["--rows", "24", "--latency", "0.02", "--capacity", "4", "--concurrency", "4"],
     rf"llm throughput: \d+\.\d req/s at concurrency 4 = \d+% of server capacity; {RATIO} concurrency 1; "
     r"300K rows: \d+\.\d\d h", True),
    ("eval_serving.py", ["--pairs", "4", "--latency", "0.02", "--capacity", "4", "--concurrency", "4"],
     rf"eval serving: \d+\.\d req/s at concurrency 4 = \d+% of the server's ceiling; {RATIO} concurrency 1; "
     r"TokenSwap-Bench: \d+\.\d min", True),
    # the sections that take about three minutes together on the CI machine; "0 tried" would check nothing, so it fails
    ("faults.py", ["--sections", "data,malformed,llm,concurrency,shard_rewrite,workers", "--concurrency-kills", "2"],
     r"faults: [1-9]\d* tried, \d+ handled, 0 lost", False),
]


@pytest.mark.parametrize("script, args, closing, writes_json", CASES, ids=[c[0] for c in CASES])
def test_benchmark_runs_and_prints_its_closing_line(script, args, closing, writes_json, tmp_path):
    out = tmp_path / "result.json"
    argv = [sys.executable, str(BENCHMARKS / script), *args]
    if writes_json:
        argv += ["--out", str(out)]
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{script} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert lines and re.fullmatch(closing, lines[-1]), f"{script} ended with {lines[-1:]!r}"
    if writes_json:
        assert json.loads(out.read_text())  # a results file with content


def test_every_benchmark_script_is_covered():
    scripts = {p.name for p in BENCHMARKS.glob("*.py")} - {"peak_memory.py"}  # a wrapper gpu_check.sh runs on a GPU
    assert scripts == {c[0] for c in CASES}


def test_gpu_check_dry_run_passes_on_a_cpu_machine(tmp_path):
    """What a GPU rental would run is checked here first: packages, every run's config and overrides, the commands."""
    env = {**os.environ, "OUT": str(tmp_path / "gpu_check"), "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(BENCHMARKS / "gpu_check.sh"), "--dry-run"], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    lines = done.stdout.splitlines()
    assert lines[-1] == "gpu_check: dry run passed"
    assert "gpu_check: configs and overrides of 6 runs are valid" in lines
    for run in ("text", "tokenswap", "tokenswap_packed", "tokenswap_zero3", "tokenswap_qlora", "tokenswap_liger"):
        assert any(f"runs/{run} " in line for line in lines), run
    assert any("gpu_packing.py --shape 7b --lora 16" in line for line in lines)


def test_faults_checks_the_checkout_it_is_run_from(tmp_path):
    """An installed (or any other) tokenswap first on the path must not answer for the checkout under test."""
    decoy = tmp_path / "decoy" / "tokenswap"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("raise ImportError('the decoy tokenswap was imported')\n")
    (decoy / "cli.py").write_text("raise SystemExit('the decoy tokenswap.cli ran')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "decoy"), "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(BENCHMARKS / "faults.py"), "--sections", "data"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    assert re.fullmatch(r"faults: [1-9]\d* tried, \d+ handled, 0 lost", done.stdout.splitlines()[-1])


def test_faults_fails_when_no_fault_was_tried(tmp_path):
    done = subprocess.run([sys.executable, str(BENCHMARKS / "faults.py"), "--sections", ","], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stdout.splitlines()[-1] == "faults: 0 tried, 0 handled, 0 lost"
