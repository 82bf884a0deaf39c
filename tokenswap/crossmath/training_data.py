"""CrossMath records as training data: image-only SFT examples and GRPO prompts.

The recipes ``recipes/image_sft.py`` and ``recipes/grpo.py`` share one data section,
:class:`CrossMathDataConfig`: either a folder written by ``tokenswap crossmath generate`` (or
the released test set), or ``n`` puzzles generated on the fly and written in the same layout
so that every path downstream (collator, TRL, ``tokenswap crossmath eval``) reads files.

Both formats put the same user turn in front of the model as ``tokenswap crossmath eval
--modality image``: the image-modality instruction, then the puzzle image.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tokenswap.crossmath.data import InconsistentPuzzleError, load_crossmath, puzzle_problem, reward_columns
from tokenswap.crossmath.generator import DEFAULT_COLS, DEFAULT_ROWS, DIFFICULTIES, generate_puzzles
from tokenswap.crossmath.grid import parse_markdown_table
from tokenswap.crossmath.prompt import build_instruction
from tokenswap.crossmath.render import STYLES, StyleName, render_grid
from tokenswap.crossmath.solver import chain_of_thought
from tokenswap.files import atomic_write_image, atomic_write_text

__all__ = [
    "CrossMathDataConfig",
    "crossmath_source",
    "grpo_dataset",
    "load_training_records",
    "sft_example",
    "sft_examples",
    "split_consistent",
    "write_puzzles",
]

JSONL_NAME = "crossmath.jsonl"
logger = logging.getLogger(__name__)


@dataclass(kw_only=True)
class CrossMathDataConfig:
    path: str | None = None
    """Output of `tokenswap crossmath generate` (the `style` subfolder is used), a style folder or a JSONL.
    None: generate `n` puzzles from `seed` into `<run.output_dir>/<generate_subdir>/`."""
    style: StyleName = "original"
    """Visual style: picks the subfolder of a generate folder, and renders generated puzzles."""
    limit: int | None = None
    """Use the first N records."""
    n: int = 1000
    """Puzzles to generate when `path` is None."""
    seed: int = 0
    """Generator seed; puzzle i depends only on (seed, i). Held-out data needs another seed. Image SFT also seeds
    the order of `collator.group_by_length` with it."""
    difficulty: Literal["easy", "medium", "hard", "mixed"] = "mixed"
    """Generated difficulty; mixed cycles easy, medium, hard."""
    rows: int = DEFAULT_ROWS
    """Generator canvas rows (odd); puzzles are cropped to their cells. 17: the largest released grid."""
    cols: int = DEFAULT_COLS
    """Generator canvas columns (odd). 21: the largest released grid."""
    n_equations: int | None = None
    """Equations per generated puzzle (None: drawn in the released 5-15)."""
    number_range: list[int] | None = None
    """[lo, hi] of every generated operand and result (None: lo in 1-5 and hi in 51-249 per puzzle, as released)."""
    max_hop: int | None = None
    """Deepest hop of every generated puzzle, for a curriculum (None: the released distribution per difficulty)."""

    def __post_init__(self) -> None:
        problems = []
        if self.difficulty != "mixed" and self.difficulty not in DIFFICULTIES:
            problems.append(f"`difficulty` must be one of {[*DIFFICULTIES, 'mixed']}, got {self.difficulty!r}")
        if self.number_range is not None and (
            len(self.number_range) != 2 or not 1 <= self.number_range[0] < self.number_range[1] - 1
        ):
            problems.append(
                f"`number_range` must be [lo, hi] with 1 <= lo and hi > lo + 1, or null, got {self.number_range}"
            )
        if self.max_hop is not None and self.max_hop < 1:
            problems.append(f"`max_hop` must be >= 1 or null, got {self.max_hop}")
        if self.path is None and self.n < 1:
            problems.append(f"`n` must be >= 1 when `path` is unset (puzzles are generated), got {self.n}")
        if self.limit is not None and self.limit < 1:
            problems.append(f"`limit` must be >= 1 or null, got {self.limit}")
        if problems:
            raise ValueError("; ".join(problems))


def write_puzzles(puzzles: list, folder: str | os.PathLike, style: StyleName) -> Path:
    """Write puzzles in the released layout: ``<folder>/crossmath.jsonl`` + the puzzle PNGs named as released.

    A folder that already holds exactly these records is left as it is, so a rerun (or the other
    ranks, after the main process wrote it) costs no rendering.

    Args:
        puzzles: :class:`~tokenswap.crossmath.generator.Puzzle` objects.
        folder: the style folder to write.
        style: the visual style of the puzzle images.

    Returns:
        The JSONL path.
    """
    folder = Path(folder)
    jsonl = folder / JSONL_NAME
    records = [p.to_record(style) for p in puzzles]
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    if jsonl.exists() and jsonl.read_text(encoding="utf-8") == lines:
        if all((folder / r["img_blank"]).exists() for r in records):
            return jsonl
    for puzzle, record in zip(puzzles, records):
        (folder / record["img_blank"]).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_image(folder / record["img_blank"], render_grid(puzzle.grid, style))  # never a truncated PNG
    atomic_write_text(jsonl, lines)
    return jsonl


def crossmath_source(cfg: CrossMathDataConfig, generate_dir: str | os.PathLike) -> Path:
    """The JSONL file or style folder a data section reads, generating its puzzles first when ``path`` is unset.

    Args:
        cfg: the data section.
        generate_dir: where generated puzzles are written (a ``<Style>`` subfolder is made).

    Returns:
        A path :func:`~tokenswap.crossmath.data.load_crossmath` (and ``tokenswap crossmath eval --data``) accepts.
    """
    folder = STYLES[cfg.style].folder
    if cfg.path is None:
        puzzles = generate_puzzles(
            cfg.n,
            cfg.seed,
            cfg.difficulty,
            rows=cfg.rows,
            cols=cfg.cols,
            n_equations=cfg.n_equations,
            number_range=tuple(cfg.number_range) if cfg.number_range is not None else None,
            max_hop=cfg.max_hop,
        )
        return write_puzzles(puzzles, Path(generate_dir) / folder, cfg.style)
    source = Path(cfg.path)
    # The top of a `tokenswap crossmath generate` output holds one folder per style.
    if source.is_dir() and (source / folder).is_dir():
        source = source / folder
    return source


def load_training_records(cfg: CrossMathDataConfig, generate_dir: str | os.PathLike) -> list[dict]:
    """The records of a data section: loaded from ``cfg.path``, or generated into ``generate_dir``.

    Args:
        cfg: the data section.
        generate_dir: where generated puzzles are written (a ``<Style>`` subfolder is made).

    Returns:
        Released-format records (of the first ``cfg.limit``, those whose puzzle agrees with its answers;
        the others are counted in a warning) with ``id`` and an absolute ``image_path``.

    Raises:
        FileNotFoundError: if ``cfg.path`` does not exist or holds no JSONL.
        KeyError: if a record has no ``img_blank`` (image-only training needs the puzzle image).
    """
    source = crossmath_source(cfg, generate_dir)
    records, skipped = split_consistent(load_crossmath(source)[: cfg.limit])
    if skipped:
        logger.warning(
            "skipped %d of %d CrossMath records of %s whose printed puzzle contradicts their answers: %s",
            len(skipped),
            len(records) + len(skipped),
            source,
            "; ".join(f"{record_id}: {reason}" for record_id, reason in skipped),
        )
    for record in records:
        if "image_path" not in record:
            raise KeyError(f"record {record['id']!r} of {source} has no img_blank; image-only training needs one")
        record["image_path"] = str(Path(record["image_path"]).resolve())
    return records


def split_consistent(records: list[dict]) -> tuple[list[dict], list[tuple[str, str]]]:
    """``(usable records, [(id, reason), ...] for the skipped ones)``: drops records whose printed
    puzzle contradicts their answers (the released ÷-bug puzzles), which no chain of thought can solve.
    """
    usable, skipped = [], []
    for record in records:
        problem = puzzle_problem(record)
        if problem is None:
            usable.append(record)
        else:
            skipped.append((str(record.get("id", "?")), problem))
    return usable, skipped


def sft_examples(records: list[dict]) -> tuple[list[dict], list[tuple[str, str]]]:
    """``(examples, skipped)``: :func:`sft_example` of every usable record, and ``(id, reason)`` of the rest."""
    usable, skipped = split_consistent(records)
    return [sft_example(record) for record in usable], skipped


def sft_example(record: dict) -> dict:
    """One image-only SFT example in the :class:`~tokenswap.collator.TokenSwapCollator` schema.

    The user turn is the image-modality instruction followed by the puzzle image (the ``<image>``
    marker, filled from ``images``), as ``build_messages("image", ...)`` renders it; the target
    verbalises the hop solver's rounds and ends in ``<answer>…</answer>``.

    Args:
        record: a loaded CrossMath record with ``image_path``.

    Returns:
        ``{"id", "messages": [user, assistant], "images": [image_path]}``.

    Raises:
        InconsistentPuzzleError: if the printed puzzle contradicts the record's answers; use
            :func:`sft_examples` to skip and count such records.
    """
    problem = puzzle_problem(record)
    if problem is not None:
        raise InconsistentPuzzleError(f"record {record.get('id', '?')!r}: {problem}; skip it as a training target")
    return {
        "id": record["id"],
        "messages": [
            {"role": "user", "content": build_instruction("image") + "<image>"},
            {"role": "assistant", "content": chain_of_thought(parse_markdown_table(record["markdown_table"]))},
        ],
        "images": [record["image_path"]],
    }


def grpo_dataset(records: list[dict]):
    """Image-only GRPO prompts as a ``datasets.Dataset`` in the layout TRL's ``GRPOTrainer`` reads.

    Columns: ``prompt`` (one user turn: the image-modality instruction, then an image placeholder
    that TRL fills from the ``image`` column), ``image`` (the puzzle, decoded to PIL on access),
    ``answer`` and ``answer_hops`` (passed to the reward functions), ``id`` and ``difficulty``.

    Args:
        records: loaded CrossMath records with ``image_path``.

    Returns:
        A ``datasets.Dataset`` with one row per record.
    """
    from datasets import Dataset, Image

    prompt = [{"role": "user", "content": [{"type": "text", "text": build_instruction("image")}, {"type": "image"}]}]
    rows = [
        {
            "id": record["id"],
            "difficulty": record.get("difficulty"),
            "prompt": prompt,
            "image": record["image_path"],
            **reward_columns(record),
        }
        for record in records
    ]
    return Dataset.from_list(rows).cast_column("image", Image())
