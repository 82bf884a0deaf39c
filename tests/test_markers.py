"""`make check` is the fast loop: it deselects `integration`, so every test that starts a process, a server or a
training run must carry that mark. A grep guards it: a test whose body (or a helper or fixture of its file it
calls) starts one of those, unmarked, fails here with its name."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# What starting a process, a server or a training run looks like in this suite.
STARTS = re.compile(
    r"\bsubprocess\.|\bPopen\(|\bos\.fork\(|\w*Server\(|serve_forever|\bmultiprocessing\b|Trainer\("
    r"|\b(?:post|pre|image_sft|grpo|recipe)\.main\(|\b(?:trainer|sft|hf)\.train\(|\brun_recipe\((?:post|pre|image_sft|grpo)\.main"
    r"|from (?:tokenswap|examples)\.demo import [^\n]*\bmain\b"
)
# Fixtures that start a server for the test that asks for them.
SERVER_FIXTURES = {"fake_openai", "server"}


def _is_integration(decorators: list[ast.expr]) -> bool:
    return any("integration" in ast.unparse(d) for d in decorators)


def _module_marked(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets):
            return "integration" in ast.unparse(node.value)
    return False


def _starters(tree: ast.Module, src: str) -> set[str]:
    """Names of the file's module-level functions and classes whose body starts something, followed one call deep."""
    bodies = {n.name: ast.get_source_segment(src, n) for n in tree.body
              if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and not n.name.startswith("test_")}
    found = {name for name, body in bodies.items() if STARTS.search(body)}
    for _ in range(3):  # helpers calling helpers
        found |= {name for name, body in bodies.items()
                  if any(re.search(rf"\b{re.escape(f)}\b", body) for f in found if f != name)}
    return found


def unmarked(path: Path) -> list[str]:
    src = path.read_text()
    tree = ast.parse(src)
    if _module_marked(tree):
        return []
    starters = _starters(tree, src)
    bad = []
    for node in tree.body:
        if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
            continue
        body = ast.get_source_segment(src, node)
        starts = (STARTS.search(body) or SERVER_FIXTURES & {a.arg for a in node.args.args}
                  or any(re.search(rf"\b{re.escape(name)}\b", body) for name in starters))
        if starts and not _is_integration(node.decorator_list):
            bad.append(f"{path.name}::{node.name}")
    return bad


def test_every_test_that_starts_a_process_a_server_or_a_training_run_is_marked_integration():
    bad = [f"{path.parent.relative_to(TESTS.parent)}/{name}" for path in sorted(TESTS.rglob("test_*.py"))
           if path != Path(__file__).resolve() for name in unmarked(path)]
    assert not bad, "mark these @pytest.mark.integration (make check skips them):\n" + "\n".join(bad)


def test_the_guard_sees_an_unmarked_subprocess_and_a_training_run(tmp_path):
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        "import subprocess\nimport pytest\n\n"
        "def launch():\n    return subprocess.run(['true'])\n\n"
        "def test_helper():\n    launch()\n\n"
        "def test_recipe(post):\n    post.main(cfg)\n\n"
        "def test_served(fake_openai):\n    pass\n\n"
        "@pytest.mark.integration\ndef test_marked():\n    launch()\n\n"
        "def test_pure():\n    assert 1\n"
    )
    names = [n.split("::")[1] for n in unmarked(probe)]
    assert names == ["test_helper", "test_recipe", "test_served"]

