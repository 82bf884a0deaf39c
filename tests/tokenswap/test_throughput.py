"""Throughput accounting: FLOP counts, the device table, and perf/* keys in a real Trainer run."""

from __future__ import annotations

import pytest
import torch

from tokenswap.collator import TokenSwapCollator
from tokenswap.swap import SwapPolicy
from tokenswap.throughput import (
    ThroughputCallback,
    model_flop_counts,
    no_peak_reason,
    peak_tflops_of,
    window_flops,
)
from tokenswap.training.config import ThroughputConfig


@pytest.fixture()
def tiny_model(tiny_qwen2vl):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(tiny_qwen2vl, dtype=torch.float32)


def test_peak_table_and_override():
    assert peak_tflops_of("NVIDIA H100 80GB HBM3") == 989.0
    assert peak_tflops_of("NVIDIA H200") == 989.0
    assert peak_tflops_of("NVIDIA A100-SXM4-80GB") == 312.0
    assert peak_tflops_of("NVIDIA GeForce RTX 4090") is None
    assert peak_tflops_of(None) is None
    assert ThroughputConfig(peak_tflops=500.0).peak_tflops == 500.0
    with pytest.raises(ValueError, match="peak_tflops"):
        ThroughputConfig(peak_tflops=0.0)


def test_peaks_match_the_exact_device_name_not_a_substring():
    # Form factors of one chip differ: NVL and PCIe parts are not scored against the SXM peak.
    assert peak_tflops_of("NVIDIA H200 NVL") == 835.0
    assert peak_tflops_of("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops_of("NVIDIA H100 NVL") == 835.0
    assert peak_tflops_of("nvidia  h200") == 989.0  # case and spacing only
    assert peak_tflops_of("NVIDIA H200 Prototype") is None  # unknown: no MFU rather than a guessed one
    assert "PEAK_TFLOPS" in no_peak_reason("NVIDIA H200 Prototype") and "peak_tflops" in no_peak_reason("x")


def test_4bit_weights_count_at_their_true_size(tiny_qwen2vl):
    """bitsandbytes packs two 4-bit values per stored element: numel() of a Params4bit is half the layer's."""
    pytest.importorskip("bitsandbytes")
    from tokenswap.training import LoraConfig, ModelConfig, load_model_and_processor

    counts = {}
    for four_bit in (False, True):
        cfg = ModelConfig(name_or_path=tiny_qwen2vl, dtype="float32", attn_implementation="sdpa",
                          lora=LoraConfig(r=4), load_in_4bit=four_bit)
        model, _ = load_model_and_processor(cfg, seed=0)
        counts[four_bit] = model_flop_counts(model)
    quantised = model.base_model.model.model.language_model.layers[0].mlp.up_proj.base_layer.weight
    assert quantised.numel() * 2 == quantised.quant_state.shape.numel()  # packed storage: what was miscounted
    assert counts[True]["n_llm"] == counts[False]["n_llm"]
    assert counts[True]["n_llm_trainable"] == counts[False]["n_llm_trainable"]  # the adapters


def test_flop_counts_follow_what_is_trained(tiny_model):
    model = tiny_model
    tc, vc = model.config.text_config, model.config.vision_config
    lm = model.model.language_model
    layers = sum(p.numel() for n, p in lm.named_parameters() if "embed_tokens" not in n)
    head = tc.vocab_size * tc.hidden_size  # tied: the output matmul still runs
    visual = model.model.visual
    merger = sum(p.numel() for p in visual.merger.parameters())
    blocks = sum(p.numel() for p in visual.parameters()) - merger

    all_trained = model_flop_counts(model)
    assert all_trained["n_llm"] == layers + head
    assert all_trained["n_llm_trainable"] == layers + head  # the tied head trains embed_tokens' weight
    assert all_trained["n_vit"] == pytest.approx(blocks + merger / vc.spatial_merge_size**2)
    assert all_trained["vit_blocks_trained"] == 1.0
    assert all_trained["llm_attn"] == tc.num_hidden_layers * tc.hidden_size
    assert all_trained["vit_attn"] == vc.depth * vc.embed_dim  # Qwen2-VL's ViT width (hidden_size is the LLM's)

    for name, p in visual.named_parameters():  # the recipes' default: ViT blocks frozen, merger trained
        p.requires_grad_(name.startswith("merger."))
    frozen = model_flop_counts(model)
    assert frozen["n_vit_trainable"] == pytest.approx(merger / vc.spatial_merge_size**2)
    assert frozen["vit_blocks_trained"] == 0.0

    # All trained: 6 N per token plus the attention term; frozen blocks: forward only for them.
    tokens, token_sq, patches, patch_sq = 1000.0, 250_000.0, 64.0, 1024.0
    f = window_flops(all_trained, tokens, token_sq, patches, patch_sq)
    expect = 6 * (layers + head) * tokens + 12 * all_trained["llm_attn"] * token_sq
    expect += 6 * all_trained["n_vit"] * patches + 12 * all_trained["vit_attn"] * patch_sq
    assert f == pytest.approx(expect)
    assert window_flops(frozen, tokens, token_sq, patches, patch_sq) < f


@pytest.mark.integration
@pytest.mark.parametrize("packing", [False, True])
def test_trainer_logs_perf_keys_to_log_history(packing, tmp_path, tiny_model, tiny_processor, tiny_store,
                                               swap_samples):
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    from tokenswap.training import install_first

    collator = TokenSwapCollator(tiny_processor, tiny_store, SwapPolicy(swap_prob=1.0),
                                 pack_budget=4096 if packing else None)
    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=4, logging_steps=2, use_cpu=True,
        report_to=[], remove_unused_columns=False, save_strategy="no", train_sampling_strategy="sequential",
        learning_rate=1e-3,
    )
    trainer = Trainer(model=tiny_model, args=args, train_dataset=Dataset.from_list(swap_samples * 2),
                      data_collator=collator)
    install_first(trainer, ThroughputCallback(collator, peak_tflops=1.0))
    trainer.train()
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logged) == 2
    for h in logged:
        assert h["perf/tokens_per_s"] > 0 and h["perf/images_per_s"] > 0
        assert h["perf/tflops"] > 0 and h["perf/mfu"] == pytest.approx(h["perf/tflops"] / 1.0)
        assert 0.0 <= h["perf/padding"] < 1.0
    if packing:  # four samples in one row: no padding at all
        assert all(h["perf/padding"] == 0.0 for h in logged)
    else:
        assert all(h["perf/padding"] > 0.0 for h in logged)


@pytest.mark.integration
def test_no_mfu_without_a_known_peak(tmp_path, tiny_model, tiny_processor, tiny_store, swap_samples):
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    collator = TokenSwapCollator(tiny_processor, tiny_store, SwapPolicy(swap_prob=1.0))
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=2, logging_steps=1,
                             use_cpu=True, report_to=[], remove_unused_columns=False, save_strategy="no")
    trainer = Trainer(model=tiny_model, args=args, train_dataset=Dataset.from_list(swap_samples),
                      data_collator=collator)
    trainer.callback_handler.callbacks.insert(0, ThroughputCallback(collator))
    trainer.train()
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert logged and all("perf/tflops" in h and "perf/mfu" not in h for h in logged)
