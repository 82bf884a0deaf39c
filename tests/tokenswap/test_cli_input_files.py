"""Input files a command reads, cut, emptied, of the wrong shape or type, or missing: one line, exit 2, no traceback.

Every case goes through the real entry point (``tokenswap.cli.main``) on real files: the ones a command wrote
(``crossmath generate``, ``rest build``), the CrossMath release fixture, a tiny checkpoint where a model is named.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tokenswap.cli import main

RELEASE = Path(__file__).parent / "crossmath" / "fixtures" / "crossmath_release"


def run_cli(argv, capsys):
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:  # argparse's own usage errors exit 2 from inside the parser
        code = e.code
    return code, capsys.readouterr().err


def assert_refused(code, err, *fragments):
    """Exit 2 with one line on stderr (progress bars aside) holding every fragment, and no traceback."""
    assert code == 2, err
    assert "Traceback" not in err, err
    progress = ("%|", "it/s]", "examples/s]")  # tqdm bars, datasets' "Generating test split" lines
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.strip() and not any(p in line for p in progress)]
    assert len(lines) == 1, err
    for fragment in fragments:
        assert str(fragment) in lines[0], err


def cut(path: Path, share: float = 0.6) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[: int(len(raw) * share)])


def rewrite_jsonl(path: Path, change) -> None:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    change(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


# ---------------------------------------------------------------------------- crossmath fidelity
@pytest.fixture
def release(tmp_path):
    return Path(shutil.copytree(RELEASE, tmp_path / "release"))


def test_fidelity_without_the_released_images(release, capsys):
    for png in release.rglob("*.png"):
        png.unlink()
    code, err = run_cli(["crossmath", "fidelity", "--released", release, "--n", "2"], capsys)
    assert_refused(code, err, "none of the 3 released Original images is there",
                   release / "Original" / "test_images_blank_hr", "pass a checkout of github.com/xuyige/CrossMath "
                   "with its image folders")
    assert "min() arg" not in err


def test_fidelity_with_one_style_without_images(release, capsys):
    for png in (release / "Beige").rglob("*.png"):
        png.unlink()
    code, err = run_cli(["crossmath", "fidelity", "--released", release, "--n", "2"], capsys)
    assert_refused(code, err, "released Beige images is there", release / "Beige")


def test_fidelity_with_a_png_that_does_not_decode(release, capsys):
    png = sorted((release / "Original").rglob("*.png"))[0]
    cut(png, 0.3)
    code, err = run_cli(["crossmath", "fidelity", "--released", release, "--n", "2"], capsys)
    assert_refused(code, err, f"released image '{png}' does not decode", "restore it from github.com/xuyige/CrossMath")


@pytest.mark.parametrize("change, message", [
    (lambda rows: rows[0].update(markdown_table=5), "record 0 of {f}: 'markdown_table' must be a string"),
    (lambda rows: rows[0].pop("range"), "record 0 of {f} is not a released CrossMath record: it has no 'range'"),
    (lambda rows: rows[1].update(markdown_table="| 1 | + |\n| 2 |"), "record 1 of {f} is not a released CrossMath "
     "record: it does not parse (markdown_table rows must all have the same number of cells"),
], ids=["table-not-a-string", "no-range", "table-does-not-parse"])
def test_fidelity_on_a_record_that_is_not_a_released_one(release, capsys, change, message):
    jsonl = release / "Original" / "testset_hr.jsonl"
    rewrite_jsonl(jsonl, change)
    code, err = run_cli(["crossmath", "fidelity", "--released", release, "--n", "2"], capsys)
    assert_refused(code, err, message.format(f=jsonl))


def test_fidelity_on_a_cut_released_file(release, capsys):
    jsonl = release / "Original" / "testset_hr.jsonl"
    raw = jsonl.read_bytes()
    jsonl.write_bytes(raw[: raw.index(b"\n") + 40])
    code, err = run_cli(["crossmath", "fidelity", "--released", release, "--n", "2"], capsys)
    assert_refused(code, err, f"{jsonl}:2 is not valid JSON (Unterminated string starting at line 1, column 9",
                   "restore it from a checkout of github.com/xuyige/CrossMath")


# ---------------------------------------------------------------------------- crossmath eval
@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    out = tmp_path_factory.mktemp("crossmath-generated")
    assert main(["crossmath", "generate", "--n", "2", "--out", str(out), "--styles", "original"]) == 0
    return out


@pytest.fixture
def style(generated, tmp_path):
    return Path(shutil.copytree(generated / "Original", tmp_path / "Original"))


def crossmath_eval(model, data, out, modality="text"):
    return ["crossmath", "eval", "--model", model, "--data", data, "--modality", modality, "--out", out,
            "--max-new-tokens", "2"]


def test_crossmath_eval_on_a_folder_with_two_jsonl_files(tiny_qwen2vl, generated, tmp_path, capsys):
    folder = tmp_path / "two"
    folder.mkdir()
    for name in ("a.jsonl", "b.jsonl"):
        shutil.copy(generated / "Original" / "crossmath.jsonl", folder / name)
    code, err = run_cli(crossmath_eval(tiny_qwen2vl, folder, tmp_path / "o"), capsys)
    assert_refused(code, err, f"CrossMath data '{folder}' holds several JSONL files (a.jsonl, b.jsonl)",
                   f"pass one of them, e.g. '{folder / 'a.jsonl'}'")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("damage, message", [
    (lambda f: cut(f, 0.7), "{f}:2 is not valid JSON (Unterminated string"),
    (lambda f: f.write_text(f.read_text() + "42\n"), "{f}:3 holds a JSON int, not an object"),
    (lambda f: f.write_bytes(b'{"a": "\xff"}\n'), "{f}:1 is not UTF-8 text (byte 7 of the line)"),
    (lambda f: rewrite_jsonl(f, lambda rows: rows[0].update(markdown_answer=7)),
     "record 0 of {f}: 'markdown_answer' must be a string as in the release, got int"),
    (lambda f: f.write_text(f.read_text() * 2), "records 0 and 2 are both puzzle 'crossmath_0_000000'"),
    (lambda f: rewrite_jsonl(f, lambda rows: rows[0].update(markdown_answer_step="| foo |")),
     "record 0: markdown_answer_step cells must read 'step<k>', got 'foo'"),
    (lambda f: rewrite_jsonl(f, lambda rows: rows[1].update(markdown_answer_step="| step1 |")),
     "record 1: markdown_answer has"),
], ids=["cut", "non-object-line", "not-utf8", "answer-not-a-string", "one-puzzle-twice", "hop-label-unreadable",
        "hops-do-not-align"])
def test_crossmath_eval_on_a_damaged_jsonl(tiny_qwen2vl, style, tmp_path, capsys, damage, message):
    jsonl = style / "crossmath.jsonl"
    damage(jsonl)
    code, err = run_cli(crossmath_eval(tiny_qwen2vl, style, tmp_path / "o"), capsys)
    assert_refused(code, err, message.format(f=jsonl))
    assert not (tmp_path / "o").exists()  # refused before the output folder is made


@pytest.mark.parametrize("damage, message", [
    (lambda png: png.unlink(), "does not exist"),
    (lambda png: cut(png, 0.2), "does not decode (image file is truncated)"),
], ids=["missing", "cut"])
def test_crossmath_eval_on_a_puzzle_image_that_is_not_there(tiny_qwen2vl, style, tmp_path, capsys, damage, message):
    png = sorted((style / "test_images_blank_hr").glob("*.png"))[0]
    damage(png)
    code, err = run_cli(crossmath_eval(tiny_qwen2vl, style, tmp_path / "o", "image"), capsys)
    assert_refused(code, err, f"puzzle image '{png}' of record 'crossmath_0_000000' {message}",
                   "tokenswap crossmath generate")


def test_crossmath_eval_of_images_on_records_without_img_blank(tiny_qwen2vl, tmp_path, capsys):
    jsonl = tmp_path / "x.jsonl"
    jsonl.write_text(json.dumps({"markdown_table": "| 1 | + | 1 | = | ? |", "markdown_answer": "| 2 |",
                                 "markdown_answer_step": "| step1 |"}) + "\n")
    code, err = run_cli(crossmath_eval(tiny_qwen2vl, jsonl, tmp_path / "o", "image"), capsys)
    assert_refused(code, err, "CrossMath record 'x_000000' has no img_blank", "evaluate with --modality text")
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------- crossmath generate (resume)
@pytest.mark.parametrize("content, message", [
    ('{"seed": 0, "diffic', "is not valid JSON"),
    ("", "is empty"),
    ("[1]", "holds a JSON list, not an object"),
], ids=["cut", "empty", "list"])
def test_generate_resume_on_a_damaged_params_file(generated, tmp_path, capsys, content, message):
    out = Path(shutil.copytree(generated, tmp_path / "cm"))
    (out / "generate_params.json").write_text(content)
    code, err = run_cli(["crossmath", "generate", "--n", "3", "--out", out, "--styles", "original"], capsys)
    assert_refused(code, err, f"--out file '{out / 'generate_params.json'}' {message}", "pick another --out")
    assert len((out / "Original" / "crossmath.jsonl").read_text().splitlines()) == 2  # nothing added


@pytest.mark.parametrize("first_line, message", [
    ('{"img_bl', "{f}:1 is not valid JSON"),
    ("[]", "{f}:1 holds a JSON list, not an object"),
    ('{"a": 1}', "{f}: record 1 has no img_blank file name"),
], ids=["bad-line-before-the-end", "list", "no-img-blank"])
def test_generate_resume_on_a_damaged_jsonl(generated, tmp_path, capsys, first_line, message):
    out = Path(shutil.copytree(generated, tmp_path / "cm"))
    jsonl = out / "Original" / "crossmath.jsonl"
    before = first_line + "\n" + jsonl.read_text()
    jsonl.write_text(before)
    code, err = run_cli(["crossmath", "generate", "--n", "3", "--out", out, "--styles", "original"], capsys)
    assert_refused(code, err, message.format(f=jsonl))
    assert jsonl.read_text() == before  # a damaged line before the end is the user's to fix, never cut


# ---------------------------------------------------------------------------- rest
@pytest.fixture(scope="module")
def rest_built(tmp_path_factory):
    out = tmp_path_factory.mktemp("rest-built")
    assert main(["rest", "build", "--source", "soebench", "--n", "2", "--out", str(out)]) == 0
    return out


@pytest.fixture
def rest_data(rest_built, tmp_path):
    return Path(shutil.copytree(rest_built, tmp_path / "rest"))


def rest_eval(model, data, out):
    return ["rest", "eval", "--model", model, "--data", data, "--out", out, "--max-new-tokens", "2"]


@pytest.mark.parametrize("damage, message", [
    (lambda f: cut(f, 0.7), "{f}:2 is not valid JSON (Unterminated string"),
    (lambda f: f.write_text("[1]\n"), "{f}:1 holds a JSON list, not an object"),
    (lambda f: rewrite_jsonl(f, lambda rows: rows[0].pop("gold")), "{f}:1: the item has no 'gold'"),
    (lambda f: rewrite_jsonl(f, lambda rows: rows[1].update(colour=1)), "{f}:2: the item has an unknown field "
     "'colour'"),
    (lambda f: rewrite_jsonl(f, lambda rows: rows[0].update(text=5)), "{f}:1: the item's 'text' must be a string, "
     "got int"),
    (lambda f: rewrite_jsonl(f, lambda rows: rows[0].update(answer_type="essay")), "{f}:1: the item's "
     "'answer_type' must be one of mc, numeric, soe, got 'essay'"),
    (lambda f: f.write_text(""), "{f}' holds no items"),
], ids=["cut", "list", "no-gold", "unknown-field", "text-not-a-string", "unknown-answer-type", "empty"])
def test_rest_eval_on_a_damaged_items_jsonl(tiny_qwen2vl, rest_data, tmp_path, capsys, damage, message):
    items = rest_data / "items.jsonl"
    damage(items)
    code, err = run_cli(rest_eval(tiny_qwen2vl, rest_data, tmp_path / "o"), capsys)
    assert_refused(code, err, message.format(f=items), "tokenswap rest build")
    assert not (tmp_path / "o").exists()


def test_rest_eval_on_a_meta_json_without_its_source(tiny_qwen2vl, rest_data, tmp_path, capsys):
    meta = rest_data / "meta.json"
    meta.write_text(json.dumps({k: v for k, v in json.loads(meta.read_text()).items() if k != "source"}))
    code, err = run_cli(rest_eval(tiny_qwen2vl, rest_data, tmp_path / "o"), capsys)
    assert_refused(code, err, f"--data file '{meta}' has no `source`", "tokenswap rest build")


@pytest.mark.parametrize("damage, message", [
    (lambda png: png.unlink(), "does not exist"),
    (lambda png: cut(png, 0.2), "does not decode (image file is truncated)"),
], ids=["missing", "cut"])
def test_rest_eval_on_a_rendering_that_is_not_there(tiny_qwen2vl, rest_data, tmp_path, capsys, damage, message):
    png = sorted(rest_data.glob("images/*/sans_200/item.png"))[0]
    damage(png)
    code, err = run_cli(rest_eval(tiny_qwen2vl, rest_data, tmp_path / "o"), capsys)
    assert_refused(code, err, f"rendering '{png}' {message}", "tokenswap rest build")


def test_rest_build_resumes_a_cut_items_jsonl_and_redoes_only_the_cut_item(rest_data, rest_built, capsys):
    items = rest_data / "items.jsonl"
    whole = items.read_bytes()
    first = whole[: whole.index(b"\n") + 1]
    items.write_bytes(first + whole[len(first):][:30])  # killed while the second item's line was written
    code, err = run_cli(["rest", "build", "--source", "soebench", "--n", "2", "--out", rest_data], capsys)
    assert code == 0, err
    assert items.read_bytes() == whole


@pytest.mark.parametrize("name, content, message", [
    ("meta.json", '{"source": "soe', "is not valid JSON"),
    ("meta.json", "[]", "holds a JSON list, not an object"),
    ("items.jsonl", "3\n", ":1 holds a JSON int, not an object"),
], ids=["meta-cut", "meta-list", "items-non-object"])
def test_rest_build_resume_on_a_damaged_folder(rest_data, capsys, name, content, message):
    (rest_data / name).write_text(content)
    code, err = run_cli(["rest", "build", "--source", "soebench", "--n", "2", "--out", rest_data], capsys)
    assert_refused(code, err, f"{rest_data / name}", message, "use a new --out folder")


@pytest.mark.parametrize("argv, message", [
    (["--source", "soebench"], "--n is required for --source soebench"),
    (["--source", "mmlu"], "--data (a hub id or a local file or folder) is required for --source mmlu"),
], ids=["soebench-without-n", "mmlu-without-data"])
def test_rest_build_without_a_required_flag(tmp_path, capsys, argv, message):
    code, err = run_cli(["rest", "build", *argv, "--out", tmp_path / "r"], capsys)
    assert_refused(code, err, message)
    assert not (tmp_path / "r").exists()


def _mmlu_folder(root: Path, table) -> Path:
    import pyarrow.parquet as pq

    (root / "all").mkdir(parents=True)
    pq.write_table(table, root / "all" / "test-00000-of-00001.parquet")
    return root


def _mmlu_table(**columns):
    import pyarrow as pa

    base = {"question": ["Is a cat an animal?"], "subject": ["bio"], "choices": [["yes", "no", "a", "b"]],
            "answer": [0]}
    return pa.table({**base, **columns})


@pytest.mark.parametrize("table, message", [
    (lambda pa: pa.table({"q": ["x"]}), "row 0: missing ['question', 'choices', 'answer'] for the cais/mmlu schema; "
     "it has ['q']"),
    (lambda pa: _mmlu_table(answer=[7]), "row 0: `answer` must be an option index 0..3, got 7"),
    (lambda pa: _mmlu_table(answer=["A"]), "row 0: `answer` must be an option index 0..3, got 'A'"),
    (lambda pa: _mmlu_table(question=[5]), "row 0: `question` must be a string, got int"),
], ids=["missing-columns", "answer-out-of-range", "answer-a-letter", "question-not-a-string"])
def test_rest_build_on_a_local_source_of_the_wrong_shape(tmp_path, capsys, table, message):
    import pyarrow as pa

    data = _mmlu_folder(tmp_path / "m", table(pa))
    code, err = run_cli(["rest", "build", "--source", "mmlu", "--data", data, "--out", tmp_path / "r"], capsys)
    assert_refused(code, err, f"--data '{data}'", message)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("kind, message", [
    ("cut-parquet", "cannot be read as parquet (ArrowInvalid: Parquet magic bytes not found"),
    ("empty-split", "holds no rows"),
    ("cut-jsonl", "gsm.jsonl:2 is not valid JSON"),
], ids=["cut-parquet", "empty-split", "cut-jsonl"])
def test_rest_build_on_a_local_source_that_does_not_read(tmp_path, capsys, kind, message):
    import pyarrow as pa

    if kind == "cut-parquet":
        data = _mmlu_folder(tmp_path / "m", _mmlu_table())
        cut(data / "all" / "test-00000-of-00001.parquet", 0.5)
        source = "mmlu"
    elif kind == "empty-split":
        data = _mmlu_folder(tmp_path / "m", _mmlu_table().slice(0, 0))
        source = "mmlu"
        assert pa  # the table above is typed, with no rows
    else:
        data = tmp_path / "gsm.jsonl"
        data.write_text('{"question": "One. Two?", "answer": "#### 2"}\n{"question": "2+')
        source = "gsm"
    code, err = run_cli(["rest", "build", "--source", source, "--data", data, "--out", tmp_path / "r"], capsys)
    assert_refused(code, err, str(data), message, "restore the file")
    assert not (tmp_path / "r").exists()


# ---------------------------------------------------------------------------- build-bench
@pytest.fixture
def mmlu(tmp_path):
    return _mmlu_folder(tmp_path / "mmlu", _mmlu_table(question=["Is a cat an animal?", "Is an apple red?"],
                                                       subject=["bio", "bio"], choices=[["yes", "no", "a", "b"]] * 2,
                                                       answer=[0, 0]))


def bench_config(tmp_path, store, source, **changes) -> list:
    cfg = {"out_dir": str(tmp_path / "bench"), "store": str(store), "source": str(source), "filters": ["validity"],
           "progress": False, "judge": {"base_url": "http://127.0.0.1:9/v1", "model": "judge", "max_retries": 0}}
    cfg.update(changes)
    (tmp_path / "bench.yaml").write_text(yaml.safe_dump(cfg))
    return ["build-bench", "--config", tmp_path / "bench.yaml"]


@pytest.mark.parametrize("changes, message", [
    ({"judge": None}, "`judge` is required by the filter validity: add a judge section"),
    ({"filters": ["importance"], "judge": None}, "`proxy` is required by the filter importance: add a proxy section"),
    ({"limit": 0}, "`limit` must be >= 1 or null (all rows), got 0"),
    ({"limit": -1}, "`limit` must be >= 1 or null (all rows), got -1"),
    ({"filters": ["vibes"]}, "`filters` must be among validity, importance, caption; got unknown ['vibes']"),
], ids=["no-judge", "no-proxy", "limit-0", "limit-negative", "unknown-filter"])
def test_build_bench_config_refused_before_any_work(tiny_store, mmlu, tmp_path, capsys, changes, message):
    code, err = run_cli(bench_config(tmp_path, tiny_store.root, mmlu, **changes), capsys)
    assert_refused(code, err, f"in {tmp_path / 'bench.yaml'}: ", message)
    assert not (tmp_path / "bench").exists()


def test_build_bench_on_a_cut_store_json(tiny_store, mmlu, tmp_path, capsys):
    store = Path(shutil.copytree(tiny_store.root, tmp_path / "store"))
    cut(store / "store.json", 0.5)
    code, err = run_cli(bench_config(tmp_path, store, mmlu), capsys)
    assert_refused(code, err, f"{store / 'store.json'}: not valid JSON")
    assert not (tmp_path / "bench").exists()


@pytest.mark.parametrize("kind, message", [
    ("cut", "cannot be read"),
    ("missing-columns", "lacks MMLU columns ['answer', 'choices', 'question', 'subject']; has ['q']"),
    ("answer-a-letter", "row 0: `answer` must be an option index 0..3, got 'A'"),
    ("answer-out-of-range", "`answer` must be in 0..3, got 9"),
], ids=["cut", "missing-columns", "answer-a-letter", "answer-out-of-range"])
def test_build_bench_on_a_source_of_the_wrong_shape(tiny_store, tmp_path, capsys, kind, message):
    import pyarrow as pa

    table = {"cut": _mmlu_table(), "missing-columns": pa.table({"q": ["x"]}),
             "answer-a-letter": _mmlu_table(answer=["A"]), "answer-out-of-range": _mmlu_table(answer=[9])}[kind]
    source = _mmlu_folder(tmp_path / "m", table)
    if kind == "cut":
        cut(source / "all" / "test-00000-of-00001.parquet", 0.5)
    code, err = run_cli(bench_config(tmp_path, tiny_store.root, source), capsys)
    assert_refused(code, err, str(source), message)
    assert not (tmp_path / "bench").exists()


@pytest.mark.parametrize("content, message", [
    ("[1]\n", ":1 holds a JSON list, not an object"),
    ('{"kept": true}\n', ":1 has no `id`"),
    ('{"id": "bio/test/0", "kept": tr\n{"id": "bio/test/1", "kept": false}\n', ":1 is not valid JSON"),
], ids=["list", "no-id", "bad-line-before-the-end"])
def test_build_bench_resume_on_a_damaged_results_jsonl(tiny_store, mmlu, tmp_path, capsys, content, message):
    (tmp_path / "bench").mkdir()
    results = tmp_path / "bench" / "results.jsonl"
    results.write_text(content)
    code, err = run_cli(bench_config(tmp_path, tiny_store.root, mmlu), capsys)
    assert_refused(code, err, f"{results}{message}", "pick a new out_dir")
    assert results.read_text() == content


# ---------------------------------------------------------------------------- build-store
@pytest.fixture(scope="module")
def store_build(tmp_path_factory):
    out = tmp_path_factory.mktemp("store-build") / "b"
    argv = ["build-store", "--config", "store_embedded.yaml", f"output_dir={out}", "data.max_samples=20"]
    assert main(argv) == 0
    return out


@pytest.mark.parametrize("damage, message", [
    (lambda b: cut(b / "state" / "plan.json", 0.5), "build plan '{b}/state/plan.json' is not valid JSON"),
    (lambda b: (b / "state" / "plan.json").write_text("[]"), "build plan '{b}/state/plan.json' holds a JSON list"),
    (lambda b: [m.write_text('{"n') for m in (b / "state").rglob("done-*.json")],
     "done marker '{b}/state/candidates/done-r000.json' is not valid JSON"),
    # The dataset stage reads the candidate chunks again: a cut one is the same InputError as every JSONL's.
    (lambda b: [cut(b / "state" / "candidates" / "part-r000-000000.jsonl", 0.5),
                shutil.rmtree(b / "state" / "dataset"), shutil.rmtree(b / "dataset")],
     "build file {b}/state/candidates/part-r000-000000.jsonl:"),
], ids=["plan-cut", "plan-list", "done-marker-cut", "candidate-chunk-cut"])
def test_build_store_resume_on_damaged_state(store_build, tmp_path, capsys, damage, message):
    build = Path(shutil.copytree(store_build, tmp_path / "b"))
    damage(build)
    argv = ["build-store", "--config", "store_embedded.yaml", f"output_dir={build}", "data.max_samples=20"]
    code, err = run_cli(argv, capsys)
    # The rerun first says what it resumes from (one line), then finds the damage: one error line after it.
    resumed = [line for line in err.splitlines() if line.startswith(f"build-store: resuming {build}: ")]
    err = "".join(line + "\n" for line in err.splitlines() if line not in resumed)
    assert_refused(code, err, message.format(b=build))
    if "candidates/part-" in message:
        assert " is not valid JSON (" in err and "this build file is damaged: build again in a new output_dir" in err


@pytest.mark.parametrize("argv, message", [
    (["--config", "{t}/none.yaml"], "config '{t}/none.yaml' not found as a path"),
    (["--config", "{t}/list.yaml"], "1 problem in {t}/list.yaml: the top level must be a mapping, got list"),
    (["--config", "store_embedded.yaml", "samples_per_shard=abc"], "`samples_per_shard` must be an integer, got 'abc'"),
], ids=["missing", "list", "wrong-type"])
def test_build_store_config_problems_are_one_line_through_main(tmp_path, capsys, argv, message):
    (tmp_path / "list.yaml").write_text("- 1\n")
    code, err = run_cli(["build-store", *(a.format(t=tmp_path) for a in argv)], capsys)
    assert_refused(code, err, "tokenswap build-store: error: ", message.format(t=tmp_path))


# ---------------------------------------------------------------------------- compare
@pytest.fixture
def run_folder(tmp_path):
    out = tmp_path / "run-a"
    out.mkdir()
    (out / "log_history.json").write_text(json.dumps([{"loss": 2.0, "step": 1}]))
    (out / "tokenswap_config.json").write_text(json.dumps({"run": {"arm": "text", "pair": "p", "seed": 0}}))
    return out


@pytest.mark.parametrize("name, content, message", [
    ("log_history.json", "[1, 2]", "training log '{f}' row 0 is a JSON int, not an object"),
    ("log_history.json", '[{"loss": "x", "step": 1}]', "training log '{f}' row 0: `loss` must be a number, got 'x'"),
    ("log_history.json", '[{"loss": 1.0, "step": "a"}]', "training log '{f}' row 0: `step` must be a number, got 'a'"),
    ("tokenswap_config.json", '{"run": 3}', "run config '{f}': `run` must be an object, got int"),
    ("tokenswap_config.json", '{"run": {"arm": "text", "seed": "x"}}', "run config '{f}': `run.seed` must be an "
     "integer, got 'x'"),
], ids=["log-rows-not-objects", "loss-a-string", "step-a-string", "run-not-an-object", "seed-a-string"])
def test_compare_on_run_files_of_the_wrong_shape(run_folder, tmp_path, capsys, name, content, message):
    (run_folder / name).write_text(content)
    code, err = run_cli(["compare", "--runs", run_folder, "--out", tmp_path / "cmp"], capsys)
    assert_refused(code, err, message.format(f=run_folder / name), "leave the folder out of --runs")
    assert not (tmp_path / "cmp").exists()


def test_compare_on_a_wandb_offline_run_points_to_the_run_folder(tmp_path, capsys):
    offline = tmp_path / "wandb" / "offline-run-1"
    offline.mkdir(parents=True)
    (offline / "run-1.wandb").write_bytes(b"nope")
    for runs in (offline, tmp_path):  # the run, or a folder of W&B runs without the recipe's log_history.json
        code, err = run_cli(["compare", "--runs", runs, "--out", tmp_path / "cmp"], capsys)
        assert_refused(code, err, f"{runs}: a W&B offline run, which compare does not read", "log_history.json")


# ---------------------------------------------------------------------------- probe
@pytest.mark.parametrize("content, message", [
    ("\n\n", "--pairs 2 needs 2 texts, but --texts '{f}' holds 0"),
    ("one\n", "--pairs 2 needs 2 texts, but --texts '{f}' holds 1"),
], ids=["empty", "too-few"])
def test_probe_on_a_texts_file_with_too_few_texts(tiny_qwen2vl, tmp_path, capsys, content, message):
    texts = tmp_path / "texts.txt"
    texts.write_text(content)
    code, err = run_cli(["probe", "--model", tiny_qwen2vl, "--pairs", "2", "--texts", texts, "--out", tmp_path / "p"],
                        capsys)
    assert_refused(code, err, message.format(f=texts), "one text per line")
    assert not (tmp_path / "p").exists()


# ---------------------------------------------------------------------------- a checkpoint folder (--model)
def _damaged_checkpoint(tiny_qwen2vl, tmp_path, damage) -> Path:
    model = Path(shutil.copytree(tiny_qwen2vl, tmp_path / "ckpt"))
    if damage == "config-cut":
        cut(model / "config.json", 0.5)
    elif damage == "config-list":
        (model / "config.json").write_text("[]")
    elif damage == "no-weights":
        for weights in model.glob("*.safetensors"):
            weights.unlink()
    else:
        for weights in model.glob("*.safetensors"):
            cut(weights, 0.5)
    return model


CHECKPOINT_DAMAGE = {
    "config-cut": "--model config '{m}/config.json' is not valid JSON",
    "config-list": "--model config '{m}/config.json' holds a JSON list, not an object",
    "no-weights": "--model '{m}' holds no weights (none of model.safetensors",
    "weights-cut": "checkpoint '{m}' does not load (SafetensorError",
}


@pytest.mark.parametrize("command", ["probe", "crossmath eval", "rest eval"])
@pytest.mark.parametrize("damage", sorted(CHECKPOINT_DAMAGE))
def test_a_damaged_checkpoint_folder_is_named(tiny_qwen2vl, generated, rest_built, tmp_path, capsys, command,
                                              damage):
    model = _damaged_checkpoint(tiny_qwen2vl, tmp_path, damage)
    argv = {
        "probe": ["probe", "--model", model, "--pairs", "2", "--out", tmp_path / "o"],
        "crossmath eval": crossmath_eval(model, generated / "Original", tmp_path / "o"),
        "rest eval": rest_eval(model, rest_built, tmp_path / "o"),
    }[command]
    code, err = run_cli(argv, capsys)
    assert_refused(code, err, CHECKPOINT_DAMAGE[damage].format(m=model), "pass a checkpoint folder a run saved whole")
    if damage != "weights-cut":  # found only by loading, after the output folder is made
        assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------- more inputs of build-bench, build-store, rest build
@pytest.mark.parametrize("content, message", [
    (None, "cannot be read (No such file or directory)"),
    (b"\xff\xfe cat\n", "is not UTF-8 text (byte 0)"),
], ids=["missing", "not-utf8"])
def test_build_bench_on_a_bad_vocabulary_file(tiny_store, mmlu, tmp_path, capsys, content, message):
    vocab = tmp_path / "vocab.txt"
    if content is not None:
        vocab.write_bytes(content)
    argv = bench_config(tmp_path, tiny_store.root, mmlu, extractor={"kind": "lexicon", "vocabulary_file": str(vocab)})
    code, err = run_cli(argv, capsys)
    assert_refused(code, err, f"`extractor.vocabulary_file` '{vocab}' {message}")


def test_build_store_on_a_vocabulary_file_that_is_not_utf8(tmp_path, capsys):
    vocab = tmp_path / "vocab.txt"
    vocab.write_bytes(b"\xff\xfe cat\n")
    code, err = run_cli(["build-store", "--config", "store_embedded.yaml", f"output_dir={tmp_path / 'b'}",
                         f"extractor.vocabulary_file={vocab}"], capsys)
    assert_refused(code, err, f"`extractor.vocabulary_file` '{vocab}' is not UTF-8 text (byte 0)",
                   "(nothing was written)")
    assert not (tmp_path / "b").exists()


def test_rest_build_on_arc_rows_of_another_shape_and_a_bad_colour(tmp_path, capsys):
    arc = tmp_path / "arc.jsonl"
    arc.write_text(json.dumps({"id": "a1", "question": "Q?", "choices": ["x", "y"], "answerKey": "A"}) + "\n")
    code, err = run_cli(["rest", "build", "--source", "arc", "--data", arc, "--out", tmp_path / "r"], capsys)
    assert_refused(code, err, f"--data '{arc}' row 0: `choices` must be an object with `label` and `text` lists")
    code, err = run_cli(["rest", "build", "--source", "soebench", "--n", "1", "--color", "blurple",
                         "--out", tmp_path / "r"], capsys)
    assert_refused(code, err, "--color: color must be one of", "got 'blurple'")
    assert not (tmp_path / "r").exists()


def test_compare_on_a_training_log_that_is_a_folder(run_folder, tmp_path, capsys):
    (run_folder / "log_history.json").unlink()
    (run_folder / "log_history.json").mkdir()
    code, err = run_cli(["compare", "--runs", run_folder, "--out", tmp_path / "cmp"], capsys)
    assert_refused(code, err, f"training log '{run_folder / 'log_history.json'}' is a folder, not a file")


def test_eval_on_a_bench_whose_choices_are_one_string(tiny_qwen2vl, tiny_bench, tmp_path, capsys):
    # "abcd" was read as the four options a, b, c, d: a bench of the wrong shape scored as if it were right.
    import pyarrow as pa
    import pyarrow.parquet as pq

    bench = Path(shutil.copytree(tiny_bench, tmp_path / "bench"))
    for part in bench.glob("*/test-*.parquet"):
        table = pq.read_table(part)
        column = table.schema.get_field_index("choices")
        pq.write_table(table.set_column(column, "choices", pa.array(["abcd"] * len(table))), part)
    code, err = run_cli(["eval", "--model", tiny_qwen2vl, "--bench", bench, "--scorer", "loglik",
                         "--out", tmp_path / "o"], capsys)
    assert_refused(code, err, f"--bench '{bench}'", "row 0: `choices` must be a list of 4 options, got str")
