"""The wheel is the library: built from the sources, installed non-editable into a fresh virtual environment beside
the pinned torch, and used from a folder that holds no checkout.

- core only (``pip install tokenswap``): the collator example of docs/training.md runs on a tiny kit, and pip
  installed none of the packages of the job extras;
- with the ``train`` extra: a tiny ``post_train`` runs from a recipes folder (the recipes, configs and data
  assets copied beside the run, not the package);
- the tiny kit (``python -m tokenswap.testing DIR``) from the wheel is byte-identical to a checkout's.

Minutes of pip and gigabytes of torch per run: marked ``integration``. The packages come from pip's configured
index with ``-c constraints.txt``, so nothing but the versions the suite runs is installed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints.txt"
# The packages of the job extras (train, eval, store); a core install pulls none of them.
JOB_PACKAGES = ("trl", "deepspeed", "wandb", "scipy", "matplotlib", "httpx", "datasets", "accelerate", "peft")
KIT = ("tiny-qwen2vl", "tiny-store", "tiny-bench")


def _env(venv: Path) -> dict[str, str]:
    """The environment of a user of ``venv``: nothing of this checkout or of the suite's interpreter on the path."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONSAFEPATH")}
    env.update(VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONNOUSERSITE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    return env


def _run(cmd: list, cwd: Path, env: dict[str, str], timeout: float = 1800) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{' '.join(map(str, cmd))} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n"
        f"--- stderr\n{proc.stderr[-4000:]}"
    )
    return proc


def _pip(venv: Path, work: Path, *args) -> None:
    _run([venv / "bin" / "python", "-m", "pip", "install", "-q", "-c", CONSTRAINTS, *args], work, _env(venv))


def _installed(venv: Path, work: Path) -> set[str]:
    code = ("import importlib.metadata as m, json, re; "
            "print(json.dumps(sorted({re.sub(r'[-_.]+', '-', d.metadata['Name']).lower() for d in m.distributions()})))")
    return set(json.loads(_run([venv / "bin" / "python", "-c", code], work, _env(venv)).stdout))


def _hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for name in KIT for p in sorted((root / name).rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def core_venv(tmp_path_factory):
    """(venv, work folder, wheel, distributions after the core install): the wheel installed without extras into
    a fresh venv that first got this interpreter's torch and torchvision."""
    from importlib.metadata import version

    tmp = tmp_path_factory.mktemp("wheel")
    src, dist, venv, work = tmp / "src", tmp / "dist", tmp / "venv", tmp / "work"
    work.mkdir()
    # Built from a copy: setuptools writes build/ and *.egg-info beside the sources it builds.
    src.mkdir()
    for name in ("pyproject.toml", "setup.cfg", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "tokenswap", src / "tokenswap", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", dist, src], tmp,
         {k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    (wheel,) = dist.glob("tokenswap-*.whl")

    _run([sys.executable, "-m", "venv", venv], tmp, _env(venv))  # not --system-site-packages: nothing leaks in
    # The installed distributions' versions (torch.__version__ may add a local tag, +cu130, its wheel does not have).
    torch_version = version("torch")
    pins = [f"torch=={torch_version}", f"torchvision=={version('torchvision')}"]
    # A +cpu build (make setup without CUDA) comes from PyTorch's CPU index, as the Makefile installs it.
    index = ["--extra-index-url", os.environ.get("TORCH_CPU_INDEX", "https://download.pytorch.org/whl/cpu")] \
        if "+cpu" in torch_version else []
    _pip(venv, work, *index, *pins)
    _pip(venv, work, wheel)
    return venv, work, wheel, _installed(venv, work)


@pytest.fixture(scope="module")
def train_venv(core_venv):
    """``core_venv`` with ``tokenswap[train]`` and, in its work folder, a recipes folder (recipes/, configs/ and the
    tests' data assets) and the tiny kit the wheel's ``python -m tokenswap.testing .cache`` wrote, with its hashes
    taken before anything runs on it."""
    venv, work, wheel, _ = core_venv
    _pip(venv, work, f"{wheel}[train]")
    shutil.copytree(ROOT / "recipes", work / "recipes", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "configs", work / "configs")
    shutil.copytree(ROOT / "tests" / "assets", work / "tests" / "assets")
    _run([venv / "bin" / "python", "-m", "tokenswap.testing", ".cache"], work, _env(venv))
    return venv, work, _hashes(work / ".cache")


def test_core_install_runs_the_collator_example_without_the_job_extras(core_venv):
    venv, work, _, installed = core_venv
    page = (ROOT / "docs" / "training.md").read_text()
    section = page.split("## The collator in your own trainer", 1)[1]
    example = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    kit = work / "core-kit"
    for released, tiny in (('"Qwen/Qwen2-VL-7B"', repr(str(kit / "tiny-qwen2vl"))),
                           ('"outputs/store_generate/store"', repr(str(kit / "tiny-store")))):
        assert released in example, f"docs/training.md's collator example no longer names {released}"
        example = example.replace(released, tiny)
    # The kit's checkpoint and store through the package's own builders (its bench needs `datasets`: [train]).
    script = (
        "import sys, json\n"
        "import tokenswap\n"
        "from tokenswap.testing import build_tiny_qwen2vl, build_tiny_store, tiny_corpus\n"
        f"build_tiny_qwen2vl({str(kit / 'tiny-qwen2vl')!r}, corpus=tiny_corpus())\n"
        f"build_tiny_store({str(kit / 'tiny-store')!r})\n"
        + example +
        "\nprint(json.dumps({'tokenswap': tokenswap.__file__, 'path': sys.path,"
        " 'shapes': {k: list(v.shape) for k, v in batch.items()}, 'swapped': collator.stats['concepts_swapped']}))\n"
    )
    out = _run([venv / "bin" / "python", "-c", script], work, _env(venv)).stdout
    report = json.loads(out.strip().splitlines()[-1])
    assert Path(report["tokenswap"]).resolve().is_relative_to(venv.resolve()), report["tokenswap"]
    assert not [p for p in report["path"] if p and Path(p).resolve() == ROOT], report["path"]
    shapes = report["shapes"]
    assert shapes["input_ids"][0] == 1 and shapes["labels"] == shapes["input_ids"], shapes
    assert shapes["image_grid_thw"] == [1, 3] and report["swapped"] == 1, report  # "cat" shown as its picture
    pulled = sorted(set(JOB_PACKAGES) & installed)
    assert not pulled, f"`pip install tokenswap` (no extra) installed packages of the job extras: {pulled}"


def test_train_extra_runs_a_tiny_post_train_from_the_recipes_folder(train_venv, tmp_path):
    venv, work, _ = train_venv
    out = tmp_path / "post"
    proc = _run([venv / "bin" / "python", "recipes/post_train.py", "--config", "tiny/post_tokenswap.yaml",
                 f"run.output_dir={out}", "train.max_steps=2", "train.save_steps=2", "gap_eval.every_steps=2"],
                work, _env(venv))
    history = json.loads((out / "log_history.json").read_text())
    assert [h["step"] for h in history if "loss" in h] == [1, 2], proc.stdout[-2000:]
    assert any("gap/abs" in h for h in history), history


def test_tiny_kit_from_the_wheel_is_byte_identical_to_the_checkouts(train_venv, tmp_path):
    _, _, wheel_hashes = train_venv
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    _run([sys.executable, "-m", "tokenswap.testing", str(tmp_path / "kit")], tmp_path, env)
    checkout = _hashes(tmp_path / "kit")
    assert set(checkout) == set(wheel_hashes) and len(checkout) > 5, (sorted(checkout), sorted(wheel_hashes))
    differ = sorted(k for k in checkout if checkout[k] != wheel_hashes[k])
    assert not differ, f"the tiny kit differs between the wheel and the checkout in {differ}"
