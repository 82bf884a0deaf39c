"""Config sections, builders and callbacks shared by the training recipes (no training loop here).

Builders take a config section and return library objects built from flat arguments; recipes
in ``recipes/`` wire them together top to bottom.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import enum
import importlib.util
import json
import logging
import math
import os
import sys
import typing
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from transformers import TrainerCallback, TrainingArguments

from tokenswap.collator import TokenSwapCollator
from tokenswap.store.image_store import ImageStore, atomic_write
from tokenswap.swap import SwapPolicy

__all__ = [
    "BOOKKEEPING_KEY",
    "COMPLETE_MARKER",
    "CheckpointCallback",
    "ResumableCollator",
    "CollatorConfig",
    "EmptyStepCallback",
    "EpochCallback",
    "GapEvalConfig",
    "LoraConfig",
    "ModelConfig",
    "NoTargetsError",
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
    "PairedTrainConfig",
    "build_training_arguments",
    "check_inputs",
    "close_process_group",
    "load_model_and_processor",
    "model_family",
    "peft_lora_config",
    "trainer_section",
    "print0",
    "resolve_attn_implementation",
    "resolve_checkpoint",
    "train",
]

logger = logging.getLogger(__name__)


def print0(*args, **kwargs) -> None:
    """print on the main process only."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(*args, **kwargs, flush=True)


# ---------------------------------------------------------------------------- config sections
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
    swap_seed: int = 0
    """Seed of the swap decisions; the arms of a pair share it."""
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
        _raise(problems)


# ---------------------------------------------------------------------------- Trainer pass-through
TRAINER_OWNED: dict[str, str] = {
    "output_dir": "set `run.output_dir`",
    "run_name": "the recipes name runs `{run.pair}-{run.arm}`",
    "seed": "set `run.seed`",
    "remove_unused_columns": "the collator reads the raw columns, so the recipes always pass false",
    "local_rank": "the launcher sets it",
}
"""``TrainingArguments`` fields a recipe sets itself, with what to do instead (a YAML key for them is an error)."""

PAIRED_OWNED: dict[str, str] = {
    **TRAINER_OWNED,
    "train_sampling_strategy": "the arms of a pair share the order fixed by `data.seed` (sequential over it); "
    "for length grouping set `collator.group_by_length: true` (paired-safe)",
}

TRAIN_DEFAULTS: dict[str, Any] = {
    "per_device_train_batch_size": 4,
    "gradient_accumulation_steps": 4,
    "learning_rate": 1e-5,
    "lr_scheduler_type": "cosine",
    "warmup_steps": 0.03,
    "num_train_epochs": 1.0,
    "bf16": True,
    "activation_checkpointing": True,
    "logging_steps": 10,
    "save_steps": 500,
    "save_total_limit": 2,
    "report_to": ["wandb"],
}
"""Where the recipes' defaults differ from ``TrainingArguments``' (the paper's 8xA100 set-up)."""

# Fields that are counts, rates or sizes: checked where the Trainer would only fail later (or never).
_POSITIVE = ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
             "logging_steps", "save_steps", "ddp_timeout", "num_generations", "max_completion_length",
             "generation_batch_size", "steps_per_generation", "num_iterations", "temperature")
_NON_NEGATIVE = ("learning_rate", "weight_decay", "warmup_steps", "max_grad_norm", "adam_epsilon",
                 "dataloader_num_workers", "label_smoothing_factor", "beta", "eval_delay")


_JSON_KWARGS = ("lr_scheduler_kwargs", "activation_checkpointing_kwargs", "gradient_checkpointing_kwargs",
                "model_init_kwargs")
"""``dict | str`` fields whose string form can only be a JSON object (the ``*_config`` ones also take a file path)."""


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _check_trainer_values(self) -> None:
    problems = []
    for f in dataclasses.fields(self):
        v = getattr(self, f.name)
        if isinstance(v, float) and not math.isfinite(v) and f.name != "max_grad_norm":
            problems.append(f"`{f.name}` must be a finite number, got {v}")
        elif f.name in _POSITIVE and v is not None and v <= 0:
            problems.append(f"`{f.name}` must be > 0, got {v}")
        elif f.name in _NON_NEGATIVE and v is not None and v < 0:
            problems.append(f"`{f.name}` must be >= 0, got {v}")
    if self.max_steps == 0 or self.max_steps < -1:
        problems.append(f"`max_steps` must be -1 (train for num_train_epochs) or > 0, got {self.max_steps}")
    if self.max_steps == -1 and not self.num_train_epochs > 0:
        problems.append(f"`num_train_epochs` must be > 0 when max_steps is -1, got {self.num_train_epochs}")
    if self.save_total_limit is not None and self.save_total_limit < 1:
        problems.append(f"`save_total_limit` must be >= 1 or null (keep all), got {self.save_total_limit}")
    for name in ("adam_beta1", "adam_beta2"):
        if not 0.0 <= getattr(self, name) < 1.0:
            problems.append(f"`{name}` must be in [0, 1), got {getattr(self, name)}")
    if self.eval_strategy != "no":
        # The Trainer would refuse it only after the data and the model loaded.
        problems.append(f"`eval_strategy` is {self.eval_strategy!r}, but the recipes give the Trainer no eval_dataset: "
                        "their in-loop evaluation is `gap_eval` (gap_eval.bench, gap_eval.every_steps); set "
                        "train.eval_strategy: no")
    resume = self.resume_from_checkpoint
    if resume is not None and resume != "latest" and not os.path.isfile(os.path.join(resume, "trainer_state.json")):
        what = "is not a Trainer checkpoint (no trainer_state.json)" if os.path.isdir(resume) else "does not exist"
        problems.append(f"`resume_from_checkpoint` {resume!r} {what} (cwd {os.getcwd()}); give a checkpoint-N folder "
                        "of an earlier run, or `latest` for the newest complete one in run.output_dir")
    for name in _JSON_KWARGS:
        v = getattr(self, name, None)
        if isinstance(v, str) and not _is_json_object(v):
            # TrainingArguments parses only strings that start with "{" and passes any other string on silently.
            problems.append(f"`{name}` must be a mapping (e.g. {{min_lr: 1.0e-6}}) or a JSON object string, got {v!r}")
    if problems:
        raise ValueError("; ".join(problems))
    # `gradient_checkpointing` is TrainingArguments' deprecated alias of `activation_checkpointing`: a YAML that
    # sets the old name means it (the new name carries our default, which would otherwise win silently).
    for old, new in (("gradient_checkpointing", "activation_checkpointing"),
                     ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs")):
        if getattr(self, old) is not None:
            setattr(self, new, getattr(self, old))
            setattr(self, old, None)


def _strict_enum(tp: Any) -> Any:
    """``SchedulerType | str`` -> ``SchedulerType``: a typo in a choice fails at config time, not mid-launch."""
    args = typing.get_args(tp)
    enums = [a for a in args if isinstance(a, type) and issubclass(a, enum.Enum)]
    if enums and str in args:
        rest = [a for a in args if a is not str]
        return rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]  # noqa: UP007
    return tp


def trainer_section(
    args_cls: type,
    name: str,
    *,
    owned: dict[str, str] = TRAINER_OWNED,
    defaults: dict[str, Any] = TRAIN_DEFAULTS,
) -> type:
    """A config section with every field of ``args_cls`` (``TrainingArguments``, ``GRPOConfig``, ...).

    Nothing is re-declared: field names, types and help come from ``args_cls`` itself, so every Trainer
    option (``use_liger_kernel``, ``push_to_hub``, ``torch_compile``, ``include_num_input_tokens_seen``, ...)
    is a YAML key and a dotted override the day transformers/TRL add it. Types are checked by the config
    loader (enum choices strictly), counts and rates by range, and ``owned`` fields are refused with what to set
    instead. ``defaults`` replace the class's defaults where the recipes differ.
    """
    hints = typing.get_type_hints(args_cls)
    specs = []
    for f in dataclasses.fields(args_cls):
        if not f.init or f.name.startswith("_") or f.name in owned:
            continue
        if f.name in defaults:
            value = defaults[f.name]
            default = dataclasses.field(default_factory=lambda v=value: copy.deepcopy(v), metadata=f.metadata)
        elif f.default is not dataclasses.MISSING:
            default = dataclasses.field(default=f.default, metadata=f.metadata)
        elif f.default_factory is not dataclasses.MISSING:
            default = dataclasses.field(default_factory=f.default_factory, metadata=f.metadata)
        else:
            continue
        specs.append((f.name, _strict_enum(hints[f.name]), default))
    cls = dataclasses.make_dataclass(
        name,
        specs,
        kw_only=True,
        namespace={"__post_init__": _check_trainer_values, "ARGS_CLASS": args_cls, "OWNED": owned},
    )
    cls.__module__ = __name__
    cls.__doc__ = f"Every `{args_cls.__name__}` field (see its documentation), except: " + "; ".join(
        f"`{k}`: {v}" for k, v in owned.items()
    )
    return cls


TrainConfig = trainer_section(TrainingArguments, "TrainConfig")
"""Every ``TrainingArguments`` field, with the recipes' defaults (:data:`TRAIN_DEFAULTS`)."""

PairedTrainConfig = trainer_section(TrainingArguments, "PairedTrainConfig", owned=PAIRED_OWNED)
"""``TrainConfig`` for the paired recipes: the sample order belongs to ``data.seed``."""


def build_training_arguments(train, run: RunConfig, **recipe: Any):
    """The Trainer's arguments for one run, after setting up the process state every recipe needs.

    Multi-process CPU runs need a gloo ``PartialState`` built before the arguments (and reused by the
    Trainer); DeepSpeed needs ``ACCELERATE_USE_DEEPSPEED`` before any state exists. ``recipe`` holds the
    values the recipe owns (``train_sampling_strategy``, ...). Like :func:`tokenswap.config.parse_config`,
    a value ``TrainingArguments`` rejects is printed as a config problem and the process exits with 2.
    """
    from accelerate import PartialState

    from tokenswap.config import ConfigError

    kwargs = {f.name: getattr(train, f.name) for f in dataclasses.fields(train)}
    if kwargs.get("use_liger_kernel") and importlib.util.find_spec("liger_kernel") is None:
        # liger-kernel 0.8.5 patches every family tokenswap supports (qwen2_vl ... qwen3_5_moe); it needs Triton + CUDA.
        print("error: train.use_liger_kernel needs liger-kernel: pip install 'tokenswap[gpu]'", file=sys.stderr)
        raise SystemExit(2)
    if kwargs.get("fp16") and (kwargs.get("use_cpu") or not torch.cuda.is_available()):
        # Accepted by TrainingArguments on CPU, where it does not give the fp16 training the user asked for.
        print("error: train.fp16 needs a CUDA GPU and this run has none (or train.use_cpu is set); on CPU set "
              "train.fp16: false (train.bf16: true for mixed precision)", file=sys.stderr)
        raise SystemExit(2)
    if kwargs.get("deepspeed"):
        os.environ.setdefault("ACCELERATE_USE_DEEPSPEED", "true")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and (kwargs.get("use_cpu") or not torch.cuda.is_available()):
        # CPU ranks talk over gloo; the Trainer must reuse this state instead of building its own.
        PartialState(cpu=not kwargs.get("deepspeed"), backend="gloo")
        given = kwargs.get("accelerator_config") or {}
        if isinstance(given, str):
            with open(given) as f:
                given = json.load(f)
        kwargs["accelerator_config"] = {**given, "use_configured_state": True}
    try:
        return train.ARGS_CLASS(
            output_dir=run.output_dir,
            run_name=f"{run.pair}-{run.arm}",
            seed=run.seed,
            remove_unused_columns=False,
            **kwargs,
            **recipe,
        )
    except (ValueError, TypeError) as e:
        err = ConfigError([f"train: {e}"], f"train ({train.ARGS_CLASS.__name__})")
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


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

    def __post_init__(self) -> None:
        _raise(_ranges(self, positive=("llava_limit", "swap_limit")))


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

    def __post_init__(self) -> None:
        _raise(_ranges(self, positive=("every_steps", "limit", "batch_size")))


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
    """The implementation a model loads with: auto -> flash_attention_2 when usable, otherwise sdpa (said once in
    the log); varlen and flex_attention load as tokenswap's kernels, which run padded batches as sdpa does."""
    if requested in ("varlen", "flex_attention"):
        from tokenswap.attention import PACKED_KERNELS, register_packed_attention

        register_packed_attention()
        return PACKED_KERNELS[requested]
    if requested != "auto":
        return requested
    if torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    print0("[tokenswap] flash-attn not available (or no CUDA): using sdpa attention")
    return "sdpa"


_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "auto": "auto"}


COMPLETE_MARKER = "tokenswap_complete.json"
"""Written into ``checkpoint-N`` after every rank finished saving it (see :class:`CheckpointCallback`)."""


def _atomic_json(path: str, data: dict) -> None:
    atomic_write(Path(path), json.dumps(data).encode())


def _checkpoint_complete(path: str) -> bool:
    """Saved to the end: our marker (and every rank's state file), or, for checkpoints written before markers
    existed, a readable trainer_state.json and model weights."""
    marker = os.path.join(path, COMPLETE_MARKER)
    try:
        if os.path.exists(marker):
            with open(marker) as f:
                world = int(json.load(f)["world_size"])
            return all(os.path.exists(os.path.join(path, f"tokenswap_state.rank{r}.json")) for r in range(world))
        with open(os.path.join(path, "trainer_state.json")) as f:
            json.load(f)
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return any(
        os.path.exists(os.path.join(path, name))
        for name in ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors", "pytorch_model.bin")
    ) or any(name.startswith("global_step") for name in os.listdir(path))


def resolve_checkpoint(output_dir: str, resume: str | None) -> str | None:
    """``"latest"`` -> the newest *complete* ``checkpoint-N`` in ``output_dir`` (None if there is none yet).

    A run killed while saving leaves a partial ``checkpoint-N``; it is skipped (and said), and the resumed run
    writes that step's checkpoint again over it.
    """
    if resume != "latest":
        return resume
    if not os.path.isdir(output_dir):
        return None
    steps = sorted(
        (int(name.split("-")[1]), name)
        for name in os.listdir(output_dir)
        if name.startswith("checkpoint-") and name.split("-")[1].isdigit()
        and os.path.isdir(os.path.join(output_dir, name))
    )
    for _, name in reversed(steps):
        path = os.path.join(output_dir, name)
        if _checkpoint_complete(path):
            return path
        print0(f"[tokenswap] {path} is incomplete (killed while saving?): resuming from an older checkpoint")
    return None


def train(trainer, resume: str | None) -> None:
    """``trainer.train(resume_from_checkpoint=resume)``, except from a checkpoint that already reached ``max_steps``.

    transformers 5.24 checks ``max_steps`` only after a step, so resuming from the final checkpoint (a run killed
    after its last save, relaunched) would train one step past the end. That checkpoint's weights and state are
    loaded instead, and the recipe goes on to save as if the run had just finished.
    """
    with _renamed_key_warnings_dropped(trainer, resume):
        if resume is not None and trainer.args.max_steps > 0:
            from transformers import TrainerState

            state = TrainerState.load_from_json(os.path.join(resume, "trainer_state.json"))
            if state.global_step >= trainer.args.max_steps:
                print0(f"[tokenswap] {resume} is at step {state.global_step} >= max_steps: nothing left to train")
                trainer._load_from_checkpoint(resume)
                trainer.state = state
                return
        try:
            trainer.train(resume_from_checkpoint=resume)
        except NoTargetsError as e:  # the data's fault, said in one message: not a traceback from the Trainer
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(1) from None


class _DropMessages(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


@contextlib.contextmanager
def _renamed_key_warnings_dropped(trainer, resume: str | None):
    """Drop the Trainer's missing/unexpected-key warnings on resume when the weights already came from ``resume``.

    transformers 5.24's Trainer loads a checkpoint's state dict with ``strict=False`` without the key renaming
    ``from_pretrained`` applies (``model.layers.*`` on disk, ``model.language_model.layers.*`` in memory;
    transformers#43701), so for Qwen-VL models it loads nothing and lists every key twice, which reads as a
    broken checkpoint. :func:`load_model_and_processor` took the weights from the same folder with
    ``from_pretrained`` (it marks the model), so the warnings say nothing true; for a model it did not load
    from ``resume`` they are kept.
    """
    model = getattr(trainer, "model", None)
    loaded = getattr(model, "tokenswap_weights_from", None)
    if resume is None or loaded is None or loaded != os.path.realpath(resume):
        yield
        return
    print0(f"[tokenswap] weights loaded from {resume} by from_pretrained; the Trainer restores optimizer, scheduler "
           "and RNG state (its own weight load does not rename Qwen-VL keys: transformers#43701, warnings dropped)")
    log = logging.getLogger("transformers.trainer")
    drop = _DropMessages(("There were missing keys in the checkpoint model loaded",
                          "There were unexpected keys in the checkpoint model loaded"))
    log.addFilter(drop)
    try:
        yield
    finally:
        log.removeFilter(drop)


BOOKKEEPING_KEY = "tokenswap_bookkeeping"
"""The batch key :class:`ResumableCollator` puts each batch's bookkeeping under (taken off before the model)."""


class ResumableCollator:
    """The recipes' collator: its bookkeeping travels with each batch and counts once the batch has trained.

    With ``dataloader_num_workers > 0`` the collator runs in worker processes, and with any number of workers
    the loader collates ahead of the optimizer (prefetch), so neither the collator's own ``stats`` nor a log it
    writes itself tell what trained. Each batch therefore carries, under :data:`BOOKKEEPING_KEY`, the stats it
    added and its sample-id lines. The hook :meth:`attach` puts on the model (:class:`CheckpointCallback` does
    at the start of training) takes that key off every batch in the main process before the forward, and for a
    training forward adds it to :attr:`stats` and appends the lines to ``log_ids_to``. :meth:`state` is what a
    checkpoint stores and :meth:`restore` rewinds to it on resume, so ``sample_ids.rank*.txt`` and the stats
    hold exactly the batches that trained, in order, whatever the worker count, and a resumed run's equal an
    uninterrupted run's.

    Args:
        collator: a :class:`~tokenswap.collator.TokenSwapCollator` whose own ``log_ids_to`` is unset.
        log_ids_to: this process's sample-id log: one line per trained batch (per packed row when packing).
    """

    def __init__(self, collator, log_ids_to: str | None = None):
        self.collator = collator
        self.log_ids_to = log_ids_to
        self.stats: Counter = Counter()

    def __call__(self, examples):
        before = dict(self.collator.stats)
        out = self.collator(examples)
        # Keys first counted with 0 are kept: swap_stats.json lists them as a run without workers always did.
        added = {k: v - before.get(k, 0) for k, v in self.collator.stats.items() if v != before.get(k)}
        out[BOOKKEEPING_KEY] = {"stats": added, "ids": list(self.collator.last_ids)}
        return out

    def __getattr__(self, name):
        # Only called for names the wrapper lacks; "collator" itself missing means a half-built object (unpickling
        # in a spawned data-loader worker), which must not recurse.
        if name == "collator" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.collator, name)

    def attach(self, model: torch.nn.Module):
        """Take the bookkeeping off every batch before ``model`` runs; count it when ``model`` is training.

        Returns:
            the hook's handle (``handle.remove()`` detaches it).
        """
        return model.register_forward_pre_hook(self._take, with_kwargs=True)

    def _take(self, module, args, kwargs):
        if BOOKKEEPING_KEY not in kwargs:
            return None
        kwargs = dict(kwargs)
        bookkeeping = kwargs.pop(BOOKKEEPING_KEY)
        if module.training:  # an evaluation batch trained nothing
            self.stats.update(bookkeeping["stats"])
            if self.log_ids_to is not None and bookkeeping["ids"]:
                with open(self.log_ids_to, "a") as f:
                    f.write("".join(line + "\n" for line in bookkeeping["ids"]))
        return args, kwargs

    def state(self) -> dict:
        """The log size and stats after the batches trained so far (stored in each checkpoint)."""
        log = self.log_ids_to
        size = os.path.getsize(log) if log is not None and os.path.exists(log) else 0
        return {"log_bytes": size, "stats": dict(self.stats)}

    def restore(self, state: dict) -> None:
        log = self.log_ids_to
        if log is not None and os.path.exists(log):
            with open(log, "r+b") as f:
                f.truncate(state["log_bytes"])
        self.stats = Counter(state["stats"])


class CheckpointCallback(TrainerCallback):
    """Marks a checkpoint complete only after every rank saved it, with the collator state to resume exactly.

    Register on every rank. ``on_save`` runs after the Trainer wrote the whole ``checkpoint-N`` (weights,
    optimizer, scheduler, RNG, trainer_state); each rank writes ``tokenswap_state.rank{r}.json`` (micro-batches
    consumed, collator log size and stats), all ranks meet at a barrier, and rank 0 writes
    :data:`COMPLETE_MARKER`. :func:`resolve_checkpoint` only resumes from marked checkpoints. With a collator,
    training starts by attaching it to the model (:meth:`ResumableCollator.attach`).
    """

    def __init__(self, collator: ResumableCollator | None = None, consumed: int = 0):
        self.collator = collator
        self.consumed = consumed
        self._hook = None

    @classmethod
    def resuming(cls, collator: ResumableCollator | None, checkpoint: str | None) -> CheckpointCallback:
        """The callback for a run resuming from ``checkpoint`` (rewinds ``collator`` to that point)."""
        rank = int(os.environ.get("RANK", "0"))
        consumed = 0
        if checkpoint is None and collator is not None:
            # A fresh run in a used output_dir: the log starts empty, not after an earlier run's lines.
            collator.restore({"log_bytes": 0, "stats": {}})
        path = os.path.join(checkpoint, f"tokenswap_state.rank{rank}.json") if checkpoint else None
        if path is not None and os.path.exists(path):
            with open(path) as f:
                saved = json.load(f)
            consumed = saved["consumed"]
            if collator is not None and saved.get("collator") is not None:
                collator.restore(saved["collator"])
        return cls(collator, consumed)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.collator is not None and self._hook is None:
            self._hook = self.collator.attach(model)

    def on_substep_end(self, args, state, control, **kwargs):
        self.consumed += 1

    def on_step_end(self, args, state, control, **kwargs):
        self.consumed += 1

    def on_save(self, args, state, control, **kwargs):
        import torch.distributed as dist

        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        rank = int(os.environ.get("RANK", "0"))
        if os.path.isdir(folder):
            collator_state = self.collator.state() if self.collator is not None else None
            _atomic_json(
                os.path.join(folder, f"tokenswap_state.rank{rank}.json"),
                {"consumed": self.consumed, "collator": collator_state},
            )
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if world > 1:
            dist.barrier()  # every rank, folder or not: one that skipped it would leave the others waiting
        if rank == 0 and os.path.isdir(folder):
            _atomic_json(os.path.join(folder, COMPLETE_MARKER), {"world_size": world, "global_step": state.global_step})


def _check_model_path(name_or_path: str) -> None:
    """A local folder that is not there gets a clear error (the Hub client would say "Repo id must ...")."""
    if os.path.exists(name_or_path):
        return
    looks_local = name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") != 1 or os.sep == "\\"
    if looks_local:
        raise FileNotFoundError(
            f"model.name_or_path: local folder {name_or_path!r} does not exist (cwd {os.getcwd()}); "
            "give an existing checkpoint folder or a hub id like Qwen/Qwen2-VL-7B-Instruct"
        )


def model_family(cfg: ModelConfig):
    """The :class:`~tokenswap.families.Family` of ``cfg.name_or_path``, read from its ``config.json`` (no weights).

    Raises:
        FileNotFoundError: a local folder that does not exist, or a hub id that cannot be loaded.
        UnsupportedFamilyError: a model type outside the family table; names the supported ones.
    """
    from transformers import AutoConfig

    from tokenswap.families import family_of

    _check_model_path(cfg.name_or_path)
    try:
        config = AutoConfig.from_pretrained(cfg.name_or_path)
    except OSError as e:
        raise FileNotFoundError(
            f"model.name_or_path {cfg.name_or_path!r} is neither a local checkpoint folder (cwd {os.getcwd()}) "
            f"nor loadable as a hub id: {str(e).splitlines()[0]}"
        ) from None
    return family_of(config.model_type)


def check_inputs(
    model: ModelConfig,
    *,
    packing: bool = False,
    image_store: str | None = None,
    paths: dict[str, str | None] | None = None,
    device: str | None = None,
) -> None:
    """A run's inputs checked against its settings before any data or weights load.

    Like :func:`tokenswap.config.parse_config`, every problem is printed with its fix and the process exits with 2:
    a local path that does not exist (``paths``: config key -> path, None skipped), an image store that is missing or
    damaged, a model folder that is missing, a family tokenswap does not support, or ``collator.packing`` for a family
    whose samples cannot be separated in a packed row (Qwen3.5), or a ``model.attn_implementation`` named that
    cannot run on ``device`` (default CUDA when available). The model is judged from its ``config.json`` alone;
    each of these would otherwise surface as a traceback after the data and the model loaded.
    """
    from tokenswap.attention import packed_attention_choice
    from tokenswap.config import ConfigError
    from tokenswap.packing import RopeIndex

    problems = [f"`{key}` {path!r} does not exist (cwd {os.getcwd()})"
                for key, path in (paths or {}).items() if path is not None and not os.path.exists(path)]
    if image_store is not None:
        try:
            ImageStore(image_store)
        except (FileNotFoundError, ValueError) as e:  # StoreFormatError is a ValueError
            problems.append(f"`image_store`: {e}")
    try:
        family = model_family(model)
        if packing:
            RopeIndex(family.name, 2)  # refuses, naming the family and why, what it cannot pack
    except (FileNotFoundError, ValueError) as e:  # UnsupportedFamilyError, PackingNotSupportedError: ValueErrors
        problems.append(str(e))
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if packing or model.attn_implementation == "flash_attention_2":
        try:
            packed_attention_choice(model.attn_implementation, device)
        except ValueError as e:
            problems.append(str(e))
    if problems:
        print(f"error: {ConfigError(problems, 'the run inputs')}", file=sys.stderr)
        raise SystemExit(2)


def _quantization_config(cfg: ModelConfig):
    """NF4 with double quantisation and bf16 compute (QLoRA); the vision tower and lm_head stay unquantised."""
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ImportError(
            "model.load_in_4bit needs bitsandbytes: pip install 'tokenswap[gpu]' (or pip install 'bitsandbytes>=0.45')"
        )
    if not torch.cuda.is_available() and not _bnb_supports_cpu():
        raise RuntimeError(
            "model.load_in_4bit: no CUDA device, and this bitsandbytes is older than 0.50 (the first with the CPU "
            "4-bit path tokenswap tests); run on a GPU or pip install -U 'bitsandbytes>=0.50'"
        )
    from transformers import BitsAndBytesConfig

    compute = torch.bfloat16 if cfg.dtype in ("bfloat16", "auto") else _DTYPES[cfg.dtype]
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute,
        # ViT and lm_head are a small share of the weights and quantise badly; the merger must stay trainable.
        llm_int8_skip_modules=["model.visual", "lm_head"],
    )


def _bnb_supports_cpu() -> bool:
    from importlib.metadata import version

    major, minor = (int(x) for x in version("bitsandbytes").split(".")[:2])
    return (major, minor) >= (0, 50)  # the CPU 4-bit path tokenswap's tests run (tested with 0.50.2)


def load_model_and_processor(cfg: ModelConfig, resume_from: str | None = None, seed: int = 0):
    """Load a Qwen-VL-family checkpoint with the configured pixels, attention, quantisation, freezing and LoRA.

    The model class comes from the family table (:mod:`tokenswap.families`): Qwen2-VL, Qwen2.5-VL,
    Qwen3-VL, Qwen3.5 and their MoE variants; anything else fails with the list of supported families.
    Under DeepSpeed ZeRO-3 call this after creating ``TrainingArguments`` so weights load partitioned
    (``zero.Init``).

    Args:
        cfg: the model section.
        resume_from: a Trainer checkpoint folder of a full-weight run to take the weights from.
            transformers 5.24's ``Trainer`` resume loads Qwen2-VL checkpoints with
            ``strict=False`` into renamed keys (``model.layers.*`` on disk vs
            ``model.language_model.layers.*`` in memory) and so silently keeps the initial
            weights; ``from_pretrained`` applies the key mapping. Optimizer, scheduler and RNG
            state still come from the Trainer.
        seed: seeds the LoRA initialisation, so runs (and the arms of a pair, and every process of a run)
            with the same seed start from identical adapters. The caller's random state is left as it was.
    """
    import transformers
    from transformers import AutoProcessor

    family = model_family(cfg)
    processor = AutoProcessor.from_pretrained(cfg.name_or_path, min_pixels=cfg.min_pixels, max_pixels=cfg.max_pixels)
    # from_pretrained also files the two under the tokenizer's init kwargs, which every processor call then passes
    # to the image processor as call kwargs (deprecated: a FutureWarning per process; the sizes set above stay).
    for key in ("min_pixels", "max_pixels"):
        processor.tokenizer.init_kwargs.pop(key, None)
    from_checkpoint = resume_from is not None and cfg.lora is None
    weights = resume_from if from_checkpoint else cfg.name_or_path
    extra = {"quantization_config": _quantization_config(cfg)} if cfg.load_in_4bit else {}
    model = getattr(transformers, family.model_class).from_pretrained(
        weights,
        dtype=_DTYPES[cfg.dtype],
        attn_implementation=resolve_attn_implementation(cfg.attn_implementation),
        **extra,
    )
    if from_checkpoint:
        # What train() checks before it drops the Trainer's renamed-key warnings for this checkpoint.
        model.tokenswap_weights_from = os.path.realpath(resume_from)
    if cfg.load_in_4bit:
        from peft import prepare_model_for_kbit_training

        # Freezes every weight, keeps norms in fp32 and makes inputs require grad (for checkpointing).
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    visual = model.model.visual
    if cfg.freeze_vision_tower:
        for name, p in visual.named_parameters():
            # Qwen3-VL's deepstack mergers feed the LLM like the main merger: they train with it.
            if not name.startswith(("merger.", "deepstack_merger_list.")):
                p.requires_grad_(False)
    if cfg.freeze_merger:
        for name, p in visual.named_parameters():
            if name.startswith(("merger.", "deepstack_merger_list.")):
                p.requires_grad_(False)
    if cfg.lora is not None:
        from peft import get_peft_model

        # Seeded here, not by the caller: without a seed each process of a run drew other adapters (ranks then
        # disagree before the first step). A forked RNG keeps the caller's random state untouched.
        cuda = [torch.cuda.current_device()] if torch.cuda.is_initialized() else []
        with torch.random.fork_rng(devices=cuda):
            torch.random.default_generator.manual_seed(seed)
            if cuda:
                torch.cuda.manual_seed(seed)
            model = get_peft_model(model, peft_lora_config(cfg.lora))
    return model, processor


def peft_lora_config(cfg: LoraConfig):
    """The peft config of a ``model.lora`` section."""
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=cfg.target_modules,
        task_type="CAUSAL_LM",
    )


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
        on_bad_image=cfg.on_bad_image,
        on_bad_sample=cfg.on_bad_sample,
        max_images_per_sample=cfg.max_images_per_sample,
        max_chars_per_sample=cfg.max_chars_per_sample,
        max_image_pixels=cfg.max_image_pixels,
        pack_budget=cfg.pack_budget if cfg.packing else None,
        pixel_dtype=cfg.pixel_dtype,
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

    Logged (cumulative over the batches this process trained, read from a :class:`ResumableCollator`'s
    ``stats``): ``swap/images_per_sample``,
    ``swap/swapped_per_sample``, ``swap/text_by_policy``, ``swap/text_missing_image``,
    ``swap/text_corrupt_image``, ``swap/truncated_samples``, ``swap/dummy_images``, and what cuts
    and packing did: ``swap/tokens_truncated``, ``swap/images_dropped_truncation`` (image blocks cut
    whole at ``max_length``/``pack_budget``), ``swap/packed_rows``. Must run before the reporting
    callbacks; :func:`install_first` puts it there.
    """

    def __init__(self, collator: ResumableCollator):
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
                "swap/tokens_truncated": s["tokens_truncated"],
                "swap/images_dropped_truncation": s["images_dropped_truncation"],
                "swap/packed_rows": s["packed_rows"],
            }
        )
        # Trainer.log stored a copy of `logs` in log_history before calling on_log: keep log_history.json complete.
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update({k: v for k, v in logs.items() if k.startswith("swap/")})


class NoTargetsError(RuntimeError):
    """Too many optimizer steps of a run had no target token (see :class:`EmptyStepCallback`)."""


class EmptyStepCallback(TrainerCallback):
    """Stops a run whose optimizer steps have nothing to learn, instead of training on zero targets with loss 0.

    A forward pre-hook on ``model`` counts the target tokens (``labels != -100``) of every training forward: the
    micro-batches that actually trained, whatever data-loader workers and prefetching do. At each step end the count
    is summed over the ranks (so every rank decides alike), and a step without any target counts as empty (a step
    whose forwards got no ``labels`` at all, as with label smoothing, is not judged). Once more
    than ``max_share`` of the run's ``max_steps`` were empty, :class:`NoTargetsError` names the step and the
    collator's refusal counts; before that each empty step is warned.

    Args:
        model: the model given to the Trainer.
        max_share: ``collator.max_empty_step_share``.
        collator: the collator, whose ``stats`` name the refusals in the error.
    """

    def __init__(self, model, max_share: float, collator=None):
        self.max_share = max_share
        self.collator = collator
        self.empty_steps = 0
        self._targets: torch.Tensor | None = None  # (targets, forwards with labels) of this step on this rank
        model.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module, args, kwargs):
        labels = kwargs.get("labels")
        if module.training and torch.is_tensor(labels):
            # Stays on the device: one sync per step, at step end.
            n = torch.stack([(labels != -100).sum(), torch.ones((), dtype=torch.int64, device=labels.device)])
            self._targets = n if self._targets is None else self._targets + n.to(self._targets.device)

    def on_step_end(self, args, state, control, **kwargs):
        import torch.distributed as dist

        counts = self._targets if self._targets is not None else torch.zeros(2, dtype=torch.int64)
        self._targets = None
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            device = "cpu" if dist.get_backend() == "gloo" else args.device
            counts = counts.to(device=device, dtype=torch.int64)
            dist.all_reduce(counts)
        targets, forwards = (int(v) for v in counts.tolist())
        # No forward saw labels: the Trainer computes the loss itself (label smoothing pops them), so nothing is known.
        if targets > 0 or forwards == 0:
            return
        self.empty_steps += 1
        refusals = {k: v for k, v in (self.collator.stats if self.collator is not None else {}).items()
                    if k.startswith(("samples_skipped_", "samples_dropped_", "samples_truncated", "batches_")) and v}
        what = (f"step {state.global_step} of {state.max_steps} had no target token on any rank (every label -100): its "
                f"samples were refused or cut before their answers (collator counts in this process: {refusals})")
        allowed = self.max_share * state.max_steps
        if self.empty_steps > allowed:
            raise NoTargetsError(
                f"{what}. {self.empty_steps} step(s) without targets so far, more than collator.max_empty_step_share="
                f"{self.max_share} of {state.max_steps} steps allows ({allowed:g}). Fix the data (the collator's "
                "warnings name the refused samples), or raise collator.max_empty_step_share"
            )
        print0(f"[tokenswap] warning: {what}; {self.empty_steps} such step(s) so far, up to {allowed:g} allowed")


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


def close_process_group() -> None:
    """End a successful multi-process run: tear the process group down and exit without finalizing the interpreter.

    Call it last, after every file is written; in a process group it does not return (exit status 0). A no-op in a
    single process, so a recipe's ``main`` called in-process returns as before.

    Why not a normal exit: gloo's worker threads outlive ``destroy_process_group()`` (``ProcessGroupGloo`` has no
    shutdown, and DeepSpeed's engine, its ZeRO-3 optimizer and every partitioned parameter, or DDP's reducer, still
    reference the groups). Such a thread releases each finished collective after the rank waiting on it has moved
    on, and a collective's tensors can belong to Python objects (ZeRO-3's parameters): releasing them takes the GIL.
    If the main thread has started finalizing the interpreter by then, Python ends the worker thread with
    ``pthread_exit``, whose unwinding through a ``noexcept`` destructor calls ``std::terminate``: "terminate called
    without an active exception", SIGABRT, and a launcher reporting a failure after the run had finished and saved
    (a core dump of such an abort: ``ProcessGroupGloo::runLoop`` -> ``~AsyncAllgatherWork`` ->
    ``TensorImpl::decref_pyobject`` -> ``take_gil`` -> ``PyThread_exit_thread``). How often depends on scheduling:
    1 in 42 2-rank ZeRO-3 CPU launches of the tiny run here. Without finalization there is no moment at which a
    thread may not take the GIL, so buffered output is flushed and the process ends with ``os._exit``.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    dist.destroy_process_group()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def finish_wandb() -> None:
    """Close the W&B run opened by :func:`init_wandb` (flushes offline run files)."""
    import sys

    if "wandb" in sys.modules and sys.modules["wandb"].run is not None:
        sys.modules["wandb"].finish()
