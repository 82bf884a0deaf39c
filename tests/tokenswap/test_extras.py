"""A command or recipe that needs a package of an extra not installed says so in one line, exit status 2, no
traceback (the missing package simulated by a finder that refuses it, in a fresh interpreter)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Runs `tokenswap ARGS` (or the recipe at ARGS[0], or `python -m MODULE ARGS`) with the packages of argv[1] refused by the import system, as
# in an environment that does not have them.
BLOCKED = '''
import runpy, sys
refused = set(sys.argv[1].split(","))

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in refused:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Refuse())
if sys.argv[2] == "-m":
    sys.argv = sys.argv[3:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
elif sys.argv[2].endswith(".py"):
    sys.argv = sys.argv[2:]
    runpy.run_path(sys.argv[0], run_name="__main__")
else:
    from tokenswap.cli import main
    sys.exit(main(sys.argv[2:]))
'''


def run_without(packages: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", BLOCKED, packages, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def assert_one_line(done: subprocess.CompletedProcess, line: str) -> None:
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == line


@pytest.mark.integration
def test_eval_without_the_eval_extra(tmp_path):
    # A bench folder in the hub's file layout is read with pyarrow alone; one whose README declares its layout (as a
    # hub id's) needs `datasets`.
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "README.md").write_text("---\nconfigs:\n- config_name: text\n  data_files: text/*.parquet\n---\n")
    done = run_without("datasets", "eval", "--backend", "openai", "--model", "served", "--base-url",
                       "http://127.0.0.1:9/v1", "--bench", str(bench), "--out", str(tmp_path / "out"))
    assert_one_line(done, 'tokenswap eval needs the eval extra: pip install "tokenswap[eval]"')


@pytest.mark.integration
def test_the_tiny_kit_without_the_eval_extra_writes_the_model_and_store_and_skips_the_bench(tmp_path):
    done = run_without("datasets", "-m", "tokenswap.testing", str(tmp_path / "kit"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == ('the tiny bench needs the eval extra: pip install "tokenswap[eval]" '
                                                    "(skipped: the model and the store above are written)")
    assert (tmp_path / "kit" / "tiny-qwen2vl" / "config.json").is_file()
    assert (tmp_path / "kit" / "tiny-store" / "store.json").is_file()
    assert not (tmp_path / "kit" / "tiny-bench").exists()


@pytest.mark.integration
def test_leaderboard_without_scipy(tmp_path):
    import json

    from tokenswap.eval.gap import summarize

    runs = []
    # gap.json as `tokenswap eval` writes it, three models that answered differently (runs that answered alike are one
    # replicate, counted once): scipy is reached for the group statistics
    for k, name in enumerate(("a", "b", "c")):
        items = [{"id": f"q{i}", "subject": "s", "answer": "A", "num_images": 1, "pred_text": "A",
                  "pred_interleaved": "A" if (i + k) % 3 else "B", "correct_text": True,
                  "correct_interleaved": bool((i + k) % 3)}
                 for i in range(6)]
        runs.append(tmp_path / name)
        runs[-1].mkdir()
        payload = {"model": name, "bench": "b", "split": "test", **summarize("generate", "zero_shot", items).to_dict()}
        (runs[-1] / "gap.json").write_text(json.dumps(payload))
    done = run_without("scipy", "leaderboard", *map(str, runs), "--out", str(tmp_path / "board"))
    assert_one_line(done, 'tokenswap leaderboard needs the eval extra: pip install "tokenswap[eval]"')


@pytest.mark.integration
@pytest.mark.parametrize("recipe", ["post_train", "pretrain", "image_sft", "grpo"])
def test_a_recipe_without_the_train_extra(recipe):
    done = run_without("trl", f"recipes/{recipe}.py", "--help")
    assert_one_line(done, f'recipes/{recipe}.py needs the train extra: pip install "tokenswap[train]"')


def test_the_line_names_the_commands_own_extra():
    from tokenswap.extras import extra_of, missing_extra_line

    assert extra_of("httpx._client", "store") == "store"
    assert extra_of("httpx", "eval") == "eval"
    assert extra_of("wandb_workspaces.reports.v2") == "report"
    assert extra_of("torch") is None
    error = ModuleNotFoundError("No module named 'resvg_py'", name="resvg_py")
    assert missing_extra_line(error, "tokenswap build-store", "store") == (
        'tokenswap build-store needs the store extra: pip install "tokenswap[store]"')


def test_an_import_error_raised_over_the_missing_package_names_its_extra():
    from tokenswap.extras import missing_extra_line

    try:
        try:
            raise ModuleNotFoundError("No module named 'wandb_workspaces'", name="wandb_workspaces")
        except ImportError as e:  # as compare's --wandb-report words it
            raise ImportError("--wandb-report needs `pip install wandb-workspaces`") from e
    except ImportError as e:
        line = missing_extra_line(e, "tokenswap compare")
    assert line == 'tokenswap compare needs the report extra: pip install "tokenswap[report]"'


def test_a_missing_core_package_is_still_a_bug():
    from tokenswap.extras import exit_on_missing_extra

    def run() -> int:
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    with pytest.raises(ModuleNotFoundError):
        exit_on_missing_extra(run, "tokenswap eval", "eval")
