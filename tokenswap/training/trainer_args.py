"""The Trainer pass-through: every ``TrainingArguments`` / ``GRPOConfig`` field from YAML, checked at config time.

:func:`trainer_section` derives a typed section from the Trainer's own dataclass (so a new Trainer option needs
no change here); :func:`build_training_arguments` adds what the recipe owns (output folder, run name, seed).

Importing ``TrainingArguments`` loads torch, transformers and peft (seconds), so this module imports none of them:
:data:`TrainConfig` and :data:`PairedTrainConfig` are :class:`TrainerSection` stand-ins that build the section on
first use, and whose key names are read from the source files without importing them. A recipe's typo is then
answered before those imports (:func:`tokenswap.config.check_config_early`).
"""

from __future__ import annotations

import ast
import copy
import copyreg
import dataclasses
import enum
import functools
import importlib.util
import json
import math
import os
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tokenswap.config import DeferredSection
from tokenswap.errors import InputError
from tokenswap.ranks import rank_and_world
from tokenswap.training.config import RunConfig
from tokenswap.training.tracking import run_name

TRAINER_OWNED: dict[str, str] = {
    "output_dir": "set `run.output_dir`",
    "run_name": "the recipes name runs `{run.pair}-{run.arm}-s{run.seed}`",
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


_CHECKPOINTING_RENAMED = (("gradient_checkpointing", "activation_checkpointing"),
                          ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs"))
"""(old, new): transformers renamed the fields after 5.17; the configs use the new names on every release."""


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
    if self.MAPPED:
        # A transformers with only `gradient_checkpointing` (5.17): the new name, where a YAML sets it, is that
        # field; both read the same afterwards, and only the old one reaches TrainingArguments.
        for new, old in self.MAPPED.items():
            if getattr(self, new) is not None:
                setattr(self, old, getattr(self, new))
            setattr(self, new, getattr(self, old))
        return
    # `gradient_checkpointing` is TrainingArguments' deprecated alias of `activation_checkpointing`: a YAML that
    # sets the old name means it (the new name carries our default, which would otherwise win silently).
    for old, new in _CHECKPOINTING_RENAMED:
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
    names = {f.name for f in dataclasses.fields(args_cls)}
    # Before the rename (transformers 5.17) the new names are section keys of their own, mapped onto the old
    # fields by __post_init__, and the recipes' default goes to the old field.
    mapped = {new: old for old, new in _CHECKPOINTING_RENAMED if new not in names and old in names}
    specs = []
    for f in dataclasses.fields(args_cls):
        if not f.init or f.name.startswith("_") or f.name in owned:
            continue
        key = next((new for new, old in mapped.items() if old == f.name), None)
        if f.name in defaults or key in defaults:
            value = defaults[f.name] if f.name in defaults else defaults[key]
            default = dataclasses.field(default_factory=lambda v=value: copy.deepcopy(v), metadata=f.metadata)
        elif f.default is not dataclasses.MISSING:
            default = dataclasses.field(default=f.default, metadata=f.metadata)
        elif f.default_factory is not dataclasses.MISSING:
            default = dataclasses.field(default_factory=f.default_factory, metadata=f.metadata)
        else:
            continue
        specs.append((f.name, _strict_enum(hints[f.name]), default))
    for new, old in mapped.items():
        specs.append((new, hints[old] | None, dataclasses.field(default=None, metadata={"help": f"`{old}`"})))
    cls = dataclasses.make_dataclass(
        name,
        specs,
        kw_only=True,
        namespace={"__post_init__": _check_trainer_values, "ARGS_CLASS": args_cls, "OWNED": owned,
                   "MAPPED": mapped},
    )
    cls.__module__ = __name__
    cls.__doc__ = f"Every `{args_cls.__name__}` field (see its documentation), except: " + "; ".join(
        f"`{k}`: {v}" for k, v in owned.items()
    )
    return cls


TRAINING_ARGUMENTS = ("transformers", "training_args.py", "TrainingArguments")
"""Where ``TrainingArguments`` is written: (top-level package, file inside it, class)."""

GRPO_CONFIG = ("trl", "trainer/grpo_config.py", "GRPOConfig")
"""Where TRL's ``GRPOConfig`` is written (its fields on top of ``TrainingArguments``')."""

TRL_BASE_CONFIG = ("trl", "trainer/base_config.py", "_BaseConfig")
"""The class between ``TrainingArguments`` and TRL's configs (it re-declares some fields; a new one would be here)."""


@functools.cache
def source_fields(package: str, path: str, class_name: str) -> frozenset[str] | None:
    """The init fields a dataclass declares in its own body, read from its source without importing it.

    ``package`` is found (not imported) by :func:`importlib.util.find_spec`; None when the file or the class is not
    where it was (a release that moved it): then only the full parse checks the keys.
    """
    try:
        spec = importlib.util.find_spec(package)
        roots = list(spec.submodule_search_locations or ()) if spec is not None else []
        tree = ast.parse(Path(roots[0], path).read_text(encoding="utf-8")) if roots else None
    except (ImportError, ValueError, OSError, SyntaxError):
        return None
    body = next((node.body for node in (tree.body if tree else ()) if isinstance(node, ast.ClassDef)
                 and node.name == class_name), None)
    if body is None:
        return None
    names = set()
    for node in body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        init = not any(k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False
                       for k in (node.value.keywords if isinstance(node.value, ast.Call) else ()))
        if init and not node.target.id.startswith("_"):
            names.add(node.target.id)
    return frozenset(names) or None


class TrainerSection(DeferredSection):
    """A ``train:`` section of every field of a Trainer's arguments class, built by ``build`` on first use.

    A recipe types its field with it (``train: PairedTrainConfig = field(default_factory=PairedTrainConfig)``);
    :meth:`resolve` is the dataclass :func:`trainer_section` makes (what the full parse and ``--help`` use), and
    :meth:`known_keys` the field names of ``sources`` (:data:`TRAINING_ARGUMENTS`, :data:`GRPO_CONFIG`) read from
    their files. ``owned`` are the keys the recipe sets itself.
    """

    def __init__(self, name: str, build: Callable[[], type], sources: tuple[tuple[str, str, str], ...],
                 owned: dict[str, str] = TRAINER_OWNED):
        super().__init__(name, owned)
        self._build = build
        self._sources = sources

    @functools.cached_property
    def _resolved(self) -> type:
        return self._build()

    def resolve(self) -> type:
        return self._resolved

    def known_keys(self) -> frozenset[str] | None:
        found = [source_fields(*src) for src in self._sources]
        if any(f is None for f in found):
            return None
        names = frozenset().union(*found) - self.owned.keys()
        return names | {new for old, new in _CHECKPOINTING_RENAMED if old in names}


def _training_arguments() -> type:
    from transformers import TrainingArguments

    return TrainingArguments


TrainConfig = TrainerSection("TrainConfig", lambda: trainer_section(_training_arguments(), "TrainConfig"),
                             (TRAINING_ARGUMENTS,))
"""Every ``TrainingArguments`` field, with the recipes' defaults (:data:`TRAIN_DEFAULTS`)."""


PairedTrainConfig = TrainerSection(
    "PairedTrainConfig",
    lambda: trainer_section(_training_arguments(), "PairedTrainConfig", owned=PAIRED_OWNED),
    (TRAINING_ARGUMENTS,),
    PAIRED_OWNED,
)
"""``TrainConfig`` for the paired recipes: the sample order belongs to ``data.seed``."""


def _redacted_state(state: dict) -> dict:
    """An arguments object's attributes with credentials masked (by field name, URL user info, known values)."""
    from tokenswap.redaction import mask_secrets

    return {k: mask_secrets(v, k) if isinstance(v, (str, dict, list, tuple)) else v for k, v in state.items()}


@functools.cache
def redacting(args_cls: type) -> type:
    """``args_cls`` (``TrainingArguments``, ``GRPOConfig``) whose every outward copy has its credentials masked.

    The Trainer keeps the real values (``hub_token`` must reach the hub), but hands its arguments out through
    ``to_dict`` (the W&B callback's run config and W&B's ``debug.log``, MLflow, TensorBoard hparams), ``str``
    (logs) and pickling (``torch.save(self.args)`` into every ``checkpoint-*/training_args.bin``, the output
    folder and what a hub push uploads). Each of those masks ``hub_token``, every ``*_token``/``*_secret``/
    ``password`` field, ``user:password@`` in any URL and any secret tokenswap knows (:mod:`tokenswap.redaction`).
    A pickle loads as ``args_cls`` itself (no tokenswap needed to read it); nothing in the Trainer reads
    ``training_args.bin`` back (resume restores model, optimizer, scheduler, RNG and ``trainer_state.json``), so
    resuming is unchanged. ``copy``/``deepcopy`` keep the real values.
    """

    def to_dict(self) -> dict:
        from tokenswap.redaction import mask_secrets

        return mask_secrets(args_cls.to_dict(self))

    def __str__(self) -> str:
        return "".join([f"{args_cls.__name__}(\n", *(f"{k}={v},\n" for k, v in sorted(self.to_dict().items())), ")"])

    def __reduce_ex__(self, protocol):
        # copyreg's own reconstructor: the pickle names only args_cls and the standard library.
        return copyreg._reconstructor, (args_cls, object, None), _redacted_state(self.__dict__)

    def __copy__(self):
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def __deepcopy__(self, memo):
        new = object.__new__(type(self))
        memo[id(self)] = new
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return new

    namespace = {"to_dict": to_dict, "__str__": __str__, "__repr__": __str__, "__reduce_ex__": __reduce_ex__,
                 "__copy__": __copy__, "__deepcopy__": __deepcopy__, "__module__": __name__,
                 "__doc__": args_cls.__doc__}
    return type(args_cls.__name__, (args_cls,), namespace)


def gpu_settings(bf16: bool, deepspeed) -> list[str]:
    """The settings of a run's ``train`` section that are written for CUDA GPUs, each in a few words."""
    settings = ["train.bf16 (bf16 mixed precision)"] if bf16 else []
    if deepspeed:
        stage = None
        try:
            if isinstance(deepspeed, dict):
                stage = deepspeed.get("zero_optimization", {}).get("stage")
            else:
                with open(deepspeed) as f:
                    stage = json.load(f).get("zero_optimization", {}).get("stage")
        except (OSError, ValueError, AttributeError):
            pass  # an unreadable file is TrainingArguments' to name; here it is only described
        settings.append(f"train.deepspeed (DeepSpeed{f' ZeRO-{stage}' if stage else ''} on CUDA)")
    return settings


def needs_a_gpu(settings: list[str], forcing: bool = True) -> str:
    """One line: this config needs a GPU (``settings`` say why), and where the configs for this machine are;
    ``forcing`` adds the overrides that run it on CPU anyway (for a model small enough)."""
    force = "; a small model runs it on CPU with train.bf16=false train.use_cpu=true" if forcing else ""
    return (f"this config needs a GPU and this machine has none: {', '.join(settings)}; on CPU start from a config of "
            f"configs/tiny/ (on one GPU, configs/one_gpu/){force}")


def build_training_arguments(train, run: RunConfig, **recipe: Any):
    """The Trainer's arguments for one run, after setting up the process state every recipe needs.

    Multi-process CPU runs need a gloo ``PartialState`` built before the arguments (and reused by the
    Trainer); DeepSpeed needs ``ACCELERATE_USE_DEEPSPEED`` before any state exists. ``recipe`` holds the
    values the recipe owns (``train_sampling_strategy``, ...). Like :func:`tokenswap.config.parse_config`,
    a value ``TrainingArguments`` rejects is raised as a :class:`~tokenswap.config.ConfigError` (exit status 2
    through the recipe's entry), as are settings this machine cannot run (fp16 on CPU, liger without its package).
    """
    import torch
    from accelerate import PartialState

    from tokenswap.config import ConfigError

    kwargs = {f.name: getattr(train, f.name) for f in dataclasses.fields(train) if f.name not in train.MAPPED}
    if kwargs.get("bf16") and not kwargs.get("use_cpu") and not torch.cuda.is_available():
        # TrainingArguments' own words ("Your setup doesn't support bf16/gpu") say neither what else in the config
        # is GPU-only nor where a CPU config lives.
        raise InputError(needs_a_gpu(gpu_settings(True, kwargs.get("deepspeed"))))
    if kwargs.get("use_liger_kernel") and importlib.util.find_spec("liger_kernel") is None:
        # liger-kernel 0.8.5 patches every family tokenswap supports (qwen2_vl ... qwen3_5_moe); it needs Triton + CUDA.
        raise InputError("train.use_liger_kernel needs liger-kernel: pip install 'tokenswap[gpu]'")
    if kwargs.get("fp16") and (kwargs.get("use_cpu") or not torch.cuda.is_available()):
        # Accepted by TrainingArguments on CPU, where it does not give the fp16 training the user asked for.
        raise InputError("train.fp16 needs a CUDA GPU and this run has none (or train.use_cpu is set); on CPU set "
                         "train.fp16: false (train.bf16: true for mixed precision)")
    if kwargs.get("deepspeed"):
        os.environ.setdefault("ACCELERATE_USE_DEEPSPEED", "true")
    _, world = rank_and_world()
    if world > 1 and (kwargs.get("use_cpu") or not torch.cuda.is_available()):
        # CPU ranks talk over gloo; the Trainer must reuse this state instead of building its own.
        PartialState(cpu=not kwargs.get("deepspeed"), backend="gloo")
        given = kwargs.get("accelerator_config") or {}
        if isinstance(given, str):
            with open(given) as f:
                given = json.load(f)
        kwargs["accelerator_config"] = {**given, "use_configured_state": True}
    from tokenswap.redaction import mask_secrets

    mask_secrets(kwargs)  # remembers hub_token and URL credentials: masked wherever they would be printed
    try:
        return redacting(train.ARGS_CLASS)(
            output_dir=run.output_dir,
            run_name=run_name(run),
            seed=run.seed,
            remove_unused_columns=False,
            **{**kwargs, **recipe},  # a recipe's value wins over the section's (image SFT's grouped order)
        )
    except (ValueError, TypeError) as e:  # the message may quote a value: mask_secrets remembered the secrets
        problem = f"train: {e}"
        if kwargs.get("bf16") and "bf16" in str(e):  # the paper's configs on a machine without a bf16 GPU
            problem += (" (this config trains in bf16 on GPUs; on this machine pass train.bf16=false "
                        "train.use_cpu=true, or start from a config of configs/tiny/)")
        raise ConfigError([problem], f"train ({train.ARGS_CLASS.__name__})") from None
