"""A missing or mistyped --bench, --data, --model or run folder: one line saying no such folder exists and what a
valid one holds, exit status 2, for every command that takes one (issue 39 item 2).

The values are the typos a user makes: a path such as ``.cache/tiny-benc`` (which the hub would answer with "Repo id
must use alphanumeric chars"), and an ``owner/name``-shaped path such as ``data/mmlu`` or a bare name, which only the
hub can refuse (offline here, as in the whole suite).
"""

from __future__ import annotations

import json

import pytest

from tokenswap.cli import main

OPENAI = ["--backend", "openai", "--base-url", "http://127.0.0.1:9/v1"]  # no model check, and nothing is asked


def run(argv, capsys):
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def assert_no_such(code, err, says, holds):
    assert code == 2, err
    lines = [line for line in err.splitlines() if "error" in line.lower()]  # progress bars may print too
    assert len(lines) == 1 and says in lines[0] and holds in lines[0], err
    assert "Traceback" not in err and "Repo id must" not in err


@pytest.fixture
def rest_data(tmp_path):
    built = tmp_path / "built"
    built.mkdir()
    (built / "meta.json").write_text('{"variants": ["plain"]}')
    return built


@pytest.fixture
def crossmath_data(tmp_path, capsys):
    code, err = run(["crossmath", "generate", "--n", "1", "--difficulty", "easy", "--rows", "7", "--cols", "7",
                     "--n-equations", "2", "--range", "1", "20", "--styles", "original", "--out", tmp_path / "cm"],
                    capsys)
    assert code == 0, err
    return tmp_path / "cm" / "Original"


def test_eval_bench(tmp_path, capsys):
    code, err = run(["eval", *OPENAI, "--model", "m", "--bench", ".cache/tiny-benc", "--out", tmp_path / "r"], capsys)
    assert_no_such(code, err, "--bench '.cache/tiny-benc' does not exist locally: no such folder",
                   "a bench folder holds text/ and img/ parquet splits")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("model", ["{tmp}/ckpt", "no-such-model-xyz"], ids=["path", "bare-name-offline"])
def test_eval_model(tmp_path, capsys, tiny_bench, model):
    model = model.format(tmp=tmp_path)
    code, err = run(["eval", "--model", model, "--bench", tiny_bench, "--limit", "1", "--out", tmp_path / "r"], capsys)
    assert_no_such(code, err, f"--model '{model}' does not exist locally", "a checkpoint folder holds config.json")


def test_crossmath_eval_data(tmp_path, capsys):
    code, err = run(["crossmath", "eval", *OPENAI, "--model", "m", "--data", tmp_path / "cm/Orignal",
                     "--modality", "text", "--out", tmp_path / "r"], capsys)
    assert_no_such(code, err, f"--data '{tmp_path}/cm/Orignal' does not exist: no such file or folder",
                   "a puzzle JSONL or the style folder holding one")


def test_crossmath_eval_model(tmp_path, capsys, crossmath_data):
    code, err = run(["crossmath", "eval", "--model", tmp_path / "ckpt", "--data", crossmath_data, "--modality", "text",
                     "--out", tmp_path / "r"], capsys)
    assert_no_such(code, err, f"--model '{tmp_path}/ckpt' does not exist locally: no such folder",
                   "a checkpoint folder holds config.json")


def test_rest_eval_data(tmp_path, capsys):
    code, err = run(["rest", "eval", *OPENAI, "--model", "m", "--data", tmp_path / "rest/soebnch",
                     "--out", tmp_path / "r"], capsys)
    assert_no_such(code, err, f"--data '{tmp_path}/rest/soebnch' does not exist: no such folder",
                   "a REST dataset folder holds meta.json")


def test_rest_eval_model(tmp_path, capsys, rest_data):
    code, err = run(["rest", "eval", "--model", tmp_path / "ckpt", "--data", rest_data, "--out", tmp_path / "r"],
                    capsys)
    assert_no_such(code, err, f"--model '{tmp_path}/ckpt' does not exist locally: no such folder",
                   "a checkpoint folder holds config.json")


@pytest.mark.parametrize("data, says", [
    ("./mmlu-copy", "--data './mmlu-copy' does not exist locally: no such file or folder"),
    ("data/mmlu", "--data 'data/mmlu' does not exist locally (no such file or folder), and the hub cannot be reached"),
], ids=["path", "owner-name-shaped-offline"])
def test_rest_build_data(tmp_path, capsys, monkeypatch, data, says):
    monkeypatch.chdir(tmp_path)
    code, err = run(["rest", "build", "--source", "mmlu", "--data", data, "--n", "4", "--out", tmp_path / "r"], capsys)
    assert_no_such(code, err, says, "a parquet/JSONL/JSON/CSV file of its rows")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("model", ["{tmp}/ckpt", "no-such-model-xyz"], ids=["path", "bare-name-offline"])
def test_probe_model(tmp_path, capsys, model):
    model = model.format(tmp=tmp_path)
    code, err = run(["probe", "--model", model, "--pairs", "2", "--out", tmp_path / "o"], capsys)
    assert_no_such(code, err, f"--model '{model}' does not exist locally", "a checkpoint folder holds config.json")


def test_compare_runs(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "log_history.json").write_text(json.dumps([{"step": 1, "loss": 1.0}]))
    code, err = run(["compare", "--runs", tmp_path / "a", tmp_path / "b", "--out", tmp_path / "c"], capsys)
    assert_no_such(code, err, f"--runs '{tmp_path}/b' does not exist: no such folder",
                   "a run folder holds log_history.json")
    assert not (tmp_path / "c").exists()


def test_leaderboard_runs(tmp_path, capsys):
    code, err = run(["leaderboard", tmp_path / "gone", "--out", tmp_path / "board"], capsys)
    assert_no_such(code, err, f"result '{tmp_path}/gone' does not exist", "pass a `tokenswap eval`")


@pytest.mark.parametrize("key, says, holds", [
    ("store", "`store` '{tmp}/nostore' does not exist: no such folder", "an image store folder holds store.json"),
    ("source", "`source` '{tmp}/nosource' does not exist locally: no such folder", "an MMLU-format source is a folder"),
])
def test_build_bench_inputs(tmp_path, capsys, tiny_store, key, says, holds):
    paths = {"store": tiny_store.root, "source": "cais/mmlu", key: tmp_path / f"no{key}"}
    code, err = run(["build-bench", "--config", "bench_mmlu.yaml", f"store={paths['store']}",
                     f"source={paths['source']}", f"out_dir={tmp_path / 'b'}"], capsys)
    assert_no_such(code, err, says.format(tmp=tmp_path), holds)
    assert not (tmp_path / "b").exists()


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed once the block ends: a connection there is refused


@pytest.mark.parametrize("how", ["unreachable-endpoint", "hf-hub-offline"])
def test_a_hub_id_without_network_is_one_line_saying_how_to_fetch_it_elsewhere(tmp_path, capsys, monkeypatch, how):
    # Without network the hub libraries retried for ~47 s, printed a warning per retry, and the line suggested a hub
    # id (the very thing that had failed). The loader must not even be reached.
    import tokenswap.families as families

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    for proxy in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    if how == "hf-hub-offline":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")

    def reached(*args, **kwargs):
        raise AssertionError("the hub libraries were asked")

    monkeypatch.setattr(families, "load_checkpoint", reached)
    code, err = run(["probe", "--model", "some-owner/some-model", "--pairs", "2", "--out", tmp_path / "o"], capsys)
    assert_no_such(code, err, "--model 'some-owner/some-model' does not exist locally (no such folder), and the hub "
                   "cannot be reached", "(`hf download some-owner/some-model --local-dir DIR`), copy DIR here and pass "
                   "--model DIR")
    assert "such as" not in err and "pass a hub id" not in err and len(err.strip().splitlines()) == 1, err
    if how == "hf-hub-offline":
        assert "HF_HUB_OFFLINE is set" in err
def test_a_missing_tiny_kit_path_names_the_command_that_builds_it(tmp_path, capsys, monkeypatch):
    """Before `python -m tokenswap.testing .cache` the README's tiny paths are missing: every message says how to
    build them, and `tokenswap --help` shows that line."""
    monkeypatch.chdir(tmp_path)
    code, err = run(["eval", *OPENAI, "--model", "m", "--bench", ".cache/tiny-bench", "--out", tmp_path / "r"], capsys)
    assert code == 2 and "python -m tokenswap.testing .cache" in err
    from tokenswap.errors import InputError
    from tokenswap.training.model import _check_model_path

    with pytest.raises(InputError, match=r"python -m tokenswap\.testing \.cache"):
        _check_model_path(".cache/tiny-qwen2vl")
    assert main(["--help"]) == 0
    assert "python -m tokenswap.testing .cache" in capsys.readouterr().out
