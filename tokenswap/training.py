"""Config sections, builders and callbacks shared by the training recipes (no training loop here).

Builders take a config section and return library objects built from flat arguments; recipes
in ``recipes/`` wire them together top to bottom.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import dataclass, field
from typing import Literal

import torch
from transformers import TrainerCallback

from tokenswap.collator import TokenSwapCollator
from tokenswap.store.image_store import ImageStore
from tokenswap.swap import SwapPolicy

__all__ = [
    "CollatorConfig",
    "EpochCallback",
    "GapEvalConfig",
    "LoraConfig",
    "ModelConfig",
    "RunConfig",
    "SwapStatsCallback",
    "TrainConfig",
    "WandbConfig",
    "build_collator",
    "build_gap_callback",
    "build_image_store",
    "finish_wandb",
    "init_wandb",
    "install_first",
    "load_model_and_processor",
    "print0",
    "resolve_attn_implementation",
    "resolve_checkpoint",
]

logger = logging.getLogger(__name__)


def print0(*args, **kwargs) -> None:
    """print on the main process only."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(*args, **kwargs, flush=True)


# ---------------------------------------------------------------------------- config sections
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
    """Model init / trainer seed. The data order comes from data.seed so arms stay paired."""


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


@dataclass(kw_only=True)
class ModelConfig:
    name_or_path: str
    """Hub id (e.g. Qwen/Qwen2-VL-7B) or a local checkpoint folder."""
    dtype: Literal["bfloat16", "float16", "float32", "auto"] = "bfloat16"
    """Weights dtype at load time."""
    attn_implementation: Literal["auto", "flash_attention_2", "sdpa", "eager"] = "auto"
    """auto: flash_attention_2 when flash-attn is installed and CUDA is present, otherwise sdpa."""
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

    def __post_init__(self) -> None:
        if self.min_pixels <= 0 or self.max_pixels < self.min_pixels:
            raise ValueError(
                f"need 0 < min_pixels <= max_pixels, got min_pixels={self.min_pixels}, max_pixels={self.max_pixels}"
            )


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
    swap_seed: int = 0
    """Seed of the swap decisions; the arms of a pair share it."""
    prepared: str | None = None
    """Prepared copy of the image store for this processor (tokenswap.store.prepare.prepare_store): cache misses
    read images at the target size instead of decoding and resizing them. Pixels are identical."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.swap_prob <= 1.0:
            raise ValueError(f"`swap_prob` must be in [0, 1], got {self.swap_prob}")
        if self.cache_gb < 0:
            raise ValueError(f"`cache_gb` must be >= 0, got {self.cache_gb}")


@dataclass(kw_only=True)
class TrainConfig:
    per_device_train_batch_size: int = 4
    """Micro-batch per GPU."""
    gradient_accumulation_steps: int = 4
    """Effective batch = micro-batch x accumulation x world size."""
    learning_rate: float = 1e-5
    """Peak learning rate."""
    lr_scheduler_type: str = "cosine"
    """Any transformers scheduler name."""
    warmup_steps: float = 0.03
    """Linear warm-up: a step count, or a fraction of all steps when < 1."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    num_train_epochs: float = 1.0
    """Epochs over the mixture (ignored when max_steps > 0)."""
    max_steps: int = -1
    """Stop after this many optimizer steps (-1: use epochs)."""
    bf16: bool = True
    """bf16 autocast; set false on CPU."""
    gradient_checkpointing: bool = True
    """Recompute activations in the backward pass."""
    deepspeed: str | None = None
    """DeepSpeed JSON (e.g. configs/deepspeed/zero3.json); None for plain DDP."""
    logging_steps: int = 10
    """Log every N optimizer steps."""
    save_steps: int = 500
    """Checkpoint every N optimizer steps."""
    save_total_limit: int | None = 2
    """Keep at most this many checkpoints."""
    dataloader_num_workers: int = 0
    """Collation costs about a tokenizer call, so workers rarely help (and split swap stats per worker)."""
    resume_from_checkpoint: str | None = None
    """A checkpoint folder, or "latest" for the newest one in output_dir."""
    report_to: list[str] = field(default_factory=lambda: ["wandb"])
    """Trainer loggers: wandb, tensorboard, none."""
    use_cpu: bool = False
    """Force CPU (tests and the demo)."""


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
    seed: int = 0
    """Mixture order; the arms of a pair must share it."""


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
    recognition: bool = False
    """Also score the concept-identification control (which concept does each image show?)."""


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


# ---------------------------------------------------------------------------- builders
def resolve_attn_implementation(requested: str) -> str:
    """auto -> flash_attention_2 when usable, otherwise sdpa (said once in the log)."""
    if requested != "auto":
        return requested
    if torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    print0("[tokenswap] flash-attn not available (or no CUDA): using sdpa attention")
    return "sdpa"


_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "auto": "auto"}


def resolve_checkpoint(output_dir: str, resume: str | None) -> str | None:
    """``"latest"`` -> the newest ``checkpoint-N`` in ``output_dir`` (None if there is none yet)."""
    if resume != "latest":
        return resume
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None


def load_model_and_processor(cfg: ModelConfig, resume_from: str | None = None):
    """Load a Qwen2-VL-family checkpoint with the configured pixels, attention, freezing and LoRA.

    Under DeepSpeed ZeRO-3 call this after creating ``TrainingArguments`` so weights load
    partitioned (``zero.Init``).

    Args:
        cfg: the model section.
        resume_from: a Trainer checkpoint folder of a full-weight run to take the weights from.
            transformers 5.24's ``Trainer`` resume loads Qwen2-VL checkpoints with
            ``strict=False`` into renamed keys (``model.layers.*`` on disk vs
            ``model.language_model.layers.*`` in memory) and so silently keeps the initial
            weights; ``from_pretrained`` applies the key mapping. Optimizer, scheduler and RNG
            state still come from the Trainer.
    """
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(cfg.name_or_path, min_pixels=cfg.min_pixels, max_pixels=cfg.max_pixels)
    weights = resume_from if resume_from is not None and cfg.lora is None else cfg.name_or_path
    model = AutoModelForImageTextToText.from_pretrained(
        weights,
        dtype=_DTYPES[cfg.dtype],
        attn_implementation=resolve_attn_implementation(cfg.attn_implementation),
    )
    visual = model.model.visual
    if cfg.freeze_vision_tower:
        for name, p in visual.named_parameters():
            if not name.startswith("merger."):
                p.requires_grad_(False)
    if cfg.freeze_merger:
        visual.merger.requires_grad_(False)
    if cfg.lora is not None:
        from peft import LoraConfig as PeftLoraConfig
        from peft import get_peft_model

        model = get_peft_model(
            model,
            PeftLoraConfig(
                r=cfg.lora.r,
                lora_alpha=cfg.lora.alpha,
                lora_dropout=cfg.lora.dropout,
                target_modules=cfg.lora.target_modules,
                task_type="CAUSAL_LM",
            ),
        )
    return model, processor


def build_image_store(root: str | None) -> ImageStore | None:
    return None if root is None else ImageStore(root)


def build_collator(
    cfg: CollatorConfig,
    processor,
    store: ImageStore | None,
    arm: str,
    learn: Literal["assistant", "all"] = "assistant",
    image_root: str | None = None,
) -> TokenSwapCollator:
    """The collator of one arm; ``baseline`` and ``text`` render everything as text."""
    return TokenSwapCollator(
        processor=processor,
        store=store,
        policy=SwapPolicy(
            swap_prob=cfg.swap_prob,
            max_images=cfg.max_images,
            seed=cfg.swap_seed,
            resample_each_epoch=cfg.resample_each_epoch,
        ),
        arm="tokenswap" if arm == "tokenswap" else "text",
        max_length=cfg.max_length,
        learn=learn,
        dummy_image=cfg.dummy_image,
        image_root=image_root,
        cache_bytes=int(cfg.cache_gb * (1 << 30)),
        prepared=cfg.prepared,
    )


# ---------------------------------------------------------------------------- callbacks
class EpochCallback(TrainerCallback):
    """Tell the collator the epoch, for ``resample_each_epoch`` swap policies."""

    def __init__(self, collator: TokenSwapCollator):
        self.collator = collator

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.collator.epoch = int(state.epoch or 0)


class SwapStatsCallback(TrainerCallback):
    """Adds the collator's swap statistics to every log line (W&B included).

    Logged (cumulative over the run, this process): ``swap/images_per_sample``,
    ``swap/swapped_per_sample``, ``swap/text_by_policy``, ``swap/text_missing_image``,
    ``swap/text_corrupt_image``, ``swap/truncated_samples``, ``swap/dummy_images``. Must run
    before the reporting callbacks; :func:`install_first` puts it there.
    """

    def __init__(self, collator: TokenSwapCollator):
        self.collator = collator

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or "loss" not in logs:
            return
        s = self.collator.stats
        n = max(1, s["samples"])
        logs.update(
            {
                "swap/images_per_sample": s["images"] / n,
                "swap/swapped_per_sample": s["concepts_swapped"] / n,
                "swap/text_by_policy": s["concepts_text_by_policy"],
                "swap/text_missing_image": s["concepts_text_missing_image"],
                "swap/text_corrupt_image": s["concepts_text_corrupt_image"],
                "swap/truncated_samples": s["samples_truncated"],
                "swap/dummy_images": s["dummy_images"],
            }
        )


def install_first(trainer, callback: TrainerCallback) -> None:
    """Register ``callback`` ahead of the reporting callbacks so values it adds to ``logs`` are reported."""
    trainer.callback_handler.callbacks.insert(0, callback)


def init_wandb(cfg: WandbConfig, run: RunConfig, stage: str, config: dict, report_to: list[str]) -> None:
    """Start the W&B run of one arm on rank 0: name ``{pair}-{arm}``, group ``{pair}``.

    The Trainer's W&B callback then logs into this run instead of opening its own.
    """
    if "wandb" not in report_to or int(os.environ.get("RANK", "0")) != 0:
        return
    import wandb

    wandb.init(
        project=cfg.project,
        entity=cfg.entity,
        name=f"{run.pair}-{run.arm}",
        group=run.pair,
        job_type=stage,
        tags=[stage, run.arm, run.image_source, *cfg.tags],
        config={"arm": run.arm, "image_source": run.image_source, "stage": stage, "pair": run.pair, **config},
        mode=cfg.mode,
        dir=run.output_dir,
    )


def build_gap_callback(cfg: GapEvalConfig, processor, trainer):
    """The in-loop gap evaluator for ``trainer``, or None when ``cfg.bench`` is unset.

    Register it with ``trainer.add_callback``; it logs through ``trainer.log`` (W&B included).
    """
    if cfg.bench is None:
        return None
    from tokenswap.data.tokenswap_bench import load_tokenswap_bench_pairs
    from tokenswap.eval.callback import GapEvalCallback
    from tokenswap.eval.gap import GapEvaluator

    pairs = load_tokenswap_bench_pairs(cfg.bench, split=cfg.split, limit=cfg.limit)
    evaluator = GapEvaluator(
        processor, pairs, scorer=cfg.scorer, batch_size=cfg.batch_size, recognition=cfg.recognition, progress=False
    )
    return GapEvalCallback(trainer, evaluator, eval_steps=cfg.every_steps)


def finish_wandb() -> None:
    """Close the W&B run opened by :func:`init_wandb` (flushes offline run files)."""
    import sys

    if "wandb" in sys.modules and sys.modules["wandb"].run is not None:
        sys.modules["wandb"].finish()
