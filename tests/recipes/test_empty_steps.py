"""A run whose samples are all refused stops with an error naming why, instead of training on nothing with rc 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenswap.config import load_config
from tokenswap.training import run_recipe

ASSETS = Path(__file__).resolve().parents[2] / "tests" / "assets"


@pytest.fixture(scope="module")
def post(load_recipe):
    return load_recipe("post_train")


def overrides(out, model, *extra):
    return [f"run.output_dir={out}", f"model.name_or_path={model}", f"data.swap_dataset={ASSETS / 'swap_tiny.jsonl'}",
            f"data.llava_json={ASSETS / 'llava_tiny.json'}", f"data.llava_image_root={ASSETS / 'images'}",
            "collator.max_chars_per_sample=1", "gap_eval.bench=null", *extra]  # every sample is longer: all refused


@pytest.mark.integration
def test_a_run_where_every_sample_is_refused_stops_at_its_first_step(post, tiny_qwen2vl, tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.warns(UserWarning, match="skipped"), pytest.raises(SystemExit) as e:
        run_recipe(post.main, post.PostTrainConfig, ["--config", "tiny/post_text.yaml", *overrides(out, tiny_qwen2vl)])
    err = capsys.readouterr().err
    assert e.value.code == 1
    assert "step 1 of 4 had no target token on any rank" in err and "samples_skipped_too_long" in err
    assert "collator.max_empty_step_share" in err and "Traceback" not in err
    assert not (out / "log_history.json").exists()  # the run did not finish as if it had trained


@pytest.mark.integration
def test_the_share_is_a_budget_a_run_may_spend(post, tiny_qwen2vl, tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.warns(UserWarning, match="skipped"):
        post.main(load_config(post.PostTrainConfig, "tiny/post_text.yaml",
                              overrides(out, tiny_qwen2vl, "collator.max_empty_step_share=1.0")))
    assert "step 4 of 4 had no target token" in capsys.readouterr().out  # warned, not stopped
    assert json.loads((out / "swap_stats.json").read_text())["batches_without_targets"] == 4
