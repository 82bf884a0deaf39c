"""Section ``launcher`` of benchmarks/faults.py: each recipe under ``accelerate launch`` (one CPU process; the post-
training recipe also with two) with ``HF_TOKEN``, ``WANDB_API_KEY`` and ``OPENAI_API_KEY`` in the environment, ended
by a config error: the launcher's traceback quotes the command line, which holds no secret, and no secret is on
stdout, stderr or in any file; a hub token typed on the launched command line: refused (exit 2 on the rank, the
launcher's 1), the rank's line naming ``HF_TOKEN`` and never the value, nothing written.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from ._common import ENV, PY, REPO, Tally

OUTCOME = ("secrets in the environment: none past accelerate launch's traceback (config error, 1 and 2 processes); a "
           "hub token on the launched command line refused, its value in no line of the recipe, nothing written")

SECRETS = {"HF_TOKEN": "hf_FaultsLauncher0a1b2c3d4e5f", "WANDB_API_KEY": "wandbFaultsLauncher0123456789abcd",
           "OPENAI_API_KEY": "sk-FaultsLauncher-0123456789abcdef"}
CONFIGS = {"post_train": "tiny/post_text.yaml", "pretrain": "tiny/pretrain_text.yaml",
           "image_sft": "tiny/image_sft_crossmath.yaml", "grpo": "tiny/grpo_crossmath.yaml"}


def _launch(recipe: str, procs: int, *overrides: str) -> subprocess.CompletedProcess:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [PY, "-m", "accelerate.commands.launch"]
    cmd += (["--config_file", str(REPO / "configs/accelerate/cpu_2proc.yaml"), "--main_process_port", str(port)]
            if procs == 2 else ["--cpu", "--num_processes", "1"])
    cmd += [str(REPO / "recipes" / f"{recipe}.py"), "--config", CONFIGS[recipe], *overrides]
    try:
        return subprocess.run(cmd, cwd=REPO, env={**ENV, "OMP_NUM_THREADS": "1", **SECRETS}, capture_output=True,
                              text=True, timeout=900)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(cmd, 124, e.stdout or "", "timed out after 900 s")


def _leaks(said: str, root: Path) -> list[str]:
    forms = [f for v in SECRETS.values() for f in (v, v[:12], v[-12:])]
    found = [f"output: {f[:4]}..." for f in forms if f in said]
    if root.exists():
        found += [f"{p.relative_to(root)}" for p in root.rglob("*") if p.is_file() for f in forms
                  if f.encode() in p.read_bytes()]
    return found


def section_launcher(t: Tally, work: Path) -> None:
    cases = [(recipe, 1) for recipe in CONFIGS] + [("post_train", 2)]
    for recipe, procs in cases:
        out = work / f"launcher-{recipe}-{procs}"
        proc = _launch(recipe, procs, f"run.output_dir={out}", "nope.key=1")
        said = proc.stdout + proc.stderr
        leaks = _leaks(said, out)
        t.add("launcher", f"{recipe}, {procs} process(es), config error: launcher's 1, the rank's line, no secret",
              proc.returncode == 1 and "unknown key `nope`" in said and not leaks,
              f"rc={proc.returncode} leaks={leaks[:3]} {said[-300:]}")
    token = "hf_FaultsOnTheLine0a1b2c3d4e5f6"
    out = work / "launcher-token-on-line"
    proc = _launch("post_train", 1, f"run.output_dir={out}", f"train.hub_token={token}")
    said = proc.stdout + proc.stderr
    lines = [x for x in said.splitlines() if x.startswith("error: ")]
    t.add("launcher", "a hub token on the launched command line: refused naming HF_TOKEN, the value in no rank line",
          proc.returncode == 1 and len(lines) == 1 and "set HF_TOKEN" in lines[0] and token not in lines[0]
          and not out.exists(), f"rc={proc.returncode} {said[-300:]}")
