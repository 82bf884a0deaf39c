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
from tokenswap.errors import InputError
from tokenswap.files import cut_torn_tail
from tokenswap.files import read_jsonl as read_checked_jsonl

__all__ = [
    "RECORD_FIELDS",
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
        InputError: if a folder holds several ``*.jsonl`` (pass the file itself).
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
        raise InputError(f"CrossMath data {str(path)!r} holds several JSONL files ({', '.join(f.name for f in files)}) "
                         f"and which one to read is not clear; pass one of them, e.g. {str(files[0])!r}")
    return files[0]


READ_FIX = ("fix or delete that line, or write the file again (`tokenswap crossmath generate` with the same flags "
            "finishes a file a kill cut short)")


def read_jsonl(path: str | os.PathLike, repair: bool = False, fix: str = READ_FIX) -> list[dict]:
    """Records of a JSONL file, skipping blank lines.

    Args:
        path: the file.
        repair: if True, an unterminated last line (a write killed half way) is cut off the file
            instead of being read or raising, so an interrupted job can resume by appending.
        fix: what the error of a bad line tells the user to do.

    Returns:
        The records in file order.

    Raises:
        InputError: a line that is not UTF-8 or no JSON object (names ``path:line`` and the fix).
    """
    if repair:
        cut_torn_tail(path)
    return read_checked_jsonl(path, "CrossMath file", fix)


def append_jsonl(path: str | os.PathLike, record: dict) -> None:
    """Append one record as a line and flush it, so a killed job loses at most the line being written."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")
        f.flush()


RECORD_FIELDS = ("markdown_table", "markdown_answer", "markdown_answer_step")
"""The fields every CrossMath record has (all strings, as released)."""


def load_crossmath(path: str | os.PathLike, fix: str = READ_FIX) -> list[dict]:
    """Load released-format CrossMath records (the released test set or ours).

    Args:
        path: a JSONL file, or a style folder holding exactly one.
        fix: what the error of a line that is no JSON object tells the user to do.

    Returns:
        The records, each with two fields added when absent: ``id`` (the ``img_blank`` file name
        without its style suffix, so ``math_puzzle_0001_blank_hr_beige.png`` and
        ``math_puzzle_0001_blank.png`` are both ``math_puzzle_0001``) and ``image_path`` (``img_blank``
        resolved against the JSONL's folder).

    Raises:
        InputError: a line that is no JSON object, a record without one of :data:`RECORD_FIELDS` or with one
            (or ``img_blank``) that is not a string; each names the file and the record.
    """
    file = find_jsonl(path)
    records = read_jsonl(file, fix=fix)
    for index, record in enumerate(records):
        missing = [key for key in RECORD_FIELDS if key not in record]
        if missing:
            raise InputError(f"record {index} of {file} has no {missing[0]!r}; is this a CrossMath JSONL? Each record "
                             f"needs {', '.join(RECORD_FIELDS)}")
        for key in (*RECORD_FIELDS, "img_blank"):
            if key in record and not isinstance(record[key], str):
                raise InputError(f"record {index} of {file}: {key!r} must be a string as in the release, got "
                                 f"{type(record[key]).__name__} {str(record[key])[:40]!r}; fix or drop that record")
        if "img_blank" in record:
            record.setdefault("id", puzzle_id_from_image(record["img_blank"]))
            record.setdefault("image_path", str(file.parent / record["img_blank"]))
        else:
            record.setdefault("id", f"{file.stem}_{index:06d}")
    return records


def load_image(record: dict) -> Image.Image:
    """The puzzle image of a loaded record, as RGB.

    Raises:
        InputError: the record has no ``image_path`` (its JSONL gave no ``img_blank``), or its image is missing
            or does not decode (names the file and the fix).
    """
    if "image_path" not in record:
        raise InputError(f"CrossMath record {record.get('id', '?')!r} has no img_blank, so it has no puzzle image; "
                         "give the records their images, or evaluate with --modality text")
    path = record["image_path"]
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except FileNotFoundError:
        problem = "does not exist"
    except (OSError, Image.DecompressionBombError) as e:  # UnidentifiedImageError and a cut file are OSErrors
        problem = f"does not decode ({e})"
    raise InputError(f"puzzle image {path!r} of record {record.get('id', '?')!r} {problem}; restore it, or write the "
                     "folder again with `tokenswap crossmath generate` (or from the release's checkout)")


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
