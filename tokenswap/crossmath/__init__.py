"""CrossMath: puzzles in three equivalent formats (text, image, image+text), the hop solver,
metrics and the hop-weighted GRPO reward.

>>> from tokenswap.crossmath import generate_puzzle, solve
>>> puzzle = generate_puzzle(0, difficulty="easy")
>>> solve(puzzle.grid).max_hop
1
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# Lazy (PEP 562): the puzzle tools load without the training data's datasets or the evaluation's backends.
# Every name below still imports from here.
_EXPORTS = {
    "InconsistentPuzzleError": "tokenswap.crossmath.data",
    "append_jsonl": "tokenswap.crossmath.data",
    "find_jsonl": "tokenswap.crossmath.data",
    "load_crossmath": "tokenswap.crossmath.data",
    "load_image": "tokenswap.crossmath.data",
    "puzzle_problem": "tokenswap.crossmath.data",
    "read_jsonl": "tokenswap.crossmath.data",
    "reward_columns": "tokenswap.crossmath.data",
    "sft_messages": "tokenswap.crossmath.data",
    "DIFFICULTIES": "tokenswap.crossmath.generator",
    "Difficulty": "tokenswap.crossmath.generator",
    "Puzzle": "tokenswap.crossmath.generator",
    "classify_difficulty": "tokenswap.crossmath.generator",
    "generate_puzzle": "tokenswap.crossmath.generator",
    "generate_puzzles": "tokenswap.crossmath.generator",
    "mixed_difficulty": "tokenswap.crossmath.generator",
    "puzzle_seed": "tokenswap.crossmath.generator",
    "BLANK": "tokenswap.crossmath.grid",
    "OPERATORS": "tokenswap.crossmath.grid",
    "Equation": "tokenswap.crossmath.grid",
    "apply_operator": "tokenswap.crossmath.grid",
    "blank_cells": "tokenswap.crossmath.grid",
    "find_equations": "tokenswap.crossmath.grid",
    "format_markdown_table": "tokenswap.crossmath.grid",
    "normalize_glyph": "tokenswap.crossmath.grid",
    "parse_markdown_table": "tokenswap.crossmath.grid",
    "HOP_BUCKETS": "tokenswap.crossmath.metrics",
    "aggregate_runs": "tokenswap.crossmath.metrics",
    "extract_answer": "tokenswap.crossmath.metrics",
    "format_metrics_table": "tokenswap.crossmath.metrics",
    "gold_answer": "tokenswap.crossmath.metrics",
    "gold_hops": "tokenswap.crossmath.metrics",
    "khop_accuracy": "tokenswap.crossmath.metrics",
    "macro_accuracy": "tokenswap.crossmath.metrics",
    "micro_accuracy": "tokenswap.crossmath.metrics",
    "score_run": "tokenswap.crossmath.metrics",
    "MODALITIES": "tokenswap.crossmath.prompt",
    "Modality": "tokenswap.crossmath.prompt",
    "build_instruction": "tokenswap.crossmath.prompt",
    "build_messages": "tokenswap.crossmath.prompt",
    "build_user_content": "tokenswap.crossmath.prompt",
    "CELL_PX": "tokenswap.crossmath.render",
    "STYLES": "tokenswap.crossmath.render",
    "image_names": "tokenswap.crossmath.render",
    "puzzle_id_from_image": "tokenswap.crossmath.render",
    "render_grid": "tokenswap.crossmath.render",
    "REWARDS": "tokenswap.crossmath.rewards",
    "format_reward": "tokenswap.crossmath.rewards",
    "get_hop_weighted_reward": "tokenswap.crossmath.rewards",
    "hop_weighted_reward": "tokenswap.crossmath.rewards",
    "hop_weights": "tokenswap.crossmath.rewards",
    "micro_accuracy_reward": "tokenswap.crossmath.rewards",
    "validate_hop_weighting": "tokenswap.crossmath.rewards",
    "HopSolution": "tokenswap.crossmath.solver",
    "chain_of_thought": "tokenswap.crossmath.solver",
    "solve": "tokenswap.crossmath.solver",
    "CrossMathDataConfig": "tokenswap.crossmath.training_data",
    "crossmath_source": "tokenswap.crossmath.training_data",
    "grpo_dataset": "tokenswap.crossmath.training_data",
    "load_training_records": "tokenswap.crossmath.training_data",
    "sft_example": "tokenswap.crossmath.training_data",
    "sft_examples": "tokenswap.crossmath.training_data",
    "split_consistent": "tokenswap.crossmath.training_data",
    "write_puzzles": "tokenswap.crossmath.training_data",
}

__all__ = [
    "BLANK",
    "CELL_PX",
    "DIFFICULTIES",
    "HOP_BUCKETS",
    "MODALITIES",
    "OPERATORS",
    "REWARDS",
    "STYLES",
    "CrossMathDataConfig",
    "Difficulty",
    "Equation",
    "HopSolution",
    "InconsistentPuzzleError",
    "Modality",
    "Puzzle",
    "aggregate_runs",
    "append_jsonl",
    "apply_operator",
    "blank_cells",
    "build_instruction",
    "build_messages",
    "build_user_content",
    "chain_of_thought",
    "classify_difficulty",
    "crossmath_source",
    "extract_answer",
    "find_equations",
    "find_jsonl",
    "format_markdown_table",
    "format_metrics_table",
    "format_reward",
    "generate_puzzle",
    "generate_puzzles",
    "get_hop_weighted_reward",
    "gold_answer",
    "gold_hops",
    "grpo_dataset",
    "hop_weighted_reward",
    "hop_weights",
    "image_names",
    "khop_accuracy",
    "load_crossmath",
    "load_image",
    "load_training_records",
    "macro_accuracy",
    "micro_accuracy",
    "micro_accuracy_reward",
    "mixed_difficulty",
    "normalize_glyph",
    "parse_markdown_table",
    "puzzle_id_from_image",
    "puzzle_problem",
    "puzzle_seed",
    "read_jsonl",
    "render_grid",
    "reward_columns",
    "score_run",
    "sft_example",
    "sft_examples",
    "sft_messages",
    "solve",
    "split_consistent",
    "validate_hop_weighting",
    "write_puzzles",
]

if TYPE_CHECKING:
    from tokenswap.crossmath.data import (
        InconsistentPuzzleError,
        append_jsonl,
        find_jsonl,
        load_crossmath,
        load_image,
        puzzle_problem,
        read_jsonl,
        reward_columns,
        sft_messages,
    )
    from tokenswap.crossmath.generator import (
        DIFFICULTIES,
        Difficulty,
        Puzzle,
        classify_difficulty,
        generate_puzzle,
        generate_puzzles,
        mixed_difficulty,
        puzzle_seed,
    )
    from tokenswap.crossmath.grid import (
        BLANK,
        OPERATORS,
        Equation,
        apply_operator,
        blank_cells,
        find_equations,
        format_markdown_table,
        normalize_glyph,
        parse_markdown_table,
    )
    from tokenswap.crossmath.metrics import (
        HOP_BUCKETS,
        aggregate_runs,
        extract_answer,
        format_metrics_table,
        gold_answer,
        gold_hops,
        khop_accuracy,
        macro_accuracy,
        micro_accuracy,
        score_run,
    )
    from tokenswap.crossmath.prompt import MODALITIES, Modality, build_instruction, build_messages, build_user_content
    from tokenswap.crossmath.render import CELL_PX, STYLES, image_names, puzzle_id_from_image, render_grid
    from tokenswap.crossmath.rewards import (
        REWARDS,
        format_reward,
        get_hop_weighted_reward,
        hop_weighted_reward,
        hop_weights,
        micro_accuracy_reward,
        validate_hop_weighting,
    )
    from tokenswap.crossmath.solver import HopSolution, chain_of_thought, solve
    from tokenswap.crossmath.training_data import (
        CrossMathDataConfig,
        crossmath_source,
        grpo_dataset,
        load_training_records,
        sft_example,
        sft_examples,
        split_consistent,
        write_puzzles,
    )


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
