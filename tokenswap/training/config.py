"""The config sections the recipes share (run, model, LoRA, collator, data, gap evaluation, W&B, throughput).

Plain ``kw_only`` dataclasses mapped from YAML by :func:`tokenswap.config.parse_config`; each validates in
``__post_init__`` and names the key and the fix. The Trainer's own options pass through
:mod:`tokenswap.training.trainer_args`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from tokenswap.eval.forms import ENDS, PlanError, check_plan


def _ranges(obj, positive: tuple[str, ...] = (), non_negative: tuple[str, ...] = ()) -> list[str]:
    """Range problems of ``obj``'s numeric fields (None means unset and passes)."""
    problems = []
    for name in positive:
        v = getattr(obj, name)
        if v is not None and not v > 0:
            problems.append(f"`{name}` must be > 0, got {v}")
    for name in non_negative:
        v = getattr(obj, name)
        if v is not None and not v >= 0:
            problems.append(f"`{name}` must be >= 0, got {v}")
    return problems


_SEED_MAX = 2**32 - 1  # numpy's seeds (the Trainer's set_seed, the mixture order) are 32-bit and never negative


def _seeds(obj, *names: str) -> list[str]:
    """Problems of ``obj``'s seed fields: a seed numpy refuses would fail mid-launch, after the model loaded."""
    return [f"`{name}` must be a whole number in [0, {_SEED_MAX}], got {getattr(obj, name)}" for name in names
            if getattr(obj, name) is not None and not 0 <= getattr(obj, name) <= _SEED_MAX]


def resolve_replicate(run: RunConfig, data: DataConfig | None = None, collator: CollatorConfig | None = None) -> None:
    """Give the unset ``data.seed`` and ``collator.swap_seed`` the replicate's ``run.seed``.

    A second seed of a full fine-tune changed nothing while the order and the swaps had their own fixed seeds: the
    one switch makes another ``run.seed`` another sample (order, swaps, init), and the arms of one ``run.seed`` keep
    one order and one set of swap decisions.
    """
    if data is not None and data.seed is None:
        data.seed = run.seed
    if collator is not None and collator.swap_seed is None:
        collator.swap_seed = run.seed


def _raise(problems: list[str]) -> None:
    if problems:
        raise ValueError("; ".join(problems))


@dataclass(kw_only=True)
class RunConfig:
    output_dir: str
    """Checkpoints, logs, sample-id logs and the resolved config go here."""
    pair: str
    """Name shared by the arms of one comparison; the W&B group."""
    arm: Literal["baseline", "text", "tokenswap"]
    """baseline: VL data only; text: + Magpie as text; tokenswap: + the same Magpie samples with concepts as images."""
    image_source: str = "none"
    """Where the swap images came from (generate, retrieve, embedded); logged as W&B config."""
    seed: int = 42
    """The replicate: seeds the init and the trainer, and also the data order (`data.seed`) and the swap decisions
    (`collator.swap_seed`) unless those are set. Run every arm of a pair with one `run.seed`: they stay paired (same
    order, same swaps); another `run.seed` is another replicate (see docs/training.md, "Replicates")."""

    def __post_init__(self) -> None:
        problems = _seeds(self, "seed")
        if os.path.exists(self.output_dir) and not os.path.isdir(self.output_dir):
            problems.append(f"`output_dir` {self.output_dir!r} is a file, not a folder; pass a folder path (or move "
                            "the file away)")
        else:
            above = os.path.dirname(os.path.abspath(self.output_dir))
            while not os.path.exists(above):
                above = os.path.dirname(above)
            if not os.path.isdir(above):
                problems.append(f"`output_dir` {self.output_dir!r} cannot be a folder: {above!r} above it is a file; "
                                "pass another folder path")
        _raise(problems)


@dataclass(kw_only=True)
class LoraConfig:
    r: int = 16
    """LoRA rank."""
    alpha: int = 32
    """LoRA scaling numerator."""
    dropout: float = 0.05
    """Dropout on the LoRA input."""
    target_modules: str = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)$"
    """Regex over module names; the default adapts the language model only."""

    def __post_init__(self) -> None:
        problems = _ranges(self, positive=("r", "alpha"))
        if not 0.0 <= self.dropout < 1.0:
            problems.append(f"`dropout` must be in [0, 1), got {self.dropout}")
        _raise(problems)


@dataclass(kw_only=True)
class ModelConfig:
    name_or_path: str
    """Hub id (e.g. Qwen/Qwen2-VL-7B) or a local checkpoint folder."""
    dtype: Literal["bfloat16", "float16", "float32", "auto"] = "bfloat16"
    """Weights dtype at load time."""
    attn_implementation: Literal["auto", "flash_attention_2", "varlen", "flex_attention", "sdpa", "eager"] = "auto"
    """auto: padded batches run flash_attention_2 when flash-attn is installed and CUDA is present, otherwise sdpa;
    packed rows (collator.packing) run the fastest exact kernel here: flash_attention_2, then torch's varlen
    kernel (CUDA), FlexAttention, per-sample sdpa (CPU). Naming one forces it (see tokenswap.attention);
    eager is for debugging."""
    min_pixels: int = 56 * 56
    """Image processor lower bound per image."""
    max_pixels: int = 256 * 28 * 28
    """Image processor upper bound per image (256 visual tokens). Always set: the default allows 16k tokens."""
    freeze_vision_tower: bool = True
    """Freeze the ViT blocks (the paper trains the LLM; the tower only has to run)."""
    freeze_merger: bool = False
    """Freeze the vision-language merger too."""
    lora: LoraConfig | None = None
    """Train LoRA adapters (peft) instead of full weights."""
    load_in_4bit: bool = False
    """QLoRA: load the language model in 4-bit NF4 (double quantisation, bf16 compute) with bitsandbytes
    (`pip install 'tokenswap[gpu]'`) and train `lora` adapters on it. Not with DeepSpeed ZeRO-3."""

    def __post_init__(self) -> None:
        if self.min_pixels <= 0 or self.max_pixels < self.min_pixels:
            raise ValueError(
                f"need 0 < min_pixels <= max_pixels, got min_pixels={self.min_pixels}, max_pixels={self.max_pixels}"
            )
        if self.load_in_4bit and self.lora is None:
            raise ValueError("`load_in_4bit` trains adapters on frozen 4-bit weights: also set `lora` (e.g. `lora: {r: 16}`)")


@dataclass(kw_only=True)
class CollatorConfig:
    swap_prob: float = 1.0
    """Probability that an eligible concept is shown as an image (tokenswap arm)."""
    max_images: int | None = None
    """At most this many swapped concepts per sample."""
    max_length: int | None = 4096
    """Token budget per sample; image blocks are never split (see TokenSwapCollator)."""
    dummy_image: bool = True
    """Give image-less batches a masked dummy image so every ZeRO-3 rank runs the vision tower."""
    cache_gb: float = 2.0
    """Processed-pixel cache bound per process."""
    resample_each_epoch: bool = False
    """Re-draw swap decisions every epoch (the paper's augmentation is static)."""
    swap_seed: int | None = None
    """Seed of the swap decisions; null: `run.seed` (the replicate). Set it only to hold the swaps fixed across
    replicates."""
    prepared: str | None = None
    """Prepared copy of the image store for this processor (tokenswap.store.prepare.prepare_store): cache misses
    read images at the target size instead of decoding and resizing them. Pixels are identical."""
    on_bad_image: Literal["skip", "error"] = "skip"
    """A native (LLaVA) image that cannot be used (decompression bomb, aspect ratio over 200, broken file, path
    outside the image root): `skip` drops its sample (counted, warned once), `error` stops with the file named.
    Store images of swapped concepts that cannot be used always stay text."""
    on_bad_sample: Literal["skip", "error"] = "skip"
    """A sample the collator refuses (special tokens such as <|im_end|> typed in its text, no assistant turn when
    learning assistant tokens, <image> markers that do not match its images, over the bounds below): `skip`
    counts it in the swap stats and warns once, `error` stops naming the sample."""
    max_images_per_sample: int | None = 256
    """Images in one sample: more native images refuse the sample, more swapped concepts stay text; null: no bound."""
    max_chars_per_sample: int | None = 1_000_000
    """Characters in one sample's messages; a longer sample is refused (see `on_bad_sample`); null: no bound."""
    max_image_pixels: int = 50_000_000
    """Largest image (width x height) decoded, checked from the file header before any pixel is decoded."""
    packing: bool = False
    """Pack each micro-batch's samples, greedily in order, into rows of `pack_budget` tokens with per-sample
    positions (tokenswap.packing): no padding, same samples per step. Qwen2-VL, Qwen2.5-VL and Qwen3-VL only."""
    pack_budget: int = 16384
    """Tokens per packed row (with packing). Samples longer than this are cut image-safe and counted. About
    per_device_train_batch_size x mean sample length puts a whole micro-batch in one row (no padding at all)."""
    pixel_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """dtype of pixel_values and of the pixel cache; set it to model.dtype (bfloat16 halves the cache and the
    copies, and a bfloat16 vision tower computes bit-identical outputs)."""
    group_by_length: bool = False
    """Reorder the mixture so each micro-batch holds samples of similar length (less padding without packing):
    seeded by data.seed, from the text arm's lengths, so both arms of a pair keep the same order. The grouped
    order is read sequentially and is the same every epoch (image SFT: instead of its per-epoch shuffle)."""

    max_empty_step_share: float = 0.01
    """Share of the run's optimizer steps that may have no target token on any rank (every sample of the step
    refused by the collator, or cut before its answer) before the run stops with an error naming the refusals. A run
    whose data gives nothing to learn stops at its first step; a long run may lose a few steps (0.01: 10 of 1000) to
    bad data. 0: the first such step stops the run; 1: never stop (such steps are only counted and warned)."""

    SWAP_ONLY: ClassVar[tuple[str, ...]] = ("swap_prob", "max_images", "resample_each_epoch", "swap_seed", "prepared")
    """Fields read only where concepts are swapped (arm tokenswap with an image store)."""

    def swap_only_set(self) -> list[str]:
        """The :attr:`SWAP_ONLY` fields set to something other than their default, for recipes that swap nothing."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        return [name for name in self.SWAP_ONLY if getattr(self, name) != defaults[name]]

    def __post_init__(self) -> None:
        problems = _ranges(
            self,
            positive=("max_images", "max_images_per_sample", "max_chars_per_sample", "max_image_pixels",
                      "pack_budget"),
            non_negative=("cache_gb",),
        )
        if not 0.0 <= self.swap_prob <= 1.0:
            problems.append(f"`swap_prob` must be in [0, 1], got {self.swap_prob}")
        if not 0.0 <= self.max_empty_step_share <= 1.0:
            problems.append(f"`max_empty_step_share` must be in [0, 1], got {self.max_empty_step_share}")
        if self.max_length is not None and self.max_length < 16:
            problems.append(f"`max_length` must be >= 16 or null (no limit), got {self.max_length}")
        _raise(problems + _seeds(self, "swap_seed"))


@dataclass(kw_only=True)
class DataConfig:
    llava_json: str | None = None
    """llava_v1_5_mix665k.json (or a file in its schema); None for continued pre-training."""
    llava_image_root: str | None = None
    """Folder the LLaVA image paths are relative to."""
    llava_limit: int | None = None
    """Use the first N LLaVA records."""
    on_missing_image: Literal["error", "drop"] = "error"
    """What to do with LLaVA records whose image file is absent."""
    swap_dataset: str | None = None
    """The Magpie swap dataset written by `tokenswap build-store` (JSONL file/folder or a datasets folder)."""
    swap_limit: int | None = None
    """Use the first N swap samples."""
    seed: int | None = None
    """Mixture order; null: `run.seed` (the replicate), so the arms of one replicate share it. Set it only to hold
    the order fixed across replicates."""

    def __post_init__(self) -> None:
        _raise(_ranges(self, positive=("llava_limit", "swap_limit")) + _seeds(self, "seed"))


@dataclass(kw_only=True)
class GapEvalConfig:
    bench: str | None = None
    """Held-out bench (TokenSwap-Bench format: hub id or local folder); None disables the in-loop evaluator."""
    every_steps: int = 200
    """Evaluate every N optimizer steps (and at the end of training)."""
    scorer: Literal["loglik", "generate"] = "loglik"
    """loglik: one forward over the option letters (fast); generate: the official greedy protocol."""
    limit: int | None = 200
    """Evaluate on the first N items."""
    batch_size: int = 8
    """Items per forward."""
    split: str = "test"
    """Bench split to evaluate on."""
    forms: list[str] = field(default_factory=lambda: list(ENDS))
    """Forms scored at each evaluation (tokenswap.eval.forms): text and interleaved always; `both` (every concept
    word kept, its picture right after it), `rendered` (the word rendered as a picture) and `recognition` (which of
    4 concepts each picture shows: multiple-choice and naming forms) add gap/acc_both, gap/load,
    gap/recognition_rate, gap/recognised_only/abs and the split gap/components/{load,recognition,rest} to the log.
    `caption` needs a generation pass before its items: it runs in `tokenswap eval` only."""

    RETIRED: ClassVar[dict[str, str]] = {
        "recognition": "add `recognition` to `gap_eval.forms` (the form is the one recognition switch)"}

    def __post_init__(self) -> None:
        problems = _ranges(self, positive=("every_steps", "limit", "batch_size"))
        try:
            check_plan(self.forms, scorer=self.scorer, in_loop=True)
        except PlanError as e:
            problems.append(f"`forms`: {e}")
        _raise(problems)


@dataclass(kw_only=True)
class WandbConfig:
    project: str = "tokenswap"
    """W&B project."""
    entity: str | None = None
    """W&B entity (team); None for the default."""
    mode: Literal["online", "offline", "disabled"] = "online"
    """offline writes wandb/offline-run-* folders (sync later with `wandb sync`)."""
    tags: list[str] = field(default_factory=list)
    """Extra run tags."""


@dataclass(kw_only=True)
class ThroughputConfig:
    """The perf/* keys :class:`tokenswap.throughput.ThroughputCallback` logs (a section here: that module imports
    the Trainer, which a config must not need)."""

    enabled: bool = True
    """Log perf/tokens_per_s, perf/images_per_s, perf/padding, perf/tflops and perf/mfu at every logging step."""
    peak_tflops: float | None = None
    """Peak TFLOP/s of one device for MFU; null: from the table by the exact GPU name (A100 312, H100/H200 SXM 989,
    NVL 835, PCIe 756, bf16 dense); MFU is left out when the device is not in the table (CPU, other GPUs) and
    this is null."""

    def __post_init__(self) -> None:
        if self.peak_tflops is not None and not self.peak_tflops > 0:
            raise ValueError(f"`peak_tflops` must be > 0 or null (from the device table), got {self.peak_tflops}")
