"""Model loading: the checks that need only ``config.json``, then weights, quantization, LoRA and attention.

:func:`check_inputs` runs before any data or weights load (exit 2 with every problem and its fix);
:func:`load_model_and_processor` is the one path from a checkpoint folder or hub id to a trainable model.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from tokenswap.data.tokenswap_bench import BENCH_HOLDS
from tokenswap.errors import InputError
from tokenswap.inputs import MODEL_HOLDS, local_or_hub, tiny_kit_hint
from tokenswap.ranks import print0
from tokenswap.store.image_store import ImageStore
from tokenswap.training.config import CollatorConfig, GapEvalConfig, LoraConfig, ModelConfig


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
    print0("[tokenswap] flash-attn not available (or no CUDA): padded batches use sdpa attention")
    return "sdpa"


_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "auto": "auto"}


def _check_model_path(name_or_path: str) -> None:
    """A local folder that is not there gets a clear error (the Hub client would say "Repo id must ..."); local or
    hub is :func:`tokenswap.inputs.local_or_hub`'s rule, the one the commands use."""
    local_or_hub(name_or_path, "model.name_or_path", MODEL_HOLDS)


def model_family(cfg: ModelConfig):
    """The :class:`~tokenswap.families.Family` of ``cfg.name_or_path``, read from its ``config.json`` (no weights).

    Raises:
        FileNotFoundError: a local folder that does not exist, or a hub id that cannot be loaded.
        UnsupportedFamilyError: a model type outside the family table; names the supported ones.
    """

    from tokenswap.families import family_of

    return family_of(_model_config(cfg).model_type)


def _model_config(cfg: ModelConfig):
    """The model's ``config.json`` (no weights); FileNotFoundError naming the path when it cannot be read."""
    from transformers import AutoConfig

    _check_model_path(cfg.name_or_path)
    try:
        return AutoConfig.from_pretrained(cfg.name_or_path)
    except OSError as e:
        raise FileNotFoundError(
            f"model.name_or_path {cfg.name_or_path!r} is neither a local checkpoint folder (cwd {os.getcwd()}) "
            f"nor loadable as a hub id: {str(e).splitlines()[0]}"
        ) from None


def largest_image_block(cfg: ModelConfig, config) -> int:
    """Tokens of the largest image block the processor makes: ``model.max_pixels`` over the area of one merged
    patch (``patch_size * spatial_merge_size`` squared, from the vision config), plus the vision start/end."""
    vision = getattr(config, "vision_config", None)
    side = int(getattr(vision, "patch_size", 14)) * int(getattr(vision, "spatial_merge_size", 2))
    return cfg.max_pixels // (side * side) + 2


def _bench_problems(gap_eval: GapEvalConfig) -> list[str]:
    """``gap_eval.bench`` checked without loading it: a local folder must hold both configs of the split with at
    least one row (parquet metadata only); a hub id is left to the loader."""
    bench = gap_eval.bench
    if bench is None:
        return []
    try:
        root = local_or_hub(bench, "`gap_eval.bench`", BENCH_HOLDS + ", or null to evaluate nothing")
    except InputError as e:
        return [str(e)]
    if root is None:  # a hub id: left to the loader
        return []
    if not root.is_dir():
        return [f"`gap_eval.bench` {bench!r} is not a folder; {BENCH_HOLDS}, or null to evaluate nothing"]
    import pyarrow.parquet as pq

    problems = []
    for config in ("text", "img"):
        split = gap_eval.split
        files = sorted(root.glob(f"{config}/{split}-*.parquet")) or sorted(root.glob(f"{config}/{split}/*.parquet"))
        if not files:
            if not (root / "README.md").exists():
                problems.append(f"`gap_eval.bench` {bench}: no {config}/{split}-*.parquet (gap_eval.split={split!r}); "
                                "lay it out as tokenswap build-bench writes it, or fix gap_eval.split")
            continue
        try:
            rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a damaged file
            problems.append(f"`gap_eval.bench` {files[0]}: not a readable parquet file ({type(e).__name__}: {e})")
            continue
        if rows == 0:
            problems.append(f"`gap_eval.bench` {bench}: {config}/{split} has no rows ({', '.join(f.name for f in files)})"
                            "; rebuild the bench, or set gap_eval.bench: null to evaluate nothing")
    return problems


def check_inputs(
    model: ModelConfig,
    *,
    packing: bool = False,
    image_store: str | None = None,
    paths: dict[str, str | None] | None = None,
    device: str | None = None,
    collator: CollatorConfig | None = None,
    args=None,
    gap_eval: GapEvalConfig | None = None,
) -> None:
    """A run's inputs checked against its settings before any data or weights load.

    Like :func:`tokenswap.config.parse_config`, every problem is raised with its fix in one ``ConfigError`` (exit 2):
    a local path that does not exist (``paths``: config key -> path, None skipped), an image store that is missing or
    damaged, a model folder that is missing, a family tokenswap does not support, or ``collator.packing`` for a family
    whose samples cannot be separated in a packed row (Qwen3.5), or a ``model.attn_implementation`` named that
    cannot run on ``device`` (default CUDA when available), or ``collator.resample_each_epoch`` with persistent
    dataloader workers in ``args`` (the workers keep the collator of the first epoch and would never redraw), a
    ``collator.prepared`` folder that does not exist, a ``collator.pack_budget`` smaller than one image block
    (:func:`largest_image_block`), or a ``gap_eval.bench`` folder that is missing or has no rows. The model is
    judged from its ``config.json`` alone; each of these would otherwise surface as a traceback after the data and
    the model loaded (or, for ``prepared``, be ignored).
    """
    from tokenswap.attention import packed_attention_choice
    from tokenswap.config import ConfigError
    from tokenswap.packing import RopeIndex

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available() and (settings := _gpu_only(model, args)):
        # Before any path or hub lookup: with no GPU the rest does not matter, and a hub id's lookup retries for
        # tens of seconds on a machine that cannot reach the hub.
        from tokenswap.training.trainer_args import needs_a_gpu

        raise InputError(needs_a_gpu(settings, forcing=False))
    problems = [f"`{key}` {path!r} does not exist (cwd {os.getcwd()}){tiny_kit_hint(path)}"
                for key, path in (paths or {}).items() if path is not None and not os.path.exists(path)]
    if (collator is not None and collator.resample_each_epoch and args is not None
            and args.dataloader_num_workers > 0 and args.dataloader_persistent_workers):
        problems.append("`collator.resample_each_epoch` needs the collator's epoch in every worker, but persistent "
                        "dataloader workers keep the collator of the first epoch; set "
                        "train.dataloader_persistent_workers: false (or collator.resample_each_epoch: false)")
    if collator is not None and collator.prepared is not None and not os.path.isdir(collator.prepared):
        problems.append(f"`collator.prepared` {collator.prepared!r} is not a folder (cwd {os.getcwd()}); give the "
                        "folder tokenswap.store.prepare.prepare_store wrote for this processor, or remove the key")
    if image_store is not None:
        try:
            ImageStore(image_store)
        except (FileNotFoundError, ValueError) as e:  # StoreFormatError is a ValueError
            problems.append(f"`image_store`: {e}{tiny_kit_hint(image_store)}")
    if gap_eval is not None:
        problems += _bench_problems(gap_eval)
    try:
        from tokenswap.families import family_of

        config = _model_config(model)
        family = family_of(config.model_type)
        if packing:
            RopeIndex(family.name, 2)  # refuses, naming the family and why, what it cannot pack
            block = largest_image_block(model, config)
            if collator is not None and collator.pack_budget < block:
                problems.append(f"`collator.pack_budget` {collator.pack_budget} is smaller than one image block: "
                                f"model.max_pixels={model.max_pixels} makes blocks of up to {block} tokens, which are "
                                f"never split; set collator.pack_budget >= {block} (a whole micro-batch: about "
                                "per_device_train_batch_size x the mean sample length), or lower model.max_pixels")
    except (FileNotFoundError, ValueError) as e:  # UnsupportedFamilyError, PackingNotSupportedError: ValueErrors
        problems.append(str(e))
    if packing or model.attn_implementation == "flash_attention_2":
        try:
            packed_attention_choice(model.attn_implementation, device)
        except ValueError as e:
            problems.append(str(e))
    if problems:
        raise ConfigError(problems, "the run inputs")


CPU_MODEL_LIMIT_B = 3.0
"""The largest model, in billions of parameters as its hub name states them, that a CPU run is let load: above it
a training step takes hours and the weights alone fill most machines' memory."""


def _gpu_only(model: ModelConfig, args) -> list[str]:
    """The settings that refuse a CPU run, judged from the config alone (no lookup): a model whose name states more
    than :data:`CPU_MODEL_LIMIT_B` parameters, or flash_attention_2; with either, the GPU-only ``train`` settings
    are named too. Empty when the config can run on CPU."""
    import re

    from tokenswap.training.trainer_args import gpu_settings

    sizes = [float(n) for n in re.findall(r"(?:^|[-_])(\d+(?:\.\d+)?)[bB](?=$|[-_])",
                                           os.path.basename(str(model.name_or_path).rstrip("/")))]
    found = []
    if sizes and max(sizes) > CPU_MODEL_LIMIT_B:
        found.append(f"model.name_or_path {model.name_or_path} ({max(sizes):g}B parameters)")
    if model.attn_implementation == "flash_attention_2":
        found.append("model.attn_implementation flash_attention_2 (CUDA only)")
    if found and args is not None:
        found += gpu_settings(bool(getattr(args, "bf16", False)), getattr(args, "deepspeed", None))
    return found


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
        # Every base weight frozen; the adapters added below train. Not peft's prepare_model_for_kbit_training: it
        # also casts every unquantised weight (embeddings, norms, vision tower) to fp32, so a bf16 run computed its
        # activations in fp32 and handed fp32 queries to the attention kernel (torch's varlen kernel takes bf16 or
        # fp16 only: packed QLoRA rows silently ran FlexAttention). Qwen's RMSNorm computes in fp32 by itself.
        for p in model.parameters():
            p.requires_grad_(False)
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
