"""Reading and writing CrossMath records in the released format, and turning them into examples.

The released test set is one JSONL per style folder (``Original/testset_hr.jsonl``, ...), each
record's ``img_blank`` relative to that folder; blank lines occur and are skipped. Our
generator writes the same layout (``<out>/<Style>/crossmath.jsonl`` + the PNGs under the released
folder and file names), so one loader serves both, and a puzzle has one id in every style.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from PIL import Image

from tokenswap.crossmath.grid import BLANK, apply_operator, parse_markdown_table
from tokenswap.crossmath.metrics import gold_answer, gold_hops
from tokenswap.crossmath.prompt import Modality, build_user_content
from tokenswap.crossmath.render import puzzle_id_from_image
from tokenswap.crossmath.solver import chain_of_thought, solve

__all__ = [
    "InconsistentPuzzleError",
    "append_jsonl",
    "find_jsonl",
    "load_crossmath",
    "load_image",
    "puzzle_problem",
    "read_jsonl",
    "reward_columns",
    "sft_messages",
]


class InconsistentPuzzleError(ValueError):
    """A record whose printed puzzle contradicts its answers, so no correct chain of thought exists for it."""


def puzzle_problem(record: dict) -> str | None:
    """Why a record cannot be a training target, or ``None`` if its puzzle and answers agree.

    Seven released puzzles print ``+`` where the answers need ``÷`` (``math_puzzle_0013``, ``0090``,
    ``0096``, ``0174``, ``0178``, ``0187``, ``0240``): their equations, filled with the gold answers,
    are false, and the hop solver either finds other numbers or none.

    Args:
        record: a CrossMath record (``markdown_table`` and ``markdown_answer``).

    Returns:
        A one-line reason, or ``None``.
    """
    try:
        grid = parse_markdown_table(record["markdown_table"])
        gold = gold_answer(record)
        solution = solve(grid)
    except (KeyError, ValueError) as err:
        return f"unreadable puzzle: {err}"
    if len(gold) != len(solution.blanks):
        return f"{len(solution.blanks)} blanks but {len(gold)} answers in markdown_answer"
    filled = dict(zip(solution.blanks, gold))
    for equation in solution.equations:
        a, b, c = (filled.get(cell, grid[cell[0]][cell[1]]) for cell in equation.numbers)
        if BLANK in (a, b, c) or not all(v.isdigit() for v in (a, b, c)):
            return f"{equation.render({})} has a non-numeric answer"
        if apply_operator(int(a), equation.op, int(b)) != int(c):
            return f"the printed equation {a} {equation.op} {b} = {c} is false with the gold answers"
    if not solution.solved:
        return f"the hop solver cannot determine blanks {solution.unsolved}"
    if [str(v) for v in solution.answers()] != gold:
        return "the hop solver's answers differ from markdown_answer"
    return None


def find_jsonl(path: str | os.PathLike) -> Path:
    """A JSONL file, or the single ``*.jsonl`` inside a style folder.

    Raises:
        FileNotFoundError: if the path does not exist, or a folder holds no ``*.jsonl``.
        ValueError: if a folder holds several ``*.jsonl`` (pass the file itself).
    """
    path = Path(path)
    if path.is_file():
        return path
    if not path.is_dir():
        raise FileNotFoundError(f"CrossMath data {str(path)!r} does not exist; pass a JSONL file or its style folder")
    files = sorted(path.glob("*.jsonl"))
    if not files:
        raise FileNotFoundError(f"no *.jsonl in {str(path)!r}; pass a style folder such as <out>/Original")
    if len(files) > 1:
        raise ValueError(f"{str(path)!r} holds several JSONL files {[f.name for f in files]}; pass one of them")
    return files[0]


def read_jsonl(path: str | os.PathLike, repair: bool = False) -> list[dict]:
    """Records of a JSONL file, skipping blank lines.

    Args:
        path: the file.
        repair: if True, an unterminated last line (a write killed half way) is cut off the file
            instead of being read or raising, so an interrupted job can resume by appending.

    Returns:
        The records in file order.

    Raises:
        ValueError: if a line is not valid JSON.
    """
    path = Path(path)
    raw = path.read_bytes()
    if repair and raw and not raw.endswith(b"\n"):
        raw = raw[: raw.rfind(b"\n") + 1]
        with open(path, "r+b") as f:
            f.truncate(len(raw))
    records = []
    for number, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number} is not valid JSON ({err}); fix or delete that line") from err
    return records


def append_jsonl(path: str | os.PathLike, record: dict) -> None:
    """Append one record as a line and flush it, so a killed job loses at most the line being written."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")
        f.flush()


def load_crossmath(path: str | os.PathLike) -> list[dict]:
    """Load released-format CrossMath records (the released test set or ours).

    Args:
        path: a JSONL file, or a style folder holding exactly one.

    Returns:
        The records, each with two fields added when absent: ``id`` (the ``img_blank`` file name
        without its style suffix, so ``math_puzzle_0001_blank_hr_beige.png`` and
        ``math_puzzle_0001_blank.png`` are both ``math_puzzle_0001``) and ``image_path`` (``img_blank``
        resolved against the JSONL's folder).

    Raises:
        KeyError: if a record lacks ``markdown_table``, ``markdown_answer`` or ``markdown_answer_step``.
    """
    file = find_jsonl(path)
    records = read_jsonl(file)
    for index, record in enumerate(records):
        for key in ("markdown_table", "markdown_answer", "markdown_answer_step"):
            if key not in record:
                raise KeyError(f"record {index} of {file} has no {key!r}; is this a CrossMath JSONL?")
        if "img_blank" in record:
            record.setdefault("id", puzzle_id_from_image(record["img_blank"]))
            record.setdefault("image_path", str(file.parent / record["img_blank"]))
        else:
            record.setdefault("id", f"{file.stem}_{index:06d}")
    return records


def load_image(record: dict) -> Image.Image:
    """The puzzle image of a loaded record, as RGB.

    Raises:
        KeyError: if the record has no ``image_path`` (its JSONL gave no ``img_blank``).
    """
    with Image.open(record["image_path"]) as image:
        return image.convert("RGB")


def reward_columns(record: dict) -> dict[str, list]:
    """``{"answer": gold tokens, "answer_hops": hop per token}``: the columns the rewards read."""
    return {"answer": gold_answer(record), "answer_hops": gold_hops(record)}


def sft_messages(record: dict, modality: Modality = "image", image: Image.Image | None = None) -> list[dict]:
    """A two-turn SFT conversation: the puzzle prompt, then the solver's chain of thought and answer.

    Args:
        record: a CrossMath record.
        modality: the prompt's modality (the paper's SFT is image-only).
        image: the puzzle image; loaded from ``record["image_path"]`` when needed and not given.

    Returns:
        ``[{"role": "user", ...}, {"role": "assistant", "content": [{"type": "text", "text": cot}]}]``.

    Raises:
        InconsistentPuzzleError: if the printed puzzle contradicts the record's answers (see
            :func:`puzzle_problem`); skip such records.
    """
    problem = puzzle_problem(record)
    if problem is not None:
        raise InconsistentPuzzleError(f"record {record.get('id', '?')!r}: {problem}; skip it as a training target")
    if image is None and modality != "text":
        image = load_image(record)
    cot = chain_of_thought(parse_markdown_table(record["markdown_table"]))
    return [
        {"role": "user", "content": build_user_content(modality, record["markdown_table"], image)},
        {"role": "assistant", "content": [{"type": "text", "text": cot}]},
    ]
