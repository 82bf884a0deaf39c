"""REST items in three rendering-equivalent modalities, and loaders for MMLU, AI2-ARC and GSM-style data.

Every item carries the same content three ways:

- **text**: ``item.text`` as text;
- **image**: ``item.text`` rendered to one image;
- **mixed**: ``item.stem`` rendered as an image followed by ``item.query`` as text, split per item type:

  - multiple choice (MMLU, ARC): stem = the question, query = the lettered options;
  - GSM-style: stem = every sentence but the last, query = the final (question) sentence;
  - SoEBench: stem = the equations, query = the question asking for the values.

The instruction (task and answer format) is always text and is not part of the content.

Filtering as in REST: items whose text is over 800 characters or contains LaTeX are dropped.
GSM questions with a single sentence cannot be split for the mixed modality and are dropped too.
Loaders go through ``datasets.load_dataset`` and accept a hub id (e.g. ``cais/mmlu``) or a local
file/folder (parquet, JSON lines, CSV) in the same schema.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Literal, get_args

from tokenswap.errors import InputError
from tokenswap.files import read_jsonl
from tokenswap.rest.extract import AnswerType, normalize_number

__all__ = [
    "MAX_CHARS",
    "Modality",
    "RestItem",
    "Source",
    "arc_item",
    "build_conversation",
    "filter_reason",
    "gsm_item",
    "load_rows",
    "load_source",
    "mmlu_item",
    "read_items",
    "write_items",
]

Source = Literal["mmlu", "arc", "gsm", "soebench"]
Modality = Literal["text", "image", "mixed"]

MAX_CHARS = 800
# Backslash commands (\frac, \(, \[), $$ blocks, and $...$ spans holding TeX syntax. A bare "$5" is money, not LaTeX.
_LATEX = re.compile(r"\\[A-Za-z]+|\\[\(\[]|\$\$|\$[^$\n]*[\\^_{}][^$\n]*\$")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")
_LETTERS = "ABCDEFGHIJ"

_INSTRUCTIONS: dict[str, str] = {
    "mc": (
        "Answer the following multiple-choice question. Think step by step, then write your final answer "
        "on the last line as 'Answer: X', where X is the letter of the correct option."
    ),
    "numeric": (
        "Solve the following math problem. Think step by step, then write your final answer on the last "
        "line as 'Answer: N', where N is a number."
    ),
    "soe": (
        "Solve the following system of linear equations. Think step by step, then write the values on the "
        "last line as 'Answer: A=..., B=..., ...' with one entry per variable."
    ),
}
# Where the content is, per answer type and modality; the text modality needs no pointer.
_LOCATORS: dict[tuple[str, str], str] = {
    ("mc", "image"): "The question and its options are shown in the image.",
    ("mc", "mixed"): "The question is shown in the image; its options follow as text.",
    ("numeric", "image"): "The problem is shown in the image.",
    ("numeric", "mixed"): "The beginning of the problem is shown in the image; its final question follows as text.",
    ("soe", "image"): "The equations and the question are shown in the image.",
    ("soe", "mixed"): "The equations are shown in the image; the question follows as text.",
}


@dataclass(kw_only=True)
class RestItem:
    """One REST item; ``text`` is the whole item, ``stem`` + ``query`` its mixed-modality split."""

    id: str
    """Unique, filesystem-safe id (also the image folder name)."""
    source: Source
    answer_type: AnswerType
    gold: str
    """Gold answer in extractor-canonical form: a letter, a normalised number, or ``A=1,B=2``."""
    options: str
    """Option letters (mc) or variable names (soe); empty for numeric."""
    text: str
    stem: str
    query: str
    meta: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, row: dict) -> RestItem:
        """The item of a ``items.jsonl`` line.

        Raises:
            ValueError: a field missing, unknown or of the wrong type, an unknown answer type or source, or an id
                that is no folder name (the item's images live in ``images/<id>/``).
        """
        names = [f.name for f in fields(cls)]
        missing = [k for k in names if k not in row and k != "meta"]
        if missing:
            raise ValueError(f"the item has no {missing[0]!r}")
        unknown = [k for k in row if k not in names]
        if unknown:
            raise ValueError(f"the item has an unknown field {unknown[0]!r}")
        for key in names:
            kind = dict if key == "meta" else str
            if key in row and not isinstance(row[key], kind):
                raise ValueError(f"the item's {key!r} must be a {'JSON object' if kind is dict else 'string'}, got "
                                 f"{type(row[key]).__name__}")
        for key, allowed in (("answer_type", _INSTRUCTIONS), ("source", get_args(Source))):
            if row[key] not in allowed:
                raise ValueError(f"the item's {key!r} must be one of {', '.join(allowed)}, got {row[key]!r}")
        if not _SAFE_ID.fullmatch(row["id"]) or row["id"] in (".", ".."):
            raise ValueError(f"the item's 'id' {row['id'][:60]!r} is no folder name (letters, digits, '_', '.', '-')")
        return cls(**row)


def filter_reason(text: str, max_chars: int = MAX_CHARS) -> str | None:
    """Why REST would drop this item text (``"too_long"``, ``"latex"``), or None to keep it."""
    if len(text) > max_chars:
        return "too_long"
    if _LATEX.search(text):
        return "latex"
    return None


_SAFE_ID = re.compile(r"[A-Za-z0-9_.-]+")


def _safe_id(raw: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", raw)


def _mc_item(item_id: str, source: Source, question: str, choices: Sequence[str], gold_index: int, meta: dict):
    if not 2 <= len(choices) <= len(_LETTERS):
        raise ValueError(f"item {item_id}: expected 2-{len(_LETTERS)} choices, got {len(choices)}")
    letters = _LETTERS[: len(choices)]
    stem = question.strip()
    query = "\n".join(f"{letter}. {str(choice).strip()}" for letter, choice in zip(letters, choices))
    return RestItem(
        id=item_id,
        source=source,
        answer_type="mc",
        gold=letters[gold_index],
        options=letters,
        text=f"{stem}\n{query}",
        stem=stem,
        query=query,
        meta=meta,
    )


def mmlu_item(row: dict, index: int, split: str = "test") -> RestItem:
    """An item from a ``cais/mmlu`` row (``question``, ``subject``, ``choices``, ``answer`` 0-3)."""
    _require(row, ("question", "choices", "answer"), "cais/mmlu")
    answer, choices = row["answer"], row["choices"]
    if isinstance(answer, str) and answer.strip().isdigit():  # a CSV or JSON copy that quotes the index
        answer = int(answer)
    if isinstance(answer, bool) or not isinstance(answer, int) or not isinstance(choices, list) \
            or not 0 <= answer < len(choices):
        raise ValueError(f"`answer` must be an option index 0..{len(choices) - 1 if isinstance(choices, list) else 3},"
                         f" got {answer!r}")
    return _mc_item(
        f"mmlu-{split}-{index:05d}",
        "mmlu",
        row["question"],
        choices,
        answer,
        {"subject": row.get("subject", ""), "index": index},
    )


def arc_item(row: dict, index: int, split: str = "test") -> RestItem:
    """An item from an ``allenai/ai2_arc`` row.

    Option labels are re-lettered A, B, C, ... by position, since some ARC items use ``1``-``4``.
    """
    _require(row, ("id", "question", "choices", "answerKey"), "allenai/ai2_arc")
    choices = row["choices"]
    if not isinstance(choices, dict) or not isinstance(choices.get("label"), list) \
            or not isinstance(choices.get("text"), list):
        raise ValueError(f"`choices` must be an object with `label` and `text` lists (the allenai/ai2_arc schema), "
                         f"got {type(choices).__name__}")
    labels = [str(label) for label in choices["label"]]
    if row["answerKey"] not in labels:
        raise ValueError(f"ARC item {row['id']}: answerKey {row['answerKey']!r} not among labels {labels}")
    return _mc_item(
        f"arc-{_safe_id(row['id'])}",
        "arc",
        row["question"],
        row["choices"]["text"],
        labels.index(row["answerKey"]),
        {"arc_id": row["id"], "index": index},
    )


def gsm_item(row: dict, index: int, split: str = "test") -> RestItem | None:
    """An item from a ``gsm8k`` / GSM-Symbolic row (``question``, ``answer`` ending in ``#### N``).

    Returns None for a single-sentence question, which has no stem/question split.
    """
    _require(row, ("question", "answer"), "gsm8k")
    final = row["answer"].rsplit("####", 1)
    gold = normalize_number(final[-1]) if len(final) == 2 else None
    if gold is None:
        raise ValueError(f"GSM row {index}: 'answer' must end with '#### <number>', got {row['answer'][-40:]!r}")
    question = " ".join(row["question"].split())
    sentences = _SENTENCE_END.split(question)
    if len(sentences) < 2:
        return None
    return RestItem(
        id=f"gsm-{split}-{index:05d}",
        source="gsm",
        answer_type="numeric",
        gold=gold,
        options="",
        text=question,
        stem=" ".join(sentences[:-1]),
        query=sentences[-1],
        meta={"index": index},
    )


def _require(row: dict, keys: Iterable[str], schema: str) -> None:
    missing = [k for k in keys if k not in row]
    if missing:
        raise ValueError(f"missing {missing} for the {schema} schema; it has {sorted(row)}")
    for key in ("question", "answer") if schema == "gsm8k" else ("question",):
        if not isinstance(row[key], str):
            raise ValueError(f"`{key}` must be a string, got {type(row[key]).__name__}")


_ITEM_BUILDERS = {"mmlu": mmlu_item, "arc": arc_item, "gsm": gsm_item}
# (hub config, split) used when the data argument is a hub id.
_HUB_DEFAULTS = {"mmlu": ("all", "test"), "arc": ("ARC-Challenge", "test"), "gsm": ("main", "test")}


def load_rows(data: str | Path, split: str, config: str | None = None):
    """A ``datasets.Dataset`` from a hub id or a local file/folder.

    Args:
        data: hub id (``cais/mmlu``), a parquet/JSONL/JSON/CSV file, or a folder of such files.
        split: split to take (hub ids and folders with several splits; a single file is one split).
        config: hub config name (``all``, ``ARC-Challenge``, ``main``).

    Raises:
        InputError: a local file or folder that does not read (cut, another format), holds no rows, or lacks
            ``split``; names it.
    """
    from datasets import load_dataset

    from tokenswap.data.local import load_local

    path = Path(data)
    fix = "restore the file (a cut copy or download?) or pass another --data"
    if path.is_file():
        return load_local([path], "train", f"--data {str(path)!r}", fix)
    if path.is_dir():
        return load_local(path, split, f"--data {str(path)!r}", fix)
    return load_dataset(str(data), config, split=split)


def load_source(
    source: Literal["mmlu", "arc", "gsm"],
    data: str | Path,
    n: int | None = None,
    split: str | None = None,
    config: str | None = None,
    max_chars: int = MAX_CHARS,
) -> tuple[list[RestItem], Counter]:
    """The first ``n`` items of a dataset that pass the REST filters, in dataset order.

    Args:
        source: ``mmlu``, ``arc`` or ``gsm`` (the row schema).
        data: hub id or local file/folder (see :func:`load_rows`).
        n: number of items to keep (all when None).
        split: dataset split; defaults to ``test``.
        config: hub config; defaults to ``all`` / ``ARC-Challenge`` / ``main``.
        max_chars: length filter on the item text.

    Returns:
        ``(items, counts)`` where ``counts`` tallies ``kept`` and each drop reason.

    Raises:
        InputError: data that does not read (:func:`load_rows`), or a row that is no item of ``source`` (names it).
    """
    if source not in _ITEM_BUILDERS:
        raise ValueError(f"source must be one of {sorted(_ITEM_BUILDERS)} (soebench is generated), got {source!r}")
    default_config, default_split = _HUB_DEFAULTS[source]
    split = split or default_split
    rows = load_rows(data, split, config or default_config)
    items: list[RestItem] = []
    counts: Counter = Counter()
    for index, row in enumerate(rows):
        if n is not None and len(items) >= n:
            break
        try:
            item = _ITEM_BUILDERS[source](row, index, split)
        except (ValueError, TypeError) as e:  # a missing column, an answer no option, a null or list where text is
            raise InputError(f"--data {str(data)!r} row {index}: {e}; fix or drop that row, or pass the --source its "
                             "rows are in") from None
        reason = "single_sentence" if item is None else filter_reason(item.text, max_chars)
        counts[reason or "kept"] += 1
        if reason is None:
            items.append(item)
    return items, counts


ITEMS_FIX = ("the folder was not written whole: rerun the `tokenswap rest build` command that wrote it (it finishes a "
             "cut file), or build a new --out")


def read_items(path: str | Path, fix: str = ITEMS_FIX) -> list[RestItem]:
    """Items from a JSONL file written by :func:`write_items`.

    Raises:
        InputError: a line that is no JSON object or no item (:meth:`RestItem.from_dict`), naming ``path:line``
            and ``fix``.
    """
    return read_jsonl(path, "REST items", fix, parse=RestItem.from_dict)


def write_items(items: Iterable[RestItem], path: str | Path, append: bool = False) -> None:
    """Write items as JSON lines (one per item), each flushed whole so a kill cuts at most the last one."""
    with open(path, "a" if append else "w", encoding="utf-8") as f:
        for item in items:
            f.write(json.dumps(item.to_dict(), ensure_ascii=False) + "\n")
            f.flush()


def build_conversation(item: RestItem, modality: Modality | Literal["ocr_first"], image=None, text=None) -> list[dict]:
    """One user turn asking for the item's answer in the given modality.

    Args:
        item: the item.
        modality: ``text``, ``image`` (``image`` = the whole item rendered), ``mixed`` (``image`` = the
            rendered stem; the query follows as text) or ``ocr_first`` (``text`` = the model's own
            transcription of the whole-item image, asked as in the text modality).
        image: PIL image for ``image``/``mixed``.
        text: transcription for ``ocr_first``.

    Returns:
        Chat messages for any backend (:mod:`tokenswap.inference.backends`).
    """
    instruction = _INSTRUCTIONS[item.answer_type]
    if modality == "text":
        parts = [{"type": "text", "text": f"{instruction}\n\n{item.text}"}]
    elif modality == "ocr_first":
        if text is None:
            raise ValueError("modality 'ocr_first' needs text= (the transcription)")
        parts = [{"type": "text", "text": f"{instruction}\n\n{text}"}]
    elif modality in ("image", "mixed"):
        if image is None:
            raise ValueError(
                f"modality {modality!r} needs image= (the rendered {'item' if modality == 'image' else 'stem'})"
            )
        locator = _LOCATORS[(item.answer_type, modality)]
        parts = [{"type": "text", "text": f"{instruction} {locator}\n\n"}, {"type": "image", "image": image}]
        if modality == "mixed":
            parts.append({"type": "text", "text": f"\n{item.query}"})
    else:
        raise ValueError(f"modality must be text, image, mixed or ocr_first, got {modality!r}")
    return [{"role": "user", "content": parts}]
