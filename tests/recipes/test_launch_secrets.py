"""Each recipe under ``accelerate launch`` (1 and 2 CPU processes) with its secrets in the environment, as the
docs say to pass them, ending 0, 2 (a config error), 1 (a run that could not do its work) and 143 (a SIGTERM stop):
no secret on stdout, on stderr or in any file the run wrote, whatever the launcher prints about the command.

The launcher's own report of a failed run (``CalledProcessError``, torchrun's ``ChildFailedError``) quotes the
command line, which is why no secret may be on it; the recipes' 2 and 143 reach the shell as the launcher's 1.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "tests" / "assets"
SECRETS = {"HF_TOKEN": "hf_LaunchPlanted0a1b2c3d4e5f", "WANDB_API_KEY": "wandb0LaunchPlanted0123456789ab",
           "OPENAI_API_KEY": "sk-LaunchPlanted-0123456789abcdef"}
CONFIGS = {"post_train": "tiny/post_text.yaml", "pretrain": "tiny/pretrain_text.yaml",
           "image_sft": "tiny/image_sft_crossmath.yaml", "grpo": "tiny/grpo_crossmath.yaml"}
LAUNCHER_STATUS = {0: 0, 1: 1, 2: 1, 143: 1}  # accelerate launch: any failure of a rank is its own 1


def launch(recipe: str, procs: int, port: int, *overrides: str, on_start=None, **env) -> tuple[int, str]:
    argv = [sys.executable, "-m", "accelerate.commands.launch"]
    argv += (["--config_file", str(ROOT / "configs/accelerate/cpu_2proc.yaml"), "--main_process_port", str(port)]
             if procs == 2 else ["--cpu", "--num_processes", "1"])
    argv += [str(ROOT / "recipes" / f"{recipe}.py"), "--config", CONFIGS[recipe], *overrides]
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **SECRETS,
               **env}
    proc = subprocess.Popen(argv, cwd=ROOT, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if on_start is not None:
        on_start(proc)
    said, _ = proc.communicate(timeout=900)
    return proc.returncode, said


def leaks(said: str, out: Path) -> list[str]:
    forms = [f for v in SECRETS.values() for f in (v, v[:12], v[-12:])]
    found = [f"output: {f}" for f in forms if f in said]
    if out.exists():
        found += [f"{p.relative_to(out)}: {f}" for p in out.rglob("*") if p.is_file() for f in forms
                  if f.encode() in p.read_bytes()]
    return found


def tiny(out: Path, model: Path) -> list[str]:
    return [f"run.output_dir={out}", f"model.name_or_path={model}", f"data.swap_dataset={ASSETS / 'swap_tiny.jsonl'}",
            f"data.llava_json={ASSETS / 'llava_tiny.json'}", f"data.llava_image_root={ASSETS / 'images'}",
            "gap_eval.bench=null", "train.max_steps=2", "train.save_steps=1", "train.report_to=[]"]


@pytest.mark.parametrize("procs", [1, 2])
@pytest.mark.parametrize("recipe", list(CONFIGS))
def test_a_config_error_under_the_launcher_leaks_no_secret(recipe, procs, tmp_path, free_port):
    code, said = launch(recipe, procs, free_port, f"run.output_dir={tmp_path / 'run'}", "nope.key=1")
    assert code == LAUNCHER_STATUS[2], said[-3000:]
    assert "error: 1 problem in " in said and "unknown key `nope`" in said, said[-3000:]
    assert not leaks(said, tmp_path), leaks(said, tmp_path)


@pytest.mark.parametrize("procs", [1, 2])
@pytest.mark.parametrize("end", [0, 1, 143])
def test_a_run_under_the_launcher_leaks_no_secret_however_it_ends(end, procs, tiny_qwen2vl, tmp_path, free_port):
    out = tmp_path / "run"
    extra, env, on_start = [], {}, None
    if end == 1:
        extra = ["collator.max_chars_per_sample=1"]  # every step has nothing to learn: IncompleteRunError
    if end == 143:
        env = {"TOKENSWAP_FAULT_SAVE_PAUSE_S": "20@1"}  # the stop lands while step 1 is saved

        def on_start(proc):
            marker = out / "checkpoint-1" / "trainer_state.json"
            deadline = time.monotonic() + 600
            while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            for child in psutil.Process(proc.pid).children(recursive=True):  # the ranks, as a scheduler stops them
                if "post_train.py" in " ".join(child.cmdline()):
                    child.send_signal(signal.SIGTERM)

    code, said = launch("post_train", procs, free_port, *tiny(out, tiny_qwen2vl), *extra, on_start=on_start, **env)
    assert code == LAUNCHER_STATUS[end], said[-3000:]
    if end == 143:
        assert "stopped" in said.lower() or "resume" in said.lower(), said[-3000:]
    assert not leaks(said, tmp_path), leaks(said, tmp_path)


@pytest.mark.parametrize("procs", [1, 2])
def test_a_hub_token_on_the_launched_command_line_is_refused_unprinted(procs, tmp_path, free_port):
    token = "hf_OnTheLine0a1b2c3d4e5f6g"
    code, said = launch("post_train", procs, free_port, f"run.output_dir={tmp_path / 'run'}",
                        f"train.hub_token={token}")
    assert code == LAUNCHER_STATUS[2], said[-3000:]
    assert "`train.hub_token` on the command line" in said and "set HF_TOKEN" in said
    # The launcher's traceback quotes the command it ran: a token typed there is the user's to keep out
    assert token not in "\n".join(x for x in said.splitlines() if x.startswith("error: "))
    assert not (tmp_path / "run").exists()
