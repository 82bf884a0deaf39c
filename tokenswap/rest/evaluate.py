"""Run a model on a REST dataset folder: answers in three modalities, OCR control, OCR-first, metrics.

Generation is greedy (temperature 0) through a backend (:mod:`tokenswap.inference.backends`: a local
checkpoint or any OpenAI-compatible endpoint). Every response is appended to ``OUT/predictions.jsonl``
as soon as it finishes, keyed by ``item|task|variant``; a rerun skips keys already answered, so an
interrupted run resumes. Scores are recomputed from the stored responses each time (fixing the
extractor needs no regeneration). A failed request is recorded with ``error`` and asked again by the
next run; meanwhile its item is left out of that variant's scores (``excluded`` in ``metrics.json``).

Tasks per item: ``text`` once; for each evaluated variant ``image`` and ``mixed``; with OCR also
``ocr_item`` and ``ocr_stem`` (transcriptions of the two renderings) and ``ocr_first`` (answer the
model's own ``ocr_item`` transcription as text). An item is OCR-correct for a variant iff both
transcriptions have CER = 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from tokenswap.errors import InputError
from tokenswap.files import atomic_write_figure, atomic_write_json, atomic_write_text
from tokenswap.inputs import require_items
from tokenswap.rest.build import BASE_VARIANT, META_FIX, image_path, read_meta
from tokenswap.rest.extract import extract_answer
from tokenswap.rest.items import ITEMS_FIX, RestItem, build_conversation, read_items
from tokenswap.rest.metrics import MODALITIES, ItemOutcome, rest_report
from tokenswap.rest.ocr import OCR_PROMPT, cer

__all__ = ["TEXT_VARIANT", "default_max_new_tokens", "load_rest_data", "run_rest_eval", "score_predictions",
           "write_report"]

TEXT_VARIANT = "-"  # the text modality has no rendering


@dataclass(frozen=True)
class _Task:
    item: RestItem
    task: str
    variant: str

    @property
    def key(self) -> str:
        return f"{self.item.id}|{self.task}|{self.variant}"


def default_max_new_tokens(source: str) -> int:
    """REST's budget: 1024 new tokens, 2048 for SoEBench."""
    return 2048 if source == "soebench" else 1024


def load_rest_data(data_dir: str | Path, variants: Sequence[str], n: int | None = None) -> tuple[dict, list[RestItem]]:
    """A REST folder's ``meta.json`` and first ``n`` items, checked before any model loads.

    Args:
        data_dir: a folder written by :func:`tokenswap.rest.build.build_rest_dataset`.
        variants: the renderings the evaluation reads (each must be built, each item's PNGs on disk).
        n: only the first ``n`` items.

    Returns:
        ``(meta, items)``.

    Raises:
        InputError: a damaged ``meta.json`` or ``items.jsonl``, no items, a variant not built, or a rendering
            that is not on disk; each names the file and the fix.
    """
    data = Path(data_dir)
    meta = read_meta(data / "meta.json")
    if not isinstance(meta.get("source"), str):
        raise InputError(f"--data file {str(data / 'meta.json')!r} has no `source` (mmlu, arc, gsm or soebench: where "
                         f"the items came from); {META_FIX}")
    unknown = [v for v in variants if v not in meta["variants"]]
    if unknown:
        raise InputError(f"variants {unknown} are not in {data}; built variants: {meta['variants']}")
    items_path = data / "items.jsonl"
    items = read_items(items_path)[:n]
    require_items(items, f"--data file {str(items_path)!r}", "items", ITEMS_FIX)
    for item in items:
        for variant in variants:
            for part in ("item", "stem"):
                if not image_path(data, item.id, variant, part).is_file():
                    raise InputError(f"rendering {str(image_path(data, item.id, variant, part))!r} does not exist; "
                                     f"{ITEMS_FIX}")
    return meta, items


def _rendering(data_dir: Path, item: RestItem, variant: str, part: str) -> Image.Image:
    path = image_path(data_dir, item.id, variant, part)
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except FileNotFoundError:
        problem = "does not exist"
    except (OSError, Image.DecompressionBombError) as e:  # a cut or overwritten PNG
        problem = f"does not decode ({e})"
    raise InputError(f"rendering {str(path)!r} {problem}; {ITEMS_FIX}")


def _conversation(task: _Task, data_dir: Path, predictions: dict[str, dict]) -> list[dict]:
    item = task.item
    if task.task == "text":
        return build_conversation(item, "text")
    if task.task in ("image", "mixed"):
        part = "item" if task.task == "image" else "stem"
        image = _rendering(data_dir, item, task.variant, part)
        return build_conversation(item, task.task, image=image)
    if task.task in ("ocr_item", "ocr_stem"):
        image = _rendering(data_dir, item, task.variant, task.task[4:])
        return [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": OCR_PROMPT}]}]
    if task.task == "ocr_first":
        transcript = predictions[f"{item.id}|ocr_item|{task.variant}"]["response"]
        return build_conversation(item, "ocr_first", text=transcript)
    raise ValueError(f"unknown task {task.task!r}")


def _run_tasks(backend, tasks, data_dir, log, max_new_tokens, progress, max_error_share=None) -> None:
    from tokenswap.inference.runs import run_units

    def make_record(t: _Task, fields: dict) -> dict:
        return {"key": t.key, "item_id": t.item.id, "task": t.task, "variant": t.variant, **fields}

    ready, blocked = [], []
    for t in tasks:
        source = log.records.get(f"{t.item.id}|ocr_item|{t.variant}") if t.task == "ocr_first" else None
        (blocked if t.task == "ocr_first" and (source is None or source.get("response") is None) else ready).append(t)
    for t in blocked:  # OCR-first answers the model's own transcription; without one there is nothing to ask
        if not log.answered(t.key):
            log.append(make_record(t, {"key": t.key, "response": None,
                                       "skipped": "its ocr_item transcription failed or was skipped"}))
    run_units(backend, log, ready, lambda t: t.key, lambda t: _conversation(t, data_dir, log.records), make_record,
              max_new_tokens=max_new_tokens, progress="rest eval" if progress else None,
              max_error_share=max_error_share)


def _usable(predictions: dict[str, dict], key: str) -> bool:
    row = predictions.get(key)
    return row is not None and "error" not in row and "skipped" not in row


def _needed_keys(item: RestItem, variant: str, ocr: bool) -> list[str]:
    tasks = [("text", TEXT_VARIANT), ("image", variant), ("mixed", variant)]
    if ocr:
        tasks += [("ocr_item", variant), ("ocr_stem", variant), ("ocr_first", variant)]
    return [f"{item.id}|{task}|{v}" for task, v in tasks]


def score_predictions(
    items: Sequence[RestItem], predictions: dict[str, dict], variants: Sequence[str], ocr: bool
) -> dict[str, dict]:
    """Metrics per variant from stored responses.

    Returns:
        ``{variant: {"all", "ocr_correct", "ocr", "ocr_first"}}``; ``all``/``ocr_correct`` come from
        :func:`tokenswap.rest.metrics.rest_report`; ``ocr`` holds mean CERs and the OCR-correct rate;
        ``ocr_first`` holds image vs OCR-first accuracy and ``delta_acc`` = OCR-first - image.
    """

    def answer(item: RestItem, task: str, variant: str) -> str | None:
        return extract_answer(predictions[f"{item.id}|{task}|{variant}"]["response"], item.answer_type, item.options)

    results = {}
    all_items = items
    for variant in variants:
        # Items with a failed or skipped request in this variant are left out, never scored as wrong.
        items = [i for i in all_items if all(_usable(predictions, k) for k in _needed_keys(i, variant, ocr))]
        outcomes, cer_item, cer_stem, ocr_first_ok = [], [], [], []
        for item in items:
            ocr_ok = None
            if ocr:
                c_item = cer(item.text, predictions[f"{item.id}|ocr_item|{variant}"]["response"])
                c_stem = cer(item.stem, predictions[f"{item.id}|ocr_stem|{variant}"]["response"])
                cer_item.append(c_item)
                cer_stem.append(c_stem)
                ocr_ok = c_item == 0 and c_stem == 0
                ocr_first_ok.append(answer(item, "ocr_first", variant) == item.gold)
            outcomes.append(
                ItemOutcome(
                    item_id=item.id,
                    gold=item.gold,
                    answers={
                        "text": answer(item, "text", TEXT_VARIANT),
                        "image": answer(item, "image", variant),
                        "mixed": answer(item, "mixed", variant),
                    },
                    ocr_correct=ocr_ok,
                )
            )
        result = rest_report(outcomes, MODALITIES)
        result["ocr"] = result["ocr_first"] = None
        if ocr and items:
            n = len(items)
            acc_image = result["all"]["accuracy"]["image"]
            acc_ocr_first = sum(ocr_first_ok) / n
            result["ocr"] = {
                "mean_cer_item": sum(cer_item) / n,
                "mean_cer_stem": sum(cer_stem) / n,
                "ocr_correct_rate": sum(o.ocr_correct for o in outcomes) / n,
            }
            result["ocr_first"] = {
                "acc_image": acc_image,
                "acc_ocr_first": acc_ocr_first,
                "delta_acc": acc_ocr_first - acc_image,
            }
        results[variant] = result
    return results


def run_rest_eval(
    model,
    processor,
    data_dir: str | Path,
    out_dir: str | Path,
    variants: Sequence[str] = (BASE_VARIANT,),
    ocr: bool = False,
    n: int | None = None,
    max_new_tokens: int | None = None,
    batch_size: int = 8,
    progress: bool = False,
    model_name: str = "",
    backend=None,
    max_error_share: float = 1.0,
    run_info: dict | None = None,
) -> dict:
    """Generate (resumably), score and report one model on a REST dataset folder.

    Args:
        model: a Qwen2-VL-family ``*ForConditionalGeneration`` model (None when ``backend`` is given).
        processor: its processor (None when ``backend`` is given).
        data_dir: a folder written by :func:`tokenswap.rest.build.build_rest_dataset`.
        out_dir: where ``predictions.jsonl``, ``metrics.json``, ``report.md`` and ``accuracy.png`` go.
        variants: rendering variants to evaluate (``sans_200`` = plain REST; others = REST+).
        ocr: run the OCR control and the OCR-first counterfactual.
        n: evaluate only the first ``n`` items.
        max_new_tokens: generation budget; default 1024 (2048 for SoEBench).
        batch_size: conversations per generate call (``hf``).
        progress: show a progress bar.
        model_name: recorded in the report.
        backend: a :class:`tokenswap.inference.backends.Backend` (default: ``hf`` around ``model``), or a
            zero-argument callable returning one, called only when something is left to ask.
        max_error_share: raise :class:`tokenswap.inference.runs.ErrorShareExceeded` (before writing
            ``metrics.json``) when more than this share of the requests failed.
        run_info: extra fields for ``metrics.json`` (the backend and settings the command line chose).

    Returns:
        The metrics dict written to ``metrics.json``.
    """
    from tokenswap.inference.backends import Backend, HFBackend
    from tokenswap.inference.runs import RecordLog, check_error_share, tally

    data, out = Path(data_dir), Path(out_dir)
    meta, items = load_rest_data(data, variants, n)
    max_new_tokens = max_new_tokens or default_max_new_tokens(meta["source"])
    out.mkdir(parents=True, exist_ok=True)
    log = RecordLog(out / "predictions.jsonl")

    # Group tasks by kind so batches hold similar prompts; ocr_first needs the ocr_item transcripts first.
    tasks = [_Task(item, "text", TEXT_VARIANT) for item in items]
    kinds = ["image", "mixed"] + (["ocr_item", "ocr_stem"] if ocr else [])
    tasks += [_Task(item, kind, v) for kind in kinds for v in variants for item in items]
    second = [_Task(item, "ocr_first", v) for v in variants for item in items] if ocr else []
    opened = None
    if any(not log.answered(t.key) for t in tasks + second):
        if backend is None:
            opened = HFBackend(model, processor, model_name, batch_size=batch_size)
        else:
            opened = backend if isinstance(backend, Backend) else backend()
        try:
            _run_tasks(opened, tasks, data, log, max_new_tokens, progress, max_error_share)
            if second:
                _run_tasks(opened, second, data, log, max_new_tokens, progress, max_error_share)
        finally:
            opened.close()
    predictions = log.records
    counts = tally(predictions[t.key] for t in tasks + second)
    metrics = {
        "model": model_name,
        "data": str(data),
        "source": meta["source"],
        "n_items": len(items),
        "max_new_tokens": max_new_tokens,
        "ocr": ocr,
        "base_variant": BASE_VARIANT,
        "variants": score_predictions(items, predictions, variants, ocr),
        "n_requests": counts["n"],
        "n_failed": counts["failed"],
        "n_skipped": counts["skipped"],
        "excluded": {
            v: [i.id for i in items if not all(_usable(predictions, k) for k in _needed_keys(i, v, ocr))]
            for v in variants
        },
        "usage": counts["usage"],
        **(run_info or {}),
    }
    check_error_share(counts, max_error_share, "requests")
    atomic_write_json(out / "metrics.json", metrics)
    write_report(metrics, out)
    return metrics


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}"


def write_report(metrics: dict, out_dir: str | Path) -> None:
    """``report.md`` (one row per variant, all items and OCR-correct subset) and ``accuracy.png``."""
    out = Path(out_dir)
    lines = [
        f"# REST: {metrics['model'] or 'model'} on {metrics['source']} ({metrics['n_items']} items)",
        "",
        "Percentages. RER/CFR/MMC as in SPECS §2; `OCR✓` columns use only items whose renderings "
        "the model transcribed exactly (CER = 0). ΔAcc = OCR-first − image accuracy.",
        "",
        "| variant | acc text | acc image | acc mixed | RER | CFR | MMC | all correct "
        "| OCR✓ rate | n OCR✓ | RER OCR✓ | CFR OCR✓ | ΔAcc OCR-first |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for variant, r in metrics["variants"].items():
        a, o = r["all"], r["ocr_correct"]
        acc = a["accuracy"]
        lines.append(
            f"| {variant} | {_fmt(acc['text'])} | {_fmt(acc['image'])} | {_fmt(acc['mixed'])} | {_fmt(a['rer'])} "
            f"| {_fmt(a['cfr'])} | {_fmt(a['mmc'])} | {_fmt(a['all_correct'])} "
            f"| {_fmt(r['ocr']['ocr_correct_rate']) if r['ocr'] else '–'} | {o['n'] if o else '–'} "
            f"| {_fmt(o['rer']) if o else '–'} | {_fmt(o['cfr']) if o else '–'} "
            f"| {_fmt(r['ocr_first']['delta_acc']) if r['ocr_first'] else '–'} |"
        )
    atomic_write_text(out / "report.md", "\n".join(lines) + "\n")
    _plot(metrics, out / "accuracy.png")


def _plot(metrics: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    variants = list(metrics["variants"])
    base = metrics["variants"].get(metrics["base_variant"]) or metrics["variants"][variants[0]]
    fig = Figure(figsize=(4 + 0.9 * len(variants), 3.6))
    left, right = fig.subplots(1, 2, width_ratios=[1, max(1, len(variants) / 2)])
    accs = [base["all"]["accuracy"][m] or 0.0 for m in MODALITIES]
    left.bar(MODALITIES, accs, color=["#4c72b0", "#dd8452", "#55a868"])
    left.set_ylim(0, 1)
    left.set_ylabel("accuracy")
    left.set_title("per modality (plain REST)")
    width = 0.4
    xs = range(len(variants))
    for offset, modality, color in ((-width / 2, "image", "#dd8452"), (width / 2, "mixed", "#55a868")):
        values = [metrics["variants"][v]["all"]["accuracy"][modality] or 0.0 for v in variants]
        right.bar([x + offset for x in xs], values, width, label=modality, color=color)
    right.axhline(base["all"]["accuracy"]["text"] or 0.0, color="#4c72b0", linestyle="--", label="text")
    right.set_xticks(list(xs), variants, rotation=45, ha="right")
    right.set_ylim(0, 1)
    right.set_title("per perturbation")
    right.legend(fontsize=8)
    fig.tight_layout()
    atomic_write_figure(path, fig, dpi=100)
