"""Attention kernels for packed rows: the fastest exact one the machine has.

A packed row (:mod:`tokenswap.packing`) holds several samples end to end, with no ``attention_mask`` and a
text-position row that restarts at 0 for each sample. Every kernel here attends causally within each
sample only, so a packed row computes exactly what its samples compute one at a time, and none of them
spends FLOPs on the cross-sample part of the ``T x T`` score matrix that sdpa/eager would compute and
then mask away.

``model.attn_implementation: auto`` picks, for packed training, the first that runs:

=====================  ================================  =============================================
name (YAML)            transformers name                 needs
=====================  ================================  =============================================
``flash_attention_2``  ``flash_attention_2``             the flash-attn package, CUDA
``varlen``             ``tokenswap_varlen``              ``torch.nn.attention.varlen`` (torch >= 2.10),
                                                         CUDA, an Ampere or newer GPU
``flex_attention``     ``tokenswap_flex``                ``torch.nn.attention.flex_attention``
                                                         (compiled on CUDA; on CPU unfused and
                                                         forward only: torch has no CPU backward)
``sdpa``               ``tokenswap_varlen_sdpa``         nothing: one sdpa call per sample (CPU)
=====================  ================================  =============================================

Each name can also be set explicitly. Batches that are not packed (a padding ``attention_mask``), the
vision tower (called per image, without text positions) and decoding fall through to sdpa, so padded
runs keep sdpa (or flash-attention 2) as before.
"""

from __future__ import annotations

import importlib.util
import inspect
import warnings

import torch

__all__ = [
    "FLEX",
    "PACKED_KERNELS",
    "VARLEN",
    "VARLEN_SDPA",
    "packed_attention_choice",
    "packed_segments",
    "register_packed_attention",
    "resolve_packed_attention",
    "use_packed_attention",
]

VARLEN = "tokenswap_varlen"
"""torch's own variable-length (flash) attention, ``torch.nn.attention.varlen.varlen_attn``."""
FLEX = "tokenswap_flex"
"""FlexAttention with a per-sample causal block mask."""
VARLEN_SDPA = "tokenswap_varlen_sdpa"
"""One causal sdpa call per packed sample."""

PACKED_KERNELS = {
    "flash_attention_2": "flash_attention_2",
    "varlen": VARLEN,
    "flex_attention": FLEX,
    "sdpa": VARLEN_SDPA,
}
"""YAML name -> transformers ``attn_implementation`` used for packed batches, fastest first."""


# ---------------------------------------------------------------------------- which kernels can run here
def _flash_attn_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def _varlen_fn():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def _flex_fn():
    try:
        from torch.nn.attention.flex_attention import flex_attention
    except ImportError:
        return None
    return flex_attention


def _why_not(name: str, device: str, training: bool = True) -> str | None:
    """None when the kernel ``name`` (a YAML name) runs on ``device``, else the reason it does not."""
    cuda = device == "cuda"
    if name == "flash_attention_2":
        if not _flash_attn_installed():
            return "the flash-attn package is not installed"
        return None if cuda else "flash-attn runs on CUDA only"
    if name == "varlen":
        if _varlen_fn() is None:
            return f"torch {torch.__version__} has no torch.nn.attention.varlen (torch >= 2.10)"
        if not cuda:
            return "torch's varlen attention runs on CUDA only"
        if torch.cuda.get_device_capability()[0] < 8:
            return "torch's varlen attention needs an Ampere or newer GPU (compute capability 8.0)"
        return None
    if name == "flex_attention":
        if _flex_fn() is None:
            return f"torch {torch.__version__} has no torch.nn.attention.flex_attention"
        if cuda and importlib.util.find_spec("triton") is None:
            return "compiled FlexAttention needs triton"
        if not cuda and training:
            return f"torch {torch.__version__} runs FlexAttention's backward on CUDA only (forward-only use is fine)"
        return None
    if name == "sdpa":
        return None
    raise ValueError(f"unknown packed attention {name!r}; choose one of {['auto', *PACKED_KERNELS]}")


def packed_attention_choice(requested: str, device: str, training: bool = True) -> tuple[str, str]:
    """The YAML name of the kernel packed rows use, and why (for the log line).

    Args:
        requested: ``auto`` or a name in :data:`PACKED_KERNELS` (``eager`` stays eager, for debugging).
        device: ``"cuda"`` or ``"cpu"``.
        training: whether gradients flow through the kernel (evaluation-only use admits more kernels).

    Raises:
        ValueError: a kernel named explicitly that cannot run here, saying why and what to set instead.
    """
    if requested == "eager":
        return "eager", "requested; computes the whole T x T score matrix of each row"
    if requested != "auto":
        why = _why_not(requested, device, training)
        if why is not None:
            raise ValueError(
                f"model.attn_implementation={requested} cannot run packed rows here: {why}. "
                "Set model.attn_implementation=auto to take the fastest kernel this machine has."
            )
        return requested, "requested"
    skipped = []
    # CPU: FlexAttention runs unfused (the full score matrix, per row) there; per-sample sdpa is faster.
    for name in PACKED_KERNELS if device == "cuda" else ("sdpa",):
        why = _why_not(name, device, training)
        if why is None:
            return name, "auto" + (f" ({'; '.join(skipped)})" if skipped else "")
        skipped.append(f"not {name}: {why}")
    raise AssertionError("per-sample sdpa always runs")  # pragma: no cover


def resolve_packed_attention(requested: str, device: str, training: bool = True) -> str:
    """The transformers ``attn_implementation`` for packed batches (registered with transformers)."""
    return _registered(packed_attention_choice(requested, device, training)[0])


def _registered(name: str) -> str:
    """The transformers name of the kernel ``name`` (a YAML name), registered when it is one of ours."""
    impl = PACKED_KERNELS.get(name, name)
    if impl.startswith("tokenswap_"):
        register_packed_attention()
    return impl


_LOGGED: set[tuple[str, str]] = set()


def use_packed_attention(model, requested: str = "auto", device: str | None = None, training: bool = True) -> str:
    """Switch ``model`` to the packed-attention kernel; says once which one ("packed attention: ...").

    Args:
        model: a transformers model (loaded with sdpa, eager, flash_attention_2 or one of ours).
        requested: ``model.attn_implementation`` from the config.
        device: where the model will run; default CUDA when available.
        training: whether the model will be trained (False admits forward-only kernels, for evaluation).

    Returns:
        The transformers ``attn_implementation`` the model now uses.
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    name, why = packed_attention_choice(requested, device, training)
    impl = _registered(name)
    if model.config._attn_implementation != impl:
        model.set_attn_implementation(impl)
    if (impl, why) not in _LOGGED:
        _LOGGED.add((impl, why))
        from tokenswap.ranks import print0

        print0(f"[tokenswap] packed attention: {name} ({impl} on {device}; {why})")
    return model.config._attn_implementation


# ---------------------------------------------------------------------------- the kernels
def packed_segments(position_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``cu_seqlens`` (int32, over the flattened ``B*T`` tokens) and the longest segment of packed rows.

    A segment starts at every row start and wherever the text position does not step by +1 (the rule
    of transformers' ``find_packed_sequence_indices``), so row padding, which forms its own position run,
    is a segment of its own.

    >>> packed_segments(torch.tensor([[0, 1, 2, 0, 1], [0, 1, 0, 1, 2]]))
    (tensor([ 0,  3,  5,  7, 10], dtype=torch.int32), 3)
    """
    B, T = position_ids.shape
    flat = position_ids.reshape(-1)
    start = torch.ones_like(flat, dtype=torch.bool)
    start[1:] = flat[1:] != flat[:-1] + 1
    start[::T] = True
    starts = torch.nonzero(start).flatten()
    cu = torch.cat([starts, starts.new_tensor([B * T])]).to(torch.int32)
    return cu, int(torch.diff(cu).max())


class _LastSegments:
    """Segments of the last position tensor seen: every layer of one forward passes the same tensor, so the
    boundaries (and their one device-to-host sync) are computed once per forward, not once per layer."""

    def __init__(self, build):
        self.build = build
        self.key = None
        self.value = None

    def __call__(self, position_ids: torch.Tensor, batch: int):
        key = (position_ids, position_ids._version, batch)
        if self.key is None or self.key[0] is not position_ids or self.key[1:] != key[1:]:
            # Some models pass one position row for the whole batch.
            rows = position_ids.expand(batch, -1) if position_ids.shape[0] != batch else position_ids
            self.key, self.value = key, self.build(rows)
        return self.value


_segments = _LastSegments(packed_segments)


def _is_packed(query, key, position_ids) -> bool:
    T = query.shape[2]
    return position_ids is not None and position_ids.shape[-1] == T and key.shape[2] == T and T > 1


def _sdpa(module, query, key, value, attention_mask, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def _varlen_sdpa(module, query, key, value, attention_mask, position_ids=None, **kwargs):
    """sdpa per packed sample: each run of text positions (0, 1, 2, ...) attends causally within itself."""
    if not _is_packed(query, key, position_ids):
        return _sdpa(module, query, key, value, attention_mask, **kwargs)
    kwargs.pop("is_causal", None)
    cu, _ = _segments(position_ids, query.shape[0])
    T = query.shape[2]
    bounds = cu.tolist()
    rows = []
    for b in range(query.shape[0]):
        lengths = [e - a for a, e in zip(bounds, bounds[1:]) if b * T <= a < (b + 1) * T]
        # split, not slicing: its backward concatenates the gradients instead of zero-filling a full
        # tensor per sample.
        parts = zip(*(x[b : b + 1].split(lengths, dim=2) for x in (query, key, value)))
        rows.append(torch.cat([_sdpa(module, q, k, v, None, is_causal=True, **kwargs)[0] for q, k, v in parts],
                              dim=1))
    return torch.cat(rows, dim=0), None


_VARLEN_PARAMS: frozenset[str] | None = None


def _varlen_cannot_run(query: torch.Tensor, dropout: float) -> str | None:
    """Why torch's flash kernel cannot take these inputs (it runs half precision on CUDA, without dropout)."""
    if not query.is_cuda:
        return f"{query.device.type} tensors"
    if query.dtype not in (torch.float16, torch.bfloat16):
        return f"{query.dtype}"
    return "attention dropout" if dropout else None


def _torch_varlen(module, query, key, value, attention_mask, position_ids=None, scaling=None, dropout=0.0,
                  **kwargs):
    """torch's varlen flash kernel over the flattened rows, one causal segment per packed sample."""
    global _VARLEN_PARAMS
    if not _is_packed(query, key, position_ids):
        return _sdpa(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    why = _varlen_cannot_run(query, dropout)
    if why is not None:
        # e.g. fp32 weights without autocast: stay exact, with the next kernel in line.
        _warn_once(f"varlen attention cannot run these batches ({why}); using FlexAttention for them")
        return _flex(module, query, key, value, attention_mask, position_ids=position_ids, scaling=scaling, **kwargs)
    varlen_attn = _varlen_fn()
    if _VARLEN_PARAMS is None:
        _VARLEN_PARAMS = frozenset(inspect.signature(varlen_attn).parameters)
    B, H, T, D = query.shape
    Hkv = key.shape[1]
    cu, longest = _segments(position_ids, B)
    q = query.transpose(1, 2).reshape(B * T, H, D)
    k = key.transpose(1, 2).reshape(B * T, Hkv, D)
    v = value.transpose(1, 2).reshape(B * T, Hkv, D)
    extra = {}
    # torch 2.10 spells causal as is_causal, later releases as a (left, right) window.
    if "window_size" in _VARLEN_PARAMS:
        extra["window_size"] = (-1, 0)
    else:
        extra["is_causal"] = True
    if H != Hkv:
        if "enable_gqa" in _VARLEN_PARAMS:
            extra["enable_gqa"] = True
        else:
            k, v = (x.repeat_interleave(H // Hkv, dim=1) for x in (k, v))
    if "scale" in _VARLEN_PARAMS:
        extra["scale"] = scaling
    elif scaling is not None:
        q = q * (scaling * D**0.5)  # the kernel's own scale is 1/sqrt(D)
    out = varlen_attn(q, k, v, cu, cu, longest, longest, **extra)
    return out.view(B, T, H, D), None


_COMPILED_FLEX = None


def _flex_attention(device: torch.device):
    global _COMPILED_FLEX
    flex_attention = _flex_fn()
    if device.type != "cuda":
        return flex_attention  # unfused but exact; compiling for CPU costs more than the tiny runs it serves
    if _COMPILED_FLEX is None:
        # dynamic: packed rows change length every batch; a static compile would recompile per length.
        _COMPILED_FLEX = torch.compile(flex_attention, dynamic=True)
    return _COMPILED_FLEX


def _block_mask(position_ids: torch.Tensor):
    from torch.nn.attention.flex_attention import create_block_mask

    B, T = position_ids.shape
    cu, _ = packed_segments(position_ids)
    # The sample each flattened token belongs to; tokens attend within their sample, causally.
    sample = torch.zeros(B * T, dtype=torch.int32, device=position_ids.device)
    sample[cu[1:-1].long()] = 1
    sample = sample.cumsum(0).view(B, T)

    def mask_mod(b, h, q, kv):
        return (sample[b, q] == sample[b, kv]) & (q >= kv)

    return create_block_mask(mask_mod, B, None, T, T, device=position_ids.device,
                             _compile=position_ids.is_cuda)


_blocks = _LastSegments(_block_mask)


def _flex(module, query, key, value, attention_mask, position_ids=None, scaling=None, **kwargs):
    """FlexAttention with a block mask that skips every block two samples share no token pair in."""
    if not _is_packed(query, key, position_ids):
        return _sdpa(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        out = _flex_attention(query.device)(
            query, key, value, block_mask=_blocks(position_ids, query.shape[0]), scale=scaling,
            enable_gqa=query.shape[1] != key.shape[1],
        )
    return out.transpose(1, 2).contiguous(), None


def _packed_mask(*, attention_mask=None, **kwargs):
    """No mask for packed rows (each kernel separates the samples itself); sdpa's for padded batches."""
    from transformers.masking_utils import sdpa_mask

    return None if attention_mask is None else sdpa_mask(attention_mask=attention_mask, **kwargs)


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, stacklevel=3)


def register_packed_attention() -> None:
    """Register tokenswap's packed-attention kernels (:data:`VARLEN`, :data:`FLEX`, :data:`VARLEN_SDPA`)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    for name, fn in ((VARLEN, _torch_varlen), (FLEX, _flex), (VARLEN_SDPA, _varlen_sdpa)):
        AttentionInterface.register(name, fn)
        AttentionMaskInterface.register(name, _packed_mask)
