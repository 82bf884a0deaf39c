"""Every way a recipe run ends with an error goes one route: one line, its exit status, and no secret anywhere.

Each case runs ``recipes/post_train.py`` as its ``__main__`` block runs it (``runpy``, in this process, output
captured at the file descriptors) with a secret planted where the refusal looks: the Hugging Face token
(``HF_TOKEN``, which redaction always knows) in the name of the run's folders, a ``train.hub_token`` on the command
line, and URL credentials in a model path. The message must be the documented one line (with the secret masked),
the status the documented one, and the secret in no form on stdout or stderr.
"""

from __future__ import annotations

import os
import runpy
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tokenswap.training import PREEMPTED_EXIT
from tokenswap.training.checkpoint import FAULT_PAUSE_ENV

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "tests" / "assets"
RECIPE = ROOT / "recipes" / "post_train.py"
CONFIG = "tiny/post_text.yaml"

TOKEN = "hf_PlantedToken0a1b2c3d4e5f"  # HF_TOKEN: every form of it must stay off the console
HUB = "hf_PlantedHubOverride9z8y7x6w"  # train.hub_token in the YAML: remembered from the file
PASSWORD = "planted-url-pass-5432"  # user:password@ in a model path
MASK = "[hub token]"
SECRETS = (TOKEN, HUB, PASSWORD, TOKEN[:12], TOKEN[-12:], HUB[:12])


def masked(path) -> str:
    return str(path).replace(TOKEN, MASK)


@pytest.fixture
def planted(monkeypatch, tmp_path):
    """The folder every case writes under: its name holds the token the environment carries."""
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    root = tmp_path / f"runs-{TOKEN}"
    root.mkdir()
    return root


@pytest.fixture(scope="module", autouse=True)
def _config_with_hub_token(tmp_path_factory):
    """CONFIG with ``train.hub_token`` set in the file, where a secret may be (a command line refuses it)."""
    global CONFIG_FILE
    CONFIG_FILE = tmp_path_factory.mktemp("config") / "post_text_hub.yaml"
    CONFIG_FILE.write_text((ROOT / "configs" / CONFIG).read_text().replace("\ntrain:\n",
                                                                          f"\ntrain:\n  hub_token: {HUB}\n", 1))


CONFIG_FILE = ROOT / "configs" / CONFIG


def overrides(out, model, *extra) -> list[str]:
    return ["--config", str(CONFIG_FILE), f"run.output_dir={out}", f"model.name_or_path={model}",
            f"data.swap_dataset={ASSETS / 'swap_tiny.jsonl'}", f"data.llava_json={ASSETS / 'llava_tiny.json'}",
            f"data.llava_image_root={ASSETS / 'images'}", "gap_eval.bench=null", *extra]


def run_script(capfd, argv: list[str]) -> tuple[int, str, str]:
    """``python recipes/post_train.py ARGV``'s exit status, stdout and stderr, run in this process."""
    capfd.readouterr()
    saved = sys.argv
    sys.argv = [str(RECIPE), *argv]
    try:
        runpy.run_path(str(RECIPE), run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
    finally:
        sys.argv = saved
    out, err = capfd.readouterr()
    return code, out, err


def assert_ends(result, code: int, line: str, stream: str = "err") -> None:
    """Exit ``code``, ``line`` (its start) on one line of ``stream``, no traceback, no secret in any output."""
    got, out, err = result
    said = out + err
    assert got == code, said[-3000:]
    leaks = [s for s in SECRETS if s in said]
    assert not leaks, f"secret printed: {leaks}\n{said[-3000:]}"
    lines = (err if stream == "err" else out).splitlines()
    assert any(x.startswith(line) for x in lines), f"no line starting {line!r} in:\n{said[-3000:]}"
    if stream == "err" and code:
        errors = [x for x in err.splitlines() if x.startswith("error: ")]
        assert len(errors) == 1 and "Traceback" not in err, err[-3000:]


@pytest.fixture(scope="module")
def trained(load_recipe, tiny_qwen2vl, tmp_path_factory):
    """A finished 2-step run of the tiny text arm (a real checkpoint-2 to copy and damage)."""
    from tokenswap.config import load_config

    post = load_recipe("post_train")
    out = tmp_path_factory.mktemp("trained") / "run"
    post.main(load_config(post.PostTrainConfig, CONFIG, overrides(out, tiny_qwen2vl, "train.max_steps=2")[2:]))
    return out


def copy_checkpoint(trained: Path, where: Path) -> Path:
    ckpt = where / "checkpoint-2"
    shutil.copytree(trained / "checkpoint-2", ckpt)
    return ckpt


# ---------------------------------------------------------------------------- the command line and the config
def test_help_is_exit_0_and_lists_the_fields(planted, tiny_qwen2vl, capfd):
    assert_ends(run_script(capfd, ["--help"]), 0, "PostTrainConfig fields:", "out")


def test_a_hub_token_on_the_command_line_is_refused_without_being_printed(planted, tiny_qwen2vl, capfd):
    result = run_script(capfd, [*overrides(planted / "run", tiny_qwen2vl), f"train.hub_token={HUB}x"])
    assert_ends(result, 2, "error: ")
    assert "`train.hub_token` on the command line" in result[2] and "set HF_TOKEN" in result[2]
    assert HUB[:12] not in result[1] + result[2] and not (planted / "run").exists()


def test_a_config_problem(planted, tiny_qwen2vl, capfd):
    result = run_script(capfd, overrides(planted / "run", tiny_qwen2vl, f"data.seed={TOKEN}"))
    assert_ends(result, 2, f"error: 1 problem in {CONFIG_FILE}: `data.seed` must be int | None, got '{MASK}'")


def test_a_config_file_not_found(planted, tiny_qwen2vl, capfd):
    argv = overrides(planted / "run", tiny_qwen2vl)
    argv[1] = str(planted / "mine.yaml")
    assert_ends(run_script(capfd, argv), 2, f"error: config '{masked(planted / 'mine.yaml')}' not found as a path")


# ---------------------------------------------------------------------------- the run's inputs (check_inputs)
def test_a_model_path_that_does_not_exist(planted, capfd):
    result = run_script(capfd, overrides(planted / "run", planted / "no-model"))
    assert_ends(result, 2, "error: 1 problem in the run inputs: ")
    assert masked(planted / "no-model") in result[2]


def test_a_model_url_with_credentials(planted, capfd):
    result = run_script(capfd, overrides(planted / "run", f"https://ann:{PASSWORD}@hub.example/m"))
    assert_ends(result, 2, "error: 1 problem in command line: `model.name_or_path` on the command line is a URL "
                           "carrying a user or password")


def test_fp16_on_cpu(planted, tiny_qwen2vl, capfd):
    result = run_script(capfd, overrides(planted / "run", tiny_qwen2vl, "train.fp16=true", "train.bf16=false"))
    assert_ends(result, 2, "error: train.fp16 needs a CUDA GPU and this run has none")


@pytest.mark.skipif(__import__("importlib").util.find_spec("liger_kernel") is not None, reason="liger is installed")
def test_liger_without_its_package(planted, tiny_qwen2vl, capfd):
    result = run_script(capfd, overrides(planted / "run", tiny_qwen2vl, "train.use_liger_kernel=true"))
    assert_ends(result, 2, "error: train.use_liger_kernel needs liger-kernel: pip install 'tokenswap[gpu]'")


def test_a_value_the_trainer_rejects(planted, tiny_qwen2vl, capfd):
    result = run_script(capfd, overrides(planted / "run", tiny_qwen2vl, "train.load_best_model_at_end=true",
                                         "train.save_strategy=epoch"))
    assert_ends(result, 2, "error: 1 problem in train (TrainingArguments): train: ")


# ---------------------------------------------------------------------------- the run folder
@pytest.mark.integration
def test_a_run_folder_held_by_another_run(planted, tiny_qwen2vl, capfd):
    out = planted / "run"
    code = (f"from tokenswap.training import hold_output_dir; hold_output_dir({str(out)!r}); "
            "print('held', flush=True); import time; time.sleep(600)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout.readline().strip() == "held"
        result = run_script(capfd, overrides(out, tiny_qwen2vl))
    finally:
        holder.kill()
        holder.wait()
    assert_ends(result, 1, f"error: {masked(out)} is used by a training run by another process (pid {holder.pid} ")


def test_a_run_folder_whose_lock_file_cannot_be_made(planted, tiny_qwen2vl, capfd):
    out = planted / "run"
    (out / ".train-lock-r000").mkdir(parents=True)
    result = run_script(capfd, overrides(out, tiny_qwen2vl))
    assert_ends(result, 2, f"error: {masked(out / '.train-lock-r000')} is a folder where the lock file goes")


# ---------------------------------------------------------------------------- the checkpoint resumed from
@pytest.mark.integration
def test_an_explicit_checkpoint_that_is_not_complete(planted, tiny_qwen2vl, trained, capfd):
    ckpt = copy_checkpoint(trained, planted / "old")
    (ckpt / "tokenswap_complete.json").unlink()
    result = run_script(capfd, overrides(planted / "run", tiny_qwen2vl, f"train.resume_from_checkpoint={ckpt}"))
    assert_ends(result, 2, f"error: `resume_from_checkpoint` {masked(ckpt)} is not a complete tokenswap checkpoint: "
                           "missing tokenswap_complete.json")


@pytest.mark.integration
def test_a_checkpoint_without_its_weights(planted, tiny_qwen2vl, trained, capfd):
    ckpt = copy_checkpoint(trained, planted / "old")
    (ckpt / "model.safetensors").unlink()
    result = run_script(capfd, overrides(planted / "run", tiny_qwen2vl, f"train.resume_from_checkpoint={ckpt}"))
    assert_ends(result, 2, f"error: `resume_from_checkpoint` {masked(ckpt)} holds no model weights")


class _Payload:
    def __init__(self, flag):
        self.flag = flag

    def __reduce__(self):
        return (os.makedirs, (str(self.flag),))


@pytest.mark.integration
def test_a_tampered_checkpoint_file(planted, tiny_qwen2vl, trained, capfd, tmp_path):
    import torch

    ckpt = copy_checkpoint(trained, planted / "old")
    torch.save({"state": _Payload(tmp_path / "payload-ran")}, ckpt / "rng_state.pth")
    result = run_script(capfd, overrides(planted / "run", tiny_qwen2vl, f"train.resume_from_checkpoint={ckpt}"))
    assert_ends(result, 2, f"error: {masked(ckpt / 'rng_state.pth')} is not a safe checkpoint file: it asks to import "
                           "os.makedirs")
    assert not (tmp_path / "payload-ran").exists()


@pytest.mark.integration
def test_a_damaged_checkpoint_file(planted, tiny_qwen2vl, trained, capfd):
    ckpt = copy_checkpoint(trained, planted / "old")
    (ckpt / "trainer_state.json").write_text('{"cut')
    result = run_script(capfd, overrides(planted / "run", tiny_qwen2vl, f"train.resume_from_checkpoint={ckpt}"))
    assert_ends(result, 2, f"error: {masked(ckpt / 'trainer_state.json')} is damaged (JSONDecodeError: ")


@pytest.mark.integration
def test_a_run_config_that_is_not_json(planted, tiny_qwen2vl, trained, capfd):
    ckpt = copy_checkpoint(trained, planted / "old")
    (ckpt / "tokenswap_config.json").unlink()  # then the run folder's copy is the record
    (ckpt.parent / "tokenswap_config.json").write_text('{"cut')
    result = run_script(capfd, overrides(planted / "run", tiny_qwen2vl, f"train.resume_from_checkpoint={ckpt}"))
    assert_ends(result, 2, f"error: {masked(ckpt.parent / 'tokenswap_config.json')} is not valid JSON")


@pytest.mark.integration
def test_a_resume_with_other_settings(planted, tiny_qwen2vl, trained, capfd):
    ckpt = copy_checkpoint(trained, planted / "old")
    result = run_script(capfd, overrides(planted / "run", tiny_qwen2vl, f"train.resume_from_checkpoint={ckpt}",
                                         f"run.pair=pair-{TOKEN}"))
    assert_ends(result, 2, f"error: {masked(ckpt)} was trained with other settings (run.pair: was 'tiny-post', now "
                           f"'pair-{MASK}')")


@pytest.mark.integration
def test_a_checkpoint_whose_sample_log_is_gone(planted, tiny_qwen2vl, trained, capfd):
    ckpt = copy_checkpoint(trained, planted / "old")  # of another folder, without that folder's log
    result = run_script(capfd, overrides(planted / "run", tiny_qwen2vl, f"train.resume_from_checkpoint={ckpt}",
                                         "train.max_steps=4"))
    assert_ends(result, 2, f"error: {masked(ckpt / 'tokenswap_state.rank0.json')} records ")
    assert f"bytes of {masked(ckpt.parent / 'sample_ids.rank0.txt')}, but that log does not exist" in result[2]


# ---------------------------------------------------------------------------- training and saving
def test_a_run_whose_steps_have_nothing_to_learn(planted, tiny_qwen2vl, capfd):
    out = planted / "run"
    with pytest.warns(UserWarning, match="skipped"):
        result = run_script(capfd, overrides(out, tiny_qwen2vl, "collator.max_chars_per_sample=1"))
    assert_ends(result, 1, "error: step 1 of 4 had no target token on any rank")


def test_a_checkpoint_save_that_fails(planted, tiny_qwen2vl, capfd):
    out = planted / "run"
    out.mkdir()
    (out / "checkpoint-1").write_text("a file where the checkpoint folder goes")
    result = run_script(capfd, overrides(out, tiny_qwen2vl, "train.max_steps=1", "train.save_steps=1"))
    assert_ends(result, 1, f"error: saving {masked(out / 'checkpoint-1')} failed while writing ")


@pytest.mark.integration
def test_the_final_save_that_fails(planted, tiny_qwen2vl, capfd):
    out = planted / "run"
    (out / "model.safetensors").mkdir(parents=True)  # a folder where the trained weights go
    result = run_script(capfd, overrides(out, tiny_qwen2vl, "train.max_steps=1", "train.save_steps=1"))
    assert_ends(result, 1, f"error: saving the trained model into {masked(out)} failed while writing ")


def test_a_sigterm_stop(planted, tiny_qwen2vl, capfd, monkeypatch):
    out = planted / "run"
    monkeypatch.setenv(FAULT_PAUSE_ENV, "3@1")  # the signal lands while step 1 is saved: the run stops after step 2
    marker = out / "checkpoint-1" / "trainer_state.json"

    ended = threading.Event()

    def signal_when_saving():
        # Waits on the run's state, not a clock; a run that ends before it saves (a refusal) is not signalled,
        # so this process is never sent a SIGTERM outside the run.
        while not marker.exists() and not ended.wait(0.05):
            pass
        if not ended.is_set():
            os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=signal_when_saving, daemon=True)
    thread.start()
    try:
        result = run_script(capfd, overrides(out, tiny_qwen2vl, "train.save_steps=1"))
    finally:
        ended.set()
        thread.join()
    assert_ends(result, PREEMPTED_EXIT, f"[tokenswap] stopped by SIGTERM after step 2: {masked(out / 'checkpoint-2')} "
                                        "is complete", "out")
    assert "error: " not in result[2]


# ---------------------------------------------------------------------------- a launch of two processes
@pytest.mark.integration
def test_a_two_rank_launch_on_a_held_folder_ends_on_both_ranks_with_exit_1(planted, tiny_qwen2vl, free_port):
    out = planted / "run"
    code = (f"from tokenswap.training import hold_output_dir; hold_output_dir({str(out)!r}); "
            "print('held', flush=True); import time; time.sleep(600)")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "held"
        launch = subprocess.run(
            [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
             str(ROOT / "configs/accelerate/cpu_2proc.yaml"), "--main_process_port", str(free_port), str(RECIPE),
             *overrides(out, tiny_qwen2vl)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    finally:
        holder.kill()
        holder.wait()
    said = launch.stdout + launch.stderr
    assert launch.returncode == 1, said[-3000:]
    assert not [s for s in SECRETS if s in said], said[-3000:]
    errors = [x for x in said.splitlines() if "error: " in x and "Traceback" not in x]
    # rank 0 names the holder; rank 1 ends with the same status, pointing at rank 0's line (before: silently)
    assert any(x.startswith(f"error: {masked(out)} is used by a training run by another process (pid {holder.pid} ")
               for x in errors), said[-3000:]
    assert any(x.startswith(f"error: rank 0 could not take {masked(out)} for this run") for x in errors), said[-3000:]
    assert not (out / "tokenswap_config.json").exists()  # the refused launch wrote nothing
