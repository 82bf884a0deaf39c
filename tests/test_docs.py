"""The docs are true: every relative link resolves, every runnable shell block runs, every other shell block parses.

README.md and docs/*.md are read by tests/docs_harness.py (the marks are explained in docs/contributing.md,
"Writing docs"). A runnable block runs through real bash, offline, in a scratch folder per page that holds the
repository's configs/, recipes/, tests/ and benchmarks/ and nothing else: what a block uses (the tiny kit under
.cache/) an earlier command of the same page must have made, as on a fresh clone. A renamed flag, a moved config,
an unknown override key or a fixture the page never makes fails here, not in a user's terminal.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("docs_harness", Path(__file__).with_name("docs_harness.py"))
harness = importlib.util.module_from_spec(_spec)
sys.modules["docs_harness"] = harness
_spec.loader.exec_module(harness)

ROOT = harness.ROOT
PAGES = harness.doc_pages()
BLOCKS = [b for page in PAGES for b in harness.find_blocks(page)]
SHELL = [b for b in BLOCKS if b.lang in harness.SHELL_LANGS]
RUN_PAGES = sorted({b.page for b in SHELL if b.mark == "run"})
SYNTAX = [b for b in SHELL if b.mark == "syntax"]
BLOCK_TIMEOUT_S = 300  # one block; the whole module is budgeted at ~2-3 minutes on the 2-core CI machine
# What a page's scratch folder sees of the repository (the paths the docs' commands use, relative to the root).
LINKED = ("configs", "recipes", "tests", "benchmarks", "Makefile", "pyproject.toml")


def test_there_are_docs_to_check():
    assert (ROOT / "README.md") in PAGES and len(PAGES) >= 10
    assert RUN_PAGES and SYNTAX


def test_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move detail to a page under docs/ (at most 200)"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    assert harness.broken_links(page) == []


def test_every_fence_names_its_language_and_every_shell_block_its_mark():
    problems = [f"{b.where}: a fence without a language (```bash, ```python, ```text, ...)" for b in BLOCKS
                if not b.lang]
    problems += [f"{b.where}: a shell block without a mark on the line before its fence (<!-- run -->, "
                 "<!-- check: syntax -->, <!-- check: none (reason) -->)" for b in SHELL if b.mark is None]
    problems += [f"{b.where}: {p}" for b in BLOCKS for p in b.problems]
    problems += [f"{b.where}: a `{b.lang}` block is marked {b.mark!r}; only shell blocks are run or checked"
                 for b in BLOCKS if b.mark and b.lang not in harness.SHELL_LANGS]
    assert problems == []


@pytest.mark.parametrize("block", SYNTAX, ids=lambda b: b.where)
def test_syntax_block_parses(block):
    cmds = harness.commands(block.text)
    assert cmds, f"{block.where}: a syntax-checked block without a command"
    problems = []
    for words in cmds:
        try:
            harness.check_syntax(words)
        except harness.Unparsed as e:
            problems.append(f"{block.where}: `{' '.join(words)[:160]}`: {e}")
    assert problems == []


# ---------------------------------------------------------------------------------------------------------------
# Runnable blocks
# ---------------------------------------------------------------------------------------------------------------


class DocsServer:
    """The fork server the blocks' ``tokenswap`` and ``python`` shims hand their commands to.

    Started as soon as a test asks for it and waited for at the first block, so its imports overlap with the
    test's own set-up.
    """

    def __init__(self, folder: Path):
        self.sock = str(folder / "s")
        self.proc = subprocess.Popen([sys.executable, str(Path(harness.__file__)), "serve", self.sock], env=_env(),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.ready = False

    @property
    def path(self) -> str:
        if not self.ready:
            # Imports may print first (bitsandbytes warns about its CPU kernels on some CPUs): skip to "ready".
            # Never read to EOF here: a live server never closes its stdout, so that read would hang the suite.
            said = []
            while (line := self.proc.stdout.readline()) and line.strip() != "ready":
                said.append(line)
            assert line, f"the docs fork server exited ({self.proc.wait()}) before it was ready: {''.join(said)[-3000:]}"
            self.ready = True
        return self.sock

    def workers_cpu_s(self) -> float:
        """CPU seconds of the commands the server has run and reaped so far (Linux; 0 elsewhere)."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")  # cutime + cstime

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def docs_server(tmp_path_factory):
    server = DocsServer(tmp_path_factory.mktemp("docs-server"))
    yield server
    server.close()


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", WANDB_MODE="offline",
               TOKENIZERS_PARALLELISM="false", TRANSFORMERS_VERBOSITY="error", TQDM_DISABLE="1", MPLBACKEND="Agg",
               PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    env.update(extra)
    return env


def _scratch(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in LINKED:
        (folder / name).symlink_to(ROOT / name)
    harness.write_shims(folder / ".docs-bin")
    return folder


def run_block(block, folder: Path, server: DocsServer) -> tuple[int, str, float]:
    """Run one block in ``folder`` through bash (stop at the first failing command); (status, output, seconds)."""
    script = folder / f".block-{block.line}.sh"
    script.write_text(block.text + "\n")
    env = _env(PATH=f"{folder / '.docs-bin'}{os.pathsep}{os.environ['PATH']}", DOCS_SERVER=server.path,
               HOME=os.environ.get("HOME", str(folder)))
    start = time.perf_counter()
    try:
        done = subprocess.run(["bash", "-e", "-o", "pipefail", script.name], cwd=folder, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=BLOCK_TIMEOUT_S)
        return done.returncode, done.stdout, time.perf_counter() - start
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return 124, out + f"\n[timed out after {BLOCK_TIMEOUT_S} s]", time.perf_counter() - start


@pytest.mark.integration
@pytest.mark.parametrize("page", RUN_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_runnable_blocks_run(page, docs_server, tmp_path):
    folder = _scratch(tmp_path / "page")
    for block in (b for b in SHELL if b.page == page and b.mark == "run"):
        cpu = docs_server.workers_cpu_s()
        rc, out, seconds = run_block(block, folder, docs_server)
        # Shown by pytest -rP: where the docs test spends its time (wall time moves with the machine's load).
        print(f"{block.where}: {seconds:.1f} s wall, {docs_server.workers_cpu_s() - cpu:.1f} s CPU")
        assert rc == 0, f"{block.where}: the block failed (exit {rc}, {seconds:.0f} s):\n{block.text}\n--- output " \
                        f"(tail) ---\n{out[-4000:]}"


# ---------------------------------------------------------------------------------------------------------------
# The harness can fail
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command, says", [
    ("tokenswap eval --model m --bench b --scorr loglik", "unrecognized arguments: --scorr"),
    ("tokenswap evaluate --model m", "no such subcommand"),
    ("tokenswap crossmath eval --model m --data d --out o", "--modality"),
    ("python recipes/post_train.py --config post_text.yaml collator.swap_probb=0.5", "collator.swap_probb"),
    ("python recipes/post_train.py --config post_moved.yaml", "post_moved.yaml"),
    ("accelerate launch --config_file configs/accelerate/moved.yaml recipes/post_train.py --config post_text.yaml",
     "moved.yaml does not exist"),
    ("accelerate launch --num_processess 8 recipes/post_train.py --config post_text.yaml", "num_processess"),
    ("tokenswap build-store --config store_generate.yaml samples_per_shardd=4", "samples_per_shardd"),
    ("make tests", "no target tests"),
    ("bash benchmarks/gpu_check.sh --parts 1", "no `--parts)` case"),
    ("transformers serve path/to/checkpoint --device cpu --hots 127.0.0.1", "--hots"),
    ("python benchmarks/faults.py --sectionz llm", "--sectionz"),
    ("vllm serve Qwen/Qwen2.5-VL-7B-Instruct", "check: none"),
])
def test_syntax_check_refuses(command, says):
    [words] = harness.commands(command)
    with pytest.raises(harness.Unparsed, match=None) as e:
        harness.check_syntax(words)
    assert says in str(e.value)


@pytest.mark.parametrize("command", ["tokenswap eval --help", "python recipes/post_train.py --help",
                                     "python recipes/post_train.py --config post_text.yaml collator.swap_prob=0.5",
                                     "accelerate launch --num_processes 8 -m tokenswap.cli eval --model m --out o"])
def test_syntax_check_accepts(command):
    [words] = harness.commands(command)
    assert harness.check_syntax(words)


def test_marks_are_read(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- run -->\n```bash\ntokenswap --help\n```\n\n"
                    "<!-- check: none -->\n```bash\nvllm serve x\n```\n\n```bash\nls\n```\n\n"
                    "<!-- run: fixtures=tiny_model -->\n```sh\nls\n```\n\n```\nno language\n```\n")
    run, none, unmarked, given, bare = harness.find_blocks(page)
    assert (run.mark, run.problems) == ("run", [])
    assert none.mark == "none" and "needs a reason" in none.problems[0]
    assert unmarked.mark is None and bare.lang == ""
    # Injected fixtures are gone: a block marked with them is a failure telling the page to make them itself.
    assert given.mark == "run" and "python -m tokenswap.testing .cache" in given.problems[0]


def test_commands_are_split_as_a_shell_splits_them():
    text = ("A=1 tokenswap eval --model m \\\n    --out 'o p'   # comment\n"
            "tokenswap compare --runs a b --out c && ls c > /dev/null 2>&1; echo done | head -1\n")
    assert harness.commands(text) == [
        ["A=1", "tokenswap", "eval", "--model", "m", "--out", "o p"],
        ["tokenswap", "compare", "--runs", "a", "b", "--out", "c"], ["ls", "c"], ["echo", "done"], ["head", "-1"]]


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "there.md").write_text("# A heading\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md#a-heading) [gone](moved.md) [anchor](there.md#nope) `[code](x.md)`\n"
                    "```text\n[in a fence](y.md)\n```\n[web](https://example.org/x.md)\n")
    harness.ROOT, root = tmp_path, harness.ROOT
    try:
        problems = harness.broken_links(page)
    finally:
        harness.ROOT = root
    assert len(problems) == 2 and "moved.md does not exist" in problems[0] and "#nope" in problems[1]


@pytest.mark.integration
def test_a_failing_runnable_block_fails(docs_server, tmp_path):
    block = harness.Block(ROOT / "README.md", 1, "bash", "tokenswap --help\n"
                          "tokenswap eval --model m --bench b --limit 0\n"
                          "echo not reached", "run")
    rc, out, _ = run_block(block, _scratch(tmp_path / "page"), docs_server)
    assert rc == 2 and "usage: tokenswap <command>" in out and "--limit" in out and "not reached" not in out


@pytest.mark.integration
def test_a_block_gets_only_what_its_page_made(docs_server, tmp_path):
    """The tiny kit is not there unless the page makes it: the README's eval block alone fails, after its set-up
    line it runs, and that line writes the whole tiny kit."""
    folder = _scratch(tmp_path / "page")
    use = "tokenswap eval --model .cache/tiny-qwen2vl --bench .cache/tiny-bench --scorer loglik --limit 2 --out o\n"
    rc, out, _ = run_block(harness.Block(ROOT / "README.md", 1, "bash", use, "run"), folder, docs_server)
    assert rc == 2 and "no such folder" in out, out[-2000:]
    rc, out, _ = run_block(harness.Block(ROOT / "README.md", 2, "bash", "python -m tokenswap.testing .cache\n" + use,
                                         "run"), folder, docs_server)
    assert rc == 0, out[-4000:]
    assert all((folder / ".cache" / name).is_dir() for name in ("tiny-qwen2vl", "tiny-store", "tiny-bench"))
