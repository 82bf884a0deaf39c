"""Packed-attention kernels: which one runs where.

Their exactness (each kernel's packed rows against the samples run one at a time, torch's varlen kernel
through a CPU reference) is in test_packing.py.
"""

from __future__ import annotations

import pytest
import torch

import tokenswap.attention as attention
from tokenswap.attention import (
    VARLEN_SDPA,
    packed_attention_choice,
    packed_segments,
    resolve_packed_attention,
)


def test_segments_start_at_each_row_and_each_position_reset():
    pos = torch.tensor([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1]])
    cu, longest = packed_segments(pos)
    assert cu.tolist() == [0, 3, 5, 6, 10, 12] and cu.dtype == torch.int32 and longest == 4
    # A row that continues its predecessor's positions still starts a segment (rows never share one).
    cu, _ = packed_segments(torch.tensor([[0, 1], [2, 3]]))
    assert cu.tolist() == [0, 2, 4]


def test_auto_on_cpu_is_per_sample_sdpa_and_says_so():
    name, why = packed_attention_choice("auto", "cpu")
    assert name == "sdpa" and why.startswith("auto")
    assert resolve_packed_attention("auto", "cpu") == VARLEN_SDPA


def test_a_named_kernel_that_cannot_run_says_why_and_what_to_set():
    with pytest.raises(ValueError, match="varlen.*CUDA only.*model.attn_implementation=auto"):
        packed_attention_choice("varlen", "cpu")
    if not attention._flash_attn_installed():
        with pytest.raises(ValueError, match="flash-attn package is not installed"):
            packed_attention_choice("flash_attention_2", "cuda")
    with pytest.raises(ValueError, match="unknown packed attention 'flash3'"):
        packed_attention_choice("flash3", "cpu")


def test_auto_on_cuda_takes_the_fastest_kernel_that_runs(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(attention, "_flash_attn_installed", lambda: True)
    assert packed_attention_choice("auto", "cuda")[0] == "flash_attention_2"
    monkeypatch.setattr(attention, "_flash_attn_installed", lambda: False)
    name, why = packed_attention_choice("auto", "cuda")
    assert name == "varlen" and "not flash_attention_2: the flash-attn package is not installed" in why
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 5))  # Turing: no flash kernel
    assert packed_attention_choice("auto", "cuda")[0] == "flex_attention"
    monkeypatch.setattr(attention, "_flex_fn", lambda: None)
    assert packed_attention_choice("auto", "cuda")[0] == "sdpa"
