"""End to end on the tiny model: `tokenswap rest build` / `rest eval` (resumable) and `tokenswap probe`."""

from __future__ import annotations

import json

from tokenswap.cli import main
from tokenswap.rest.build import image_path
from tokenswap.rest.items import read_items


def _mmlu_parquet(path):
    from datasets import Dataset

    rows = [
        {"question": f"What is {i} + {i}?", "subject": "math", "choices": [str(i), str(2 * i), "0", "1"], "answer": 1}
        for i in range(2, 7)
    ]
    Dataset.from_list(rows).to_parquet(str(path))
    return path


def test_rest_build_is_resumable(tmp_path):
    data = _mmlu_parquet(tmp_path / "mmlu.parquet")
    out = tmp_path / "rest"
    assert main(["rest", "build", "--source", "mmlu", "--data", str(data), "--n", "2", "--out", str(out)]) == 0
    items = read_items(out / "items.jsonl")
    assert len(items) == 2
    meta = json.loads((out / "meta.json").read_text())
    assert len(meta["variants"]) == 10 and meta["filter_counts"] == {"kept": 2}
    for variant in meta["variants"]:
        assert image_path(out, items[0].id, variant, "item").exists()
        assert image_path(out, items[0].id, variant, "stem").exists()
    stamp = image_path(out, items[0].id, "sans_200", "item").stat().st_mtime_ns
    assert main(["rest", "build", "--source", "mmlu", "--data", str(data), "--n", "3", "--out", str(out)]) == 0
    assert [i.id for i in read_items(out / "items.jsonl")] == [i.id for i in items] + ["mmlu-test-00002"]
    assert image_path(out, items[0].id, "sans_200", "item").stat().st_mtime_ns == stamp  # not redone


def test_rest_eval_end_to_end_with_ocr_and_perturbations(tmp_path, tiny_qwen2vl):
    data, out = tmp_path / "soe", tmp_path / "run"
    assert main(["rest", "build", "--source", "soebench", "--n", "4", "--out", str(data)]) == 0
    args = ["rest", "eval", "--model", str(tiny_qwen2vl), "--data", str(data), "--out", str(out), "--n", "3",
            "--ocr", "--perturbations", "mono_50,color_red", "--max-new-tokens", "3", "--batch-size", "4"]  # fmt: skip
    assert main(args) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["n_items"] == 3 and metrics["source"] == "soebench"
    assert list(metrics["variants"]) == ["sans_200", "mono_50", "color_red"]
    for result in metrics["variants"].values():
        assert set(result) == {"all", "ocr_correct", "ocr", "ocr_first"}
        assert result["all"]["n"] == 3
        assert 0.0 <= result["ocr"]["ocr_correct_rate"] <= 1.0
        assert result["ocr"]["mean_cer_item"] >= 0.0
        assert "delta_acc" in result["ocr_first"]
    rows = (out / "predictions.jsonl").read_text().splitlines()
    # 3 text + 3 variants x 3 items x (image, mixed, ocr_item, ocr_stem, ocr_first)
    assert len(rows) == 3 + 3 * 3 * 5
    assert (out / "report.md").read_text().count("| color_red |") == 1
    assert (out / "accuracy.png").stat().st_size > 0

    # Resume: nothing is regenerated, metrics are identical.
    assert main(args) == 0
    assert len((out / "predictions.jsonl").read_text().splitlines()) == len(rows)
    assert json.loads((out / "metrics.json").read_text()) == metrics


def test_probe_cli(tmp_path, tiny_qwen2vl):
    out = tmp_path / "probe"
    assert main(["probe", "--model", str(tiny_qwen2vl), "--pairs", "4", "--out", str(out)]) == 0
    summary = json.loads((out / "probe.json").read_text())
    assert summary["n_pairs"] == 4 and summary["n_layers"] == 3
    assert len(summary["similarity"]) == len(summary["image_to_text"]) == 3
    assert -1.0 <= summary["max"]["similarity"]["value"] <= 1.0
    assert "| max over layers |" in (out / "probe.md").read_text()
    assert (out / "probe.png").stat().st_size > 0
