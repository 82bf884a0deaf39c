"""The one-owner rows of docs/architecture.md that a grep can hold (as tests/tokenswap/test_ranks.py does)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*(ROOT / "tokenswap").rglob("*.py"), *(ROOT / "recipes").glob("*.py")])


def _grep(pattern: str, allowed: set[str] = frozenset(), unless: str = r"(?!)") -> list[str]:
    found = []
    for path in SOURCES:
        rel = path.relative_to(ROOT).as_posix()
        if rel in allowed:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(pattern, line) and not re.search(unless, line):
                found.append(f"{rel}:{n}: {line.strip()}")
    return found


def test_local_or_hub_is_decided_in_inputs_only():
    # a second rule (a recipe's own "looks local") took `gpt2` for a missing folder while `tokenswap eval` loaded it
    assert _grep(r"def _?looks_(local|like_path)\b", {"tokenswap/inputs.py"}) == []
    assert _grep(r"\blooks_like_path\(", {"tokenswap/inputs.py", "tokenswap/store/build.py"}) == []


def test_files_other_commands_read_are_written_through_files_atomic_write():
    # A hand-rolled temporary (a fixed `x.tmp` renamed over x) is shared by two writers of one file and left behind
    # by a killed one; files.atomic_write names its temporary by writer and sweeps a dead writer's.
    allowed = {
        "tokenswap/files.py",  # the owner
        "tokenswap/qwen_tokenizer.py",  # a whole folder appears by one rename: no file helper for that
        "tokenswap/demo.py",  # moving to examples/ (not the library)
    }
    # (a sweep of atomic_write's own temporaries, `glob("part-r000-*.tmp")`, is no write)
    assert _grep(r"\bos\.replace\(|\.rename\(|\.tmp\b", allowed, unless=r"\.glob\(|``") == []
    # the JSON a rerun or another command reads (log_history.json by compare): no plain open-and-dump
    assert _grep(r"json\.dump\(", allowed) == []


def test_no_library_call_switches_the_matplotlib_backend_or_uses_pyplot():
    # matplotlib.use("Agg") in a plotting function took a notebook's inline figures away for the rest of its session
    assert _grep(r"matplotlib\.use\(|import matplotlib\.pyplot|from matplotlib import pyplot", {"tokenswap/demo.py"}) == []


def test_no_private_name_is_imported_across_modules():
    # a name with a leading underscore is its module's own; another module needing it makes it public
    import ast

    found = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tokenswap"):
                found += [f"{path.relative_to(ROOT)}:{node.lineno}: {node.module}.{a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert found == []


def test_recipes_set_up_and_save_through_the_shared_run_ends():
    # the setup block and the final save were copied into four recipes (and config_to_dict computed three times
    # per run); start_run / save_final in tokenswap/training/run.py own them, so a fix lands in all four at once
    not_recipes = {p.relative_to(ROOT).as_posix() for p in SOURCES if p.parts[-2] != "recipes"}
    steps = (r"\b(build_training_arguments|check_inputs|hold_output_dir|resolve_checkpoint|check_resume_settings"
             r"|write_run_config|config_to_dict|init_wandb|saving_final|finish_wandb|close_process_group)\b")
    assert _grep(steps, not_recipes) == []
    # the held-out evaluation is a function call, not the command line of `tokenswap crossmath eval`
    assert _grep(r"\bcli_main\b", not_recipes) == []
    # a recipe config derives what it needs instead of rewriting a section after parsing
    assert _grep(r"^\s*self\.\w+\.\w+\s*=[^=]", not_recipes) == []
def test_the_planner_rules_and_the_two_ends_are_stated_in_forms_only():
    # the k-shot, cot and caption rules were worded three ways (the CLI, GapEvaluator, the training config); the ends
    # were typed out a dozen times beside forms.ENDS, and ALL_FORMS re-derived beside forms.FORMS
    assert _grep(r"""\(\s*["']text["'],\s*["']interleaved["']\s*\)|\[\s*["']text["'],\s*["']interleaved["']""",
                 {"tokenswap/eval/forms.py"}, unless=r">>>|^\s*\(\(") == []
    assert _grep(r"\bALL_FORMS\b|\b(IN_LOOP_|ITEM_)?FORMS\s*=", {"tokenswap/eval/forms.py"}) == []
    assert _grep(r"""prompt\s*==\s*["'](k_shot|cot)["'].*(forms|scorer)""", {"tokenswap/eval/forms.py"}) == []
    assert _grep(r"""["']caption["'] in (self\.)?forms\b""", {"tokenswap/eval/forms.py"}) == []


def test_a_forms_reason_is_read_by_form_runs_reason_only():
    # "error: ..." / "skipped: ..." strings were built and split apart in six places; form_runs.Reason is the type,
    # its str() what gap.json writes and its parse the one reader of that text
    parsing = r"""startswith\(\(?["'](error|skipped)\b|partition\(["']: ["']\)|f["'](error|skipped): \{"""
    assert _grep(parsing, {"tokenswap/eval/form_runs.py", "tokenswap/script.py"}) == []  # script: the error line
    assert len(_grep(parsing)) == 2  # Reason.parse, script.py's "error: {why}"
