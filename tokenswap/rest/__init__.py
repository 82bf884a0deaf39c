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
