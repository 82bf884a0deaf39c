"""Reading the result folders of ``tokenswap leaderboard`` into paired per-item scores (:class:`Run`).

Each RESULT is one run's output folder (or a file in it), optionally as ``NAME=PATH`` to name the model
(the default name is the run's ``model`` field):

* ``tokenswap eval``: ``gap.json``; text vs interleaved form, ``correct_text`` / ``correct_interleaved`` per item;
  with ``--forms`` (its ``forms`` field) also ``correct_<form>`` for ``both``, ``caption``, ``rendered``, and with
  ``recognition`` the per-item ``recognized`` and the per-picture ``pictures[].correct_recognition``; a gap.json
  without ``forms`` ran text and interleaved only;
* ``tokenswap crossmath eval``: ``predictions_text.jsonl`` and ``predictions_image.jsonl`` (+ their
  ``metrics_*.json``); text vs image, a puzzle is correct when every blank is (the paper's macro accuracy);
* ``tokenswap rest eval``: ``metrics.json`` + ``predictions.jsonl``; text vs image (the whole question
  rendered) on the plain-REST rendering, re-scored with the REST extractor against the gold answers of the
  dataset folder that ``metrics.json`` names.

Items are paired by id; an item without a record of both forms is left out and counted (``unpaired``).
**Failed requests**: a record with a non-null ``error`` (or ``error_<form>`` / ``<form>_error``) field, or
``failed: true``, or a null correctness, is a request that got no answer; the item is left out of *all* forms
and counted (``failed``), never scored as a wrong answer. A record with a non-null ``skipped``
(``skipped_<form>``, ``<form>_skipped``; an item never sent, e.g. over ``--max-images``) is left out the same
way and counted apart (``skipped``). ``tokenswap eval`` moves such items out of ``items`` into ``excluded``
(``{"id", "forms": {form: "error: ..." | "skipped: ..."}}``, or before issue 31 ``{"id", "error", "skipped"}``):
each entry is one left-out item, failed when any of its forms failed, else skipped. Without ``excluded`` the
counts are gap.json's ``n_failed`` / ``n_skipped`` where present, else the flagged records.

Anything unreadable (a truncated file, a line that is no JSON object, nesting or a number Python's JSON reader
refuses, an empty predictions file, a field of the wrong type) raises :class:`LeaderboardError`: one line naming
the file and the fix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenswap.errors import InputError
from tokenswap.eval.forms import ENDS, FORMS
from tokenswap.files import read_json_object, read_jsonl

__all__ = ["CROSSMATH_FORMS", "REST_FORMS", "LeaderboardError", "Run", "left_out", "load_run"]

CROSSMATH_FORMS = ("text", "image")
REST_FORMS = ("text", "image")


class LeaderboardError(InputError):
    """An input the leaderboard cannot read; one line naming the file and the fix, exit status 2."""


@dataclass
class Run:
    """One model's paired per-item scores (1.0 correct, 0.0 wrong), item ids sorted.

    Args:
        name: the model name (shown shortened where it is a path, see :func:`short_name`).
        benchmark: ``tokenswap``, ``crossmath`` or ``rest``.
        path: the result folder.
        forms: the two forms compared (``text`` first).
        item_ids: scored items (failed, skipped and unpaired ones left out).
        text: (n,) scores in the text form.
        interleaved: (n,) scores in the other form.
        failed: items left out because a request of either form failed.
        skipped: items left out because either form was never sent (e.g. over the image cap).
        unpaired: items left out because they lack a record of one form or both.
        records: ``tokenswap eval`` runs: per scored item (``item_ids`` order) ``correct_<form>`` for every item
            form run, ``images_sent`` and, with recognition, ``recognized``: what :func:`decompose` reads.
        pictures: with the recognition control, one ``{"picture", "correct_recognition"}`` per picture identified
            or not (a picture whose request failed is left out and counted in ``pictures_failed``).
        controls: the forms run beyond the gap's ends (``both``, ``caption``, ``rendered``, ``recognition``).
        pictures_failed: pictures whose recognition request got no answer.
    """

    name: str
    benchmark: str
    path: Path
    forms: tuple[str, str]
    item_ids: list[str]
    text: np.ndarray
    interleaved: np.ndarray
    failed: int = 0
    skipped: int = 0
    unpaired: int = 0
    records: list[dict] | None = None
    pictures: list[dict] | None = None
    controls: tuple[str, ...] = ()
    pictures_failed: int = 0


# ----------------------------------------------------------------------------- reading runs


def left_out(*records: dict) -> str | None:
    """``failed`` when a record of the item is a failed request, ``skipped`` when one was never sent, else None.

    >>> left_out({"id": "q1", "correct_text": True}, {"id": "q1", "error": "HTTP 500 after 5 tries"})
    'failed'
    >>> left_out({"id": "q1", "skipped": "7 images > --max-images 6"}), left_out({"id": "q1", "error": None})
    ('skipped', None)
    """
    for kind, word in (("failed", "error"), ("skipped", "skipped")):
        for record in records:
            if kind == "failed" and record.get("failed") is True:
                return kind
            # Evaluators write the bare field only when it applies, so its presence counts; a per-form
            # variant counts when it says something, so a count such as 0 does not.
            if record.get(word) is not None or any(
                value and (key.startswith(f"{word}_") or key.endswith(f"_{word}")) for key, value in record.items()
            ):
                return kind
    return None


def _read_json(path: Path) -> dict:
    return read_json_object(path, "result file", "truncated? rerun the evaluation that wrote it, or restore the file")


def _read_jsonl(path: Path) -> list[dict]:
    return read_jsonl(path, "result file", "a run killed mid-write? rerun the same eval command, which resumes, or "
                                           "delete that line")


def _model_name(name: str | None, found, source: Path) -> str:
    if name:
        return name
    if not found or not isinstance(found, str):
        raise LeaderboardError(f"{source} names no model (field 'model'); pass the run as NAME={source.parent}")
    return found


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _as_score(value, key: str, source: Path, item_id: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or (isinstance(value, (int, float)) and value in (0, 1)):
        return float(value)
    raise LeaderboardError(f"{source}: item {item_id!r} has {key}={_short(value)}, expected true/false")


def _pair(scored: dict[str, tuple[float, float]]) -> tuple[list[str], np.ndarray, np.ndarray]:
    ids = sorted(scored)
    return ids, np.array([scored[i][0] for i in ids]), np.array([scored[i][1] for i in ids])


def _forms_of(data: dict, source: Path) -> tuple[str, ...]:
    """The forms a gap.json ran, in :data:`FORMS` order; a gap.json without ``forms`` ran the two ends."""
    forms = data.get("forms")
    if forms is None:
        return ENDS
    if not isinstance(forms, list) or not all(isinstance(f, str) for f in forms):
        raise LeaderboardError(f"{source}: 'forms' is {_short(forms)}, expected a list of form names "
                               f"({', '.join(FORMS)}); rerun `tokenswap eval`, which writes it")
    unknown = [f for f in forms if f not in FORMS]
    missing = [f for f in ENDS if f not in forms]
    if unknown or missing:
        what = f"names {unknown}, not forms of `tokenswap eval`" if unknown else f"lacks {missing}, the gap's ends"
        raise LeaderboardError(f"{source}: 'forms' {what}; the forms are {', '.join(FORMS)}: rerun "
                               "`tokenswap eval --forms ...`, which writes it")
    return tuple(f for f in FORMS if f in forms)


def _excluded_kind(entry: dict) -> str:
    # `tokenswap eval` writes {"id", "forms": {form: "error: ..." | "skipped: ..."}} (before issue 31: "error" /
    # "skipped" fields). Failed outranks skipped, as in left_out; an entry that says neither is a lost answer.
    reasons = entry.get("forms")
    if isinstance(reasons, dict):
        from tokenswap.eval.form_runs import Reason

        said = [Reason.parse(str(v)) for v in reasons.values()]
        return "skipped" if said and not any(why.failed for why in said) else "failed"
    return left_out(entry) or "failed"


def _whole(value, what: str, source: Path) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise LeaderboardError(f"{source}: {what} is {_short(value)}, expected a whole number >= 0; rerun "
                               "`tokenswap eval`, which writes it")
    return value


def _load_tokenswap(folder: Path, name: str | None) -> Run:
    source = folder / "gap.json"
    data = _read_json(source)
    forms = _forms_of(data, source)
    item_forms = [f for f in forms if f != "recognition"]
    recognition = "recognition" in forms
    items = data.get("items")
    if not isinstance(items, list):
        raise LeaderboardError(f"{source} has no per-item 'items' list; write it with `tokenswap eval` (gap.json)")
    left: dict[str, str] = {}  # item id -> "failed" | "skipped"
    excluded = data.get("excluded")
    if excluded is not None:
        if not isinstance(excluded, list):
            raise LeaderboardError(f"{source}: 'excluded' is {_short(excluded)}, not a list of left-out items")
        for entry in excluded:
            if not isinstance(entry, dict) or "id" not in entry:
                raise LeaderboardError(f"{source}: an 'excluded' entry is not an object with an 'id' field: "
                                       f"{_short(entry)}")
            left.setdefault(str(entry["id"]), _excluded_kind(entry))
    scored, records, seen = {}, {}, set()
    for record in items:
        if not isinstance(record, dict) or "id" not in record:
            raise LeaderboardError(f"{source}: an item record is not an object with an 'id' field: {_short(record)}")
        item_id = str(record["id"])
        if item_id in seen:
            raise LeaderboardError(f"{source}: item id {item_id!r} appears twice; items are paired by id")
        seen.add(item_id)
        kind = left_out(record)
        if item_id in left:
            if kind is None:
                raise LeaderboardError(f"{source}: item {item_id!r} is scored in 'items' and listed in 'excluded'; "
                                       "rerun `tokenswap eval`, which resumes and rewrites gap.json")
            continue
        if kind is not None:  # a failed or skipped record need not carry correctness at all
            left[item_id] = kind
            continue
        scores = {}
        for form in item_forms:
            key = f"correct_{form}"
            if key not in record:
                raise LeaderboardError(f"{source}: item {item_id!r} has no {key!r} field (keys {sorted(record)[:12]})")
            scores[form] = _as_score(record[key], key, source, item_id)
        flag = None
        if recognition:
            if "recognized" not in record:
                raise LeaderboardError(f"{source}: item {item_id!r} has no 'recognized' field although 'forms' holds "
                                       "recognition; rerun `tokenswap eval`, which writes it")
            flag = record["recognized"]
            if flag is not None and not isinstance(flag, bool):
                raise LeaderboardError(f"{source}: item {item_id!r} has recognized={_short(flag)}, expected true/false")
        if any(v is None for v in scores.values()) or (recognition and flag is None):
            left[item_id] = "failed"
            continue
        sent = _whole(record.get("images_sent", record.get("num_images")), f"item {item_id!r}'s images_sent", source)
        scored[item_id] = (scores["text"], scores["interleaved"])
        records[item_id] = {"id": item_id, "images_sent": sent, **{f"correct_{f}": v == 1.0 for f, v in scores.items()}}
        if recognition:
            records[item_id]["recognized"] = flag
    counts = {kind: sum(v == kind for v in left.values()) for kind in ("failed", "skipped")}
    if excluded is None:  # no list of the left-out items: the counts eval wrote, else the flagged records
        for kind in ("failed", "skipped"):
            if data.get(f"n_{kind}") is not None:
                counts[kind] = _whole(data[f"n_{kind}"], f"n_{kind}", source)
    pictures, pictures_failed = None, 0
    if recognition:
        raw = data.get("pictures")
        if not isinstance(raw, list):
            raise LeaderboardError(f"{source}: 'forms' holds recognition but there is no 'pictures' list; rerun "
                                   "`tokenswap eval`, which writes it")
        pictures = []
        for j, picture in enumerate(raw):
            verdict = picture.get("correct_recognition") if isinstance(picture, dict) else False
            if not isinstance(picture, dict) or not isinstance(verdict, (bool, type(None))):
                raise LeaderboardError(f"{source}: pictures[{j}] is not an object with correct_recognition "
                                       f"true/false: {_short(picture)}")
            if verdict is None:  # its request failed: eval leaves out the items that show it
                pictures_failed += 1
                continue
            pictures.append({"picture": str(picture.get("picture", j)), "correct_recognition": verdict})
    ids, text, inter = _pair(scored)
    model = _model_name(name, data.get("model"), source)
    return Run(model, "tokenswap", folder, ENDS, ids, text, inter, **counts,
               records=[records[i] for i in ids], pictures=pictures,
               controls=tuple(f for f in forms if f not in ENDS), pictures_failed=pictures_failed)


def _by_id(rows: list[dict], source: Path) -> dict[str, dict]:
    out = {}
    for row in rows:
        if "id" not in row:
            raise LeaderboardError(f"{source}: a record has no 'id' field (keys {sorted(row)})")
        out[str(row["id"])] = row  # a resumed run may repeat an id; the last record is the one scored
    return out


def _load_crossmath(folder: Path, name: str | None) -> Run:
    from tokenswap.crossmath.metrics import gold_answer

    forms, models = {}, {}
    for modality in CROSSMATH_FORMS:
        source = folder / f"predictions_{modality}.jsonl"
        rerun = f"run `tokenswap crossmath eval --modality {modality} --out {folder}` with the same model and data"
        if not source.exists():
            raise LeaderboardError(f"{folder} has no {source.name}; the gap needs both forms: {rerun}")
        rows = _read_jsonl(source)
        if not rows:
            raise LeaderboardError(f"{source} holds no prediction record (an empty file); {rerun}")
        forms[modality] = _by_id(rows, source)
        metrics = folder / f"metrics_{modality}.json"
        found = _read_json(metrics).get("model") if metrics.exists() else None
        models[modality] = found or next((r.get("model") for r in forms[modality].values() if r.get("model")), None)
    if models["text"] != models["image"]:
        raise LeaderboardError(
            f"{folder}: predictions_text.jsonl is of model {_short(models['text'])} but predictions_image.jsonl of "
            f"{_short(models['image'])}; a gap compares one model's two forms, put each model in its own folder"
        )
    text, image = forms["text"], forms["image"]
    scored, left = {}, {"failed": 0, "skipped": 0}
    for item_id in sorted(set(text) & set(image)):
        rows = (text[item_id], image[item_id])
        kind = left_out(*rows)
        if kind is not None:
            left[kind] += 1
            continue
        scores = []
        for modality, row in zip(CROSSMATH_FORMS, rows):
            if "answer" not in row or "prediction" not in row:
                raise LeaderboardError(f"{folder}: puzzle {item_id!r} has no 'answer'/'prediction' field")
            prediction, answer = row["prediction"], row["answer"]
            if not isinstance(answer, str) or not (prediction is None or isinstance(prediction, list)):
                raise LeaderboardError(
                    f"{folder / f'predictions_{modality}.jsonl'}: puzzle {item_id!r} has answer={_short(answer)}, "
                    f"prediction={_short(prediction)}; expected a markdown answer and a list of cells (or null): "
                    "rerun `tokenswap crossmath eval`, which writes them"
                )
            scores.append(float(list(prediction or []) == gold_answer({"markdown_answer": answer})))
        scored[item_id] = tuple(scores)
    ids, t, i = _pair(scored)
    model = _model_name(name, models["text"], folder / "metrics_text.json")
    unpaired = len(set(text) ^ set(image))
    return Run(model, "crossmath", folder, CROSSMATH_FORMS, ids, t, i, unpaired=unpaired, **left)


def _load_rest(folder: Path, name: str | None) -> Run:
    from tokenswap.rest.evaluate import TEXT_VARIANT
    from tokenswap.rest.extract import extract_answer
    from tokenswap.rest.items import read_items

    source = folder / "metrics.json"
    metrics = _read_json(source)
    for key, kind in (("data", str), ("n_items", int), ("base_variant", str)):
        if key not in metrics:
            raise LeaderboardError(f"{source} has no {key!r} field; is it written by `tokenswap rest eval`?")
        if not isinstance(metrics[key], kind) or isinstance(metrics[key], bool):
            raise LeaderboardError(f"{source}: {key!r} is {_short(metrics[key])}, expected a {kind.__name__}; "
                                   "rerun `tokenswap rest eval`, which writes it")
    data = Path(metrics["data"])
    if not (data / "items.jsonl").exists():
        raise LeaderboardError(
            f"{source}: the REST dataset it was scored on, {str(data)!r} (field 'data'), has no items.jsonl here; "
            "the gold answers are read from it: run from the folder the eval ran in, or set 'data' to its path"
        )
    predictions = {}
    for row in _read_jsonl(folder / "predictions.jsonl"):
        if "key" not in row:
            raise LeaderboardError(f"{folder / 'predictions.jsonl'}: a record has no 'key' field (keys {sorted(row)})")
        predictions[str(row["key"])] = row
    variants = {"text": TEXT_VARIANT, "image": metrics["base_variant"]}
    scored, left, unpaired = {}, {"failed": 0, "skipped": 0}, 0
    try:
        dataset = read_items(data / "items.jsonl")
    except (ValueError, TypeError, KeyError, RecursionError) as err:  # JSON errors are ValueErrors
        raise LeaderboardError(f"{data / 'items.jsonl'} cannot be read as REST items ({type(err).__name__}: "
                               f"{str(err)[:90]}); rebuild it with `tokenswap rest build`") from None
    for item in dataset[: metrics["n_items"]]:
        rows = [predictions.get(f"{item.id}|{form}|{variants[form]}") for form in REST_FORMS]
        if any(r is None for r in rows):
            unpaired += 1
            continue
        kind = left_out(*rows) or ("failed" if any(r.get("response") is None for r in rows) else None)
        bad = next((r for r in rows if kind is None and not isinstance(r["response"], str)), None)
        if bad is not None:
            raise LeaderboardError(f"{folder / 'predictions.jsonl'}: {bad['key']!r} has response="
                                   f"{_short(bad['response'])}, expected text or null; rerun `tokenswap rest eval`")
        if kind is not None:
            left[kind] += 1
            continue
        scored[item.id] = tuple(
            float(extract_answer(r["response"], item.answer_type, item.options) == item.gold) for r in rows
        )
    ids, t, i = _pair(scored)
    model = _model_name(name, metrics.get("model"), source)
    return Run(model, "rest", folder, REST_FORMS, ids, t, i, unpaired=unpaired, **left)


def _kinds(folder: Path) -> list[str]:
    kinds = []
    if (folder / "gap.json").exists():
        kinds.append("tokenswap")
    if any((folder / f"predictions_{m}.jsonl").exists() for m in CROSSMATH_FORMS):
        kinds.append("crossmath")
    if (folder / "metrics.json").exists() and (folder / "predictions.jsonl").exists():
        kinds.append("rest")
    return kinds


def load_run(spec: str) -> Run:
    """One run from ``PATH`` or ``NAME=PATH`` (a result folder, or a result file inside it).

    Raises:
        LeaderboardError: nothing readable there; the message names the file and the fix.
    """
    name, path = None, spec
    if not os.path.exists(spec) and "=" in spec:
        name, path = spec.split("=", 1)
        if not name:
            raise LeaderboardError(f"{spec!r}: the name before '=' is empty; write NAME=PATH")
    folder = Path(path)
    if folder.is_file():
        folder = folder.parent
    if not folder.is_dir():
        raise LeaderboardError(f"result {path!r} does not exist; pass a `tokenswap eval`, crossmath or rest eval --out folder")
    kinds = _kinds(folder)
    if not kinds:
        raise LeaderboardError(
            f"{folder} holds no known result file (gap.json from `tokenswap eval`, predictions_text.jsonl + "
            "predictions_image.jsonl from `tokenswap crossmath eval`, metrics.json + predictions.jsonl from "
            "`tokenswap rest eval`); pass the --out folder of one of those"
        )
    if len(kinds) > 1:
        raise LeaderboardError(f"{folder} holds results of {' and '.join(kinds)}; give each run its own folder")
    run = {"tokenswap": _load_tokenswap, "crossmath": _load_crossmath, "rest": _load_rest}[kinds[0]](folder, name)
    if not run.item_ids:
        raise LeaderboardError(
            f"{folder}: no item to score ({run.failed} failed, {run.skipped} skipped, {run.unpaired} without both "
            "forms); rerun the evaluation"
        )
    return run
