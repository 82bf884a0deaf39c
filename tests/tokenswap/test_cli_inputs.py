"""Malformed inputs to every `tokenswap` command: exit 2 with one line naming the file or flag and the fix.

Each case goes through the real entry point (``tokenswap.cli.main``) with a real tiny checkpoint where a model is
needed, so a check that ran only after the model loaded (or never) would show here as a traceback or exit 0/1.
"""

from __future__ import annotations

import json
import shutil

import pyarrow.parquet as pq
import pytest

from tokenswap.cli import main

CROSSMATH_RECORD = {"markdown_table": "| 1 | + | 1 | = | 2 |", "markdown_answer": "[2]", "markdown_answer_step": "[1]"}


def run_cli(argv, capsys):
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:  # argparse's own usage errors exit 2 from inside the parser
        code = e.code
    return code, capsys.readouterr().err


def assert_refused(code, err, *fragments):
    assert code == 2, err
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]  # one line (after argparse's usage, for its own errors)
    for fragment in fragments:
        assert str(fragment) in last, err


@pytest.fixture
def run_folder(tmp_path):
    """A finished recipe output folder, as `tokenswap compare` reads it."""
    out = tmp_path / "run-a"
    out.mkdir()
    (out / "log_history.json").write_text(json.dumps([{"loss": 2.0, "step": 1}, {"loss": 1.5, "step": 2}]))
    (out / "tokenswap_config.json").write_text(json.dumps({"run": {"arm": "text", "pair": "p"}}))
    return out


def _bench_with(tiny_bench, tmp_path, change):
    """A copy of the tiny bench whose two parquet tables went through ``change(table) -> table``."""
    root = tmp_path / "bench"
    shutil.copytree(tiny_bench, root)
    for part in root.glob("*/test-*.parquet"):
        pq.write_table(change(pq.read_table(part)), part)
    return root


# ---------------------------------------------------------------------------- tokenswap eval
def test_eval_on_a_zero_row_bench(tiny_qwen2vl, tiny_bench, tmp_path, capsys):
    bench = _bench_with(tiny_bench, tmp_path, lambda t: t.slice(0, 0))
    code, err = run_cli(["eval", "--model", tiny_qwen2vl, "--bench", bench, "--scorer", "loglik",
                         "--out", tmp_path / "o"], capsys)
    assert_refused(code, err, f"--bench '{bench}': {bench / 'text' / 'test-00000-of-00001.parquet'}: no rows in "
                   "text/test; the split is empty")


def test_eval_on_an_answer_out_of_range(tiny_qwen2vl, tiny_bench, tmp_path, capsys):
    import pyarrow as pa

    def answer_7(t):
        i = t.schema.get_field_index("answer")
        return t.set_column(i, "answer", pa.array([7] + t.column("answer").to_pylist()[1:], pa.int64()))

    bench = _bench_with(tiny_bench, tmp_path, answer_7)
    code, err = run_cli(["eval", "--model", tiny_qwen2vl, "--bench", bench, "--scorer", "loglik",
                         "--out", tmp_path / "o"], capsys)
    assert_refused(code, err, f"{bench} (text/test) row 0", "`answer` must be in 0..3, got 7", "fix or drop that row")


@pytest.mark.parametrize("flag", ["--limit", "--batch-size", "--k", "--max-new-tokens"])
@pytest.mark.parametrize("value", ["-1", "0"])
def test_eval_counts_below_one(tiny_bench, tmp_path, capsys, flag, value):
    code, err = run_cli(["eval", "--model", tmp_path / "never-loaded", "--bench", tiny_bench, flag, value], capsys)
    assert_refused(code, err, f"argument {flag}: must be >= 1, got {value}")


# ---------------------------------------------------------------------------- output folders that are files
@pytest.mark.parametrize("command", ["eval", "crossmath eval", "crossmath generate", "rest eval", "compare", "probe"])
def test_an_output_folder_that_is_a_file_is_refused_before_any_work(command, tiny_qwen2vl, tiny_bench, run_folder,
                                                                     tmp_path, capsys):
    taken = tmp_path / "taken.txt"
    taken.write_text("not a folder")
    (tmp_path / "cm.jsonl").write_text(json.dumps(CROSSMATH_RECORD) + "\n")
    (tmp_path / "rest").mkdir()
    (tmp_path / "rest" / "meta.json").write_text('{"variants": ["sans_200"]}')
    argv = {
        "eval": ["eval", "--model", tiny_qwen2vl, "--bench", tiny_bench, "--scorer", "loglik"],
        "crossmath eval": ["crossmath", "eval", "--model", tiny_qwen2vl, "--data", tmp_path / "cm.jsonl",
                           "--modality", "text"],
        "crossmath generate": ["crossmath", "generate", "--n", "1"],
        "rest eval": ["rest", "eval", "--model", tiny_qwen2vl, "--data", tmp_path / "rest"],
        "compare": ["compare", "--runs", run_folder],
        "probe": ["probe", "--model", tiny_qwen2vl, "--pairs", "2"],
    }[command]
    code, err = run_cli([*argv, "--out", taken], capsys)
    assert_refused(code, err, f"--out '{taken}' is a file, not a folder")
    assert taken.read_text() == "not a folder"


def test_a_subfolder_of_a_file_as_output_is_refused(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    code, err = run_cli(["crossmath", "generate", "--n", "1", "--out", tmp_path / "file" / "sub"], capsys)
    assert_refused(code, err, f"--out '{tmp_path / 'file' / 'sub'}' cannot be a folder")


# ---------------------------------------------------------------------------- crossmath
def test_crossmath_eval_on_an_empty_jsonl(tiny_qwen2vl, tmp_path, capsys):
    (tmp_path / "empty.jsonl").write_text("")
    code, err = run_cli(["crossmath", "eval", "--model", tiny_qwen2vl, "--data", tmp_path / "empty.jsonl",
                         "--modality", "text", "--out", tmp_path / "o"], capsys)
    assert_refused(code, err, f"--data '{tmp_path / 'empty.jsonl'}' holds no puzzles", "crossmath generate")
    assert not (tmp_path / "o").exists()


def test_crossmath_eval_on_a_jsonl_without_its_fields(tiny_qwen2vl, tmp_path, capsys):
    (tmp_path / "other.jsonl").write_text('{"question": "2+2"}\n')
    code, err = run_cli(["crossmath", "eval", "--model", tiny_qwen2vl, "--data", tmp_path / "other.jsonl",
                         "--modality", "text", "--out", tmp_path / "o"], capsys)
    assert_refused(code, err, f"record 0 of {tmp_path / 'other.jsonl'} has no 'markdown_table'")


@pytest.mark.parametrize("flag", ["--batch-size", "--max-new-tokens"])
def test_crossmath_eval_counts_below_one(tmp_path, capsys, flag):
    code, err = run_cli(["crossmath", "eval", "--model", "m", "--data", tmp_path, "--modality", "text",
                         "--out", tmp_path / "o", flag, "0"], capsys)
    assert_refused(code, err, f"argument {flag}: must be >= 1, got 0")


def test_crossmath_fidelity_on_empty_released_files(tmp_path, capsys):
    from tokenswap.crossmath.fidelity import RELEASED_FILES

    for name in RELEASED_FILES.values():
        (tmp_path / "data" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "data" / name).write_text("")
    code, err = run_cli(["crossmath", "fidelity", "--released", tmp_path, "--n", "2"], capsys)
    assert_refused(code, err, f"{tmp_path / 'data' / RELEASED_FILES['original']} holds no puzzles",
                   "github.com/xuyige/CrossMath")


# ---------------------------------------------------------------------------- rest eval
@pytest.mark.parametrize("meta, message", [
    ("{}", "has no `variants` list"),
    ('{"variants": "sans_200"}', "has no `variants` list"),
    ('{"variants": ["sans_2', "is not valid JSON"),
    ("", "is empty"),
], ids=["no-variants", "not-a-list", "truncated", "empty"])
def test_rest_eval_on_a_bad_meta_json(tiny_qwen2vl, tmp_path, capsys, meta, message):
    (tmp_path / "rest").mkdir()
    (tmp_path / "rest" / "meta.json").write_text(meta)
    code, err = run_cli(["rest", "eval", "--model", tiny_qwen2vl, "--data", tmp_path / "rest",
                         "--out", tmp_path / "o"], capsys)
    assert_refused(code, err, f"--data file '{tmp_path / 'rest' / 'meta.json'}' {message}", "tokenswap rest build")


def test_rest_eval_on_a_variant_that_was_not_built(tiny_qwen2vl, tmp_path, capsys):
    (tmp_path / "rest").mkdir()
    (tmp_path / "rest" / "meta.json").write_text('{"variants": ["sans_200"]}')
    code, err = run_cli(["rest", "eval", "--model", tiny_qwen2vl, "--data", tmp_path / "rest", "--out",
                         tmp_path / "o", "--perturbations", "mono_50"], capsys)
    assert_refused(code, err, f"variants ['mono_50'] were not built in '{tmp_path / 'rest' / 'meta.json'}' "
                   "(built: ['sans_200'])")
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------- compare
@pytest.mark.parametrize("name, content, message", [
    ("log_history.json", '[{"loss": 2.0, "step": 1}, {"lo', "training log '{f}' is not valid JSON"),
    ("log_history.json", '{"loss": 2.0}', "training log '{f}' is not a JSON list of log rows"),
    ("tokenswap_config.json", '{"run": {"arm": "te', "run config '{f}' is not valid JSON"),
], ids=["truncated-log", "log-not-a-list", "truncated-config"])
def test_compare_on_a_truncated_run_file(run_folder, tmp_path, capsys, name, content, message):
    (run_folder / name).write_text(content)
    code, err = run_cli(["compare", "--runs", run_folder, "--out", tmp_path / "cmp"], capsys)
    assert_refused(code, err, message.format(f=run_folder / name), "leave the folder out of --runs")


def test_compare_on_one_folder_given_twice(run_folder, tmp_path, capsys, monkeypatch):
    code, err = run_cli(["compare", "--runs", run_folder, run_folder, "--out", tmp_path / "cmp"], capsys)
    assert_refused(code, err, f"--runs: '{run_folder}' is the same run given twice; give each run once")
    monkeypatch.chdir(tmp_path)
    code, err = run_cli(["compare", "--runs", "run-a", f"./{run_folder.name}/", "--out", tmp_path / "cmp"], capsys)
    assert_refused(code, err, "'run-a' and './run-a/' are the same run given twice")
    assert not (tmp_path / "cmp").exists()


# ---------------------------------------------------------------------------- probe
@pytest.mark.parametrize("kind", ["missing", "folder-without-config", "a-file"])
def test_probe_with_a_bad_model_path(tmp_path, capsys, kind):
    model = tmp_path / "ckpt"
    if kind == "folder-without-config":
        model.mkdir()
        (model / "notes.txt").write_text("x")
    elif kind == "a-file":
        model.write_text("x")
    code, err = run_cli(["probe", "--model", model, "--pairs", "2", "--out", tmp_path / "o"], capsys)
    message = {"missing": "does not exist locally", "folder-without-config": "is a folder without config.json",
               "a-file": "is a file; pass a checkpoint folder"}[kind]
    assert_refused(code, err, f"--model '{model}' {message}")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("flag", ["--pairs", "--batch-size"])
def test_probe_counts_below_one(tmp_path, capsys, flag):
    code, err = run_cli(["probe", "--model", tmp_path, flag, "-1"], capsys)
    assert_refused(code, err, f"argument {flag}: must be >= 1, got -1")
