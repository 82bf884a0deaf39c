"""REST/REST+ render-equivalence suite: same content as text, image and mixed; consistency metrics.

- :mod:`~tokenswap.rest.render`: text -> image (DejaVu Sans, 200 DPI) and the 10 REST+ variants.
- :mod:`~tokenswap.rest.items`: items in three modalities; MMLU/ARC/GSM loaders; REST filters.
- :mod:`~tokenswap.rest.soebench`: generated linear systems with a unique integer solution.
- :mod:`~tokenswap.rest.extract`: answer extraction (letter, number, variable assignments).
- :mod:`~tokenswap.rest.ocr`: OCR prompt, normalisation, CER.
- :mod:`~tokenswap.rest.metrics`: RER, CFR, MMC, per-modality accuracy.
- :mod:`~tokenswap.rest.build` / :mod:`~tokenswap.rest.evaluate`: dataset folder and model evaluation.
- :mod:`~tokenswap.rest.probe`: per-layer image/text representation similarity and retrieval.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenswap.lazy import lazy_exports

# Lazy (PEP 562): the renderer and the metrics load without the evaluation's backends or the probe's model.
# Every name below still imports from here.
_EXPORTS = {
    "BASE_VARIANT": "tokenswap.rest.build",
    "build_rest_dataset": "tokenswap.rest.build",
    "image_path": "tokenswap.rest.build",
    "run_rest_eval": "tokenswap.rest.evaluate",
    "score_predictions": "tokenswap.rest.evaluate",
    "extract_answer": "tokenswap.rest.extract",
    "extract_mc": "tokenswap.rest.extract",
    "extract_numeric": "tokenswap.rest.extract",
    "extract_soe": "tokenswap.rest.extract",
    "normalize_number": "tokenswap.rest.extract",
    "MAX_CHARS": "tokenswap.rest.items",
    "RestItem": "tokenswap.rest.items",
    "arc_item": "tokenswap.rest.items",
    "build_conversation": "tokenswap.rest.items",
    "filter_reason": "tokenswap.rest.items",
    "gsm_item": "tokenswap.rest.items",
    "load_rows": "tokenswap.rest.items",
    "load_source": "tokenswap.rest.items",
    "mmlu_item": "tokenswap.rest.items",
    "read_items": "tokenswap.rest.items",
    "write_items": "tokenswap.rest.items",
    "MODALITIES": "tokenswap.rest.metrics",
    "ItemOutcome": "tokenswap.rest.metrics",
    "all_correct_rate": "tokenswap.rest.metrics",
    "consistency_metrics": "tokenswap.rest.metrics",
    "cross_modality_failure_rate": "tokenswap.rest.metrics",
    "max_modal_coverage": "tokenswap.rest.metrics",
    "modality_accuracy": "tokenswap.rest.metrics",
    "render_equivalence_rate": "tokenswap.rest.metrics",
    "rest_report": "tokenswap.rest.metrics",
    "OCR_PROMPT": "tokenswap.rest.ocr",
    "cer": "tokenswap.rest.ocr",
    "edit_distance": "tokenswap.rest.ocr",
    "normalize_ocr_text": "tokenswap.rest.ocr",
    "ocr_correct": "tokenswap.rest.ocr",
    "collect_pair_states": "tokenswap.rest.probe",
    "layer_similarity": "tokenswap.rest.probe",
    "masked_mean": "tokenswap.rest.probe",
    "pairwise_similarity": "tokenswap.rest.probe",
    "probe_summary": "tokenswap.rest.probe",
    "retrieval_accuracy": "tokenswap.rest.probe",
    "run_probe": "tokenswap.rest.probe",
    "RenderSpec": "tokenswap.rest.render",
    "cursive_font_path": "tokenswap.rest.render",
    "parse_color": "tokenswap.rest.render",
    "perturbation_specs": "tokenswap.rest.render",
    "render_text": "tokenswap.rest.render",
    "render_variants": "tokenswap.rest.render",
    "resolve_font": "tokenswap.rest.render",
    "LinearSystem": "tokenswap.rest.soebench",
    "generate_system": "tokenswap.rest.soebench",
    "integer_determinant": "tokenswap.rest.soebench",
    "soebench_items": "tokenswap.rest.soebench",
    "solve_exact": "tokenswap.rest.soebench",
}

__all__ = [
    "BASE_VARIANT",
    "MAX_CHARS",
    "MODALITIES",
    "OCR_PROMPT",
    "ItemOutcome",
    "LinearSystem",
    "RenderSpec",
    "RestItem",
    "all_correct_rate",
    "arc_item",
    "build_conversation",
    "build_rest_dataset",
    "cer",
    "collect_pair_states",
    "consistency_metrics",
    "cross_modality_failure_rate",
    "cursive_font_path",
    "edit_distance",
    "extract_answer",
    "extract_mc",
    "extract_numeric",
    "extract_soe",
    "filter_reason",
    "generate_system",
    "gsm_item",
    "image_path",
    "integer_determinant",
    "layer_similarity",
    "load_rows",
    "load_source",
    "masked_mean",
    "max_modal_coverage",
    "mmlu_item",
    "modality_accuracy",
    "normalize_number",
    "normalize_ocr_text",
    "ocr_correct",
    "pairwise_similarity",
    "parse_color",
    "perturbation_specs",
    "probe_summary",
    "read_items",
    "render_equivalence_rate",
    "render_text",
    "render_variants",
    "resolve_font",
    "rest_report",
    "retrieval_accuracy",
    "run_probe",
    "run_rest_eval",
    "score_predictions",
    "soebench_items",
    "solve_exact",
    "write_items",
]

if TYPE_CHECKING:
    from tokenswap.rest.build import BASE_VARIANT, build_rest_dataset, image_path
    from tokenswap.rest.evaluate import run_rest_eval, score_predictions
    from tokenswap.rest.extract import extract_answer, extract_mc, extract_numeric, extract_soe, normalize_number
    from tokenswap.rest.items import (
        MAX_CHARS,
        RestItem,
        arc_item,
        build_conversation,
        filter_reason,
        gsm_item,
        load_rows,
        load_source,
        mmlu_item,
        read_items,
        write_items,
    )
    from tokenswap.rest.metrics import (
        MODALITIES,
        ItemOutcome,
        all_correct_rate,
        consistency_metrics,
        cross_modality_failure_rate,
        max_modal_coverage,
        modality_accuracy,
        render_equivalence_rate,
        rest_report,
    )
    from tokenswap.rest.ocr import OCR_PROMPT, cer, edit_distance, normalize_ocr_text, ocr_correct
    from tokenswap.rest.probe import (
        collect_pair_states,
        layer_similarity,
        masked_mean,
        pairwise_similarity,
        probe_summary,
        retrieval_accuracy,
        run_probe,
    )
    from tokenswap.rest.render import (
        RenderSpec,
        cursive_font_path,
        parse_color,
        perturbation_specs,
        render_text,
        render_variants,
        resolve_font,
    )
    from tokenswap.rest.soebench import (
        LinearSystem,
        generate_system,
        integer_determinant,
        soebench_items,
        solve_exact,
    )


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
