"""A training run's folder under hostile conditions: a second run on it, kills in the save window, SIGTERM,
changed settings on resume, secrets, weights-only checkpoints, damaged or tampered checkpoints, a full disk.

Real runs of ``recipes/post_train.py`` on the tiny config (in-process, or as a subprocess where a signal or a
second process is the point).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest
import torch

from tests.support import process_group_left
from tokenswap.config import load_config
from tokenswap.training import COMPLETE_MARKER, PREEMPTED_EXIT, run_recipe
from tokenswap.training.checkpoint import FAULT_PAUSE_ENV

# Every test here starts a process, a server or a training run (make check skips them).
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "tests" / "assets"
CONFIG = "tiny/post_tokenswap.yaml"


def overrides(out, model, store, *extra):
    return [f"run.output_dir={out}", f"model.name_or_path={model}", f"data.swap_dataset={ASSETS / 'swap_tiny.jsonl'}",
            f"data.llava_json={ASSETS / 'llava_tiny.json'}", f"data.llava_image_root={ASSETS / 'images'}",
            f"image_store={store}", "gap_eval.bench=null", *extra]


def logs(out: Path) -> dict:
    """What an exact resume must reproduce: losses, the sample-id log, the swap statistics (no cache counters)."""
    history = json.loads((out / "log_history.json").read_text())
    stats = json.loads((out / "swap_stats.json").read_text())
    return {"losses": [round(h["loss"], 5) for h in history if "loss" in h],
            "ids": (out / "sample_ids.rank0.txt").read_text(),
            "stats": {k: v for k, v in stats.items() if k != "image_decodes"}}


@pytest.fixture(scope="module")
def post(load_recipe):
    return load_recipe("post_train")


@pytest.fixture(scope="module")
def reference(post, tiny_qwen2vl, tiny_store, tmp_path_factory):
    """An uninterrupted 4-step run (checkpoints at 2 and 4)."""
    out = tmp_path_factory.mktemp("reference") / "run"
    post.main(load_config(post.PostTrainConfig, CONFIG, overrides(out, tiny_qwen2vl, tiny_store.root)))
    return out


def run_main(post, out, model, store, *extra):
    post.main(load_config(post.PostTrainConfig, CONFIG, overrides(out, model, store, *extra)))


def run_entry(post, out, model, store, *extra):
    """The recipe as its ``__main__`` runs it: a refusal is one line on stderr and ``SystemExit`` with its status."""
    run_recipe(post.main, post.PostTrainConfig, ["--config", CONFIG, *overrides(out, model, store, *extra)])


def launch(out, model, store, *extra, env=None, config=CONFIG, **kw) -> subprocess.Popen:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT), **(env or {})}
    cmd = [sys.executable, str(ROOT / "recipes" / "post_train.py"), "--config", str(config),
           *overrides(out, model, store, *extra)]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def wait_for_line(proc: subprocess.Popen, text: str, timeout: float = 300) -> list[str]:
    lines = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        lines.append(line)
        if text in line:
            return lines
    proc.kill()
    raise AssertionError(f"never saw {text!r}; output: {''.join(lines)[-3000:]}")


# ---------------------------------------------------------------------------- one run per folder
def test_a_second_run_on_a_busy_output_dir_exits_1_naming_the_holder(post, tiny_qwen2vl, tiny_store, reference,
                                                                      tmp_path, capsys):
    out = tmp_path / "run"
    first = launch(out, tiny_qwen2vl, tiny_store.root, env={FAULT_PAUSE_ENV: "120@2"})
    try:
        wait_for_line(first, "checkpoint-2 has trainer_state.json")  # the first run is mid-way, holding the folder
        ids_before = (out / "sample_ids.rank0.txt").read_bytes()
        for extra in ((), ("run.arm=text",)):  # the same config, and another arm into the same folder
            with pytest.raises(SystemExit) as e:
                run_entry(post, out, tiny_qwen2vl, tiny_store.root, *extra)
            err = capsys.readouterr().err
            assert e.value.code == 1, err
            assert f"{out} is used by a training run by another process (pid {first.pid} on host " \
                   f"{socket.gethostname()} since " in err
        # the refused runs wrote nothing: the first run's log and config are its own
        assert (out / "sample_ids.rank0.txt").read_bytes() == ids_before
        assert json.loads((out / "tokenswap_config.json").read_text())["run"]["arm"] == "tokenswap"
    finally:
        first.kill()
        first.wait()
    # a killed holder locks nobody out: the next run takes the folder at once and resumes exactly
    run_main(post, out, tiny_qwen2vl, tiny_store.root, "train.resume_from_checkpoint=latest")
    assert logs(out) == logs(reference)


# ---------------------------------------------------------------------------- the trainer_state.json window
def test_a_kill_after_trainer_state_before_tokenswaps_record_is_skipped_and_resumes_exactly(
        post, tiny_qwen2vl, tiny_store, reference, tmp_path, capsys):
    out = tmp_path / "run"
    proc = launch(out, tiny_qwen2vl, tiny_store.root, env={FAULT_PAUSE_ENV: "120@4"})
    wait_for_line(proc, "checkpoint-4 has trainer_state.json")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    cut = out / "checkpoint-4"
    assert (cut / "trainer_state.json").is_file() and (cut / "model.safetensors").is_file()
    assert not (cut / COMPLETE_MARKER).exists() and not (cut / "tokenswap_state.rank0.json").exists()
    run_main(post, out, tiny_qwen2vl, tiny_store.root, "train.resume_from_checkpoint=latest")
    said = capsys.readouterr().out
    assert f"{cut} is incomplete (no {COMPLETE_MARKER}" in said
    assert logs(out) == logs(reference)  # 16 samples counted, not the 8 of a resume with empty bookkeeping


def test_an_explicit_checkpoint_without_tokenswaps_record_exits_2_naming_what_is_missing(
        post, tiny_qwen2vl, tiny_store, reference, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(reference / "checkpoint-2", tmp_path / "copy" / "checkpoint-2")
    cut = tmp_path / "copy" / "checkpoint-2"
    (cut / COMPLETE_MARKER).unlink()
    with pytest.raises(SystemExit) as e:
        run_entry(post, out, tiny_qwen2vl, tiny_store.root, f"train.resume_from_checkpoint={cut}")
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"`resume_from_checkpoint` {cut} is not a complete tokenswap checkpoint: missing " \
                                  f"{COMPLETE_MARKER}" in err


# ---------------------------------------------------------------------------- SIGTERM
def test_sigterm_saves_a_complete_checkpoint_exits_143_and_resumes_exactly(post, tiny_qwen2vl, tiny_store,
                                                                           reference, tmp_path):
    out = tmp_path / "run"
    # The signal arrives while step 2 is being saved (held open 3 s): the run must stop at the end of step 3.
    proc = launch(out, tiny_qwen2vl, tiny_store.root, env={FAULT_PAUSE_ENV: "3@2"})
    wait_for_line(proc, "checkpoint-2 has trainer_state.json")
    proc.send_signal(signal.SIGTERM)
    rest = proc.communicate(timeout=300)[0]
    assert proc.returncode == PREEMPTED_EXIT, rest[-3000:]
    assert "stopped by SIGTERM after step 3" in rest
    assert (out / "checkpoint-3" / COMPLETE_MARKER).is_file() and not (out / "checkpoint-4").exists()
    assert not (out / "log_history.json").exists()  # not dressed up as a finished run
    run_main(post, out, tiny_qwen2vl, tiny_store.root, "train.resume_from_checkpoint=latest")
    assert logs(out) == logs(reference)


# ---------------------------------------------------------------------------- changed settings on resume
def test_a_resume_with_changed_settings_exits_2_naming_each_difference(post, tiny_qwen2vl, tiny_store, tmp_path,
                                                                       capsys):
    out = tmp_path / "run"
    run_main(post, out, tiny_qwen2vl, tiny_store.root, "train.max_steps=2")
    saved = (out / "tokenswap_config.json").read_text()
    changed = ("collator.swap_prob=0.5", "data.seed=3", "collator.max_length=256", "run.arm=text")
    with pytest.raises(SystemExit) as e:
        run_entry(post, out, tiny_qwen2vl, tiny_store.root, "train.resume_from_checkpoint=latest", *changed)
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    for difference in ("collator.swap_prob: was 1.0, now 0.5", "data.seed: was 0, now 3",
                       "collator.max_length: was 512, now 256", "run.arm: was 'tokenswap', now 'text'"):
        assert difference in err
    assert "train.max_steps" not in err.split("A resume may change only")[0]  # extending the run is allowed
    assert (out / "tokenswap_config.json").read_text() == saved  # the run's record still names its settings
    # what may change does: a longer run, other logging and save intervals, more workers
    run_main(post, out, tiny_qwen2vl, tiny_store.root, "train.resume_from_checkpoint=latest", "train.max_steps=4",
             "train.save_steps=1", "train.logging_steps=2", "train.dataloader_num_workers=1")
    assert (out / "checkpoint-4" / COMPLETE_MARKER).is_file()


# ---------------------------------------------------------------------------- secrets
def test_secret_fields_are_masked_in_every_file_and_log_tokenswap_writes(post, tiny_qwen2vl, tiny_store, tmp_path,
                                                                         capfd, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    out = tmp_path / "run"
    secret = "hf_SECRETsecret0123456789"
    run_main(post, out, tiny_qwen2vl, tiny_store.root, "train.max_steps=2", f"train.hub_token={secret}",
             "train.report_to=[wandb]", "wandb.mode=offline")
    said = capfd.readouterr()
    assert secret not in said.out + said.err
    assert json.loads((out / "tokenswap_config.json").read_text())["train"]["hub_token"] == "<HUB_TOKEN>"
    # the offline W&B run (what `wandb sync` uploads) holds the run config, masked
    (run_file,) = (out / "wandb").glob("offline-run-*/run-*.wandb")
    deadline = time.monotonic() + 30
    while b"<HUB_TOKEN>" not in run_file.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.5)  # W&B's service process writes the run file behind the run
    assert b"<HUB_TOKEN>" in run_file.read_bytes()
    # training_args.bin too: the Trainer keeps the real token in memory (hub pushes need it), its pickles are masked
    leaks = [str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert not leaks


def test_no_secret_of_the_config_reaches_wandb_or_the_pickled_arguments(tiny_qwen2vl, tiny_store, tmp_path):
    """A real offline W&B run whose YAML holds ``train.hub_token`` and a ``user:pass@`` URL in a Trainer field (a
    command line may not: it is refused): the Trainer's callback records its arguments in W&B; neither they nor
    any ``training_args.bin`` may hold the secrets, and the run resumes from its checkpoint as before."""
    token, password = "hf_CommandLineToken0123456789", "Url-Pa55word-4242"
    url = f"https://alice:{password}@hub.example.com/org/model"
    config = tmp_path / "with_secrets.yaml"
    config.write_text((ROOT / "configs" / CONFIG).read_text().replace(
        "\ntrain:\n", f"\ntrain:\n  hub_token: {token}\n  hub_model_id: {url}\n", 1))
    out = tmp_path / "run"
    env = {"WANDB_MODE": "offline"}
    secrets = ("train.report_to=[wandb]", "wandb.mode=offline")
    proc = launch(out, tiny_qwen2vl, tiny_store.root, "train.max_steps=2", *secrets, env=env, config=config)
    said, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, said[-3000:]
    (run_file,) = (out / "wandb").glob("offline-run-*/run-*.wandb")
    raw = run_file.read_bytes()
    assert b"wandb.mode=offline" in raw  # W&B did record the command line, which holds no secret
    assert b"https://<CREDENTIALS>@hub.example.com/org/model" in raw  # and the Trainer's arguments: masked
    assert (run_file.parent / "logs" / "debug.log").is_file()
    # Resume from the checkpoint (nothing reads training_args.bin back) to the end of a longer run.
    proc = launch(out, tiny_qwen2vl, tiny_store.root, "train.max_steps=4", "train.resume_from_checkpoint=latest",
                  *secrets, env=env, config=config)
    said2, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, said2[-3000:]
    assert (out / "checkpoint-4" / COMPLETE_MARKER).is_file()
    pickles = sorted(out.glob("**/training_args.bin"))
    assert len(pickles) == 3  # checkpoint-2, checkpoint-4 and the final model's
    for path in pickles:
        args = torch.load(path, weights_only=False)
        assert (args.hub_token, args.hub_model_id) == ("<HUB_TOKEN>", "https://<CREDENTIALS>@hub.example.com/org/model")
    forms = [token, password, urllib.parse.quote(password), token[:12], password[:10]]
    leaks = [f"{p.relative_to(out)}: {f}" for p in out.rglob("*") if p.is_file() for f in forms
             if f.encode() in p.read_bytes()]
    assert not leaks and not [f for f in forms if f in said + said2]


# ---------------------------------------------------------------------------- weights-only checkpoints
def test_a_save_only_model_resume_says_it_restarts_the_optimizer(post, tiny_qwen2vl, tiny_store, tmp_path, capsys):
    out = tmp_path / "run"
    run_main(post, out, tiny_qwen2vl, tiny_store.root, "train.max_steps=2", "train.save_only_model=true")
    capsys.readouterr()
    run_main(post, out, tiny_qwen2vl, tiny_store.root, "train.resume_from_checkpoint=latest",
             "train.save_only_model=true")
    said = capsys.readouterr().out
    assert "holds the weights only" in said and "will not equal an uninterrupted run" in said
    assert "restores optimizer, scheduler and RNG state" not in said


# ---------------------------------------------------------------------------- damaged or tampered checkpoints
class _Payload:
    def __init__(self, flag: Path):
        self.flag = flag

    def __reduce__(self):
        return (os.makedirs, (str(self.flag),))


@pytest.mark.parametrize("damage", ["planted-pickle", "truncated-safetensors", "torn-trainer-state",
                                    "truncated-optimizer"])
def test_a_damaged_or_tampered_checkpoint_exits_2_naming_the_file(post, tiny_qwen2vl, tiny_store, reference,
                                                                  tmp_path, capsys, damage):
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    for name in ("log_history.json", "swap_stats.json"):
        (out / name).unlink()
    ckpt = out / "checkpoint-4"
    flag = tmp_path / "payload-ran"
    file = {"planted-pickle": "optimizer.pt", "truncated-safetensors": "model.safetensors",
            "torn-trainer-state": "trainer_state.json", "truncated-optimizer": "optimizer.pt"}[damage]
    if damage == "planted-pickle":
        torch.save({"state": _Payload(flag)}, ckpt / file)
    else:
        data = (ckpt / file).read_bytes()
        (ckpt / file).write_bytes(data[: len(data) // 2])
    with pytest.raises(SystemExit) as e:
        run_entry(post, out, tiny_qwen2vl, tiny_store.root, "train.resume_from_checkpoint=latest")
    err = capsys.readouterr().err
    assert e.value.code == 2 and str(ckpt / file) in err, err
    assert "Traceback" not in err
    if damage == "planted-pickle":
        assert "is not a safe checkpoint file: it asks to import os.makedirs" in err
        assert "weights_only" not in err  # torch's advice to retry with weights_only=False would run the payload
        assert not flag.exists()  # the payload never ran


# ---------------------------------------------------------------------------- a full disk during a save
def _tmpfs(path: Path, size: int) -> bool:
    path.mkdir(parents=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


@pytest.mark.compat
def test_a_full_disk_during_a_save_names_the_disk_and_file_and_the_partial_checkpoint_is_skipped(
        post, tiny_qwen2vl, tiny_store, reference, tmp_path):
    # Room for the run up to checkpoint-2 and half of checkpoint-4: a real ENOSPC from a small tmpfs.
    used_by_2 = sum(p.stat().st_size for p in (reference / "checkpoint-2").rglob("*") if p.is_file())
    disk = tmp_path / "disk"
    if not _tmpfs(disk, used_by_2 + used_by_2 // 2):
        pytest.skip("needs root and mount -t tmpfs for a real full disk")
    try:
        out = disk / "run"
        proc = launch(out, tiny_qwen2vl, tiny_store.root, "train.save_total_limit=null")
        said = proc.communicate(timeout=300)[0]
        assert proc.returncode == 1, said[-3000:]
        assert "No space left on device" in said and f"saving {out / 'checkpoint-4'} failed while writing " \
                                                     f"{out / 'checkpoint-4'}/" in said
        assert f"disk of {out}" in said and "unexpected pos" not in said.split("error: saving")[-1]
        moved = tmp_path / "moved"
        shutil.copytree(out, moved)
    finally:
        subprocess.run(["umount", str(disk)], check=False)
    run_main(post, moved, tiny_qwen2vl, tiny_store.root, "train.resume_from_checkpoint=latest")
    assert logs(moved) == logs(reference)


@pytest.mark.compat
def test_with_save_total_limit_1_a_kill_in_the_save_window_keeps_the_last_complete_checkpoint(
        post, tiny_qwen2vl, tiny_store, reference, tmp_path, capsys):
    # The Trainer deletes old checkpoints at the end of its own save, before tokenswap's record: the rotation must
    # wait for the record, or a kill in that window leaves nothing complete to resume from.
    out = tmp_path / "run"
    proc = launch(out, tiny_qwen2vl, tiny_store.root, "train.save_total_limit=1", env={FAULT_PAUSE_ENV: "120@4"})
    wait_for_line(proc, "checkpoint-4 has trainer_state.json")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (out / "checkpoint-2" / COMPLETE_MARKER).is_file()
    run_main(post, out, tiny_qwen2vl, tiny_store.root, "train.resume_from_checkpoint=latest",
             "train.save_total_limit=1")
    assert f"weights loaded from {out / 'checkpoint-2'}" in capsys.readouterr().out
    assert logs(out) == logs(reference)
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4"]  # the limit still holds


def test_sigterm_to_the_whole_job_with_dataloader_workers_still_saves_and_resumes_exactly(
        post, tiny_qwen2vl, tiny_store, reference, tmp_path):
    # Slurm signals every process of the job: the forked data-loader workers get SIGTERM too, and must keep serving
    # batches until the trainer has finished its step and saved.
    out = tmp_path / "run"
    proc = launch(out, tiny_qwen2vl, tiny_store.root, "train.dataloader_num_workers=2", env={FAULT_PAUSE_ENV: "3@2"},
                  start_new_session=True)
    wait_for_line(proc, "checkpoint-2 has trainer_state.json")
    os.killpg(proc.pid, signal.SIGTERM)
    rest = proc.communicate(timeout=300)[0]
    assert proc.returncode == PREEMPTED_EXIT, rest[-3000:]
    assert rest.count("[tokenswap] SIGTERM: saving a checkpoint") == 1  # said by the trainer, not by each worker
    assert (out / "checkpoint-3" / COMPLETE_MARKER).is_file()
    run_main(post, out, tiny_qwen2vl, tiny_store.root, "train.resume_from_checkpoint=latest",
             "train.dataloader_num_workers=2")
    assert logs(out) == logs(reference)


# ---------------------------------------------------------------------------- runs that end (issue 32)
def _children(pid: int) -> list[int]:
    kids = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            kids += [int(k) for k in f.read().split()]
    return kids


def _finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    """The rest of ``proc``'s output once it exited; its group killed and the test failed if it hangs."""
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"the run was still alive {timeout:g} s later: {proc.communicate()[0][-3000:]}") from None


def test_a_run_with_persistent_workers_ends_with_its_workers(tiny_qwen2vl, tiny_store, tmp_path):
    # The persistent loader keeps its workers (which ignore SIGTERM) after training; at exit multiprocessing's
    # SIGTERM-then-wait never ended: the run printed "done" and held the folder lock for ever.
    out = tmp_path / "run"
    proc = launch(out, tiny_qwen2vl, tiny_store.root, "train.max_steps=2", "train.dataloader_num_workers=2",
                  "train.dataloader_persistent_workers=true", start_new_session=True)
    said = _finish(proc)
    assert proc.returncode == 0 and f"[post_train] done: {out}" in said, said[-3000:]
    assert process_group_left(proc.pid) == []  # no worker outlives the run, not even as a zombie


def test_a_recipe_called_in_process_leaves_no_worker_behind(load_recipe, tiny_qwen2vl, tiny_store, tmp_path):
    import multiprocessing

    pre = load_recipe("pretrain")
    pre.main(load_config(pre.PretrainConfig, "tiny/pretrain_tokenswap.yaml", [
        f"run.output_dir={tmp_path / 'run'}", f"model.name_or_path={tiny_qwen2vl}", f"image_store={tiny_store.root}",
        f"data.swap_dataset={ASSETS / 'swap_tiny.jsonl'}", "train.max_steps=1", "train.save_steps=1",
        "train.dataloader_num_workers=2", "train.dataloader_persistent_workers=true"]))
    assert multiprocessing.active_children() == []


def test_sigterm_to_the_whole_job_before_the_first_batch_saves_exits_143_and_resumes_exactly(
        post, tiny_qwen2vl, tiny_store, reference, tmp_path):
    # Each worker holds its first batch until the job's SIGTERM is pending for it: the signal lands in the workers'
    # start, before torch's handler (which dies of any SIGTERM not its parent's) could be replaced.
    from tokenswap.training.workers import FAULT_WORKER_HOLD_ENV

    out = tmp_path / "run"
    proc = launch(out, tiny_qwen2vl, tiny_store.root, "train.dataloader_num_workers=2",
                  env={FAULT_WORKER_HOLD_ENV: "120"}, start_new_session=True)
    before = wait_for_line(proc, "waits for a SIGTERM before its first batch")
    os.killpg(proc.pid, signal.SIGTERM)
    said = "".join(before) + _finish(proc)
    assert proc.returncode == PREEMPTED_EXIT, said[-3000:]
    assert "Traceback" not in said and "exited unexpectedly" not in said
    assert said.count("[tokenswap] SIGTERM: saving a checkpoint") == 1
    assert "stopped by SIGTERM after step 1" in said
    assert (out / "checkpoint-1" / COMPLETE_MARKER).is_file()
    assert process_group_left(proc.pid) == []  # no orphan worker
    run_main(post, out, tiny_qwen2vl, tiny_store.root, "train.resume_from_checkpoint=latest")
    assert logs(out) == logs(reference)


def test_a_sigkill_of_a_run_with_workers_frees_the_folder_at_once(tiny_qwen2vl, tiny_store, tmp_path):
    from tokenswap.files import FolderLock
    from tokenswap.training.run_folder import LOCK_PREFIX

    out = tmp_path / "run"
    proc = launch(out, tiny_qwen2vl, tiny_store.root, "train.dataloader_num_workers=2", env={FAULT_PAUSE_ENV: "120@2"},
                  start_new_session=True)
    try:
        wait_for_line(proc, "checkpoint-2 has trainer_state.json")  # mid-run: the workers are serving batches
        workers = _children(proc.pid)
        assert len(workers) >= 2
        # By inode: the holder's descriptor was opened under the tagged temporary's name, linked into place.
        lock = os.stat(out / f"{LOCK_PREFIX}-r000")
        held = [os.stat(f"/proc/{proc.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{proc.pid}/fd")]
        assert (lock.st_dev, lock.st_ino) in [(s.st_dev, s.st_ino) for s in held]  # the check can see a holder
        for pid in workers:  # the workers dropped their copy of the lock right after the fork
            assert (lock.st_dev, lock.st_ino) not in [(s.st_dev, s.st_ino) for s in
                                                      (os.stat(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd"))]
        proc.kill()
        proc.wait()
        # The first try, right after the holder died (its orphaned workers may still be alive), gets the lock.
        FolderLock(out, 0, prefix=LOCK_PREFIX).acquire().release()
    finally:
        with contextlib.suppress(ProcessLookupError):  # the orphaned workers, if still there
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


# ---------------------------------------------------------------------------- resume edges and final-save errors (issue 32)
def test_a_checkpoint_without_its_weights_exits_2_naming_them_and_latest_skips_it(post, tiny_qwen2vl, tiny_store,
                                                                                    reference, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    for name in ("log_history.json", "swap_stats.json"):
        (out / name).unlink()
    (out / "checkpoint-4" / "model.safetensors").unlink()
    with pytest.raises(SystemExit) as e:
        run_entry(post, tmp_path / "other", tiny_qwen2vl, tiny_store.root,
                  f"train.resume_from_checkpoint={out / 'checkpoint-4'}")
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"`resume_from_checkpoint` {out / 'checkpoint-4'} holds no model weights (none of " \
                                  "model.safetensors, " in err
    assert "Traceback" not in err and "Restore them, or resume from another checkpoint-N" in err
    # `latest` says so and resumes from the older complete checkpoint, exactly
    run_main(post, out, tiny_qwen2vl, tiny_store.root, "train.resume_from_checkpoint=latest")
    assert f"{out / 'checkpoint-4'} holds no model weights" in capsys.readouterr().out
    assert logs(out) == logs(reference)


def test_a_checkpoint_of_another_run_resumes_exactly_into_a_fresh_folder(post, tiny_qwen2vl, tiny_store, reference,
                                                                        tmp_path, capsys):
    # run.output_dir may change on resume (RESUME_MAY_CHANGE): the checkpoint's own config copy is what is compared,
    # and the sample-id log up to the checkpoint comes from the checkpoint's run folder.
    out = tmp_path / "fresh"
    run_main(post, out, tiny_qwen2vl, tiny_store.root, f"train.resume_from_checkpoint={reference / 'checkpoint-2'}")
    assert "starts as the first" in capsys.readouterr().out
    assert logs(out) == logs(reference)
    assert (out / "checkpoint-4" / COMPLETE_MARKER).is_file()
    assert (reference / "sample_ids.rank0.txt").read_text() == (out / "sample_ids.rank0.txt").read_text()


def _pages(path: Path) -> int:
    """Bytes ``path`` takes on a tmpfs (whole 4 KiB pages per file)."""
    files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
    return sum(-(-p.stat().st_size // 4096) * 4096 for p in files)


def test_a_full_disk_during_the_final_save_names_the_folder_file_and_free_space_and_resumes(
        post, tiny_qwen2vl, tiny_store, reference, tmp_path):
    # Room for both checkpoints and the run's own files, and half of the final model.safetensors.
    room = _pages(reference / "checkpoint-2") + _pages(reference / "checkpoint-4") + 64 * 1024 + \
        _pages(reference / "model.safetensors") // 2
    disk = tmp_path / "disk"
    if not _tmpfs(disk, room):
        pytest.skip("needs root and mount -t tmpfs for a real full disk")
    try:
        out = disk / "run"
        proc = launch(out, tiny_qwen2vl, tiny_store.root)
        said = proc.communicate(timeout=300)[0]
        assert proc.returncode == 1, said[-3000:]
        line = said.split("error: ")[-1]
        assert line.startswith(f"saving the trained model into {out} failed while writing {out / 'model.safetensors'}: "
                               "[Errno 28] No space left on device (disk of "), said[-3000:]
        assert " MiB free). The run's checkpoints are complete: free space on that disk" in line
        assert "Traceback" not in said and len(line.strip().splitlines()) == 1
        moved = tmp_path / "moved"
        shutil.copytree(out, moved)
    finally:
        subprocess.run(["umount", str(disk)], check=False)
    run_main(post, moved, tiny_qwen2vl, tiny_store.root, "train.resume_from_checkpoint=latest")
    assert logs(moved) == logs(reference)
