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
import tarfile
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
    ("eval_serving.py", ["--pairs", "8", "--pairs-c1", "8", "--latency", "0.02", "--capacity", "4",
                         "--concurrency", "4"],
     rf"eval serving: \d+\.\d req/s at concurrency 4 = \d+% of the ceiling \(4 in flight / latency, set by the "
     rf"client's --concurrency\); {RATIO} concurrency 1; TokenSwap-Bench --forms all: \d+\.\d min; client CPU "
     r"\d+\.\d\d ms/request, start -> first request \d+\.\d s, last reply -> exit -?\d+\.\d s, \d+% of a "
     r"bodies-only client", True),
    # the sections that take about three minutes together on the CI machine; "0 tried" would check nothing, so it fails
    ("faults.py", ["--sections", "data,malformed,llm,concurrency,shard_rewrite,workers,runs_end:persistent",
                   "--concurrency-kills", "2"],
     r"faults: [1-9]\d* tried, \d+ handled, 0 lost", False),
]


@pytest.mark.integration
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
    # gpu_check.sh's wrapper and its report steps: run by the twin test below
    scripts = {p.name for p in BENCHMARKS.glob("*.py")} - {"peak_memory.py", "gpu_report.py"}
    assert scripts == {c[0] for c in CASES}


# gpu_wheels.sh reads the tested versions from (and builds deepspeed with) the project's interpreter, .venv/bin/python
# by default: a checkout without its own .venv (a worktree) names the one running the tests.
TWIN_ENV = {"VENV_PY": sys.executable}


@pytest.mark.integration
def test_gpu_check_runs_every_step_on_the_cpu_twin_of_the_gpu_image(tmp_path):
    """What a GPU rental would run, run first on the CPU twin (benchmarks/gpu_twin.sh: the image's packages at its
    versions, cached in ~/.cache/tokenswap) with the carried wheels over it, through the same launcher, parsing and
    summary (issue 27: a carried huggingface_hub 2.x, liger-kernel failing to patch, the ZeRO-3 run killed before
    its JSON, 4-bit weights counted at half size each failed this first)."""
    report = tmp_path / "report"
    env = {**os.environ, **TWIN_ENV, "SCRATCH": str(tmp_path / "scratch")}
    env.pop("PYTHONPATH", None)  # the twin's interpreter sees the image's packages and the carried wheels only
    archive = tmp_path / "out" / "report.tar.gz"
    done = subprocess.run(["bash", str(BENCHMARKS / "gpu_check.sh"), "--dry-run", "--report", str(report),
                           "--archive", str(archive)], env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    assert done.stdout.splitlines()[-1] == "gpu_check: dry run passed"
    summary = (report / "summary.txt").read_text()
    # the whole report comes back as one archive (the device tool returns a few files only)
    assert os.listdir(archive.parent) == ["report.tar.gz"]
    with tarfile.open(archive) as tar:
        assert tar.extractfile("report/summary.txt").read().decode() == summary
        assert {"report/preflight.json", "report/packing_test.log", "report/runs/tokenswap.log"} <= set(tar.getnames())
    # value first: the exactness tests and the packed-vs-padded bench before any recipe run
    names = [line.split()[1] for line in summary.splitlines()[1:-1]]
    assert max(names.index(k) for k in ("flash_attention_2", "tokenswap_varlen_sdpa", "gpu_packing_tiny")) < \
        min(names.index(r) for r in ("text", "tokenswap", "tokenswap_packed"))
    assert names.index("tokenswap_packed") < names.index("tokenswap") < names.index("text")
    rows = {line.split()[1]: line for line in summary.splitlines()[1:-1]}
    for run in ("text", "tokenswap", "tokenswap_packed", "one_gpu_tokenswap", "tokenswap_zero3", "tokenswap_qlora"):
        assert rows[run].split()[2] == "ok", rows[run]
    assert "packed: sdpa" in rows["tokenswap_qlora"] and "fallback" not in rows["tokenswap_qlora"]
    # no liger-kernel release patches Qwen2-VL under transformers 5.24: the run is dropped, the reason printed
    assert "skipped (dropped from the check: liger-kernel 0.8.5" in rows["tokenswap_liger"]
    assert "tokenswap_liger skipped: dropped from the check: liger-kernel 0.8.5" in done.stdout
    assert "1 dropped (tokenswap_liger)" in summary.splitlines()[-1]
    carried = (tmp_path / "scratch" / "carried.txt").read_text().split()
    assert not [c for c in carried if c.startswith("liger")]  # not carried either
    assert re.search(r"gpu_check: part 1 on the GPU \(estimate/timeout s\): .*; timeouts \d+ s of 330", done.stdout)
    assert "ok (4-bit" in summary
    for kernel in ("flash_attention_2", "tokenswap_varlen", "tokenswap_flex", "tokenswap_varlen_sdpa"):
        assert "skipped (needs a CUDA device)" in rows[kernel], rows[kernel]
    assert "gpu_packing_tiny" in summary and "0 failed" in summary.splitlines()[-1]
    preflight = json.loads((report / "preflight.json").read_text())
    # the image's own transformers (5.17.0), accelerate and peft run; none of them carried
    assert "ok transformers 5.17.0 (machine)" in preflight["packages"], preflight["packages"]
    assert not {c.split("==")[0] for c in carried} & IMAGE_OWN, carried
    # only the summary, logs and JSON figures in the report: a few MB
    assert sum(f.stat().st_size for f in report.rglob("*") if f.is_file()) < 5 * 2**20


@pytest.mark.integration
def test_gpu_check_part_1_fails_when_its_steps_do_not_fit_its_budget(tmp_path):
    """Part 1 (exactness, packed-vs-padded benches) never overruns its share of the lease: a step that might is
    skipped, said, and fails the part (its figures are what the lease is for)."""
    env = {**os.environ, **TWIN_ENV, "SCRATCH": str(tmp_path / "scratch"), "PART_BUDGET": "1"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(["bash", str(BENCHMARKS / "gpu_check.sh"), "--dry-run", "--part", "1", "--report",
                           str(tmp_path / "report")], env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 1, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    summary = (tmp_path / "report" / "summary.txt").read_text()
    assert summary.count("skipped (part budget:") == 2 and "tokenswap_packed" not in summary  # exactness, the bench
    assert summary.splitlines()[-1].endswith("2 skipped for time (exactness, gpu_packing_tiny)")


@pytest.mark.integration
def test_gpu_check_part_2_runs_what_the_lease_has_left_and_says_what_it_skipped(tmp_path):
    """--lease-left S: part 2 keeps 60 s for the way back and 100 s to rerun one run, and starts only the runs whose
    timeout fits the rest; the others read "skipped (lease: ...)" and the part passes."""
    env = {**os.environ, **TWIN_ENV, "SCRATCH": str(tmp_path / "scratch"), "STEP_TIMEOUT": "100"}
    env.pop("PYTHONPATH", None)
    archive = tmp_path / "out" / "part2.tar.gz"
    done = subprocess.run(["bash", str(BENCHMARKS / "gpu_check.sh"), "--dry-run", "--part", "2", "--lease-left", "161",
                           "--report", str(tmp_path / "report"), "--archive", str(archive)], env=env,
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    summary = (tmp_path / "report" / "summary.txt").read_text()
    assert summary.count("skipped (lease: ") == 6, summary  # every run but liger (dropped, and why)
    assert "uses at most 1 s, keeping 60 s for the way back and 100 s to rerun one run" in done.stdout
    assert "PART_BUDGET=1, the step may take 100 s" in summary and "flash_attention_2" not in summary
    with tarfile.open(archive) as tar:
        assert tar.extractfile("report/summary.txt").read().decode() == summary


@pytest.mark.integration
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


@pytest.mark.integration
def test_faults_fails_when_no_fault_was_tried(tmp_path):
    done = subprocess.run([sys.executable, str(BENCHMARKS / "faults.py"), "--sections", ","], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stdout.splitlines()[-1] == "faults: 0 tried, 0 handled, 0 lost"


@pytest.mark.integration
def test_gpu_check_leaves_a_folder_that_is_not_its_report_alone(tmp_path):
    """--report DIR is emptied of an earlier report's files: a folder holding anything else is refused, untouched."""
    (tmp_path / "figures.json").write_text("{}")
    done = subprocess.run(["bash", str(BENCHMARKS / "gpu_check.sh"), "--report", str(tmp_path)], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "SCRATCH": str(tmp_path / "scratch")})
    assert done.returncode == 2 and "not empty" in done.stderr
    assert (tmp_path / "figures.json").read_text() == "{}"


# ----------------------------------------------------------------------------- the GPU lease (issue 38 item 5)


def _plan(env=None):
    return subprocess.run([sys.executable, str(BENCHMARKS / "gpu_report.py"), "plan", "--device", "cuda"],
                          capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})


@pytest.mark.integration
def test_the_gpu_plan_gives_every_step_half_again_its_estimate_and_the_timeouts_fit_its_budget():
    done = _plan()
    assert done.returncode == 0, done.stdout + done.stderr
    line = re.search(r"part 1 on the GPU \(estimate/timeout s\): (.*); timeouts (\d+) s of (\d+)", done.stdout)
    steps = {name: (int(est), int(timeout)) for name, est, timeout in re.findall(r"(\w+) (\d+)/(\d+)", line[1])}
    assert {"install", "preflight", "exactness", "gpu_packing_2b", "gpu_packing_7b"} <= set(steps)
    for name, (est, timeout) in steps.items():
        assert timeout >= 1.5 * est, name
    # The budget (330 s) is sized so two tries of part 1 and the machine's start (~120 s) fit the 900 s lease with
    # their transfers (~15 s each); the test holds the plan to whatever budget it prints.
    assert sum(t for _, t in steps.values()) == int(line[2]) <= int(line[3])
    timeouts = dict(re.findall(r"^T_(\w+)=(\d+)$", done.stdout, re.M))
    assert int(timeouts["exactness"]) == steps["exactness"][1]


@pytest.mark.integration
def test_gpu_check_refuses_a_timeout_under_half_again_its_estimate(tmp_path):
    # The issue-38 reading: the exactness step's 90 s timeout sat at the bottom of its own estimate.
    assert _plan({"TEST_TIMEOUT": "90"}).returncode == 2
    done = subprocess.run(["bash", str(BENCHMARKS / "gpu_check.sh"), "--part", "1", "--report", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TEST_TIMEOUT": "90", "SCRATCH": str(tmp_path / "scratch"),
                               "PYTHON": sys.executable})
    assert done.returncode == 2
    assert "plan broken: exactness: timeout 90 s is under 1.5x its estimate of 150 s" in done.stderr


@pytest.mark.integration
def test_built_wheels_are_ignored_by_git(tmp_path):
    for path in ("tokenswap-1.0-py3-none-any.whl", ".whl/deepspeed-0.19.8-py3-none-any.whl"):
        done = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT)
        assert done.returncode == 0, f"{path} is not ignored: git add . would commit a built wheel"


# The image's own packages (benchmarks/gpu_image.txt, KINDS.md's versions): pip would replace any one carried.
IMAGE_OWN = {"torch", "torchvision", "numpy", "transformers", "accelerate", "peft", "tokenizers", "huggingface-hub",
             "safetensors", "protobuf"}


def _gpu_wheels(tmp_path, dependencies, train):
    """gpu_wheels.sh's plan for a pyproject with these ranges; offline, so it stops at the download."""
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(f'[project]\nname = "tokenswap"\nversion = "0"\ndependencies = {json.dumps(dependencies)}\n'
                         f'[project.optional-dependencies]\ntrain = {json.dumps(train)}\n'
                         'gpu = ["flash-attn>=2.6", "bitsandbytes>=0.50"]\n')
    return subprocess.run(["bash", str(BENCHMARKS / "gpu_wheels.sh"), str(tmp_path / "w")], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "VENV_PY": sys.executable, "PIP_NO_INDEX": "1",
                                                       "PIP_FIND_LINKS": str(tmp_path), "PYPROJECT": str(pyproject)})


@pytest.mark.integration
def test_gpu_wheels_carries_only_what_the_image_lacks_at_pinned_versions(tmp_path):
    """Ranges that admit the image's transformers 5.17 and accelerate 1.15: the train extra's trl, deepspeed,
    datasets and wandb travel, one name==version each; the image's own stack and liger-kernel do not."""
    done = _gpu_wheels(tmp_path, ["torch>=2.10", "transformers>=5.17.0", "numpy>=1.26", "pyyaml>=6"],
                       ["accelerate>=1.15.0", "deepspeed>=0.19.0", "peft>=0.21.0", "trl>=1.13.0", "datasets>=4.7.0",
                        "wandb>=0.28.2"])
    carried = re.search(r"^gpu_wheels: carried: (.*)$", done.stdout, re.M)
    assert carried, done.stdout + done.stderr
    specs = carried[1].split()
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][A-Za-z0-9.+!-]*", spec) for spec in specs), specs
    names = {spec.split("==")[0] for spec in specs}
    assert {"trl", "deepspeed", "datasets", "wandb", "bitsandbytes"} <= names
    assert not names & IMAGE_OWN and not [n for n in names if n.startswith("liger")], names
    assert "transformers 5.17.0" in done.stdout and "accelerate 1.15.0" in done.stdout


@pytest.mark.integration
def test_gpu_wheels_refuses_a_range_the_images_transformers_does_not_meet(tmp_path):
    done = _gpu_wheels(tmp_path, ["torch>=2.10", "transformers>=5.24,<5.25"], ["trl>=1.13.0"])
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        "gpu_wheels: tokenswap needs transformers<5.25,>=5.24; the image has transformers 5.17.0, and pip would "
        "replace it"], done.stderr
    assert "carried:" not in done.stdout


def _wheel(folder: Path, name: str, version: str, requires=()):
    """A minimal pure-Python wheel (no files but its metadata)."""
    import zipfile

    dist = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    files = {f"{dist}/METADATA": meta, f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
             "Tag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as z:
        for path, text in files.items():
            z.writestr(path, text)


def _install_plan(tmp_path, wheels):
    return subprocess.run([sys.executable, str(BENCHMARKS / "gpu_report.py"), "install-plan", "--wheels", str(wheels),
                           "--scratch", str(tmp_path / "scratch")], capture_output=True, text=True, timeout=300)


@pytest.mark.integration
def test_gpu_check_install_plan_refuses_to_replace_a_package_the_environment_has(tmp_path):
    """gpu_check.sh installs the carried wheels into the image's own environment: pip's dry run goes first, and a
    wheel that would replace one of that environment's packages stops it (exit 2, one line), nothing installed."""
    import importlib.metadata as md

    wheels = tmp_path / "w"
    wheels.mkdir()
    _wheel(wheels, "tokenswap_gpu_probe", "1.0", ["tqdm"])  # a package the environment lacks, needing one it has
    done = _install_plan(tmp_path, wheels)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "scratch" / "carried.txt").read_text() == "tokenswap-gpu-probe==1.0\n"
    _wheel(wheels, "tqdm", "0.0.1")  # ... and one that would replace the environment's own tqdm
    done = _install_plan(tmp_path, wheels)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        f"gpu_check: installing the carried wheels would replace the image's tqdm {md.version('tqdm')} with 0.0.1: "
        "carry only what the image lacks (benchmarks/gpu_wheels.sh) and widen the range that asks for more"]
    assert md.version("tqdm") != "0.0.1"


@pytest.mark.integration
def test_gpu_check_install_plan_says_in_one_line_what_pip_cannot_find(tmp_path):
    wheels = tmp_path / "w"
    wheels.mkdir()
    _wheel(wheels, "tokenswap_gpu_probe", "1.0", ["tokenswap-no-such-package>=1"])
    done = _install_plan(tmp_path, wheels)
    assert done.returncode == 3, done.stdout + done.stderr  # part 1 goes on without the wheels, part 2 stops
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check: pip cannot install the carried wheels") and \
        "tokenswap-no-such-package" in lines[0], lines


@pytest.mark.integration
def test_part_1_does_not_need_part_2s_packages_and_part_2_reuses_part_1s_install(tmp_path):
    """The carried wheels without trl, datasets and deepspeed (part 2's alone): part 1 passes and never names them;
    part 2 on the same machine reinstalls nothing, checks only what part 1 did not, and skips (not fails) each run
    that needs a missing package, saying which."""
    cached = subprocess.run(["bash", "-c", 'KEY=$(cat constraints.txt benchmarks/gpu_image.txt benchmarks/gpu_wheels.sh '
                             'pyproject.toml | sha256sum | cut -c1-12); PY=$(bash benchmarks/gpu_twin.sh | tail -n 1); '
                             'V=$("$PY" -c "import sys; print(f\'{sys.version_info[0]}.{sys.version_info[1]}\')"); '
                             'W="$HOME/.cache/tokenswap/gpu_twin_wheels-$V-$KEY"; '
                             # built here when absent, as gpu_check.sh builds them (this test needs no other test)
                             '[ -f "$W/.complete" ] || { PYVER=$V bash benchmarks/gpu_wheels.sh "$W" >&2 && '
                             'touch "$W/.complete"; }; echo "$W"'], cwd=ROOT, env={**os.environ, **TWIN_ENV},
                            capture_output=True, text=True, timeout=1800)
    assert cached.returncode == 0, cached.stderr[-3000:]
    cached = cached.stdout.split()[-1]
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for whl in Path(cached).glob("*.whl"):
        if not whl.name.startswith(("trl-", "datasets-", "deepspeed-")):
            (wheels / whl.name).symlink_to(whl)
    env = {**os.environ, **TWIN_ENV, "SCRATCH": str(tmp_path / "scratch")}
    env.pop("PYTHONPATH", None)

    def part(n, *extra):
        return subprocess.run(["bash", str(BENCHMARKS / "gpu_check.sh"), "--dry-run", "--part", n, "--wheels",
                               str(wheels), "--report", str(tmp_path / f"report{n}"), *extra], env=env,
                              capture_output=True, text=True, timeout=1800)

    one = part("1", "--only", "none")  # install and preflight: the steps themselves are the full twin test's
    assert one.returncode == 0, f"{one.stdout[-3000:]}\n{one.stderr[-3000:]}"
    for name in ("trl", "datasets", "deepspeed", "pyarrow"):
        assert name not in one.stdout + one.stderr, name
    pre = json.loads((tmp_path / "report1" / "preflight.json").read_text())
    assert pre["missing"] == [] and pre["problems"] == [] and pre["skips"] == {}, pre
    assert "ok transformers 5.17.0 (machine)" in pre["packages"]
    installed = (tmp_path / "scratch" / ".gpu_check_wheels").stat().st_mtime_ns
    two = part("2")
    assert two.returncode == 0, f"{two.stdout[-3000:]}\n{two.stderr[-3000:]}"
    assert "installed already" in two.stdout and "not reinstalled" in two.stdout and "installing" not in two.stdout
    assert (tmp_path / "scratch" / ".gpu_check_wheels").stat().st_mtime_ns == installed
    pre = json.loads((tmp_path / "report2" / "preflight_2.json").read_text())
    assert "torch" in pre["checked_by_an_earlier_part"] and not [p for p in pre["packages"] if p.startswith("ok torch")]
    assert [line for line in two.stdout.splitlines() if line.startswith("gpu_check: missing trl:")]
    summary = (tmp_path / "report2" / "summary.txt").read_text()
    rows = {line.split()[1]: line for line in summary.splitlines()[1:-1]}
    for run in ("tokenswap_packed", "one_gpu_tokenswap", "tokenswap", "text", "tokenswap_zero3", "tokenswap_qlora"):
        assert "skipped (package: trl: ModuleNotFoundError" in rows[run], rows[run]
    assert "0 failed" in summary.splitlines()[-1] and "6 skipped for a package" in summary.splitlines()[-1]
