"""Run the pre-/post-training recipes' real entry points on CPU with the tiny model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tokenswap.config import load_config
from tokenswap.training import COMPLETE_MARKER

# Every test here starts a process, a server or a training run (make check skips them).
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "tests" / "assets"


def overrides(out, model, store, *extra):
    return [
        f"run.output_dir={out}",
        f"model.name_or_path={model}",
        f"data.swap_dataset={ASSETS / 'swap_tiny.jsonl'}",
        *( [f"image_store={store}"] if store else []),
        "gap_eval.bench=null",  # the tiny configs evaluate .cache/tiny-bench in the loop; these tests do not
        *extra,
    ]


def post_overrides(out, model, store, *extra):
    return overrides(out, model, store, f"data.llava_json={ASSETS / 'llava_tiny.json'}",
                     f"data.llava_image_root={ASSETS / 'images'}", *extra)


def data_stats(out: Path) -> dict:
    """swap_stats.json without the pixel-cache counters, which depend on what the process had cached."""
    return {k: v for k, v in json.loads((out / "swap_stats.json").read_text()).items() if k != "image_decodes"}


def losses(out: Path) -> list[float]:
    return [h["loss"] for h in json.loads((out / "log_history.json").read_text()) if "loss" in h]


def sample_ids(out: Path, rank: int = 0) -> list[str]:
    return (out / f"sample_ids.rank{rank}.txt").read_text().split()


@pytest.fixture(scope="module")
def post(load_recipe):
    return load_recipe("post_train")


def test_paired_post_training_arms(post, tiny_qwen2vl, tiny_store, tmp_path):
    outs = {}
    for arm in ("baseline", "text", "tokenswap"):
        out = tmp_path / arm
        store = tiny_store.root if arm == "tokenswap" else None
        cfg = load_config(post.PostTrainConfig, f"tiny/post_{arm}.yaml", post_overrides(out, tiny_qwen2vl, store))
        post.main(cfg)
        outs[arm] = out
        trace = losses(out)
        assert len(trace) == 4 and all(torch.isfinite(torch.tensor(trace)))
        assert trace[-1] < trace[0], f"{arm}: loss did not fall: {trace}"
        before = load_file(Path(tiny_qwen2vl) / "model.safetensors")
        after = load_file(out / "model.safetensors")
        assert any(not torch.equal(before[k], after[k]) for k in before), f"{arm}: no parameter changed"

    # the text and tokenswap arms see the same samples in the same order ...
    assert sample_ids(outs["text"]) == sample_ids(outs["tokenswap"])
    # ... and the baseline sees the LLaVA rows of that order, without the Magpie rows
    llava_in_text_order = [i for i in sample_ids(outs["text"]) if i.startswith("ll-")]
    n = min(len(llava_in_text_order), 10)  # the baseline wraps into a 2nd epoch after its 10 rows
    assert sample_ids(outs["baseline"])[:n] == llava_in_text_order[:n]
    assert not any(i.startswith("mp-") for i in sample_ids(outs["baseline"]))

    swap = json.loads((outs["tokenswap"] / "swap_stats.json").read_text())
    text = json.loads((outs["text"] / "swap_stats.json").read_text())
    assert swap["concepts_swapped"] > 0 and text.get("concepts_swapped", 0) == 0
    # the output folder is a complete checkpoint: it reloads through from_pretrained
    from tokenswap.families import load_checkpoint

    model, processor = load_checkpoint(outs["tokenswap"])
    assert processor.tokenizer.chat_template == load_checkpoint(tiny_qwen2vl)[1].tokenizer.chat_template


def test_resume_reproduces_uninterrupted_losses(post, tiny_qwen2vl, tiny_store, tmp_path, trainer_warnings):
    store = tiny_store.root
    full = tmp_path / "full"
    post.main(load_config(post.PostTrainConfig, "tiny/post_tokenswap.yaml", post_overrides(full, tiny_qwen2vl, store)))
    part = tmp_path / "part"
    post.main(load_config(post.PostTrainConfig, "tiny/post_tokenswap.yaml",
                          post_overrides(part, tiny_qwen2vl, store, "train.max_steps=2")))
    assert (part / "checkpoint-2" / COMPLETE_MARKER).is_file()
    post.main(load_config(post.PostTrainConfig, "tiny/post_tokenswap.yaml",
                          post_overrides(part, tiny_qwen2vl, store, "train.resume_from_checkpoint=latest")))
    # from_pretrained took the weights; the Trainer's key-blind reload must not report a broken checkpoint
    assert not [w for w in trainer_warnings if w.startswith("There were")], trainer_warnings[:2]
    resumed = losses(part)
    torch.testing.assert_close(torch.tensor(resumed[-2:]), torch.tensor(losses(full)[-2:]), rtol=1e-5, atol=1e-5)
    # the side logs of the resumed run are those of the uninterrupted one, not the union of both attempts
    assert sample_ids(part) == sample_ids(full)
    assert (part / "sample_ids.rank0.txt").read_text() == (full / "sample_ids.rank0.txt").read_text()
    assert data_stats(part) == data_stats(full)


@pytest.mark.compat
def test_resume_after_a_kill_during_a_save(post, tiny_qwen2vl, tiny_store, tmp_path):
    """A SIGKILL while checkpoint-4 was being written leaves it partial: `latest` resumes from checkpoint-2."""
    store = tiny_store.root
    full = tmp_path / "full"
    post.main(load_config(post.PostTrainConfig, "tiny/post_tokenswap.yaml", post_overrides(full, tiny_qwen2vl, store)))
    killed = tmp_path / "killed"
    shutil.copytree(full, killed)
    for name in ("log_history.json", "swap_stats.json", "model.safetensors"):
        (killed / name).unlink()  # the run never reached its end
    partial = killed / "checkpoint-4"
    for name in (COMPLETE_MARKER, "trainer_state.json", "optimizer.pt", "tokenswap_state.rank0.json"):
        (partial / name).unlink()  # the save was cut after the weights
    with open(killed / "sample_ids.rank0.txt", "a") as f:
        f.write("prefetched batch that never trained\n")
    post.main(load_config(post.PostTrainConfig, "tiny/post_tokenswap.yaml",
                          post_overrides(killed, tiny_qwen2vl, store, "train.resume_from_checkpoint=latest")))
    torch.testing.assert_close(torch.tensor(losses(killed)), torch.tensor(losses(full)), rtol=1e-5, atol=1e-5)
    assert (killed / "sample_ids.rank0.txt").read_text() == (full / "sample_ids.rank0.txt").read_text()
    assert data_stats(killed) == data_stats(full)
    assert (partial / COMPLETE_MARKER).is_file()  # written again by the resumed run


@pytest.mark.compat
def test_relaunching_a_finished_run_trains_no_further(post, tiny_qwen2vl, tiny_store, tmp_path):
    """transformers checks max_steps only after a step: resuming from the final checkpoint must not add one."""
    out = tmp_path / "done"
    cfg = load_config(post.PostTrainConfig, "tiny/post_tokenswap.yaml", post_overrides(out, tiny_qwen2vl, tiny_store.root))
    post.main(cfg)
    before = load_file(out / "model.safetensors")
    ids_before, trace = (out / "sample_ids.rank0.txt").read_text(), losses(out)
    post.main(load_config(post.PostTrainConfig, "tiny/post_tokenswap.yaml", post_overrides(
        out, tiny_qwen2vl, tiny_store.root, "train.resume_from_checkpoint=latest")))
    assert losses(out) == trace and not (out / "checkpoint-5").exists()
    after = load_file(out / "model.safetensors")
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert (out / "sample_ids.rank0.txt").read_text() == ids_before


def test_trainer_options_pass_through_to_a_real_run(post, tiny_qwen2vl, tiny_store, tmp_path):
    out = tmp_path / "opts"
    cfg = load_config(post.PostTrainConfig, "tiny/post_text.yaml", post_overrides(
        out, tiny_qwen2vl, None, "train.max_steps=2", "train.include_num_input_tokens_seen=true",
        "train.torch_compile=false", "train.push_to_hub=false", "train.use_liger_kernel=false",
        "train.max_grad_norm=0.5", "train.optim=adamw_torch"))
    post.main(cfg)
    history = json.loads((out / "log_history.json").read_text())
    seen = [h["num_input_tokens_seen"] for h in history if "num_input_tokens_seen" in h]
    assert seen and seen == sorted(seen) and seen[-1] > 0
    saved = json.loads((out / "tokenswap_config.json").read_text())["train"]
    assert saved["max_grad_norm"] == 0.5 and saved["optim"] == "adamw_torch"
    args = torch.load(out / "checkpoint-2" / "training_args.bin", weights_only=False)
    assert (args.max_grad_norm, args.optim.value, args.push_to_hub, args.torch_compile) == (0.5, "adamw_torch", False, False)


def test_pretrain_learns_all_text_tokens(load_recipe, tiny_qwen2vl, tiny_store, tmp_path):
    pre = load_recipe("pretrain")
    out = tmp_path / "pre"
    cfg = load_config(pre.PretrainConfig, "tiny/pretrain_tokenswap.yaml",
                      overrides(out, tiny_qwen2vl, tiny_store.root, "train.max_steps=2"))
    pre.main(cfg)
    assert len(losses(out)) == 2
    with pytest.raises(Exception, match="continued pre-training has text and tokenswap arms"):
        load_config(pre.PretrainConfig, "tiny/pretrain_text.yaml", overrides(out, tiny_qwen2vl, None, "run.arm=baseline"))


def test_wandb_offline_run_is_read_back_and_compared(post, tiny_qwen2vl, tiny_store, tmp_path, monkeypatch,
                                                     read_wandb_offline):
    from tokenswap.compare import cli_main
    from tokenswap.errors import InputError

    monkeypatch.setenv("WANDB_MODE", "offline")
    for arm in ("text", "tokenswap"):
        store = tiny_store.root if arm == "tokenswap" else None
        post.main(load_config(post.PostTrainConfig, f"tiny/post_{arm}.yaml", post_overrides(
            tmp_path / arm, tiny_qwen2vl, store, "train.report_to=[wandb]", "wandb.mode=offline")))
    run_dirs = sorted((tmp_path / "tokenswap" / "wandb").glob("offline-run-*"))
    assert len(run_dirs) == 1
    run = read_wandb_offline(run_dirs[0])  # what W&B got: the run log_history.json holds, named and grouped
    assert (run.name, run.group, run.arm) == ("tiny-post-tokenswap-s0", "tiny-post", "tokenswap")
    steps, values = run.series("loss")
    assert values == pytest.approx(losses(tmp_path / "tokenswap"), rel=1e-3) and len(steps) == 4
    assert run.last("swap/images_per_sample") > 0
    # One name per metric: W&B holds log_history.json's keys (loss, swap/...), not the Trainer's train/loss.
    from tokenswap.training.tracking import wandb_records

    logged = {item.key or "/".join(item.nested_key) for rec in wandb_records(next(run_dirs[0].glob("run-*.wandb")))
              if rec.WhichOneof("record_type") == "history" for item in rec.history.item}
    assert {"loss", "swap/images_per_sample"} <= logged and not {"train/loss", "train/swap/images_per_sample"} & logged

    out = tmp_path / "cmp"
    # compare reads the run folders; a W&B offline run is pointed back to its folder (or to W&B)
    with pytest.raises(InputError, match="a W&B offline run, which compare does not read"):
        cli_main(["--runs", str(tmp_path / "text"), str(run_dirs[0]), "--out", str(out)])
    assert cli_main(["--runs", str(tmp_path / "text"), str(tmp_path / "tokenswap"), "--out", str(out)]) == 0
    table = json.loads((out / "comparison.json").read_text())
    assert list(table["arms"]) == ["text", "tokenswap"]
    assert table["arms"]["text"]["loss"]["values"] == [losses(tmp_path / "text")[-1]]
    assert (out / "comparison.png").stat().st_size > 1000


def _launch(config_file: str, port: int, out: Path, model, store, *extra) -> subprocess.CompletedProcess:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ROOT / config_file),
           "--main_process_port", str(port), str(ROOT / "recipes" / "post_train.py"), "--config", "tiny/post_tokenswap.yaml",
           *post_overrides(out, model, store, *extra)]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize(
    "launcher, extra",
    [
        ("configs/accelerate/cpu_2proc.yaml", ()),
        ("configs/accelerate/zero3_cpu2.yaml", ("train.deepspeed=configs/deepspeed/zero3.json",)),
    ],
    ids=["ddp", "zero3"],
)
def test_two_rank_cpu_runs(launcher, extra, tiny_qwen2vl, tiny_store, tiny_bench, free_port, tmp_path):
    out = tmp_path / "run"
    gap = (f"gap_eval.bench={tiny_bench}", "gap_eval.every_steps=2", "gap_eval.forms=[text,interleaved,recognition]")
    proc = _launch(launcher, free_port, out, tiny_qwen2vl, tiny_store.root, *extra, *gap)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ids0, ids1 = sample_ids(out, 0), sample_ids(out, 1)
    # two real ranks: each takes every other batch of 4, so their first two batches are disjoint
    assert len(ids0) >= 16 and len(ids1) >= 16 and not set(ids0[:8]) & set(ids1[:8])
    trace = losses(out)
    assert len(trace) == 4 and trace[-1] < trace[0]
    # the in-loop evaluator ran on both ranks together (ZeRO-3 gathers parameters collectively)
    gap_steps = [h["step"] for h in json.loads((out / "log_history.json").read_text()) if "gap/acc_text" in h]
    assert gap_steps == [2, 4]
    from tokenswap.families import load_checkpoint

    model, _ = load_checkpoint(out)  # ZeRO-3 gathers the full weights at save
    assert sum(p.numel() for p in model.parameters()) > 100_000


def test_in_loop_gap_forms_are_logged_and_reach_wandb(post, tiny_qwen2vl, tiny_store, tiny_bench, tmp_path,
                                                      monkeypatch, read_wandb_offline):
    """`gap_eval.forms` adds the both and recognition forms to the in-loop evaluator: the load, the recognition rate
    and the split of the gap go through trainer.log into log_history.json and the offline W&B run."""

    monkeypatch.setenv("WANDB_MODE", "offline")
    out = tmp_path / "run"
    post.main(load_config(post.PostTrainConfig, "tiny/post_tokenswap.yaml", post_overrides(
        out, tiny_qwen2vl, tiny_store.root, "train.report_to=[wandb]", "wandb.mode=offline",
        f"gap_eval.bench={tiny_bench}", "gap_eval.every_steps=2", "gap_eval.forms=[both,recognition]")))
    logged = [h for h in json.loads((out / "log_history.json").read_text()) if "gap/abs" in h]
    assert [h["step"] for h in logged] == [2, 4]
    keys = ("gap/acc_both", "gap/load", "gap/content", "gap/recognition_rate", "gap/recognised_only/n",
            "gap/components/load", "gap/components/recognition", "gap/components/rest", "gap/components/n",
            "gap/recognition_naming")
    for h in logged:
        assert all(k in h for k in keys), sorted(h)
        assert h["gap/load"] == pytest.approx(h["gap/acc_text"] - h["gap/acc_both"])
        assert h["gap/components/load"] + h["gap/components/recognition"] + h["gap/components/rest"] == \
            pytest.approx(h["gap/abs"])
        assert 0.0 <= h["gap/recognition_rate"] <= 1.0
        assert 0 < h["gap/components/n"] <= h["gap/n"]  # the items the split rests on, of the gap's
    (run_dir,) = (out / "wandb").glob("offline-run-*")
    run = read_wandb_offline(run_dir)
    for key in ("gap/load", "gap/recognition_rate", "gap/components/rest", "gap/acc_both"):
        steps, values = run.series(key)
        assert values == pytest.approx([h[key] for h in logged]), key
