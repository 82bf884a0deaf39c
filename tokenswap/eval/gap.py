"""The modality-gap evaluator: the same multiple-choice items in text and interleaved form, one model.

Two scorers:

* ``generate``: the official protocol (greedy decoding, strict-match of the last A-D letter);
* ``loglik``: one forward pass per batch, the answer is the option letter whose next-token
  log-probability is highest. Cheap enough to run inside a training loop. The probability of a
  letter is that of ``"X"`` plus that of ``" X"`` (both are how a reply can start; the release's
  strict match accepts either), summed in probability space (logsumexp of the log-probs).

Two recognition controls (the ``recognition`` form), both over the same 4 candidate concept names
per swapped image (:func:`tokenswap.eval.recognition.recognition_items`):

* ``recognition_naming``: the question the model learned to answer about a picture: the naming
  prompt (``<image>`` + "What is shown in the picture?") is followed by each candidate answer
  ("A {name}."), and the candidate with the highest total log-likelihood wins. It measures
  whether the model knows what the picture shows, without needing any other skill.
* ``recognition_mc``: a 4-way multiple-choice question with the picture inside it, scored like the
  bench. Answering it already needs the skill the gap measures (using a picture inside a
  question), so it is a confounded control; it is kept beside the naming form for comparison.

An item is ``recognized`` when the multiple-choice form identified every one of its pictures (the recognition form
of :mod:`tokenswap.eval.forms`, which every backend can ask); the recognition-controlled gap (``controlled``) is over
items whose images were all recognized in naming form (``recognized_naming``), the cleaner control.

More forms (``forms=``, see :mod:`tokenswap.eval.forms`): ``both`` (every concept word kept, its picture after it)
and ``rendered`` (the word rendered as a picture) are scored like the two ends; with them or the recognition control
the result carries :func:`tokenswap.eval.decompose.decompose`'s split of the gap, and :meth:`GapResult.metrics`
logs it (``gap/acc_both``, ``gap/load``, ``gap/recognition_rate``, ``gap/components/...``).

Gap = acc_text - acc_interleaved; relative gap = gap / acc_text; retention = acc_interleaved /
acc_text (what the release's ``scripts/compute_gap.py`` prints; = 1 - relative gap); all overall
and by number of swapped images (distinct ``<image N>`` tags of an item). Model inputs are built once per evaluator (the held-out set is fixed) and reused
by every :meth:`GapEvaluator.evaluate` call.

Distributed: every rank scores a strided shard and results are gathered with
``accelerate.utils.gather_object``. Units with and without images are sharded separately and
every shard is padded to the same length with dummy repeats (dropped after gathering), so all
ranks run the same number of forward/generate calls and, call by call, either all or none of
them run the vision tower, which DeepSpeed ZeRO-3 needs to gather parameters without hanging.

One module at ~780 lines: both scorers, the controls and the report share the item batching and the
caches they are measured with.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Literal

from tokenswap.eval.forms import ENDS
from tokenswap.eval.mc import (
    IMAGE_TAG,
    LETTERS,
    MCItem,
    PromptMode,
    as_rgb,
    build_conversation,
    extract_answer,
    format_prompt,
    pair_ids_match,
    shots_for,
)

__all__ = ["NAMING_ANSWER", "NAMING_PROMPT", "GapEvaluator", "GapResult", "GapStats", "Scorer", "decomposition_metrics",
           "form_fields", "letter_token_ids", "naming_inputs", "naming_loglik", "naming_records", "plan_result",
           "summarize"]
# letter_token_ids lives in tokenswap.inference.hf (the hf backend scores letters too); named here for its users.
# torch and the hf engine load where a model is scored, not with this module: `tokenswap eval --backend openai`
# reads its records through plan_result and sends no tensor.

if TYPE_CHECKING:
    from tokenswap.inference.backends import HFBackend
    from tokenswap.inference.hf import letter_token_ids


def __getattr__(name: str):
    if name == "letter_token_ids":
        from tokenswap.inference.hf import letter_token_ids

        return letter_token_ids
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


Scorer = Literal["loglik", "generate"]
# The naming-form recognition control's turn and candidate reply (the demo trains exactly this pair).
NAMING_PROMPT = "<image 1>\nWhat is shown in the picture?"
NAMING_ANSWER = "A {concept}."


def _naming_content(prompt: str, image) -> list[dict]:
    """The naming prompt as chat content parts (``<image 1>`` becomes the picture)."""
    parts: list[dict] = []
    for part in IMAGE_TAG.split(prompt):
        if IMAGE_TAG.fullmatch(part):
            parts.append({"type": "image", "image": image})
        elif part:
            parts.append({"type": "text", "text": part})
    return parts


# ----------------------------------------------------------------------------- results


@dataclass(frozen=True)
class GapStats:
    """Accuracies and gap over a set of paired items.

    Args:
        n: number of items.
        acc_text: accuracy on the text form.
        acc_interleaved: accuracy on the interleaved form.
        gap: ``acc_text - acc_interleaved``.
        rel_gap: ``gap / acc_text``; None when ``acc_text`` is 0.
    """

    @property
    def retention(self) -> float | None:
        """``acc_interleaved / acc_text`` (the release's retention; 1 - rel_gap); None when ``acc_text`` is 0."""
        return self.acc_interleaved / self.acc_text if self.acc_text > 0 else None

    n: int
    acc_text: float
    acc_interleaved: float
    gap: float
    rel_gap: float | None

    @classmethod
    def of(cls, records: Sequence[dict]) -> GapStats:
        n = len(records)
        if n == 0:
            return cls(0, math.nan, math.nan, math.nan, None)
        acc_t = sum(r["correct_text"] for r in records) / n
        acc_i = sum(r["correct_interleaved"] for r in records) / n
        gap = acc_t - acc_i
        return cls(n, acc_t, acc_i, gap, gap / acc_t if acc_t > 0 else None)

    def metrics(self, prefix: str) -> dict[str, float]:
        out = {f"{prefix}acc_text": self.acc_text, f"{prefix}acc_interleaved": self.acc_interleaved}
        out[f"{prefix}abs"] = self.gap
        if self.rel_gap is not None:
            out[f"{prefix}rel"] = self.rel_gap
            out[f"{prefix}retention"] = self.retention
        out[f"{prefix}n"] = float(self.n)
        return out


@dataclass
class GapResult:
    """What one evaluation measured.

    Args:
        scorer: ``loglik`` or ``generate``.
        prompt: prompt mode.
        overall: stats over all items.
        by_images: stats per number of swapped images.
        items: one record per item (id, subject, answer, num_images (distinct `<image N>` tags), predictions, correctness,
            responses for ``generate``, ``recognized`` with the recognition control).
        recognition_mc: multiple-choice identification accuracy over all swapped images (None
            without the control).
        recognition_naming: naming-form identification accuracy (log-likelihood of the 4 candidate
            names after the naming prompt), over the same images (None without the control).
        recognition_n: number of distinct pictures identified.
        controlled: stats over the items whose images were all identified in naming form (MC form
            when no naming records were given; None without the control).
        recognition: one record per distinct picture (the items showing it, picture id, concept, the MC prediction and
            ``correct_mc``, the naming prediction, its candidate log-likelihoods and ``correct_naming``).
        forms: the forms run; pictures: one record per distinct picture of the items; decomposition: the split of
            the gap over the items scored in every form.
        excluded: one record per item left out of the gap (its text or interleaved form has no answer).
        form_counts: per form, ``n`` (items scored in it), ``failed`` and ``skipped``.
    """

    scorer: str
    prompt: str
    overall: GapStats
    by_images: dict[int, GapStats]
    items: list[dict] = field(repr=False)
    recognition_mc: float | None = None
    recognition_naming: float | None = None
    recognition_n: int = 0
    controlled: GapStats | None = None
    recognition: list[dict] = field(default_factory=list, repr=False)
    forms: tuple[str, ...] = ENDS
    pictures: list[dict] = field(default_factory=list, repr=False)
    decomposition: dict | None = field(default=None, repr=False)
    excluded: list[dict] = field(default_factory=list, repr=False)
    form_counts: dict = field(default_factory=dict, repr=False)

    @property
    def acc_text(self) -> float:
        return self.overall.acc_text

    @property
    def acc_interleaved(self) -> float:
        return self.overall.acc_interleaved

    @property
    def gap(self) -> float:
        return self.overall.gap

    @property
    def rel_gap(self) -> float | None:
        return self.overall.rel_gap

    def metrics(self, prefix: str = "gap/") -> dict[str, float]:
        """Flat scalars for a logger: ``gap/acc_text``, ``gap/abs``, ``gap/rel``, ``gap/images_2/abs``, ..."""
        out = self.overall.metrics(prefix)
        for k, stats in sorted(self.by_images.items()):
            out.update(stats.metrics(f"{prefix}images_{k}/"))
        if self.recognition_mc is not None:
            out[f"{prefix}recognition_mc"] = self.recognition_mc
        if self.recognition_naming is not None:
            out[f"{prefix}recognition_naming"] = self.recognition_naming
        if self.controlled is not None:
            out.update(self.controlled.metrics(f"{prefix}controlled/"))
        out.update(decomposition_metrics(self.decomposition, prefix))
        for form, counts in self.form_counts.items():  # each control's own n: its items can be fewer than the gap's
            if form not in ENDS:
                out[f"{prefix}n_{form}"] = float(counts["n"])
        return out

    @property
    def recognition_rate(self) -> float | None:
        """Share of distinct pictures the recognition form identified (None when it did not run)."""
        return form_fields(self.forms, self.items, self.pictures, None)["recognition_rate"]

    def form_fields(self) -> dict:
        """The forms' top-level fields of ``gap.json``: ``forms``, ``acc_<form>``, ``recognition_rate``, ..."""
        return form_fields(self.forms, self.items, self.pictures, self.decomposition, self.form_counts)

    def empty_forms(self) -> list[str]:
        """One line per form run that rests on no item (recognition: no identified picture), saying why."""
        from tokenswap.eval.form_runs import empty_forms

        return list(empty_forms(self.form_counts, self.excluded, self.items).values())

    def to_dict(self) -> dict:
        """JSON-ready (NaN becomes None)."""

        def clean(v):
            if isinstance(v, float) and math.isnan(v):
                return None
            if isinstance(v, dict):
                return {str(k): clean(x) for k, x in v.items()}
            if isinstance(v, list):
                return [clean(x) for x in v]
            return v

        d = {
            "scorer": self.scorer,
            "prompt": self.prompt,
            **asdict(self.overall),
            "retention": self.overall.retention,
            "by_images": {k: asdict(s) | {"retention": s.retention} for k, s in sorted(self.by_images.items())},
            "recognition_mc": self.recognition_mc,
            "recognition_naming": self.recognition_naming,
            "recognition_n": self.recognition_n,
            "controlled": None if self.controlled is None else asdict(self.controlled),
            "items": self.items,
            "recognition": self.recognition,
            **self.form_fields(),
        }
        return clean(d)

    def to_markdown(self) -> str:
        """A table: one row overall, one per image count, and the recognition-controlled row if any."""

        def fmt(v: float | None) -> str:
            return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"

        rows = [("all", self.overall)] + [(str(k), s) for k, s in sorted(self.by_images.items())]
        if self.controlled is not None:  # one word per control: "named" (naming form), "recognised" (multiple choice)
            rows.append(("named" if self.recognition_naming is not None else "recognised (multiple choice)",
                         self.controlled))
        lines = [
            f"Modality gap ({self.scorer}, {self.prompt})",
            "",
            "| images | n | acc_text | acc_interleaved | gap | rel_gap | retention |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name, s in rows:
            lines.append(
                f"| {name} | {s.n} | {fmt(s.acc_text)} | {fmt(s.acc_interleaved)} | {fmt(s.gap)} | {fmt(s.rel_gap)} "
                f"| {fmt(s.retention)} |"
            )
        if self.recognition_mc is not None:
            naming = "" if self.recognition_naming is None else f"naming form {fmt(self.recognition_naming)}, "
            lines += [
                "",
                f"Concept identification over {self.recognition_n} images: {naming}multiple-choice form "
                f"{fmt(self.recognition_mc)} (chance 0.25)",
            ]
        if self.decomposition is not None and (len(self.forms) > 2):
            from tokenswap.eval.decompose import decomposition_markdown

            lines += ["", decomposition_markdown(self.decomposition).rstrip("\n")]
        return "\n".join(lines) + "\n"


def form_fields(forms: Sequence[str], items: Sequence[dict], pictures: Sequence[dict], decomposition: dict | None,
                form_counts: dict | None = None) -> dict:
    """``forms``, ``acc_<form>`` per item form (over the items scored in that form), ``recognition_rate`` (over the
    pictures identified or not), ``n_pictures``, ``pictures``, ``decomposition`` (over the items scored in every
    form) and ``form_counts`` (each form's ``n``, ``failed`` and ``skipped``): what ``gap.json`` adds to the gap."""
    from tokenswap.eval.forms import ITEM_FORMS

    out: dict = {"forms": list(forms)}
    for form in forms:
        if form in ITEM_FORMS:
            scored = [r[f"correct_{form}"] for r in items if r.get(f"correct_{form}") is not None]
            out[f"acc_{form}"] = sum(scored) / len(scored) if scored else None
    rate = None
    verdicts = [p["correct_recognition"] for p in pictures if p.get("correct_recognition") is not None]
    if "recognition" in forms and verdicts:
        rate = sum(verdicts) / len(verdicts)
    out.update(recognition_rate=rate, n_pictures=len(pictures), pictures=list(pictures), decomposition=decomposition)
    if form_counts is not None:
        out["form_counts"] = form_counts
    return out


def decomposition_metrics(d: dict | None, prefix: str = "gap/") -> dict[str, float]:
    """Point values of a decomposition as flat scalars for a logger: ``gap/acc_both``, ``gap/load``,
    ``gap/recognition_rate``, ``gap/recognised_only/abs``, ``gap/components/rest``, ... (only what ran); the split's
    ``gap/components/n`` is the number of items it rests on (those scored in every form it uses)."""
    if d is None:
        return {}
    out: dict[str, float] = {}

    def put(name: str, estimate: dict | None) -> None:
        if estimate is not None and estimate.get("value") is not None:
            out[f"{prefix}{name}"] = float(estimate["value"])

    for form, estimate in d["acc"].items():
        if form not in ENDS:
            put(f"acc_{form}", estimate)
    for name in ("load", "content", "caption_recovery", "reading_recovery", "recognition_rate"):
        put(name, d.get(name))
    if d.get("recognised_only") is not None:
        put("recognised_only/abs", d["recognised_only"]["gap"])
        out[f"{prefix}recognised_only/n"] = float(d["recognised_only"]["n"])
    if len(d["forms"]) > 2:  # a split needs a control beside the gap's two ends
        for name, estimate in (d.get("components") or {}).items():
            put(f"components/{name}", estimate)
        if d.get("split") is not None:  # the split may rest on fewer items than the gap logged beside it
            out[f"{prefix}components/n"] = float(d["split"]["n"])
    return out


def summarize(
    scorer: str,
    prompt: str,
    items: list[dict],
    recognition: Sequence[dict] | None = None,
    naming: Sequence[dict] | None = None,
) -> GapResult:
    """Aggregate per-item records into a :class:`GapResult`.

    Args:
        scorer: scorer name (recorded).
        prompt: prompt mode (recorded).
        items: records with ``num_images``, ``correct_text``, ``correct_interleaved``.
        recognition: multiple-choice identification records ``{"item": index into items, "correct": bool}``
            (or ``"items": [indices]`` for a picture several items show).
        naming: naming-form identification records, same shape. An item is ``recognized`` when all of its MC
            records are correct (``recognized_naming``: all of its naming records), None when one of them has
            ``correct`` None (no identification); ``controlled`` is over the items recognized in naming form (in
            MC form when ``naming`` is None).
    """
    by: dict[int, list[dict]] = {}
    for r in items:
        by.setdefault(r["num_images"], []).append(r)
    result = GapResult(
        scorer=scorer,
        prompt=prompt,
        overall=GapStats.of(items),
        by_images={k: GapStats.of(v) for k, v in sorted(by.items())},
        items=items,
    )
    def share(records: Sequence[dict]) -> float:
        answered = [r["correct"] for r in records if r["correct"] is not None]
        return sum(answered) / len(answered) if answered else math.nan

    if recognition is not None:
        result.recognition_n = sum(r["correct"] is not None for r in recognition)
        result.recognition_mc = share(recognition)
    if naming is not None:
        result.recognition_n = sum(r["correct"] is not None for r in naming)
        result.recognition_naming = share(naming)

    def flags(control: Sequence[dict]) -> list[bool | None]:
        # None: a picture of the item has no identification (its request failed, or it has no concept name).
        ok: list[bool | None] = [True] * len(items)
        for r in control:
            for i in r.get("items", [r.get("item")]):
                ok[i] = None if ok[i] is None or r["correct"] is None else ok[i] and bool(r["correct"])
        return ok

    control = None
    if recognition is not None:
        control = flags(recognition)
        for r, flag in zip(items, control):
            r["recognized"] = flag
    if naming is not None:
        control = flags(naming)
        for r, flag in zip(items, control):
            r["recognized_naming"] = flag
    if control is not None:
        result.controlled = GapStats.of([r for r, flag in zip(items, control) if flag])
    return result


def plan_result(plan, records: Mapping[str, dict], scorer: str, prompt: str, resamples: int | None = None) -> GapResult:
    """The :class:`GapResult` of a :class:`~tokenswap.eval.form_runs.FormPlan` from its records (unit key -> record):
    what ``tokenswap eval`` and :class:`GapEvaluator` both report, read one way.

    The gap rests on the items answered in text and interleaved; each other form on the items scored in it; the
    decomposition's components each on the items scored in the forms they use (paired there). A form resting on no
    item is reported with ``n`` 0 (see :meth:`GapResult.empty_forms`) and in the decomposition's ``missing``, never
    raised here.
    """
    from tokenswap.eval.decompose import DEFAULT_RESAMPLES, decompose
    from tokenswap.eval.form_runs import collect

    got = collect(plan, dict(records), scorer)
    items, pictures = got.items, got.pictures
    recognition = naming = None
    if plan.recognition:
        index = {r["id"]: k for k, r in enumerate(items)}
        recognition = [{"items": [index[i] for i in p["items"]], "correct": p["correct_recognition"]}
                       for p in pictures]
        if any("correct_naming" in p for p in pictures):  # hf's log-likelihood naming control ran
            naming = [{"items": [index[i] for i in p["items"]], "correct": p.get("correct_naming")} for p in pictures]
    result = summarize(scorer, prompt, items, recognition, naming)
    result.forms, result.pictures = tuple(plan.forms), pictures
    result.excluded, result.form_counts = got.excluded, got.form_counts
    # Each component on the items scored in the forms it uses (null where a form was not scored): one thin form
    # narrows only its own components, and a form on no item is named in the decomposition, not the end of it.
    scored = [r for r in items if r.get("correct_text") is not None and r.get("correct_interleaved") is not None]
    if scored:
        by_id = {p["picture"]: p for p in pictures}
        shown = [by_id[pid] for pid in dict.fromkeys(pid for r in scored for pid in r.get("pictures", ()))
                 if pid in by_id and by_id[pid].get("correct_recognition") is not None]
        result.decomposition = decompose(scored, shown if plan.recognition else None,
                                         resamples=DEFAULT_RESAMPLES if resamples is None else resamples)
        why = got.empty_forms()
        for m in result.decomposition["missing"]:
            m["why"] = why.get(m["form"], f"the {m['form']} form rests on 0 items")
    return result


# ----------------------------------------------------------------------------- scoring helpers


@dataclass(frozen=True)
class _Unit:
    """One conversation to score: the :class:`~tokenswap.eval.form_runs.FormPlan` unit ``key`` (an item form,
    ``recognition|...``), or one candidate name (``candidate`` indexes the choices) of ``naming|{picture id}``."""

    key: str
    item: MCItem
    shots: tuple[MCItem, ...] = ()
    candidate: int = -1
    mode: str = "zero_shot"

    @property
    def has_images(self) -> bool:
        return any(x.num_images for x in (*self.shots, self.item))

    @property
    def naming(self) -> bool:
        return self.key.startswith("naming|")


# ----------------------------------------------------------------------------- evaluator


class GapEvaluator:
    """Measures the modality gap of a model on fixed pairs of (text item, interleaved item).

    Args:
        processor: the model's processor (Qwen2-VL family).
        pairs: ``(text item, interleaved item)`` with equal id, subject and answer.
        scorer: ``loglik`` (next-token choice among the option letters) or ``generate``
            (greedy decoding + strict match, the official protocol).
        prompt: ``zero_shot`` (published template), ``cot`` (generate only) or ``k_shot``.
        shots: for ``k_shot``: subject -> dev ``(text, interleaved)`` pairs; text items get text
            shots, interleaved items get interleaved shots.
        k: number of shots.
        batch_size: conversations per forward/generate call (left padded).
        max_new_tokens: generation budget (the release uses 2048; 128 for Qwen2.5-VL).
        recognition_seed: seed of the controls' distractors.
        naming_prompt: the naming-form control's user turn; ``<image 1>`` is the picture.
        naming_answer: the candidate reply scored after it; ``{concept}`` is the candidate name.
        progress: tqdm bar on rank 0.
        forms: the forms scored (:mod:`tokenswap.eval.forms`): ``text`` and ``interleaved`` always, and any of
            ``both``, ``rendered`` and ``recognition`` (the concept-identification controls, multiple-choice and
            naming form; ``caption`` needs a generation pass before its items and runs in ``tokenswap eval`` only).
            What is asked is :class:`~tokenswap.eval.form_runs.FormPlan`'s plan, the one ``tokenswap eval`` makes:
            an item whose tags lack concept names is skipped (and counted, with the reason) in ``both``,
            ``rendered`` and ``recognition`` and scored in the others; ``both`` and ``rendered`` run zero-shot or
            with ``cot`` (shots exist for the two ends only).
        resamples: bootstrap resamples of the decomposition (:func:`tokenswap.eval.decompose.decompose`).

    Ranks and world size come from ``accelerate.PartialState``: create the ``Accelerator`` (or
    the ``Trainer``) first. On CPU a bare ``PartialState()`` ignores ``ACCELERATE_USE_CPU`` and
    would see one process per rank.

    Example::

        evaluator = GapEvaluator(processor, pairs, scorer="loglik", batch_size=16, forms=("both", "recognition"))
        result = evaluator.evaluate(model)        # every rank calls it under accelerate/DeepSpeed
        print(result.to_markdown()); wandb.log(result.metrics())
    """

    def __init__(
        self,
        processor,
        pairs: Sequence[tuple[MCItem, MCItem]],
        scorer: Scorer = "loglik",
        prompt: PromptMode = "zero_shot",
        shots: Mapping[str, Sequence[tuple[MCItem, MCItem]]] | None = None,
        k: int = 5,
        batch_size: int = 8,
        max_new_tokens: int = 128,
        recognition_seed: int = 0,
        naming_prompt: str = NAMING_PROMPT,
        naming_answer: str = NAMING_ANSWER,
        progress: bool = True,
        forms: Sequence[str] = ENDS,
        resamples: int | None = None,
    ):
        from tokenswap.eval.decompose import DEFAULT_RESAMPLES
        from tokenswap.eval.form_runs import FormPlan
        from tokenswap.eval.forms import check_plan

        if scorer not in ("loglik", "generate"):
            raise ValueError(f"scorer must be 'loglik' or 'generate', got {scorer!r}")
        if prompt not in ("zero_shot", "cot", "k_shot"):
            raise ValueError(f"prompt must be 'zero_shot', 'cot' or 'k_shot', got {prompt!r}")
        if prompt == "k_shot" and shots is None:
            raise ValueError("prompt='k_shot' needs `shots` (subject -> dev pairs, e.g. from the bench's dev split)")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not pairs:
            raise ValueError("GapEvaluator needs at least one (text, interleaved) pair")
        self.forms = check_plan(forms, prompt, scorer, in_loop=True)  # a PlanError is a ValueError
        self.item_forms = [f for f in self.forms if f != "recognition"]
        pair_ids_match(pairs)
        if "{concept}" not in naming_answer:
            raise ValueError(f"naming_answer must contain '{{concept}}' (the candidate name), got {naming_answer!r}")
        if "<image 1>" not in naming_prompt:
            raise ValueError(f"naming_prompt must contain '<image 1>' (the picture), got {naming_prompt!r}")
        self.naming_prompt = naming_prompt
        self.naming_answer = naming_answer
        self.processor = processor
        self.pairs = list(pairs)
        self.scorer = scorer
        self.prompt = prompt
        self.batch_size = batch_size
        self.max_new_tokens = max_new_tokens
        self.progress = progress
        self.resamples = DEFAULT_RESAMPLES if resamples is None else resamples
        from tokenswap.inference.hf import OPEN_THINK, letter_token_ids

        self.letter_ids = letter_token_ids(processor.tokenizer) if scorer == "loglik" else None
        # A template whose generation prompt opens a think block (Qwen3.5): the answer is read after "</think>".
        probe = [{"role": "user", "content": [{"type": "text", "text": "?"}]}]
        self._opens_think = processor.apply_chat_template(probe, tokenize=False, add_generation_prompt=True).endswith(
            OPEN_THINK)

        item_shots = None
        if prompt == "k_shot":
            chosen = {subject: shots_for({subject: list(shots.get(subject, ()))}, subject, k)
                      for subject in {t.subject for t, _ in self.pairs}}
            item_shots = [(tuple(t for t, _ in chosen[text.subject]), tuple(i for _, i in chosen[text.subject]))
                          for text, _ in self.pairs]
        # The plan of `tokenswap eval` decides what is asked (and what is skipped, and why); this evaluator only
        # scores its units on the ranks. Raises ValueError for recognition on fewer than 4 distinct concepts.
        self.plan = FormPlan(self.pairs, self.forms, prompt, item_shots, recognition_seed)
        recognition_mode = "zero_shot" if prompt == "k_shot" else prompt
        self.units: list[_Unit] = []
        for unit in self.plan.independent_units():
            if unit.form == "recognition":
                self.units.append(_Unit(unit.key, self.plan.recognition_items[unit.picture], mode=recognition_mode))
                continue
            text_shots, inter_shots = self.plan.shots[unit.index]
            form_shots = {"text": text_shots, "interleaved": inter_shots}.get(unit.form, ())
            self.units.append(_Unit(unit.key, self.plan.item(unit), tuple(form_shots), mode=prompt))
        for pid, item in self.plan.recognition_items.items():
            for c in range(len(item.choices)):
                self.units.append(_Unit(f"naming|{pid}", item, candidate=c))
        self._batches: list[tuple[list[int | None], object]] | None = None
        self._built_for: tuple[int, int] | None = None

    # -- input preparation (once) ------------------------------------------------

    def _shard(self, rank: int, world: int) -> list[list[tuple[int, bool]]]:
        """This rank's batches as ``(unit index, is_real)``; the same number of batches on every rank.

        Padding slots repeat the pool's first unit (``is_real`` False), so a padded call runs the
        same modules as the other ranks' calls and its result is dropped.
        """
        batches: list[list[tuple[int, bool]]] = []
        # Naming units are their own pool: they need logits over a whole reply, not one next token.
        for naming, has_images in ((False, False), (False, True), (True, True)):
            pool = [
                u for u, unit in enumerate(self.units) if unit.has_images == has_images and unit.naming == naming
            ]
            if not pool:
                continue
            # Similar lengths side by side: less left padding per batch.
            pool.sort(key=lambda u: (self.units[u].item.num_images, len(format_prompt(self.units[u].item))))
            per_rank = math.ceil(len(pool) / world)
            mine = [(u, True) for u in pool[rank::world]]
            mine += [(pool[0], False)] * (per_rank - len(mine))
            batches += [mine[s : s + self.batch_size] for s in range(0, per_rank, self.batch_size)]
        return batches

    def _build(self, rank: int, world: int) -> None:
        from tokenswap.inference.hf import build_inputs

        self._batches = []
        for slots in self._shard(rank, world):
            idx = [u if real else None for u, real in slots]
            if self.units[slots[0][0]].naming:
                rows = [(self.units[u].item.images[1], self.units[u].item.choices[self.units[u].candidate])
                        for u, _ in slots]
                self._batches.append((idx, naming_inputs(self.processor, rows, self.naming_prompt, self.naming_answer)))
                continue
            convs = [build_conversation(self.units[u].item, self.units[u].mode, self.units[u].shots) for u, _ in slots]
            # loglik reads the answer's first token: after a closed think block where the template opens one.
            self._batches.append((idx, build_inputs(self.processor, convs, close_think=self.scorer == "loglik")))
        self._built_for = (rank, world)

    # -- scoring -----------------------------------------------------------------

    def _loglik(self, model, batch) -> list[str]:
        from tokenswap.inference.hf import letter_logprobs

        scores = letter_logprobs(model, batch, self.letter_ids)  # (B, 4)
        return [LETTERS[i] for i in scores.argmax(dim=-1).tolist()]

    def evaluate(self, model) -> GapResult:
        """Score every pair (and recognition item) with ``model``; all ranks must call this.

        Args:
            model: a ``*ForConditionalGeneration`` model (the unwrapped module under DeepSpeed).

        Returns:
            The same :class:`GapResult` on every rank. The model's train/eval mode is restored.
        """
        from accelerate import PartialState
        from accelerate.utils import gather_object
        from tqdm.auto import tqdm

        from tokenswap.inference.hf import generate_batch

        state = PartialState()
        if self._built_for != (state.process_index, state.num_processes):
            self._build(state.process_index, state.num_processes)
        was_training = model.training
        model.eval()
        local: list[tuple[int, str | float | None, str | None]] = []
        try:
            bar = tqdm(
                self._batches, desc=f"gap eval ({self.scorer})", disable=not (self.progress and state.is_main_process)
            )
            for idx, batch in bar:
                if isinstance(batch, tuple):  # naming units: a score per candidate
                    preds, responses = naming_loglik(model, batch), [None] * len(idx)
                elif self.scorer == "loglik":
                    preds, responses = self._loglik(model, batch), [None] * len(idx)
                else:
                    done = generate_batch(model, self.processor.tokenizer, batch, self.max_new_tokens,
                                          [self._opens_think] * len(idx))
                    preds, responses = [extract_answer(c.text) for c in done], [c.decoded for c in done]
                local += [(u, p, r) for u, p, r in zip(idx, preds, responses) if u is not None]
        finally:
            model.train(was_training)
        gathered = sorted(gather_object(local) if state.num_processes > 1 else local, key=lambda t: t[0])
        return self._summarize({u: (p, r) for u, p, r in gathered})

    def _summarize(self, outputs: dict[int, tuple[str | float | None, str | None]]) -> GapResult:
        if len(outputs) != len(self.units):
            raise RuntimeError(
                f"gap eval gathered {len(outputs)} results for {len(self.units)} units; a rank is missing"
            )
        # The records `tokenswap eval` would have written, by unit key: the same reading of them follows.
        records: dict[str, dict] = {}
        for u, unit in enumerate(self.units):
            pred, response = outputs[u]
            if unit.naming:
                row = records.setdefault(unit.key, {"form": "naming", "picture": unit.key.split("|", 1)[1],
                                                    "choices": list(unit.item.choices), "loglik": []})
                row["loglik"].append(pred)
                if len(row["loglik"]) == len(unit.item.choices):
                    best = max(range(len(row["loglik"])), key=row["loglik"].__getitem__)
                    row.update(pred=unit.item.choices[best], correct=best == unit.item.answer)
                continue
            form, _, name = unit.key.partition("|")
            row = {"form": form, "pred": pred}
            if response is not None:
                row["response"] = response
            if form == "recognition":
                row.update(picture=name, choices=list(unit.item.choices), answer=unit.item.letter)
            records[unit.key] = row
        result = plan_result(self.plan, records, self.scorer, self.prompt, self.resamples)
        index = {r["id"]: k for k, r in enumerate(result.items)}
        for picture in result.pictures:
            if picture.get("correct_recognition") is None:
                continue
            result.recognition.append({
                "items": [index[i] for i in picture["items"]], "picture": picture["picture"],
                "concept": picture["concept"], "pred_mc": picture["pred_recognition"],
                "correct_mc": picture["correct_recognition"], "pred_naming": picture["pred_naming"],
                "loglik_naming": picture["loglik_naming"], "correct_naming": picture["correct_naming"]})
        empty = result.empty_forms()
        if empty:  # a training run goes on; the log says which form has nothing to report
            print(f"gap eval: {'; '.join(empty)}", file=sys.stderr)
        return result


# ----------------------------------------------------------------------------- naming control


def naming_inputs(processor, rows: Sequence[tuple], naming_prompt: str = NAMING_PROMPT,
                  naming_answer: str = NAMING_ANSWER):
    """Left-padded naming prompt + candidate reply per ``(picture, candidate name)`` row, for :func:`naming_loglik`.

    Returns:
        ``(batch, reply_len)``: the processor's batch and the number of reply tokens of each row.
    """
    from tokenswap.inference.hf import close_open_think

    tokenizer = processor.tokenizer
    prompts, fulls, images = [], [], []
    for picture, name in rows:
        image = as_rgb(picture)
        conv = [{"role": "user", "content": _naming_content(naming_prompt, image)}]
        # The reply is scored where training puts an answer: after a closed think block (Qwen3.5).
        prompt = close_open_think(processor.apply_chat_template(conv, tokenize=False, add_generation_prompt=True))
        prompts.append(prompt)
        fulls.append(prompt + naming_answer.format(concept=name))
        images.append(image)
    reply_len = []
    for prompt, full in zip(prompts, fulls):
        p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        f_ids = tokenizer(full, add_special_tokens=False)["input_ids"]
        if f_ids[: len(p_ids)] != p_ids or len(f_ids) == len(p_ids):
            raise ValueError(
                f"the naming reply {full[len(prompt):]!r} does not tokenize as its own tokens after the prompt; "
                "pick a naming_answer that starts a new token (e.g. 'A {concept}.')"
            )
        reply_len.append(len(f_ids) - len(p_ids))
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"  # replies end every row, so the last positions hold them
    try:
        batch = processor(text=fulls, images=images, padding=True, return_tensors="pt")
    finally:
        tokenizer.padding_side = side
    return batch, reply_len


def naming_loglik(model, built) -> list[float]:
    """Total log-likelihood of each row's reply (:func:`naming_inputs`) under ``model``."""
    import torch

    batch, reply_len = built
    keep = max(reply_len) + 1
    with torch.no_grad():
        out = model(**batch.to(model.device), use_cache=False, logits_to_keep=keep)
    logprobs = torch.log_softmax(out.logits[:, :-1, :].float(), dim=-1)  # position k predicts token k+1
    targets = batch["input_ids"][:, -keep + 1 :]
    token_lp = logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, keep-1)
    return [float(token_lp[row, token_lp.shape[1] - n :].sum()) for row, n in enumerate(reply_len)]


def naming_records(backend: HFBackend, log, plan, progress: str | None = None) -> int:
    """hf's log-likelihood naming control per distinct picture: ``naming|{picture id}`` records (resumable).

    Each of the picture's candidate names (its recognition item's choices) is scored after the naming prompt
    (:data:`NAMING_PROMPT`), on the picture as the backend prepares it for generation; a forward holds up to the
    backend's ``batch_size`` rows (one picture's candidates at least).
    """
    from tqdm.auto import tqdm

    from tokenswap.eval.mc import as_rgb

    todo = [(pid, item) for pid, item in plan.recognition_items.items()
            if log.records.get(f"naming|{pid}", {}).get("choices") != list(item.choices)]
    chunks: list[list[tuple[str, MCItem]]] = []
    for pid, item in todo:
        if not chunks or sum(len(i.choices) for _, i in chunks[-1]) + len(item.choices) > backend.batch_size:
            chunks.append([])
        chunks[-1].append((pid, item))
    was_training = backend.model.training
    backend.model.eval()
    try:
        for chunk in tqdm(chunks, desc=progress and f"{progress} naming", disable=progress is None, file=sys.stderr):
            rows = [(backend.prepare_image(as_rgb(item.images[1])), name) for _, item in chunk for name in item.choices]
            scores = naming_loglik(backend.model, naming_inputs(backend.processor, rows))
            start = 0
            for pid, item in chunk:
                mine = scores[start : start + len(item.choices)]
                start += len(item.choices)
                best = max(range(len(mine)), key=mine.__getitem__)
                log.append({log.key_field: f"naming|{pid}", "form": "naming", "picture": pid,
                            "choices": list(item.choices), "loglik": mine, "pred": item.choices[best],
                            "correct": best == item.answer})
    finally:
        backend.model.train(was_training)
    return len(todo)
