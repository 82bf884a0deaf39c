"""`tokenswap eval` end to end on a local bench, and the bench config file."""

from __future__ import annotations

import json

import pytest
from datasets import Dataset, Features, Image, Sequence, Value
from PIL import Image as PILImage

from tokenswap.config import load_config
from tokenswap.eval.bench_builder import BenchBuildConfig
from tokenswap.eval.cli import cli_main

CONCEPTS = ["cat", "dog", "sun", "car"]


def _write_bench(root) -> None:
    base = {"subject": Value("string"), "question": Value("string"), "choices": Sequence(Value("string"))}
    base["answer"] = Value("int64")
    text, img = [], []
    for i, c in enumerate(CONCEPTS):
        q = f"Is the {c} small?"
        text.append({"subject": "miscellaneous", "question": q, "choices": ["yes", "no", "maybe", c], "answer": i})
        img.append(
            {
                "subject": "miscellaneous",
                "question": "Is the <image 1> small?",
                "choices": ["yes", "no", "maybe", "<image 1>"],
                "answer": i,
                "image_1": PILImage.new("RGB", (28, 28), ["red", "green", "blue", "white"][i]),
            }
        )
    for config, rows, features in (
        ("text", text, Features(base)),
        ("img", img, Features({**base, "image_1": Image()})),
    ):
        (root / config).mkdir(parents=True)
        Dataset.from_list(rows, features=features).to_parquet(str(root / config / "test-00000-of-00001.parquet"))


def test_eval_cli_writes_gap_json_and_md(tiny_qwen2vl, tmp_path):
    _write_bench(tmp_path / "bench")
    out = tmp_path / "out"
    argv = ["--model", str(tiny_qwen2vl), "--bench", str(tmp_path / "bench"), "--scorer", "loglik"]
    argv += ["--batch-size", "2", "--out", str(out), "--forms", "recognition"]
    assert cli_main(argv) == 0
    result = json.loads((out / "gap.json").read_text())
    assert result["n"] == 4 and result["scorer"] == "loglik" and result["recognition_n"] == 4
    assert result["gap"] == result["acc_text"] - result["acc_interleaved"]
    assert "| all | 4 |" in (out / "gap.md").read_text()


def test_bench_config_loads():
    cfg = load_config(BenchBuildConfig, "bench_mmlu.yaml")
    assert cfg.filters == ["validity", "importance", "caption"] and cfg.judge.backend == "openai"


def test_eval_cli_defaults_to_the_release_protocol():
    from tokenswap.eval.cli import _parser, max_new_tokens
    from tokenswap.inference.model_settings import release_settings

    args = _parser().parse_args(["--model", "m"])
    assert (args.scorer, args.bench, args.backend, args.concurrency) == (
        "generate", "dongx1997/TokenSwap-Bench", "hf", 32)
    # The release's budget, and its per-model one for Qwen2.5-VL (the task file's model_specific_generation_kwargs).
    assert max_new_tokens(args, release_settings("tokenswap", "qwen2_vl")) == 2048
    assert max_new_tokens(args, release_settings("tokenswap", "qwen2_5_vl")) == 128
    args = _parser().parse_args(["--model", "m", "--max-new-tokens", "64"])
    assert max_new_tokens(args, release_settings("tokenswap", "qwen2_5_vl")) == 64


def test_eval_cli_per_item_path_equals_the_in_loop_evaluator(tiny_qwen2vl, tmp_path):
    """`tokenswap eval` (hf, one process: per-item records, resumable) scores as GapEvaluator does, both scorers."""
    from tokenswap.data.tokenswap_bench import load_tokenswap_bench_pairs
    from tokenswap.eval.gap import GapEvaluator
    from tokenswap.families import load_checkpoint

    _write_bench(tmp_path / "bench")
    pairs = load_tokenswap_bench_pairs(tmp_path / "bench")
    model, processor = load_checkpoint(tiny_qwen2vl)
    for scorer in ("loglik", "generate"):
        out = tmp_path / scorer
        argv = ["--model", str(tiny_qwen2vl), "--bench", str(tmp_path / "bench"), "--scorer", scorer,
                "--max-new-tokens", "4", "--batch-size", "3", "--out", str(out)]
        assert cli_main(argv) == 0
        result = json.loads((out / "gap.json").read_text())
        assert len((out / "records.jsonl").read_text().splitlines()) == 2 * len(pairs)
        expected = GapEvaluator(processor, pairs, scorer=scorer, max_new_tokens=4, progress=False).evaluate(model)
        for got, want in zip(result["items"], expected.items):
            assert (got["pred_text"], got["pred_interleaved"]) == (want["pred_text"], want["pred_interleaved"])
        assert result["backend"] == "hf" and result["usage"]["requests"] == 2 * len(pairs)
        assert cli_main(argv) == 0  # resumed: nothing left to ask, the same summary
        assert json.loads((out / "gap.json").read_text()) == result


def test_eval_cli_forms_on_hf_equal_the_in_loop_evaluator(tiny_qwen2vl, tmp_path):
    """both, rendered and recognition (with hf's naming control) through the per-item records path score as
    GapEvaluator's forms do."""
    from tokenswap.data.tokenswap_bench import load_tokenswap_bench_pairs
    from tokenswap.eval.gap import GapEvaluator
    from tokenswap.families import load_checkpoint

    _write_bench(tmp_path / "bench")
    pairs = load_tokenswap_bench_pairs(tmp_path / "bench")
    model, processor = load_checkpoint(tiny_qwen2vl)
    out = tmp_path / "out"
    argv = ["--model", str(tiny_qwen2vl), "--bench", str(tmp_path / "bench"), "--scorer", "loglik", "--batch-size",
            "3", "--forms", "both,rendered,recognition", "--out", str(out)]
    assert cli_main(argv) == 0
    result = json.loads((out / "gap.json").read_text())
    forms = ("both", "rendered", "recognition")
    expected = GapEvaluator(processor, pairs, scorer="loglik", forms=forms, progress=False).evaluate(model)
    assert result["forms"] == list(expected.forms) == ["text", "interleaved", *forms]
    for got, want in zip(result["items"], expected.items):
        assert {k: got[k] for k in want if k.startswith(("pred_", "correct_", "recognized"))} == {
            k: want[k] for k in want if k.startswith(("pred_", "correct_", "recognized"))}
    assert len(result["pictures"]) == len(expected.pictures) == 4
    for got, want in zip(result["pictures"], expected.pictures):
        assert got["loglik_naming"] == pytest.approx(want.pop("loglik_naming"), abs=1e-4)
        assert {k: got[k] for k in want} == want
    assert result["decomposition"] == expected.decomposition
    records = [json.loads(line)["key"].split("|")[0] for line in (out / "records.jsonl").read_text().splitlines()]
    assert sorted(set(records)) == ["both", "interleaved", "naming", "recognition", "rendered", "text"]
    assert records.count("naming") == records.count("recognition") == 4
