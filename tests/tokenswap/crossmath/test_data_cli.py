"""The released-format loader and the ``tokenswap crossmath generate | eval`` commands."""

from __future__ import annotations

import json
from pathlib import Path

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
from tokenswap.crossmath.data import InconsistentPuzzleError, find_jsonl, puzzle_problem, read_jsonl
from tokenswap.crossmath.fidelity import RELEASED_FILES
from tokenswap.crossmath.render import puzzle_id_from_image
from tokenswap.crossmath.training_data import (
    CrossMathDataConfig,
    load_training_records,
    sft_example,
    sft_examples,
    split_consistent,
)
from tokenswap.errors import InputError

# Three released records (math_puzzle_0104 easy, 0072 hard, 0187 one of the ÷-bug puzzles) in all four
# styles, with the released file and folder names and the PNGs of the first two: see fixtures/README.md.
RELEASE = Path(__file__).parent / "fixtures" / "crossmath_release"
IDS = ["math_puzzle_0104", "math_puzzle_0072", "math_puzzle_0187"]


def cli_main(argv):
    """`tokenswap crossmath ...` through the real entry point (it maps refusals to exit 2)."""
    return tokenswap_main(["crossmath", *argv])


@pytest.mark.parametrize("style", sorted(RELEASED_FILES))
def test_loader_gives_one_id_per_puzzle_in_every_style(style):
    path = RELEASE / RELEASED_FILES[style]
    records = load_crossmath(path.parent)
    assert [r["id"] for r in records] == IDS
    assert [r["id"] for r in load_crossmath(path)] == IDS
    assert Path(records[0]["img_blank"]).name.startswith("math_puzzle_0104_blank")
    for record in records[:2]:
        grid = parse_markdown_table(record["markdown_table"])
        assert load_image(record).size == (55 * len(grid[0]), 55 * len(grid))
    # Our solver reproduces the released hop labels and answers of the consistent puzzles.
    for record in records[:2]:
        puzzle = Puzzle.from_record(record)
        assert puzzle.id == record["id"]
        assert solve(puzzle.grid).answer_hops() == gold_hops(record)
        assert puzzle.answer == gold_answer(record)
        assert reward_columns(record) == {"answer": gold_answer(record), "answer_hops": gold_hops(record)}


@pytest.mark.parametrize("style", sorted(RELEASED_FILES))
def test_records_rebuild_byte_for_byte(style):
    """A released record read back and written by us is the same JSONL line (field set, order, spelling)."""
    lines = [line for line in (RELEASE / RELEASED_FILES[style]).read_text(encoding="utf-8").split("\n") if line]
    assert len(lines) == 3
    for line in lines[:2]:
        record = json.loads(line)
        assert json.dumps(Puzzle.from_record(record).to_record(style), ensure_ascii=False) == line
    # The ÷-bug puzzle prints `154 + 11 = 14`: its released solutions follow the hidden ÷, ours the print.
    assert json.loads(lines[2])["solving_steps"] != Puzzle.from_record(json.loads(lines[2])).to_record(style)[
        "solving_steps"
    ]


def test_inconsistent_released_puzzles_are_skipped_and_counted():
    records = load_crossmath(RELEASE / "Original")
    assert puzzle_problem(records[0]) is None and puzzle_problem(records[1]) is None
    assert "154 + 11 = 14 is false" in puzzle_problem(records[2])
    usable, skipped = split_consistent(records)
    assert [r["id"] for r in usable] == IDS[:2]
    assert skipped == [("math_puzzle_0187", puzzle_problem(records[2]))]
    examples, skipped_examples = sft_examples(records)
    assert [e["id"] for e in examples] == IDS[:2] and skipped_examples == skipped
    for example, record in zip(examples, usable):
        assert extract_answer(example["messages"][1]["content"]) == gold_answer(record)
    with pytest.raises(InconsistentPuzzleError, match="math_puzzle_0187.*skip it"):
        sft_example(records[2])
    with pytest.raises(InconsistentPuzzleError, match="math_puzzle_0187"):
        sft_messages(records[2], modality="text")
    messages = sft_messages(records[0], modality="image")
    assert [p["type"] for p in messages[0]["content"]] == ["text", "image"]
    assert extract_answer(messages[1]["content"][0]["text"]) == gold_answer(records[0])


def test_training_records_skip_inconsistent_puzzles_with_a_warning(caplog):
    cfg = CrossMathDataConfig(path=str(RELEASE / "Beige"))
    with caplog.at_level("WARNING", logger="tokenswap.crossmath.training_data"):
        records = load_training_records(cfg, "unused")
    assert [r["id"] for r in records] == IDS[:2]
    assert "skipped 1 of 3" in caplog.text and "math_puzzle_0187" in caplog.text


def test_loader_errors_say_what_to_pass(tmp_path):
    with pytest.raises(FileNotFoundError, match="no \\*.jsonl"):
        find_jsonl(tmp_path)
    (tmp_path / "a.jsonl").write_text("")
    (tmp_path / "b.jsonl").write_text("")
    with pytest.raises(InputError, match="several JSONL files"):
        find_jsonl(tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"markdown_table": "| 1 |"}) + "\n")
    with pytest.raises(InputError, match="has no 'markdown_answer'"):
        load_crossmath(bad)


def test_generate_end_to_end_and_resume(tmp_path, capsys):
    out = tmp_path / "gen"
    argv = ["generate", "--n", "4", "--seed", "3", "--out", str(out), "--styles", "original", "altstyle"]
    assert tokenswap_main(["crossmath", *argv]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["Altstyle", "Original", "generate_params.json"]
    puzzles = generate_puzzles(4, seed=3, difficulty="mixed")
    ids = [f"crossmath_3_{i:06d}" for i in range(4)]
    for style, folder in (("original", "Original"), ("altstyle", "Altstyle")):
        # The JSONL is exactly what the release would hold: no extra keys, released image names.
        lines = (out / folder / "crossmath.jsonl").read_text(encoding="utf-8").splitlines()
        assert lines == [json.dumps(p.to_record(style), ensure_ascii=False) for p in puzzles]
        records = load_crossmath(out / folder)
        assert [r["id"] for r in records] == ids  # one id per puzzle, whatever the style's file suffix
        for record, puzzle in zip(records, puzzles):
            with Image.open(record["image_path"]) as image:
                assert image.size == (55 * puzzle.cols, 55 * puzzle.rows)
            assert (out / folder / record["img"]).exists()
    assert load_crossmath(out / "Altstyle")[0]["img_blank"].endswith("crossmath_3_000000_blank_altstyle.png")
    with Image.open(out / "Altstyle" / load_crossmath(out / "Altstyle")[0]["img_blank"]) as image:
        assert image.getpixel((0, 0)) in {(253, 245, 230), (92, 64, 51)}  # background or border

    # Kill mid-write: the last record of one style is half written; the rerun repairs and completes it.
    jsonl = out / "Original" / "crossmath.jsonl"
    lines = jsonl.read_text(encoding="utf-8").splitlines(keepends=True)
    jsonl.write_text("".join(lines[:3]) + lines[3][:40], encoding="utf-8")
    before_alt = (out / "Altstyle" / "crossmath.jsonl").read_bytes()
    assert cli_main([*argv[:2], "6", *argv[3:]]) == 0
    expected = [json.dumps(p.to_record("original"), ensure_ascii=False) for p in generate_puzzles(6, seed=3)]
    assert jsonl.read_text(encoding="utf-8").splitlines() == expected
    alt = out / "Altstyle" / "crossmath.jsonl"
    assert [puzzle_id_from_image(r["img_blank"]) for r in read_jsonl(alt)] == [f"crossmath_3_{i:06d}" for i in range(6)]
    assert alt.read_bytes().startswith(before_alt)  # nothing redone

    # A complete last line whose newline was lost is redone rather than glued to the next record.
    alt.write_bytes(alt.read_bytes()[:-1])
    assert cli_main([*argv[:2], "6", *argv[3:]]) == 0
    assert [r["id"] for r in load_crossmath(alt)] == [f"crossmath_3_{i:06d}" for i in range(6)]

    # Other generator flags into the same folder would mix two collections: refused.
    assert cli_main([*argv, "--difficulty", "hard"]) == 2
    assert "resume with the same flags" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [["--n", "-5"], ["--n", "0"], ["--n", "many"], ["--n-equations", "0"]])
def test_generate_rejects_non_positive_counts(tmp_path, capsys, bad):
    argv = ["crossmath", "generate", "--n", "2", "--out", str(tmp_path / "gen"), *bad]
    with pytest.raises(SystemExit) as exit_info:
        tokenswap_main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {bad[0]}" in err and (">= 1" in err)
    assert not (tmp_path / "gen").exists()


def test_generate_rejects_bad_generator_flags_before_writing(tmp_path, capsys):
    out = tmp_path / "gen"
    assert cli_main(["generate", "--n", "2", "--out", str(out), "--rows", "8"]) == 2
    assert "rows must be odd" in capsys.readouterr().err
    assert not out.exists()


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

    monkeypatch.setattr("tokenswap.families.load_checkpoint", no_load)
    assert cli_main(argv) == 0
    assert len(read_jsonl(out / f"predictions_{modality}.jsonl")) == 2
    other = [*argv]
    other[other.index("--model") + 1] = "another-model"
    assert cli_main(other) == 2
