"""The released-format loader and the ``tokenswap crossmath generate | eval`` commands."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from tokenswap.cli import main as tokenswap_main
from tokenswap.crossmath import (
    Puzzle,
    extract_answer,
    generate_puzzles,
    gold_answer,
    gold_hops,
    load_crossmath,
    load_image,
    parse_markdown_table,
    reward_columns,
    sft_messages,
    solve,
)
from tokenswap.crossmath.cli import cli_main
from tokenswap.crossmath.data import find_jsonl, read_jsonl
from tokenswap.crossmath.render import render_grid

# A record in the exact released schema, written by hand (none of the released puzzles are used).
# It uses the `x` glyph for × as one released puzzle does.
RELEASED_STYLE_RECORD = {
    "img": "images/math_puzzle_0001.png",
    "img_blank": "images_blank/math_puzzle_0001_blank.png",
    "problems": 3,
    "operators": "+-*/",
    "difficulty": "medium",
    "range": [1, 50],
    "markdown_table": "| 4 | x | ? | = | 12 |\n|   |   | + |   | ÷ |\n|   |   | 2 |   | ? |\n"
    "|   |   | = |   | = |\n|   |   | ? |   | 6 |",
    "markdown_answer": "|   |   | 3 |   |   |\n|   |   |   |   |   |\n|   |   |   |   | 2 |\n"
    "|   |   |   |   |   |\n|   |   | 5 |   |   |",
    "markdown_answer_step": "|   |   | step1 |   |   |\n|   |   |   |   |   |\n|   |   |   |   | step1 |\n"
    "|   |   |   |   |   |\n|   |   | step2 |   |   |",
    "solutions": "Across\n4 × 3 = 12\n\nDown\n3 + 2 = 5\n12 ÷ 2 = 6",
    "solving_steps": {"step1": ["4 × 3 = 12", "12 ÷ 2 = 6"], "step2": ["3 + 2 = 5"]},
}


@pytest.fixture
def released_style_folder(tmp_path):
    folder = tmp_path / "Altstyle"
    (folder / "images_blank").mkdir(parents=True)
    second = dict(RELEASED_STYLE_RECORD, img_blank="images_blank/math_puzzle_0002_blank.png")
    with open(folder / "testset_altstyle.jsonl", "w", encoding="utf-8") as f:
        f.write("\n")  # the released Altstyle file starts with an empty line
        for record in (RELEASED_STYLE_RECORD, second):
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            grid = parse_markdown_table(record["markdown_table"])
            render_grid(grid, "altstyle").save(folder / record["img_blank"])
    return folder


def test_loader_reads_the_released_format(released_style_folder):
    records = load_crossmath(released_style_folder)
    assert [r["id"] for r in records] == ["math_puzzle_0001", "math_puzzle_0002"]
    assert load_crossmath(released_style_folder / "testset_altstyle.jsonl")[0]["id"] == "math_puzzle_0001"
    record = records[0]
    assert load_image(record).size == (5 * 55, 5 * 55)
    assert gold_answer(record) == ["3", "2", "5"] and gold_hops(record) == [1, 1, 2]
    assert reward_columns(record) == {"answer": ["3", "2", "5"], "answer_hops": [1, 1, 2]}
    # Our solver reproduces the record's hops and steps, reading the `x` glyph as ×.
    puzzle = Puzzle.from_record(record)
    solution = solve(puzzle.grid)
    assert solution.answer_hops() == gold_hops(record)
    assert solution.solving_steps() == record["solving_steps"]
    assert puzzle.answer == ["3", "2", "5"]
    messages = sft_messages(record, modality="image")
    assert [p["type"] for p in messages[0]["content"]] == ["text", "image"]
    assert extract_answer(messages[1]["content"][0]["text"]) == ["3", "2", "5"]


def test_loader_errors_say_what_to_pass(tmp_path, released_style_folder):
    with pytest.raises(FileNotFoundError, match="no \\*.jsonl"):
        find_jsonl(tmp_path)
    (released_style_folder / "other.jsonl").write_text("")
    with pytest.raises(ValueError, match="several JSONL files"):
        find_jsonl(released_style_folder)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"markdown_table": "| 1 |"}) + "\n")
    with pytest.raises(KeyError, match="markdown_answer"):
        load_crossmath(bad)


def test_generate_end_to_end_and_resume(tmp_path, capsys):
    out = tmp_path / "gen"
    argv = ["generate", "--n", "4", "--seed", "3", "--out", str(out), "--styles", "original", "altstyle"]
    assert tokenswap_main(["crossmath", *argv]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["Altstyle", "Original", "generate_params.json"]
    expected = [p.to_record() for p in generate_puzzles(4, seed=3, difficulty="mixed")]
    for folder in ("Original", "Altstyle"):
        records = load_crossmath(out / folder)
        assert [{k: v for k, v in r.items() if k != "image_path"} for r in records] == expected
        for record in records:
            rows = len(parse_markdown_table(record["markdown_table"]))
            cols = len(parse_markdown_table(record["markdown_table"])[0])
            with Image.open(record["image_path"]) as image:
                assert image.size == (55 * cols, 55 * rows)
            assert (out / folder / record["img"]).exists()
    assert Image.open(out / "Altstyle" / expected[0]["img_blank"]).getpixel((0, 0)) in {
        (253, 245, 230),  # background
        (92, 64, 51),  # border
    }

    # Kill mid-write: the last record of one style is half written; the rerun repairs and completes it.
    jsonl = out / "Original" / "crossmath.jsonl"
    lines = jsonl.read_text(encoding="utf-8").splitlines(keepends=True)
    jsonl.write_text("".join(lines[:3]) + lines[3][:40], encoding="utf-8")
    before_alt = (out / "Altstyle" / "crossmath.jsonl").read_bytes()
    assert cli_main([*argv[:2], "6", *argv[3:]]) == 0
    for folder in ("Original", "Altstyle"):
        records = read_jsonl(out / folder / "crossmath.jsonl")
        assert [r["id"] for r in records] == [f"crossmath_3_{i:06d}" for i in range(6)]
        assert records[:4] == expected
    assert (out / "Altstyle" / "crossmath.jsonl").read_bytes().startswith(before_alt)  # nothing redone

    # A complete last line whose newline was lost is redone rather than glued to the next record.
    alt = out / "Altstyle" / "crossmath.jsonl"
    alt.write_bytes(alt.read_bytes()[:-1])
    assert cli_main([*argv[:2], "6", *argv[3:]]) == 0
    assert [r["id"] for r in read_jsonl(alt)] == [f"crossmath_3_{i:06d}" for i in range(6)]

    # Other generator flags into the same folder would mix two collections: refused.
    assert cli_main([*argv, "--difficulty", "hard"]) == 2
    assert "resume with the same flags" in capsys.readouterr().err


@pytest.mark.parametrize("modality", ["text", "image", "image+text"])
def test_eval_on_the_tiny_model(tiny_qwen2vl, tmp_path_factory, modality, monkeypatch):
    data = tmp_path_factory.getbasetemp() / "crossmath-eval-data"
    if not data.exists():
        assert cli_main(["generate", "--n", "3", "--seed", "0", "--out", str(data), "--styles", "original"]) == 0
    out = tmp_path_factory.mktemp("crossmath-eval")
    argv = ["eval", "--model", str(tiny_qwen2vl), "--data", str(data / "Original"), "--modality", modality]
    argv += ["--n", "2", "--max-new-tokens", "8", "--batch-size", "2", "--out", str(out)]
    assert tokenswap_main(["crossmath", *argv]) == 0

    predictions = read_jsonl(out / f"predictions_{modality}.jsonl")
    records = load_crossmath(data / "Original")[:2]
    assert [p["id"] for p in predictions] == [r["id"] for r in records]
    for prediction in predictions:
        assert isinstance(prediction["response"], str)
        assert prediction["prediction"] == extract_answer(prediction["response"])
    metrics = json.loads((out / f"metrics_{modality}.json").read_text())
    assert metrics["n"] == 2 and metrics["modality"] == modality
    assert set(metrics["metrics"]) == {"micro", "macro", "step1", "step2", "step3", "step4+"}
    assert 0.0 <= metrics["metrics"]["micro"] <= 1.0
    assert (out / f"metrics_{modality}.md").read_text().startswith("| setting | micro |")

    # Resume: every puzzle is already predicted, so the model is never loaded again.
    def no_load(*args, **kwargs):
        raise AssertionError("resumed eval must not reload the model")

    monkeypatch.setattr("tokenswap.testing.load_qwen2vl", no_load)
    assert cli_main(argv) == 0
    assert len(read_jsonl(out / f"predictions_{modality}.jsonl")) == 2
    other = [*argv]
    other[other.index("--model") + 1] = "another-model"
    assert cli_main(other) == 2
