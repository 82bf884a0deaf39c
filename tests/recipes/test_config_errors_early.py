"""Config errors are exit code 2 with the fix, before any data or weights load (never a late traceback).

The data paths point at files that do not exist: a check that came after loading the data would fail there instead.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from tokenswap.training import run_recipe


def cli_main(argv):
    """`tokenswap build-store ...` through the real entry point (it maps refusals to exit 2, failures to 1)."""
    from tokenswap.cli import main

    return main(["build-store", *argv])


@pytest.fixture(scope="module")
def post(load_recipe):
    return load_recipe("post_train")


def argv(tmp_path, model, *extra):
    return ["--config", "tiny/post_text.yaml", f"run.output_dir={tmp_path / 'out'}", f"model.name_or_path={model}",
            f"data.llava_json={tmp_path / 'absent.json'}", f"data.swap_dataset={tmp_path / 'absent.jsonl'}",
            "gap_eval.bench=null", *extra]


@pytest.mark.integration
@pytest.mark.parametrize(
    "extra, message",
    [
        (["train.eval_strategy=steps"], "`eval_strategy` is 'steps', but the recipes give the Trainer no eval_dataset"),
        (["train.resume_from_checkpoint=/nonexistent/c"],
         "`resume_from_checkpoint` '/nonexistent/c' does not exist"),
        (["train.lr_scheduler_kwargs=notadict"], "`lr_scheduler_kwargs` must be a mapping"),
    ],
    ids=["eval-without-eval-set", "resume-missing", "scheduler-kwargs-not-a-dict"],
)
def test_trainer_settings_the_run_cannot_use_are_config_errors(post, tiny_qwen2vl, tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit) as e:  # the recipe's own entry: the one line and the exit status it maps
        run_recipe(post.main, post.PostTrainConfig, argv(tmp_path, tiny_qwen2vl, *extra))
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err
    assert "Repo id must" not in err and "Traceback" not in err


@pytest.mark.integration
@pytest.mark.parametrize(
    "extra, message",
    [
        (["collator.packing=true"], "collator.packing is not supported for the model family 'qwen3_5'"),
        (["train.fp16=true", "train.bf16=false"], "train.fp16 needs a CUDA GPU"),
    ],
    ids=["qwen3_5-packing", "fp16-on-cpu"],
)
def test_settings_the_model_or_machine_cannot_run_stop_before_data_and_model(post, tiny_family, tmp_path, capsys,
                                                                            extra, message):
    with pytest.raises(SystemExit) as e:
        # the data files do not exist: reaching them would raise FileNotFoundError instead
        run_recipe(post.main, post.PostTrainConfig, argv(tmp_path, tiny_family("qwen3_5"), *extra))
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_a_mistyped_alias_is_a_config_error_of_build_store(tmp_path, capsys):
    code = cli_main(["--config", "store_embedded.yaml", f"output_dir={tmp_path / 'b'}", "extractor.aliases={kitty: 5}"])
    err = capsys.readouterr().err
    assert code == 2 and "`extractor.aliases.kitty` must be a string, got 5" in err and "Traceback" not in err
    assert not (tmp_path / "b").exists()


@pytest.mark.integration
def test_missing_data_and_a_missing_or_damaged_store_are_named_together_before_any_load(post, tiny_qwen2vl, tmp_path,
                                                                                      capsys):
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "store.json").write_text("[1, 2]")
    with pytest.raises(SystemExit) as e:
        run_recipe(post.main, post.PostTrainConfig, [*argv(tmp_path, tiny_qwen2vl), "run.arm=tokenswap",
                   f"image_store={tmp_path / 'store'}"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "3 problems in the run inputs" in err
    assert f"`data.llava_json` '{tmp_path / 'absent.json'}' does not exist" in err
    assert f"`data.swap_dataset` '{tmp_path / 'absent.jsonl'}' does not exist" in err
    assert "`image_store`: " in err and "expected a JSON object" in err


@pytest.mark.integration
def test_a_packed_attention_kernel_that_cannot_run_here_is_a_config_error(post, tiny_qwen2vl, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        run_recipe(post.main, post.PostTrainConfig, [*argv(tmp_path, tiny_qwen2vl), "collator.packing=true",
                   "model.attn_implementation=varlen"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "model.attn_implementation=varlen cannot run packed rows here" in err
    assert "model.attn_implementation=auto" in err


@pytest.mark.integration
def test_resampling_swaps_each_epoch_with_persistent_workers_is_a_config_error(post, tiny_qwen2vl, tmp_path, capsys):
    # The workers would keep the first epoch's collator: every epoch would silently reuse the first draw.
    with pytest.raises(SystemExit) as e:
        run_recipe(post.main, post.PostTrainConfig, [*argv(tmp_path, tiny_qwen2vl),
                   "collator.resample_each_epoch=true", "train.dataloader_num_workers=2",
                   "train.dataloader_persistent_workers=true"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "train.dataloader_persistent_workers: false" in err


def _empty_bench(root):
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("subject", pa.string()), ("question", pa.string()), ("choices", pa.list_(pa.string())),
                        ("answer", pa.int64())])
    for config in ("text", "img"):
        (root / config).mkdir(parents=True)
        pq.write_table(schema.empty_table(), root / config / "test-00000-of-00001.parquet")
    return root


@pytest.mark.integration
@pytest.mark.parametrize(
    "extra, message",
    [
        (lambda t: [f"gap_eval.bench={t / 'no-bench'}"], "`gap_eval.bench` '{t}/no-bench' does not exist locally"),
        (lambda t: [f"gap_eval.bench={_empty_bench(t / 'bench')}"], "`gap_eval.bench` {t}/bench: text/test has no rows"),
        (lambda t: ["collator.packing=true", "collator.pack_budget=40", "model.attn_implementation=sdpa"],
         "`collator.pack_budget` 40 is smaller than one image block: model.max_pixels=50176 makes blocks of up to "
         "66 tokens"),
        (lambda t: [f"collator.prepared={t / 'no-prepared'}"], "`collator.prepared` '{t}/no-prepared' is not a folder"),
    ],
    ids=["bench-missing", "bench-empty", "pack-budget-below-one-image", "prepared-missing"],
)
def test_late_failures_are_config_errors_before_data_and_model(post, tiny_qwen2vl, tmp_path, capsys, extra, message):
    # Each used to surface after the data and the model loaded (the data files here do not even exist), or not at all.
    with pytest.raises(SystemExit) as e:
        run_recipe(post.main, post.PostTrainConfig, [*argv(tmp_path, tiny_qwen2vl), *extra(tmp_path)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message.format(t=tmp_path) in err, err
    assert "Traceback" not in err


@pytest.mark.integration
@pytest.mark.parametrize(
    "extra, message",
    [
        (lambda t: ["run.seed=-1"], "`seed` must be a whole number in [0, 4294967295], got -1"),
        (lambda t: ["run.seed=4294967296"], "`seed` must be a whole number in [0, 4294967295], got 4294967296"),
        (lambda t: ["data.seed=-3"], "data: `seed` must be a whole number in [0, 4294967295], got -3"),
        (lambda t: ["collator.swap_seed=-1"], "`swap_seed` must be a whole number in [0, 4294967295], got -1"),
        (lambda t: ["train.lr_scheduler_kwargs=[1,2]"], "`train.lr_scheduler_kwargs` must be dict | str | None, got [1, 2]"),
        (lambda t: ["train.lr_scheduler_kwargs=5"], "`train.lr_scheduler_kwargs` must be dict | str | None, got 5"),
        (lambda t: [f"run.output_dir={_file(t / 'a-file')}"], "`output_dir` '{t}/a-file' is a file, not a folder"),
        (lambda t: [f"run.output_dir={_file(t / 'a-file')}/run"], "`output_dir` '{t}/a-file/run' cannot be a folder: "
                                                                 "'{t}/a-file' above it is a file"),
    ],
    ids=["seed-negative", "seed-past-32-bits", "data-seed-negative", "swap-seed-negative", "scheduler-kwargs-list",
         "scheduler-kwargs-number", "output-dir-a-file", "output-dir-under-a-file"],
)
def test_values_the_run_would_fail_on_later_are_refused_when_the_config_is_read(post, tiny_qwen2vl, tmp_path, capsys,
                                                                               extra, message):
    with pytest.raises(SystemExit) as e:
        run_recipe(post.main, post.PostTrainConfig, argv(tmp_path, tiny_qwen2vl, *extra(tmp_path)))
    err = capsys.readouterr().err
    assert e.value.code == 2 and message.format(t=tmp_path) in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 3


def _file(path):
    path.write_text("not a folder")
    return path


@pytest.fixture
def hub_that_counts():
    """An HF_ENDPOINT on 127.0.0.1 that counts the connections made to it (and answers none)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    seen, stop = [], threading.Event()

    def accept():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            seen.append(1)
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}", seen
    stop.set()
    thread.join()
    server.close()


@pytest.mark.integration
@pytest.mark.skipif(torch.cuda.is_available(), reason="the paper's configs run on a CUDA machine")
@pytest.mark.parametrize(
    "extra, named",
    [
        ([], ["train.bf16", "train.deepspeed (DeepSpeed ZeRO-3 on CUDA)"]),
        (["train.use_cpu=true"], ["Qwen/Qwen2-VL-7B (7B parameters)", "train.deepspeed (DeepSpeed ZeRO-3 on CUDA)"]),
    ],
    ids=["as-written", "forced-onto-cpu"],
)
def test_a_paper_config_on_a_machine_without_a_gpu_says_so_before_any_hub_lookup(hub_that_counts, extra, named):
    endpoint, seen = hub_that_counts
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT=endpoint, PYTHONPATH=str(root))
    result = subprocess.run([sys.executable, "recipes/post_train.py", "--config", "post_text.yaml", *extra],
                            cwd=root, env=env, capture_output=True, text=True, timeout=300)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("error: this config needs a GPU and this machine has none: ")
    assert all(n in lines[0] for n in named) and "configs/tiny/" in lines[0] and "configs/one_gpu/" in lines[0]
    assert seen == []  # no hub lookup: the refusal comes before the model is looked up
