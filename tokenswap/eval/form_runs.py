"""Every form of a bench through one backend: the requests, their schedule, the records, and what they add up to.

``tokenswap eval --forms ...`` asks, per bench item, each item form (:mod:`tokenswap.eval.forms`), and per
distinct picture its caption (``--forms caption``) and its recognition item (``--forms recognition``). Every
request is one record of ``records.jsonl`` (:class:`tokenswap.inference.runs.RecordLog`), keyed
``{form}|{item id}`` for item forms, ``captioning|{picture digest}`` and ``recognition|{picture id}`` per picture
(``naming|{picture id}`` for hf's log-likelihood naming control): a rerun asks only what has no answer yet, a
failed request is asked again and never scored.

The schedule keeps a server full: captions, the item forms that need no caption and the recognition items are
independent and go out at once (three streams with an OpenAI-compatible endpoint, sharing the client's
``--concurrency`` slots), and each caption-form item follows as soon as the captions of its pictures are in. A local
checkpoint (``hf``) runs the streams one after another, captions first. Each distinct picture is captioned once per
run (by its bytes) and identified once (by its concept and bytes), whichever items show it.

What cannot be scored is left out and said, form by form (forms are independent): an item whose tags lack concept
names (the bench's text and img rows do not align there) is not asked in the forms that need the names
(``skipped``) and is asked in the others; a caption that is empty or absurdly long
(:data:`tokenswap.eval.forms.CAPTION_MAX_CHARS`) skips the caption form of the items that need it; a failed caption
or recognition request leaves the items that show its picture out of that form (``error``), until a rerun answers
it. An item leaves the gap only when its text or interleaved form has no answer.

:class:`FormPlan` is the one planner: ``tokenswap eval`` runs its units through a backend (:func:`run_plan`), the
in-loop :class:`tokenswap.eval.gap.GapEvaluator` scores the same units on the ranks, and both read the records back
by unit key (:func:`collect`, :func:`tokenswap.eval.gap.plan_result`).
"""

from __future__ import annotations

import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from tokenswap.concepts import normalize_concept
from tokenswap.errors import InputError
from tokenswap.eval.forms import (
    CAPTION_MAX_NEW_TOKENS,
    CAPTION_PROMPT,
    CONCEPT_FORMS,
    ENDS,
    ITEM_FORMS,
    caption_conversation,
    clean_caption,
    form_item,
    images_sent,
    missing_concepts,
)
from tokenswap.eval.mc import MCItem, build_conversation, extract_answer, format_prompt, image_tags
from tokenswap.eval.recognition import picture_digest, recognition_items
from tokenswap.files import atomic_write_figure

__all__ = ["Collected", "FormPlan", "Reason", "Unit", "collect", "empty_forms", "plot_forms", "run_plan", "skip_reasons"]


@dataclass(frozen=True)
class Reason:
    """Why a form of an item has no answer: ``error`` (its request failed or was not made: a rerun asks it again)
    or ``skipped`` (it is not asked: a tag without a concept name, an unusable caption).

    ``str(reason)`` is how ``gap.json`` writes it (``"error: HTTP 500"``); an item record's field is
    ``{kind}_{form}`` holding ``detail``.
    """

    kind: Literal["error", "skipped"]
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"

    @property
    def failed(self) -> bool:
        return self.kind == "error"

    def about(self, what: str) -> Reason:
        """The same reason, said of ``what`` (``recognition of picture p1: timed out``)."""
        return Reason(self.kind, f"{what}: {self.detail}")

    @classmethod
    def of_record(cls, row: dict | None) -> Reason | None:
        """A record's reason (``error`` or ``skipped`` field; a missing record was not asked), None for an answer."""
        if row is None:
            return cls("error", "not asked")
        if "error" in row:
            return cls("error", row["error"])
        if "skipped" in row:
            return cls("skipped", row["skipped"])
        return None

    @classmethod
    def parse(cls, text: str) -> Reason:
        """The reason ``gap.json`` wrote as ``str(reason)``."""
        kind, _, detail = text.partition(": ")
        return cls("skipped" if kind == "skipped" else "error", detail)


@dataclass(frozen=True)
class Unit:
    """One request: ``form`` is an item form, ``captioning`` or ``recognition``; ``needs`` the caption keys it waits
    for (caption-form items)."""

    key: str
    form: str
    index: int = -1  # the item (item forms)
    picture: str = ""  # the picture digest (captioning) or id (recognition)
    needs: tuple[str, ...] = ()


@dataclass
class _Picture:
    id: str
    digest: str
    concept: str | None
    image: object
    items: list[int] = field(default_factory=list)


class FormPlan:
    """What one run asks: the items, their pictures and every unit, built from the bench pairs and the forms.

    Args:
        pairs: ``(text item, interleaved item)`` pairs.
        forms: the forms to run (:func:`tokenswap.eval.forms.parse_forms` order).
        prompt: the prompt mode of the item forms (the recognition items run zero-shot under ``k_shot``).
        shots: per item, its ``(text shots, interleaved shots)`` (``k_shot``; the other item forms have none).
        recognition_seed: seed of the recognition items' distractors.

    Raises:
        ValueError: the recognition form on a set with fewer than 4 distinct concepts (no 4-way item exists).
    """

    def __init__(self, pairs: Sequence[tuple[MCItem, MCItem]], forms: Sequence[str], prompt: str = "zero_shot",
                 shots: Sequence[tuple[tuple, tuple]] | None = None, recognition_seed: int = 0):
        self.pairs = list(pairs)
        self.forms = tuple(forms)
        self.item_forms = [f for f in self.forms if f in ITEM_FORMS]
        self.recognition = "recognition" in self.forms
        self.prompt = prompt
        self.shots = list(shots) if shots is not None else [((), ())] * len(self.pairs)
        need = [f for f in self.forms if f in CONCEPT_FORMS]
        # Per item, the forms it is not asked in and why. Forms are independent: an item whose tags lack concept
        # names is still asked in text, interleaved and caption, which need none.
        self.skipped: dict[int, dict[str, str]] = {}
        for i, (_, inter) in enumerate(self.pairs):
            missing = missing_concepts(inter)
            if need and missing:
                tags = ", ".join(f"<image {t}>" for t in missing)
                why = (f"not asked: {tags} {'has' if len(missing) == 1 else 'have'} no concept name (the bench's text "
                       f"and img rows do not align there), which --forms {','.join(need)} need")
                self.skipped[i] = dict.fromkeys(need, why)
        # The pictures' digests (a hash of every pixel) are computed when first needed, not here: a run of the item
        # forms alone sends its first request before any picture is hashed (each is hashed as its request is built).
        self._index_lock = threading.Lock()
        self._index: tuple | None = None
        # Built now (their ids hold the digests): a set with too few concepts is refused before any request.
        self.recognition_items: dict[str, MCItem] = {}
        if self.recognition:
            named = [i for i in range(len(self.pairs)) if "recognition" not in self.skipped.get(i, {})]
            for _, _, item in recognition_items([self.pairs[i][1] for i in named], seed=recognition_seed):
                self.recognition_items.setdefault(item.id, item)

    def _pictures_index(self) -> tuple:
        with self._index_lock:
            if self._index is None:
                # Per item: tag -> picture id; pictures by id, in order of appearance. A picture's id is its concept
                # and its bytes (the recognition item's id); a caption is asked once per distinct bytes (``images``),
                # whatever the concept.
                item_pictures: list[dict[int, str]] = []
                pictures: dict[str, _Picture] = {}
                for i, (_, inter) in enumerate(self.pairs):
                    ids = {}
                    for tag in image_tags(inter):
                        digest = picture_digest(inter.images[tag])
                        name = inter.concepts.get(tag)
                        ids[tag] = f"{normalize_concept(name) if name else ''}#{digest}"
                        picture = pictures.setdefault(ids[tag], _Picture(ids[tag], digest, name and normalize_concept(
                            name), inter.images[tag]))
                        if i not in picture.items:
                            picture.items.append(i)
                    item_pictures.append(ids)
                images = {}  # digest -> the picture
                for picture in pictures.values():
                    images.setdefault(picture.digest, picture.image)
                self._index = (item_pictures, pictures, images)
            return self._index

    @property
    def item_pictures(self) -> list[dict[int, str]]:
        """Per item, tag -> the id of its picture."""
        return self._pictures_index()[0]

    @property
    def pictures(self) -> dict[str, _Picture]:
        """The distinct pictures by id (concept and digest), in order of appearance."""
        return self._pictures_index()[1]

    @property
    def images(self) -> dict[str, object]:
        """Picture digest -> the picture: what the captions are asked about."""
        return self._pictures_index()[2]

    @property
    def digests(self) -> list[str]:
        return list(self.images)

    def asks(self, index: int, form: str) -> bool:
        """Whether item ``index`` is asked in ``form`` (every form that needs no concept name it lacks)."""
        return form in self.forms and form not in self.skipped.get(index, {})

    # -- units ---------------------------------------------------------------------

    def caption_units(self) -> list[Unit]:
        if "caption" not in self.forms:
            return []
        return [Unit(f"captioning|{d}", "captioning", picture=d) for d in self.digests]

    def independent_units(self) -> list[Unit]:
        """The item forms that need no caption, item by item, then the recognition items."""
        units = [Unit(f"{form}|{text.id}", form, i) for i, (text, _) in enumerate(self.pairs)
                 for form in self.item_forms if form != "caption" and self.asks(i, form)]
        units += [Unit(f"recognition|{pid}", "recognition", picture=pid) for pid in self.recognition_items]
        return units

    def caption_form_units(self) -> list[Unit]:
        if "caption" not in self.forms:
            return []
        return [
            Unit(f"caption|{text.id}", "caption", i,
                 needs=tuple(dict.fromkeys(f"captioning|{self.pictures[p].digest}" for p in self.item_pictures[i]
                                           .values())))
            for i, (text, _) in enumerate(self.pairs) if self.asks(i, "caption")
        ]

    def all_units(self) -> list[Unit]:
        return [*self.caption_units(), *self.independent_units(), *self.caption_form_units()]

    # -- conversations -------------------------------------------------------------

    def item(self, unit: Unit, captions: dict[str, str] | None = None) -> MCItem:
        text, inter = self.pairs[unit.index]
        by_tag = None
        if unit.form == "caption":
            by_tag = {tag: captions[self.pictures[pid].digest] for tag, pid in self.item_pictures[unit.index].items()}
        return form_item(unit.form, text, inter, by_tag)

    def conversation(self, unit: Unit, captions: dict[str, str] | None = None) -> list[dict]:
        if unit.form == "captioning":
            return caption_conversation(self.images[unit.picture], unit.picture)
        # Each picture with its digest: a backend prepares (resizes, encodes) it once per run, not per request.
        if unit.form == "recognition":
            mode = "zero_shot" if self.prompt == "k_shot" else self.prompt
            return build_conversation(self.recognition_items[unit.picture], mode, digests=True)
        text_shots, inter_shots = self.shots[unit.index]
        shots = {"text": text_shots, "interleaved": inter_shots}.get(unit.form, ())
        return build_conversation(self.item(unit, captions), self.prompt, shots, digests=True)

    # -- records ---------------------------------------------------------------------

    def record(self, unit: Unit, fields: dict, scorer: str) -> dict:
        """The record of ``unit`` from the backend's fields (``pred`` is the strict-match letter under generate)."""
        out = {**fields, "form": unit.form}
        if unit.form == "captioning":
            return {**out, "picture": unit.picture, "prompt": CAPTION_PROMPT, "max_new_tokens": CAPTION_MAX_NEW_TOKENS}
        response = fields.get("response")
        out["pred"] = extract_answer(response) if scorer == "generate" and response is not None else response
        if unit.form == "recognition":
            item = self.recognition_items[unit.picture]
            return {**out, "picture": unit.picture, "choices": list(item.choices), "answer": item.letter}
        return {**out, "id": self.pairs[unit.index][0].id}

    def done(self, log, unit: Unit) -> bool:
        """Whether ``unit`` has an answer that needs no new request: answered, and for the same question."""
        if not log.answered(unit.key):
            return False
        row = log.records[unit.key]
        if unit.form == "captioning":
            return row.get("prompt") == CAPTION_PROMPT and row.get("max_new_tokens") == CAPTION_MAX_NEW_TOKENS
        if unit.form == "recognition":  # the distractors come from the item set: another --limit, other options
            return row.get("choices") == list(self.recognition_items[unit.picture].choices)
        if unit.form == "caption":  # asked with the captions recorded now (a caption asked again may read otherwise)
            return row.get("captions") == self.captions_for(log, unit)
        return True

    def captions_for(self, log, unit: Unit) -> dict[str, str | None]:
        """Picture digest -> the usable caption recorded for it (None: none yet), for a caption-form unit."""
        return {key.split("|", 1)[1]: caption_of(log.records.get(key))[0] for key in unit.needs}


def caption_of(row: dict | None) -> tuple[str | None, Reason | None]:
    """``(caption, None)``, or ``(None, why not)`` from a captioning record."""
    if row is None:
        return None, Reason("error", "the caption was not asked")
    if (why := Reason.of_record(row)) is not None:
        return None, why
    caption, problem = clean_caption(row.get("response"))
    return caption, None if problem is None else Reason("skipped", problem)


# ----------------------------------------------------------------------------- the schedule


class _Streams:
    """Units of several streams asked through one backend, records appended as they finish (thread-safe)."""

    def __init__(self, backend, log, total: int, progress: str | None, max_error_share: float | None):
        from tqdm.auto import tqdm

        self.backend, self.log, self.total, self.max_error_share = backend, log, total, max_error_share
        self.cond = threading.Condition()
        self.settled: set[str] = set()
        self.settled_order: list[str] = []  # the keys of ``settled`` in the order they settled (read by ``released``)
        self.stop = threading.Event()  # abandon what is in flight too (Ctrl-C, too many failures)
        self.no_more = threading.Event()  # take no new unit; what is in flight is still answered and recorded
        self.awaited: set[str] = set()  # keys ``released`` waits for: only their answers wake it
        self.error: BaseException | None = None
        self.failed, self.first_error, self.asked = 0, None, 0
        self.bar = tqdm(total=0, desc=progress, disable=progress is None, unit="request", file=sys.stderr)

    def commit(self, record: dict, answer) -> None:
        from tokenswap.inference.runs import ErrorShareExceeded

        with self.cond:
            self.log.append(record)
            self.settle(record[self.log.key_field])
            self.asked += 1
            self.bar.update()
            if answer.error is not None:
                self.failed += 1
                self.first_error = self.first_error or answer.error
                share = self.max_error_share
                if share is not None and self.failed > share * self.total and self.error is None:
                    self.error = ErrorShareExceeded(
                        f"stopped after {self.failed} failed requests: more than --max-error-share {share:.1%} of the "
                        f"{self.total} requests have failed; first error: {self.first_error}. What was answered is "
                        "recorded; the same command resumes"
                    )
                    self.stop.set()
            if self.stop.is_set() or record[self.log.key_field] in self.awaited:
                self.cond.notify_all()

    def fail(self, err: BaseException) -> None:
        with self.cond:
            if self.error is None:
                self.error = err
            self.stop.set()
            self.cond.notify_all()

    def stream(self, units: Iterable[Unit], ask: Callable, conversation: Callable, make_record: Callable) -> None:
        """Ask every unit of ``units`` (read lazily) with ``ask(conversations)``; commit each answer in order."""
        sent: deque[Unit] = deque()

        def conversations():
            for unit in units:
                if self.stop.is_set() or self.no_more.is_set():
                    return
                try:
                    built = conversation(unit)
                except InputError as err:  # a picture that does not decode (see StoredPicture): named by its row
                    with self.cond:
                        self.error = self.error or err
                        self.no_more.set()
                        self.cond.notify_all()
                    return
                sent.append(unit)
                yield built

        answers = ask(conversations())
        try:
            for answer in answers:
                unit = sent.popleft()
                self.commit(make_record(unit, {self.log.key_field: unit.key, **answer.record()}), answer)
                if self.stop.is_set():
                    break
        finally:
            close = getattr(answers, "close", None)
            if close is not None:
                close()  # stop the requests still in flight (an early stop)

    def settle(self, key: str) -> None:
        """Mark ``key`` answered (called with ``cond`` held, or before the streams start)."""
        if key not in self.settled:
            self.settled.add(key)
            self.settled_order.append(key)

    def released(self, units: Sequence[Unit], captions_done: threading.Event, ready: Callable[[Unit], bool]):
        """``units`` as the captions they need settle (in order among those settled together); those whose
        captions failed or cannot be used are left out (``ready`` False)."""
        # Per unit the count of keys it still waits for, and per key the units waiting for it: each settled key is
        # looked at once, rather than every waiting unit at every answer (quadratic on a bench of thousands).
        order = {u.key: i for i, u in enumerate(units)}
        left: dict[str, int] = {}
        waiting_on: dict[str, list[Unit]] = {}
        free: list[Unit] = []
        for unit in units:
            needs = set(unit.needs)
            left[unit.key] = len(needs)
            for key in needs:
                waiting_on.setdefault(key, []).append(unit)
            if not needs:
                free.append(unit)
        with self.cond:
            self.awaited.update(waiting_on)
        read = 0
        while left:
            with self.cond:
                while True:
                    for key in self.settled_order[read:]:
                        for unit in waiting_on.pop(key, ()):
                            left[unit.key] -= 1
                            if left[unit.key] == 0:
                                free.append(unit)
                    read = len(self.settled_order)
                    if free or self.stop.is_set() or self.no_more.is_set() or captions_done.is_set():
                        break
                    self.cond.wait(0.5)
            if self.stop.is_set() or self.no_more.is_set() or not free:
                return
            settled, free = sorted(free, key=lambda u: order[u.key]), []
            for unit in settled:
                del left[unit.key]
                if ready(unit):
                    yield unit


def run_plan(backend, log, plan: FormPlan, scorer: str, max_new_tokens: int, progress: str | None = None,
             max_error_share: float | None = None, keep: Callable[[Unit], bool] | None = None) -> int:
    """Ask ``backend`` every unit of ``plan`` without an answer in ``log``; append each record as it finishes.

    ``keep`` narrows the run to the units it accepts (one rank's shard under ``accelerate launch``).

    Returns:
        The number of requests made.

    Raises:
        ErrorShareExceeded: more than ``max_error_share`` of the run's requests failed (what was answered is kept).
        NoLogprobsError: ``loglik`` through an endpoint that returns no logprobs (from the backend).
    """
    units = plan.all_units()
    def todo(batch: list[Unit]) -> list[Unit]:
        return [u for u in batch if not plan.done(log, u) and (keep is None or keep(u))]

    captions = todo(plan.caption_units())
    independent = todo(plan.independent_units())
    dependent = todo(plan.caption_form_units())
    if not (captions or independent or dependent):
        return 0
    runs = _Streams(backend, log, len(units), progress, max_error_share)
    runs.bar.total = len(captions) + len(independent) + len(dependent)
    for unit in plan.caption_units():
        if plan.done(log, unit):
            runs.settle(unit.key)
    text_of: dict[str, str] = {}

    def caption_ready(unit: Unit) -> bool:
        for key in unit.needs:
            caption, _ = caption_of(log.records.get(key))
            if caption is None:
                return False
            text_of[key.split("|", 1)[1]] = caption
        return True

    def ask_items(convs):
        if scorer == "loglik":
            return backend.score_letters(convs)
        return backend.generate(convs, max_new_tokens)

    def make(unit, fields):
        record = plan.record(unit, fields, scorer)
        if unit.form == "caption":
            record["captions"] = {key.split("|", 1)[1]: text_of[key.split("|", 1)[1]] for key in unit.needs}
        return record

    captions_done = threading.Event()
    jobs = [
        (lambda: runs.stream(captions, lambda c: backend.generate(c, CAPTION_MAX_NEW_TOKENS), plan.conversation, make),
         captions_done),
        (lambda: runs.stream(independent, ask_items, plan.conversation, make), None),
        (lambda: runs.stream(runs.released(dependent, captions_done, caption_ready), ask_items,
                             lambda u: plan.conversation(u, text_of), make), None),
    ]

    def run(job, done: threading.Event | None) -> None:
        try:
            job()
        except BaseException as err:  # noqa: BLE001 - re-raised in the calling thread
            runs.fail(err)
        finally:
            if done is not None:
                done.set()
            with runs.cond:
                runs.cond.notify_all()

    try:
        if backend.kind == "hf":  # one model, one batch at a time: the streams in turn, captions first
            for job, done in jobs:
                run(job, done)
        else:
            threads = [threading.Thread(target=run, args=job, daemon=True, name=f"tokenswap-forms-{i}")
                       for i, job in enumerate(jobs)]
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():
                    t.join(0.2)
    except BaseException:  # Ctrl-C: the streams stop taking units and close what is in flight
        runs.stop.set()
        raise
    finally:
        runs.bar.close()
    if runs.error is not None:
        raise runs.error
    stats = backend.stats()
    if stats and progress is not None:
        print(f"{progress}: " + ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
                                          for k, v in stats.items()), file=sys.stderr)
    return runs.asked


# ----------------------------------------------------------------------------- results


@dataclass
class Collected:
    """The results of one run, read from its records by unit key (:func:`collect`); see ``gap.json`` in the docs.

    Args:
        items: one record per item of the gap (answered in text and interleaved), ``correct_<form>`` per item form
            run: true/false, or None with ``skipped_<form>`` / ``error_<form>`` saying why that form has no answer;
            with recognition ``recognized`` (None where a picture of the item has no identification).
        pictures: one per distinct picture those items show.
        excluded: one per item left out of the gap, with the reason per form.
        counts: ``failed`` and ``skipped`` items of ``excluded`` (an item both failed and skipped in different
            forms counts as failed).
        form_counts: per form run, ``n`` (items of the gap scored in it), ``failed`` and ``skipped`` (items whose
            request of that form failed or was not made); for recognition also ``pictures`` (identified or not).
    """

    items: list[dict]
    pictures: list[dict]
    excluded: list[dict]
    counts: dict
    form_counts: dict

    def complete(self) -> tuple[list[dict], list[dict]]:
        """The items scored in every form run and the pictures they show: what the decomposition rests on (its
        differences are paired over items, so every form must have the same items)."""
        forms = [k[len("correct_"):] for k in (self.items[0] if self.items else {}) if k.startswith("correct_")]
        items = [r for r in self.items if all(r[f"correct_{f}"] is not None for f in forms)
                 and r.get("recognized", False) is not None]
        by_id = {p["picture"]: p for p in self.pictures}
        return items, [by_id[pid] for pid in dict.fromkeys(pid for r in items for pid in r["pictures"])]

    def empty_forms(self) -> dict[str, str]:
        return empty_forms(self.form_counts, self.excluded, self.items)


def empty_forms(form_counts: dict, excluded: Sequence[dict], items: Sequence[dict]) -> dict[str, str]:
    """Form -> one line, for each form run that rests on no item (recognition: on no identified picture), saying
    why."""
    out = {}
    for form, c in form_counts.items():
        if c["pictures"] if form == "recognition" else c["n"]:
            continue
        first = next((f"{e['id']}: {r}" for e in (*excluded, *items) for f, r in skip_reasons(e).items() if f == form),
                     None)
        what = "identified pictures" if form == "recognition" else "items"
        why = f"{c['failed']} items failed and {c['skipped']} were skipped in it" + (f" (first: {first})" if first else "")
        out[form] = f"the {form} form rests on 0 {what}: {why}"
    return out


def skip_reasons(entry: dict) -> dict[str, Reason]:
    """Form -> :class:`Reason` of an excluded entry (``gap.json``'s ``forms``) or of an item record's per-form
    ``error_<form>`` / ``skipped_<form>`` fields."""
    if "forms" in entry and isinstance(entry["forms"], dict):
        return {form: Reason.parse(text) for form, text in entry["forms"].items()}
    out = {}
    for key, value in entry.items():
        for kind in ("error", "skipped"):
            if key.startswith(f"{kind}_") and value:
                out[key[len(kind) + 1:]] = Reason(kind, value)
    return out


def collect(plan: FormPlan, records: dict[str, dict], scorer: str) -> Collected:
    """The records of a finished run (unit key -> record, as :class:`~tokenswap.inference.runs.RecordLog` holds
    them), read by unit key.

    Forms are independent: a form whose request for an item failed or was not made (a caption that is empty, a tag
    without a concept name) leaves that item out of that form only; an item leaves the gap (``excluded``) only
    when its text or interleaved form has no answer.
    """
    reasons_of: list[dict[str, Reason]] = []
    rows_of: list[dict[str, dict]] = []
    for i, (text, _) in enumerate(plan.pairs):
        reasons: dict[str, Reason] = {}
        rows: dict[str, dict] = {}
        for form in plan.item_forms:
            row = records.get(f"{form}|{text.id}")
            if not plan.asks(i, form):
                reasons[form] = Reason("skipped", plan.skipped[i][form])
            elif form == "caption" and row is None:
                for tag, pid in plan.item_pictures[i].items():
                    _, why = caption_of(records.get(f"captioning|{plan.pictures[pid].digest}"))
                    if why is not None:
                        reasons[form] = why.about(f"caption of picture {pid} (<image {tag}>)")
                        break
                else:
                    reasons[form] = Reason("error", "not asked")
            elif (why := Reason.of_record(row)) is not None:
                reasons[form] = why
            else:
                rows[form] = row
        if plan.recognition:
            if not plan.asks(i, "recognition"):
                reasons["recognition"] = Reason("skipped", plan.skipped[i]["recognition"])
            else:
                for pid in dict.fromkeys(plan.item_pictures[i].values()):
                    if (why := Reason.of_record(records.get(f"recognition|{pid}"))) is not None:
                        reasons["recognition"] = why.about(f"recognition of picture {pid}")
                        break
        reasons_of.append(reasons)
        rows_of.append(rows)

    items, excluded = [], []
    unrecognized: list[bool] = []  # per item record: its recognition form has a reason
    for i, (text, inter) in enumerate(plan.pairs):
        reasons, rows = reasons_of[i], rows_of[i]
        if any(form in reasons for form in ENDS):
            entry = {"id": text.id, "forms": {form: str(why) for form, why in reasons.items()}}
            for kind in ("error", "skipped"):  # today's fields: the first reason of each kind
                first = next((why.detail for why in reasons.values() if why.kind == kind), None)
                if first is not None:
                    entry[kind] = first
            excluded.append(entry)
            continue
        rec = {
            "id": text.id, "subject": text.subject, "answer": text.letter, "num_images": inter.num_images,
            "images_sent": images_sent(format_prompt(inter, plan.prompt, plan.shots[i][1])),
            "pictures": list(dict.fromkeys(plan.item_pictures[i].values())),
        }
        for form in plan.item_forms:
            rec[f"pred_{form}"] = rows[form]["pred"] if form in rows else None
        for form in plan.item_forms:
            rec[f"correct_{form}"] = rows[form]["pred"] == text.letter if form in rows else None
        for form in plan.item_forms:
            r = rows.get(form)
            if r is None:
                rec[f"{reasons[form].kind}_{form}"] = reasons[form].detail
                continue
            if scorer == "generate":
                rec[f"response_{form}"] = r["response"]
            for extra in ("reasoning", "letter_probs", "outside_mass"):
                if extra in r:
                    rec[f"{extra}_{form}"] = r[extra]
        if "recognition" in reasons:
            rec[f"{reasons['recognition'].kind}_recognition"] = reasons["recognition"].detail
        items.append(rec)
        unrecognized.append("recognition" in reasons)

    shown: dict[str, list[str]] = {}
    for rec in items:
        for pid in rec["pictures"]:
            shown.setdefault(pid, []).append(rec["id"])
    pictures = []
    for pid, ids in shown.items():
        picture = plan.pictures[pid]
        out = {"picture": pid, "concept": picture.concept, "items": ids}
        if plan.recognition:
            row = records.get(f"recognition|{pid}")
            if Reason.of_record(row) is not None:  # no answer: neither right nor wrong
                out.update(pred_recognition=None, correct_recognition=None)
            else:
                out.update(pred_recognition=row["pred"], correct_recognition=row["pred"] == row["answer"])
                if scorer == "generate":
                    out["response_recognition"] = row["response"]
                if "letter_probs" in row:
                    out["letter_probs_recognition"] = row["letter_probs"]
        if "caption" in plan.forms:
            out["caption"] = caption_of(records.get(f"captioning|{picture.digest}"))[0]
        naming = records.get(f"naming|{pid}")
        if naming is not None:
            out.update(pred_naming=naming["pred"], correct_naming=naming["correct"], loglik_naming=naming["loglik"])
        pictures.append(out)
    if plan.recognition:
        correct = {p["picture"]: p["correct_recognition"] for p in pictures}
        for rec, unasked in zip(items, unrecognized):
            flags = [correct[pid] for pid in rec["pictures"]]
            rec["recognized"] = None if unasked or None in flags else all(flags)

    form_counts = {}
    for form in plan.forms:
        said = [r[form] for r in reasons_of if form in r]
        scored = (sum(r.get("recognized") is not None for r in items) if form == "recognition"
                  else sum(r[f"correct_{form}"] is not None for r in items))
        form_counts[form] = {"n": scored, "failed": sum(why.failed for why in said),
                             "skipped": sum(not why.failed for why in said)}
        if form == "recognition":
            form_counts[form]["pictures"] = sum(p["correct_recognition"] is not None for p in pictures)
    failed = sum(any(why.failed for why in reasons.values()) for reasons in reasons_of
                 if any(form in reasons for form in ENDS))
    return Collected(items, pictures, excluded, {"failed": failed, "skipped": len(excluded) - failed}, form_counts)


def plot_forms(payload: dict, path) -> None:
    """``gap_forms.png``: every form's accuracy with its 95% interval (and the recognition rate), and the gap by
    images sent with its intervals."""
    from matplotlib.figure import Figure

    d = payload["decomposition"]
    fig = Figure(figsize=(11, 4.2))
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    names, values, lows, highs = [], [], [], []
    entries = [(f"{form}\n(n {e.get('n', d['n'])})", e) for form, e in d["acc"].items()]
    if d.get("recognition_rate") is not None:
        entries.append((f"recognition\n({d['recognition_rate']['n_pictures']} pictures)", d["recognition_rate"]))
    for name, e in entries:
        v = e["value"] if e["value"] is not None else float("nan")
        lo, hi = e["ci"] if e.get("ci") else (v, v)
        names.append(name)
        values.append(100 * v)
        lows.append(max(0.0, 100 * (v - lo)))  # a percentile interval need not hold its point: no negative whisker
        highs.append(max(0.0, 100 * (hi - v)))
    colors = ["#4c72b0", "#dd8452", "#55a868", "#8172b3", "#c44e52", "#937860"][: len(names)]
    left.bar(range(len(names)), values, yerr=[lows, highs], capsize=4, color=colors)
    left.set_xticks(range(len(names)), names)
    left.set_ylabel("accuracy (%)")
    left.set_ylim(0, 105)
    name = str(payload.get("model", "")).rstrip("/").rsplit("/", 1)[-1]  # a served path: its last part
    missing = "".join(f"; {m['form']}: 0 items" for m in d.get("missing", []))
    left.set_title(f"{name}: {d['n']} items, each form on its n (bars: 95% intervals){missing}", fontsize=9)
    for x, v in enumerate(values):
        left.text(x + 0.08, min(v, 95) + 1.5, f"{v:.1f}", ha="left", fontsize=8)
    groups = d["by_images_sent"]
    ks = [int(k) for k in groups]
    gaps = [100 * (groups[str(k)]["gap"]["value"] or 0.0) for k in ks]
    err = [[max(0.0, 100 * ((g["gap"]["value"] or 0) - g["gap"]["ci"][0])) if g["gap"]["ci"] else 0
            for g in groups.values()],
           [max(0.0, 100 * (g["gap"]["ci"][1] - (g["gap"]["value"] or 0))) if g["gap"]["ci"] else 0
            for g in groups.values()]]
    right.errorbar(ks, gaps, yerr=err, fmt="o-", capsize=4, color="#4c72b0")
    right.axhline(0, color="grey", lw=0.8)
    for k, g in zip(ks, groups.values()):
        right.annotate(f"n {g['n']}", (k, 100 * (g["gap"]["value"] or 0)), textcoords="offset points",
                       xytext=(4, 6), fontsize=7)
    right.set_xticks(ks)
    right.set_xlabel("images sent (image parts of the interleaved request)")
    right.set_ylabel("gap = text − interleaved (points)")
    right.set_title("gap by images sent (95% intervals)", fontsize=9)
    fig.tight_layout()
    atomic_write_figure(path, fig, dpi=110)
