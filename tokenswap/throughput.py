"""Throughput accounting: tokens/s, images/s, padding and MFU at every logging step.

:class:`ThroughputCallback` reads what the collator counted (``collator.stats``: real tokens,
token slots including padding, images, image patches, and the sums of squared sample/image
lengths for the attention term) and the wall time between two log lines, and adds to the log
(W&B, ``log_history.json``, and so ``tokenswap compare``):

- ``perf/tokens_per_s``: non-pad tokens per second on this device (rank 0's collator);
- ``perf/images_per_s``: images (not the masked dummy) per second on this device;
- ``perf/padding``: padded token slots / all token slots in the window (dummy-image columns count as padding);
- ``perf/tflops``: achieved model TFLOP/s on this device (formula below);
- ``perf/mfu``: ``perf/tflops`` / the device's peak (``throughput.peak_tflops`` of a recipe's config,
  :class:`tokenswap.training.config.ThroughputConfig`, or the
  table :data:`PEAK_TFLOPS` by the exact device name; not logged when neither knows the device, e.g. CPU).

Model FLOPs of one window (the PaLM appendix-B convention: matmuls only, the causal mask not halved):

- language model, per real token: ``2·N_llm`` forward + ``2·N_llm`` backward through the
  activations (needed whenever anything below is trained) + ``2·N_llm_trainable`` for the weight
  gradients. All trained: ``6·N_llm``; LoRA: about ``4·N_llm``. ``N_llm`` counts the decoder
  layers and the LM head (tied or not: the output matmul is computed), not the input embedding
  (a lookup).
- language-model attention: ``12·L·d_attn`` per token per token of its own sample:
  ``12·L·d_attn·Σ S_i²`` over samples ``i`` of length ``S_i`` (packed samples attend only within
  themselves; padding is not useful work). Only full-attention layers count (Qwen3.5's linear
  layers are in ``N_llm``).
- vision tower, per image patch: ``2·N_vit`` forward (the merger's parameters act once per
  ``merge²`` patches) + ``4·N_vit_trainable`` backward. The backward term assumes the trained part
  sits on top of the tower (the default: blocks frozen, merger trained), so activation gradients
  stop where the trained part starts. Vision attention: ``4·L_v·d_v·Σ P_j²`` over images of
  ``P_j`` patches forward, times 3 when the blocks are trained (Qwen2.5-VL's windowed blocks are
  counted as full attention: an upper bound for that term).

Frozen parts therefore count only their forward (and, for the language model, the activation
gradients that must pass through it). The time is the wall time between log lines, so it
includes data loading, evaluation and checkpointing in that window: the figure is what the run
achieved, not a kernel benchmark. Statistics are per process: ``perf/*`` describe rank 0.
"""

from __future__ import annotations

import math
import time

from transformers import TrainerCallback

__all__ = [
    "PEAK_TFLOPS",
    "ThroughputCallback",
    "model_flop_counts",
    "no_peak_reason",
    "peak_tflops_of",
]

PEAK_TFLOPS: dict[str, float] = {
    # Ampere: SXM and PCIe share the tensor-core peak.
    "NVIDIA A100-SXM4-40GB": 312.0,
    "NVIDIA A100-SXM4-80GB": 312.0,
    "NVIDIA A100-PCIE-40GB": 312.0,
    "NVIDIA A100 80GB PCIe": 312.0,
    "NVIDIA A800-SXM4-80GB": 312.0,
    "NVIDIA A800 80GB PCIe": 312.0,
    # Hopper: the SXM parts 989, NVL 835, PCIe 756 (half the datasheets' with-sparsity figures).
    "NVIDIA H100 80GB HBM3": 989.0,
    "NVIDIA H100 NVL": 835.0,
    "NVIDIA H100 PCIe": 756.0,
    "NVIDIA H800": 989.0,
    "NVIDIA H800 PCIe": 756.0,
    "NVIDIA H200": 989.0,
    "NVIDIA H200 NVL": 835.0,
    "NVIDIA GH200 480GB": 989.0,
}
"""Dense bf16 tensor-core peak per device (TFLOP/s), keyed by the exact ``torch.cuda.get_device_name()``: the
form factors of one chip differ (an H200 NVL or an H100 PCIe is not scored against SXM peaks)."""


def _device_key(device_name: str) -> str:
    return " ".join(device_name.split()).casefold()


_PEAKS = {_device_key(name): peak for name, peak in PEAK_TFLOPS.items()}


def peak_tflops_of(device_name: str | None) -> float | None:
    """The table's peak for an exact device name (``"NVIDIA H100 80GB HBM3"`` -> 989), None if unknown."""
    return _PEAKS.get(_device_key(device_name)) if device_name else None


def no_peak_reason(device_name: str | None) -> str:
    """Why MFU is not given for ``device_name`` (for an ``n/a`` in a report)."""
    if not device_name:
        return "no CUDA device"
    return f"{device_name!r} is not in tokenswap.throughput.PEAK_TFLOPS; set throughput.peak_tflops (--peak-tflops)"


def _numel(p) -> int:
    # Under ZeRO-3 a parameter's local tensor is a shard (often empty); ds_numel is the full size.
    if hasattr(p, "ds_numel"):
        return int(p.ds_numel)
    # A quantised bitsandbytes 4-bit weight (Params4bit) stores two values per uint8 element: its numel() is half
    # the layer's; the quant state keeps the original shape.
    shape = getattr(getattr(p, "quant_state", None), "shape", None)
    if shape is not None:
        return math.prod(shape)
    return p.numel()


def model_flop_counts(model) -> dict[str, float]:
    """Parameter counts and attention shapes that the FLOP formula needs.

    Returns:
        ``n_llm``, ``n_llm_trainable``, ``n_vit`` (merger scaled by ``1/merge²``), ``n_vit_trainable``
        (same scaling), ``llm_attn`` (``L·d_attn`` over full-attention layers), ``vit_attn`` (``L_v·d_v``)
        and ``vit_blocks_trained`` (1.0 when any vision block, not just the merger, is trained).
    """
    config = model.config
    tc = config.text_config
    vc = config.vision_config
    merge2 = vc.spatial_merge_size**2
    out = dict(n_llm=0.0, n_llm_trainable=0.0, n_vit=0.0, n_vit_trainable=0.0, vit_blocks_trained=0.0)
    tied = bool(getattr(config, "tie_word_embeddings", False) or getattr(tc, "tie_word_embeddings", False))
    for name, p in model.named_parameters():
        n = _numel(p)
        if "embed_tokens" in name and not tied:
            continue  # a lookup; the untied lm_head is its own parameter below
        # (tied: this weight is also the LM head, whose matmul and weight gradient are real)
        if ".visual." in f".{name}":
            scale = 1.0 / merge2 if ".merger." in name else 1.0
            out["n_vit"] += n * scale
            if p.requires_grad:
                out["n_vit_trainable"] += n * scale
                if ".merger." not in name:
                    out["vit_blocks_trained"] = 1.0
        else:
            out["n_llm"] += n
            if p.requires_grad:
                out["n_llm_trainable"] += n
    head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
    layer_types = getattr(tc, "layer_types", None) or ["full_attention"] * tc.num_hidden_layers
    full = sum(t != "linear_attention" for t in layer_types)
    out["llm_attn"] = float(full * tc.num_attention_heads * head_dim)
    # Qwen2-VL's vision config calls the ViT width embed_dim (its hidden_size is the LLM's width).
    vit_width = vc.embed_dim if vc.model_type == "qwen2_vl_vision" else vc.hidden_size
    out["vit_attn"] = float(vc.depth * vit_width)
    return out


def window_flops(counts: dict[str, float], tokens: float, token_sq: float, patches: float, patch_sq: float) -> float:
    """Model FLOPs of a window with ``tokens`` real tokens and ``patches`` image patches (module docstring)."""
    llm = (4 * counts["n_llm"] + 2 * counts["n_llm_trainable"]) * tokens + 12 * counts["llm_attn"] * token_sq
    vit = (2 * counts["n_vit"] + 4 * counts["n_vit_trainable"]) * patches
    vit += 4 * counts["vit_attn"] * patch_sq * (3 if counts["vit_blocks_trained"] else 1)
    return llm + vit


class ThroughputCallback(TrainerCallback):
    """Adds ``perf/*`` keys (module docstring) to every log line; install with ``install_first``.

    Args:
        collator: what holds the run's collator ``stats``: a :class:`~tokenswap.training.ResumableCollator`
            (the batches that trained, whatever ``dataloader_num_workers``), or a bare collator run in this process.
        peak_tflops: device peak for MFU; None: from :data:`PEAK_TFLOPS` by the CUDA device name.
    """

    _KEYS = ("tokens", "token_slots", "images", "image_patches", "token_sq", "patch_sq")

    def __init__(self, collator, peak_tflops: float | None = None):
        self.collator = collator
        self.peak = peak_tflops
        self.counts: dict[str, float] | None = None
        self._last: tuple[float, dict[str, float]] | None = None

    def _snapshot(self) -> tuple[float, dict[str, float]]:
        return time.perf_counter(), {k: float(self.collator.stats[k]) for k in self._KEYS}

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is not None:
            self.counts = model_flop_counts(model)
        if self.peak is None:
            import torch

            if torch.cuda.is_available():
                name = torch.cuda.get_device_name()
                self.peak = peak_tflops_of(name)
                if self.peak is None:
                    from tokenswap.ranks import print0

                    print0(f"[tokenswap] perf/mfu not logged: {no_peak_reason(name)}")
        self._last = self._snapshot()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or "loss" not in logs or self._last is None:
            return
        now, stats = self._snapshot()
        t0, before = self._last
        self._last = (now, stats)
        dt = now - t0
        d = {k: stats[k] - before[k] for k in self._KEYS}
        if dt <= 0 or d["token_slots"] <= 0 or min(d.values()) < 0:
            return  # nothing collated yet, or the stats were rewound (a resume restored them): next window
        perf = {
            "perf/tokens_per_s": d["tokens"] / dt,
            "perf/images_per_s": d["images"] / dt,
            "perf/padding": 1.0 - d["tokens"] / d["token_slots"],
        }
        if self.counts is not None:
            tflops = window_flops(self.counts, d["tokens"], d["token_sq"], d["image_patches"], d["patch_sq"]) / dt / 1e12
            perf["perf/tflops"] = tflops
            if self.peak is not None:
                perf["perf/mfu"] = tflops / self.peak
        logs.update(perf)
        # Trainer.log stored a copy of `logs` in log_history before calling on_log: keep log_history.json complete.
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(perf)
