"""CrossMath: puzzles in three equivalent formats (text, image, image+text), the hop solver,
metrics and the hop-weighted GRPO reward.

>>> from tokenswap.crossmath import generate_puzzle, solve
>>> puzzle = generate_puzzle(0, difficulty="easy")
>>> solve(puzzle.grid).max_hop
1
"""

from tokenswap.crossmath.data import (
    append_jsonl,
    find_jsonl,
    load_crossmath,
    load_image,
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
from tokenswap.crossmath.render import CELL_PX, STYLES, render_grid
from tokenswap.crossmath.rewards import (
    REWARDS,
    format_reward,
    get_hop_weighted_reward,
    hop_weighted_reward,
    hop_weights,
    micro_accuracy_reward,
)
from tokenswap.crossmath.solver import HopSolution, chain_of_thought, solve
from tokenswap.crossmath.training_data import (
    CrossMathDataConfig,
    crossmath_source,
    grpo_dataset,
    load_training_records,
    sft_example,
    write_puzzles,
)

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
    "khop_accuracy",
    "load_crossmath",
    "load_image",
    "load_training_records",
    "macro_accuracy",
    "micro_accuracy",
    "micro_accuracy_reward",
    "normalize_glyph",
    "parse_markdown_table",
    "puzzle_seed",
    "read_jsonl",
    "render_grid",
    "reward_columns",
    "score_run",
    "sft_example",
    "sft_messages",
    "solve",
    "write_puzzles",
]
