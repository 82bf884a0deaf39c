"""Packing: a packed batch computes exactly what its samples compute one at a time.

Tiny random-weight models in float32 on CPU. Per-token losses and parameter gradients of a packed
batch are compared with the same samples run alone (1e-5), for sdpa, eager and tokenswap's varlen
sdpa; the flash-attention 2 version of the check is in benchmarks/gpu_check.sh.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tokenswap.attention as attention
from tokenswap.attention import FLEX, VARLEN, VARLEN_SDPA, register_packed_attention
from tokenswap.collator import TokenSwapCollator
from tokenswap.packing import (
    PACKABLE_FAMILIES,
    PackingNotSupportedError,
    RopeIndex,
    greedy_pack,
    length_grouped_order,
    pack_rows,
    text_lengths,
)
from tokenswap.swap import SwapPolicy

register_packed_attention()
KERNELS = ["sdpa", "eager", VARLEN_SDPA, FLEX]  # every attention that runs on CPU; torch's varlen: test_attention.py
TOL = dict(rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------- pure functions
def test_greedy_pack_keeps_order_and_budget():
    lengths = [5, 3, 9, 1, 1, 6, 10]
    rows = greedy_pack(lengths, budget=10)
    assert [i for r in rows for i in r] == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in r) <= 10 for r in rows)
    assert rows == [[0, 1], [2, 3], [4, 5], [6]]
    with pytest.raises(ValueError, match="pack_budget=10"):
        greedy_pack([11], budget=10)


def test_balanced_rows_keep_the_row_count_and_shrink_the_longest():
    rng = np.random.default_rng(0)
    for _ in range(200):
        lengths = rng.integers(1, 50, size=int(rng.integers(1, 12))).tolist()
        greedy = greedy_pack(lengths, budget=60, balance=False)
        balanced = greedy_pack(lengths, budget=60)
        assert [i for r in balanced for i in r] == list(range(len(lengths)))
        assert len(balanced) == len(greedy)
        longest = [max(sum(lengths[i] for i in r) for r in rows) for rows in (greedy, balanced)]
        assert longest[1] <= longest[0]


def test_length_grouped_order_is_a_seeded_permutation_grouping_lengths():
    rng = np.random.default_rng(1)
    lengths = rng.integers(10, 2000, size=400).tolist()
    order = length_grouped_order(lengths, batch_size=4, seed=7)
    assert sorted(order) == list(range(400))
    assert order == length_grouped_order(lengths, batch_size=4, seed=7)
    assert order != length_grouped_order(lengths, batch_size=4, seed=8)

    def padding(o):
        batches = [[lengths[i] for i in o[k : k + 4]] for k in range(0, len(o), 4)]
        return sum(4 * max(b) - sum(b) for b in batches) / sum(4 * max(b) for b in batches)

    assert padding(order) < 0.05 < padding(list(range(400)))


def test_group_by_length_reorders_a_dataset_the_same_way_for_both_arms(swap_samples):
    from datasets import Dataset

    from tokenswap.packing import group_by_length

    a = group_by_length(Dataset.from_list(swap_samples), batch_size=2, seed=3)
    b = group_by_length(Dataset.from_list(swap_samples), batch_size=2, seed=3)
    assert a["id"] == b["id"] and sorted(a["id"]) == sorted(s["id"] for s in swap_samples)
    lengths = text_lengths(list(a))
    assert lengths == sorted(lengths, reverse=True)  # one mega-batch here: fully sorted, longest first


def test_group_by_length_reorders_a_list_as_it_reorders_a_dataset(swap_samples):
    from datasets import Dataset

    from tokenswap.packing import group_by_length

    samples = list(swap_samples)
    grouped = group_by_length(samples, batch_size=2, seed=3)
    assert isinstance(grouped, list) and samples == swap_samples  # a new list; the input is untouched
    assert [s["id"] for s in grouped] == group_by_length(Dataset.from_list(swap_samples), batch_size=2, seed=3)["id"]
    assert [s["id"] for s in grouped] != [s["id"] for s in swap_samples]
    assert sorted(map(id, grouped)) == sorted(map(id, swap_samples))  # the same sample dicts, each once


def test_text_lengths_are_the_same_for_both_arms(swap_samples):
    # Lengths come from the raw text (the text arm), so both arms get the same grouped order.
    assert text_lengths(swap_samples) == text_lengths([dict(s) for s in swap_samples])
    assert all(n > 0 for n in text_lengths(swap_samples))


# ---------------------------------------------------------------------------- model helpers
def per_token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy per position of one row (0 where the label is -100)."""
    shift = torch.cat([labels[1:], labels.new_full((1,), -100)])
    return F.cross_entropy(logits.float(), shift, ignore_index=-100, reduction="none")


def grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def targets(labels: torch.Tensor) -> int:
    """Tokens the model's own shifted loss learns: position p predicts label p+1 of the same row."""
    return int((labels[..., 1:] != -100).sum())


def check_packed_equals_alone(model, packed: dict, singles: list[dict], plan: list[list[int]]):
    """Per-token losses, target counts, the model's own loss and summed-loss gradients of the packed batch
    equal the one-at-a-time runs (gradients not for FlexAttention on CPU: torch runs its backward on CUDA only)."""
    if model.config._attn_implementation == FLEX and model.device.type == "cpu":
        with torch.no_grad():
            return _check_packed_equals_alone(model, packed, singles, plan, backward=False)
    return _check_packed_equals_alone(model, packed, singles, plan, backward=True)


def _check_packed_equals_alone(model, packed, singles, plan, backward: bool):
    # No target may cross a sample boundary: the packed rows learn exactly the tokens the samples learn alone.
    assert targets(packed["labels"]) == sum(targets(s["labels"]) for s in singles)
    with torch.no_grad():
        own = model(**packed).loss * targets(packed["labels"])  # the model's shift and token-mean, undone
        own_alone = sum(model(**s).loss * targets(s["labels"]) for s in singles if targets(s["labels"]))
    torch.testing.assert_close(own, own_alone, rtol=1e-5, atol=1e-4)
    model.zero_grad()
    out = model(**{k: v for k, v in packed.items() if k != "labels"})
    loss_rows = []
    for r in range(packed["input_ids"].shape[0]):
        loss_rows.append(per_token_losses(out.logits[r], packed["labels"][r]))
    if backward:
        torch.stack(loss_rows).sum().backward()
    g_packed = grads(model)

    model.zero_grad()
    total = 0.0
    for r, row in enumerate(plan):
        pos = 0
        for i in row:
            s = singles[i]
            n = s["input_ids"].shape[1]
            logits = model(**{k: v for k, v in s.items() if k != "labels"}).logits[0]
            alone = per_token_losses(logits, s["labels"][0])
            torch.testing.assert_close(loss_rows[r][pos : pos + n], alone, **TOL)
            torch.testing.assert_close(out.logits[r, pos : pos + n], logits, **TOL)
            total = total + alone.sum()
            pos += n
    if not backward:
        return
    total.backward()
    g_alone = grads(model)
    assert g_alone
    for name in g_packed.keys() | g_alone.keys():
        # A parameter only one side touched (the vision tower, through the masked dummy image) must get zero.
        a = g_packed.get(name, torch.zeros_like(g_alone.get(name, torch.zeros(0))))
        b = g_alone.get(name, torch.zeros_like(a))
        torch.testing.assert_close(a, b, **TOL, msg=lambda m, n=name: f"{n}: {m}")


# ---------------------------------------------------------------------------- through the collator (Qwen2-VL)
@pytest.fixture(scope="module")
def qwen2vl_models(tiny_qwen2vl):
    from transformers import AutoModelForImageTextToText

    return {
        attn: AutoModelForImageTextToText.from_pretrained(tiny_qwen2vl, dtype=torch.float32, attn_implementation=attn)
        for attn in KERNELS
    }


@pytest.mark.parametrize("learn", ["assistant", "all"])
@pytest.mark.parametrize("attn", KERNELS)
def test_collator_packed_batch_equals_samples_one_at_a_time(attn, learn, qwen2vl_models, tiny_processor, tiny_store,
                                                            swap_samples):
    model = qwen2vl_models[attn].train()
    policy = SwapPolicy(swap_prob=1.0)
    examples = swap_samples[:6]
    alone = TokenSwapCollator(tiny_processor, tiny_store, policy, learn=learn)
    singles = [alone([ex]) for ex in examples]
    singles = [{k: v for k, v in s.items() if k != "attention_mask"} for s in singles]
    lengths = [s["input_ids"].shape[1] for s in singles]
    budget = max(lengths) + min(lengths)  # at least one row holds two samples, and rows differ in length
    packer = TokenSwapCollator(tiny_processor, tiny_store, policy, pack_budget=budget, learn=learn)
    packed = packer(examples)
    plan = greedy_pack(lengths, budget)
    assert any(len(r) > 1 for r in plan) and len(plan) > 1
    assert "attention_mask" not in packed and packed["use_cache"] is False
    assert packed["position_ids"].shape == (4, len(plan), packed["input_ids"].shape[1])
    # Images keep the unpacked order (and so belong to the right sample).
    torch.testing.assert_close(packed["image_grid_thw"], torch.cat([s["image_grid_thw"] for s in singles]))
    torch.testing.assert_close(packed["pixel_values"], torch.cat([s["pixel_values"] for s in singles]))
    # Every sample keeps its labels, including each <|im_end|> it learns.
    im_end = tiny_processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert int((packed["labels"] == im_end).sum()) == sum(int((s["labels"] == im_end).sum()) for s in singles)
    assert packer.stats["tokens"] == sum(lengths)
    assert packer.stats["token_slots"] == packed["input_ids"].numel()
    check_packed_equals_alone(model, packed, singles, plan)


def test_use_packed_attention_switches_an_sdpa_model_and_keeps_its_outputs(tiny_qwen2vl, tiny_processor, tiny_store,
                                                                           swap_samples, capsys):
    from transformers import AutoModelForImageTextToText

    from tokenswap.attention import use_packed_attention

    model = AutoModelForImageTextToText.from_pretrained(tiny_qwen2vl, dtype=torch.float32,
                                                        attn_implementation="sdpa").eval()
    batch = TokenSwapCollator(tiny_processor, tiny_store, SwapPolicy(swap_prob=1.0), pack_budget=4096)(swap_samples[:4])
    with torch.no_grad():
        before = model(**batch).logits
        assert use_packed_attention(model, "auto", device="cpu") == VARLEN_SDPA
        after = model(**batch).logits
        with pytest.raises(ValueError, match="FlexAttention's backward on CUDA only"):
            use_packed_attention(model, "flex_attention", device="cpu")
        assert use_packed_attention(model, "flex_attention", device="cpu", training=False) == FLEX
        flex = model(**batch).logits
    torch.testing.assert_close(after, before, **TOL)
    torch.testing.assert_close(flex, before, **TOL)
    assert "packed attention: sdpa (tokenswap_varlen_sdpa on cpu; auto" in capsys.readouterr().out
    eager = AutoModelForImageTextToText.from_pretrained(tiny_qwen2vl, attn_implementation="eager")
    assert use_packed_attention(eager, "eager", device="cpu") == "eager"


def test_a_sample_never_depends_on_its_neighbours(qwen2vl_models, tiny_processor, tiny_store, swap_samples):
    model = qwen2vl_models["sdpa"].eval()
    collator = TokenSwapCollator(tiny_processor, tiny_store, SwapPolicy(swap_prob=1.0), pack_budget=4096)
    target = swap_samples[0]
    n = collator([target])["input_ids"].shape[1]
    tails = []
    for neighbours in ([swap_samples[1]], [swap_samples[2], swap_samples[3]], [swap_samples[4]]):
        batch = collator([*neighbours, target])
        assert batch["input_ids"].shape[0] == 1  # one row: the target sits after its neighbours
        with torch.no_grad():
            tails.append(model(**{k: v for k, v in batch.items() if k != "labels"}).logits[0, -n:])
    for t in tails[1:]:
        torch.testing.assert_close(t, tails[0], **TOL)


def test_text_only_batch_with_dummy_image_packs(qwen2vl_models, tiny_processor, swap_samples):
    model = qwen2vl_models["eager"].train()
    examples = swap_samples[:3]
    singles = [TokenSwapCollator(tiny_processor, None, dummy_image=False)([ex]) for ex in examples]
    singles = [{k: v for k, v in s.items() if k != "attention_mask"} for s in singles]
    packed = TokenSwapCollator(tiny_processor, None, pack_budget=4096)(examples)
    assert packed["image_grid_thw"].shape[0] == 1  # the masked dummy, at the end of the last row
    check_packed_equals_alone(model, packed, singles, [[0, 1, 2]])


def test_long_sample_is_cut_to_the_budget_image_safe_and_counted(tiny_processor, tiny_store, swap_samples):
    ex = swap_samples[0]
    full = TokenSwapCollator(tiny_processor, tiny_store, SwapPolicy(swap_prob=1.0))([ex])["input_ids"].shape[1]
    budget = full - 5
    collator = TokenSwapCollator(tiny_processor, tiny_store, SwapPolicy(swap_prob=1.0), pack_budget=budget)
    with pytest.warns(UserWarning, match="per-sample budget"):
        batch = collator([ex, swap_samples[1]])
    assert batch["input_ids"].shape[1] <= budget
    assert collator.stats["samples_truncated"] == 1
    ids = batch["input_ids"]
    vs, ve = (tiny_processor.tokenizer.convert_tokens_to_ids(t) for t in ("<|vision_start|>", "<|vision_end|>"))
    assert int((ids == vs).sum()) == int((ids == ve).sum()) == batch["image_grid_thw"].shape[0]


def test_budget_smaller_than_an_image_block_is_a_clear_error(tiny_processor, tiny_store):
    with pytest.raises(ValueError, match="smaller than one image block"):
        TokenSwapCollator(tiny_processor, tiny_store, pack_budget=20)


def test_pack_ids_are_logged_one_line_per_pack(tmp_path, tiny_processor, tiny_store, swap_samples):
    log = tmp_path / "sample_ids.rank0.txt"
    collator = TokenSwapCollator(tiny_processor, tiny_store, SwapPolicy(swap_prob=1.0), pack_budget=300,
                                 log_ids_to=str(log))
    batch = collator(swap_samples[:6])
    lines = log.read_text().splitlines()
    assert len(lines) == batch["input_ids"].shape[0] > 1
    assert " ".join(lines).split() == [str(s["id"]) for s in swap_samples[:6]]


def test_packing_is_identical_across_calls(tiny_processor, tiny_store, swap_samples):
    a = TokenSwapCollator(tiny_processor, tiny_store, SwapPolicy(swap_prob=0.5), pack_budget=300)(swap_samples)
    b = TokenSwapCollator(tiny_processor, tiny_store, SwapPolicy(swap_prob=0.5), pack_budget=300)(swap_samples)
    for k in ("input_ids", "labels", "position_ids", "pixel_values"):
        assert torch.equal(a[k], b[k])


# ---------------------------------------------------------------------------- every family, at the tensor level
def family_sample(config, rng: np.random.Generator, n_images: int, text: int, grid=(1, 4, 6), learn="assistant"):
    """A token row with ``n_images`` image blocks, labels on the text, and matching pixels.

    ``learn="assistant"`` leaves the first half of the leading text unlearned (a prompt); ``"all"`` learns every
    non-image token, the first one included (as the collator's ``learn="all"`` does).
    """
    vc = config.vision_config
    t, h, w = grid
    merged = t * h * w // vc.spatial_merge_size**2
    vocab = config.text_config.vocab_size
    special = {config.image_token_id, config.vision_start_token_id, config.vision_end_token_id, config.video_token_id}
    ordinary = np.array([i for i in range(min(vocab, 300)) if i not in special])
    ids: list[int] = list(rng.choice(ordinary, size=text))
    for _ in range(n_images):
        ids += [config.vision_start_token_id] + [config.image_token_id] * merged + [config.vision_end_token_id]
        ids += list(rng.choice(ordinary, size=text))
    ids = np.asarray(ids, dtype=np.int64)
    labels = np.where(np.isin(ids, list(special)), -100, ids)
    if learn == "assistant":
        labels[: text // 2] = -100
    patch = vc.in_channels * vc.temporal_patch_size * vc.patch_size**2
    pixels = torch.from_numpy(rng.standard_normal((n_images * t * h * w, patch)).astype(np.float32))
    return ids, labels, [grid] * n_images, pixels


@pytest.fixture(scope="module")
def family_models(tmp_path_factory):
    from transformers import AutoModelForImageTextToText

    from tokenswap.testing import build_tiny_model

    def load(family: str, attn: str):
        path = build_tiny_model(tmp_path_factory.getbasetemp() / f"tiny-{family}", family=family)
        return AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32, attn_implementation=attn)

    return load


@pytest.mark.parametrize("learn", ["assistant", "all"])
@pytest.mark.parametrize("attn", KERNELS)
@pytest.mark.parametrize("family", PACKABLE_FAMILIES)
def test_every_packable_family_packs_exactly(family, attn, learn, family_models):
    model = family_models(family, attn).train()
    config = model.config
    rng = np.random.default_rng(0)
    samples = [family_sample(config, rng, n, text, learn=learn) for n, text in ((1, 20), (0, 33), (2, 9), (1, 40))]
    merge = config.vision_config.spatial_merge_size
    rope = RopeIndex(family, merge)

    singles = []
    for ids, labels, grids, pixels in samples:
        s = {"input_ids": torch.from_numpy(ids)[None], "labels": torch.from_numpy(labels)[None],
             "mm_token_type_ids": torch.from_numpy((ids == config.image_token_id).astype(np.int64))[None]}
        if grids:
            s["pixel_values"] = pixels
            s["image_grid_thw"] = torch.tensor(grids)
            # The model-less rope index gives the model's own positions for the sample alone.
            mask = torch.ones_like(s["input_ids"])
            own, _ = model.model.get_rope_index(s["input_ids"], s["mm_token_type_ids"], s["image_grid_thw"],
                                                attention_mask=mask)
            torch.testing.assert_close(rope(s["input_ids"], s["mm_token_type_ids"], s["image_grid_thw"], mask), own)
        singles.append(s)
    budget = max(len(s[0]) for s in samples) + 8  # some rows hold two samples, some one
    packed, plan = pack_rows([s[0] for s in samples], [s[1] for s in samples], [s[2] for s in samples],
                             budget=budget, rope_index=rope, pad_id=0, image_pad_id=config.image_token_id)
    assert len(plan) > 1 and any(len(r) > 1 for r in plan)
    packed["pixel_values"] = torch.cat([s[3] for s in samples if s[2]])
    packed["image_grid_thw"] = torch.tensor([g for s in samples for g in s[2]])
    check_packed_equals_alone(model, packed, singles, plan)


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe", "llava"])
def test_packing_an_unsupported_family_names_it(family):
    with pytest.raises(PackingNotSupportedError, match=family):
        RopeIndex(family, 2)


def test_collator_refuses_packing_for_qwen3_5(tmp_path_factory):
    from transformers import AutoProcessor

    from tokenswap.testing import build_tiny_model

    processor = AutoProcessor.from_pretrained(build_tiny_model(tmp_path_factory.getbasetemp() / "tiny-qwen3_5",
                                                               family="qwen3_5"))
    TokenSwapCollator(processor, None)  # unpacked is fine
    with pytest.raises(PackingNotSupportedError, match="'qwen3_5'.*collator.packing=false"):
        TokenSwapCollator(processor, None, pack_budget=4096)


@pytest.mark.parametrize("learn", ["assistant", "all"])
@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"])
def test_collator_packs_other_families_exactly(family, learn, family_models, tmp_path_factory, tiny_store,
                                               swap_samples):
    from transformers import AutoProcessor

    model = family_models(family, "sdpa").train()
    processor = AutoProcessor.from_pretrained(tmp_path_factory.getbasetemp() / f"tiny-{family}")
    policy = SwapPolicy(swap_prob=1.0)
    examples = swap_samples[:5]
    singles = [TokenSwapCollator(processor, tiny_store, policy, learn=learn)([ex]) for ex in examples]
    singles = [{k: v for k, v in s.items() if k != "attention_mask"} for s in singles]
    lengths = [s["input_ids"].shape[1] for s in singles]
    budget = max(lengths) + min(lengths)
    packed = TokenSwapCollator(processor, tiny_store, policy, pack_budget=budget, learn=learn)(examples)
    plan = greedy_pack(lengths, budget)
    assert len(plan) > 1 and any(len(r) > 1 for r in plan)
    check_packed_equals_alone(model, packed, singles, plan)


# ---------------------------------------------------------------------------- pixel dtype and buffers
def test_bfloat16_pixels_give_bit_identical_outputs_on_a_bfloat16_model(tiny_qwen2vl, tiny_processor, tiny_store,
                                                                         swap_samples):
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(tiny_qwen2vl, dtype=torch.bfloat16,
                                                        attn_implementation="eager").eval()
    policy = SwapPolicy(swap_prob=1.0)
    f32 = TokenSwapCollator(tiny_processor, tiny_store, policy)(swap_samples[:4])
    bf16 = TokenSwapCollator(tiny_processor, tiny_store, policy, pixel_dtype="bfloat16")(swap_samples[:4])
    assert f32["pixel_values"].dtype == torch.float32 and bf16["pixel_values"].dtype == torch.bfloat16
    assert torch.equal(f32["pixel_values"].to(torch.bfloat16), bf16["pixel_values"])
    with torch.no_grad():
        a, b = model(**f32).logits, model(**bf16).logits
    assert torch.equal(a, b)


def test_bfloat16_cache_holds_half_the_bytes(tiny_processor, tiny_store, swap_samples):
    policy = SwapPolicy(swap_prob=1.0)
    f32 = TokenSwapCollator(tiny_processor, tiny_store, policy)
    bf16 = TokenSwapCollator(tiny_processor, tiny_store, policy, pixel_dtype="bfloat16")
    f32(swap_samples)
    bf16(swap_samples)
    assert bf16.cache_info()["bytes"] * 2 == f32.cache_info()["bytes"] > 0


def test_a_held_batch_is_never_overwritten_and_a_released_buffer_is_reused(tiny_processor, tiny_store,
                                                                            swap_samples):
    collator = TokenSwapCollator(tiny_processor, tiny_store, SwapPolicy(swap_prob=1.0))
    held = [collator(swap_samples[i : i + 2]) for i in range(0, 10, 2)]  # more batches than buffers, all held
    copies = [b["pixel_values"].clone() for b in held]
    for b, c in zip(held, copies):
        assert torch.equal(b["pixel_values"], c)
    pointers = {b["pixel_values"].data_ptr() for b in held}
    assert len(pointers) == len(held)  # no two live batches share memory
    del held, b
    first = collator(swap_samples[:2])["pixel_values"].untyped_storage().data_ptr()
    again = collator(swap_samples[:2])["pixel_values"].untyped_storage().data_ptr()
    assert first == again  # the previous batch was dropped, so its buffer is reused


# ---------------------------------------------------------------------------- torch's varlen, wired through a reference
# torch's varlen kernel runs on CUDA only (benchmarks/gpu_check.sh runs it); here its wiring (flattened layout,
# segment boundaries, GQA, causality, both of torch's signatures) runs through a CPU reference of its contract.
def reference_varlen(new_signature: bool):
    """sdpa per segment on the (total_tokens, heads, head_dim) layout: the contract of torch's varlen_attn."""
    calls = []

    def causal(q, k, v, cu_q, cu_k, max_q, max_k, scale, gqa):
        assert torch.equal(cu_q, cu_k) and cu_q.dtype == torch.int32 and q.shape[0] == int(cu_q[-1])
        lengths = torch.diff(cu_q)
        assert max_q == max_k == int(lengths.max())
        out = [F.scaled_dot_product_attention(*(x[a:b].transpose(0, 1)[None] for x in (q, k, v)), is_causal=True,
                                              scale=scale, enable_gqa=gqa)[0].transpose(0, 1)
               for a, b in zip(cu_q[:-1].tolist(), cu_q[1:].tolist())]
        calls.append(len(lengths))
        return torch.cat(out)

    if new_signature:
        def varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, *, return_aux=None, scale=None, window_size=(-1, -1),
                        enable_gqa=False):
            assert tuple(window_size) == (-1, 0)  # causal
            return causal(q, k, v, cu_q, cu_k, max_q, max_k, scale, enable_gqa)
    else:  # torch 2.10: is_causal, no scale, no GQA
        def varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=False, return_aux=None):
            assert is_causal and q.shape[1] == k.shape[1]
            return causal(q, k, v, cu_q, cu_k, max_q, max_k, None, False)
    return varlen_attn, calls


@pytest.mark.parametrize("new_signature", [True, False])
def test_torch_varlen_wiring_packs_exactly(new_signature, monkeypatch, tiny_qwen2vl, tiny_processor, tiny_store,
                                           swap_samples):
    from transformers import AutoModelForImageTextToText

    fn, calls = reference_varlen(new_signature)
    monkeypatch.setattr(attention, "_varlen_fn", lambda: fn)
    monkeypatch.setattr(attention, "_varlen_cannot_run", lambda query, dropout: None)
    monkeypatch.setattr(attention, "_VARLEN_PARAMS", None)
    register_packed_attention()
    model = AutoModelForImageTextToText.from_pretrained(tiny_qwen2vl, dtype=torch.float32,
                                                        attn_implementation=VARLEN).train()
    assert model.config.text_config.num_key_value_heads < model.config.text_config.num_attention_heads  # GQA
    policy = SwapPolicy(swap_prob=1.0)
    examples = swap_samples[:6]
    singles = [TokenSwapCollator(tiny_processor, tiny_store, policy)([ex]) for ex in examples]
    singles = [{k: v for k, v in s.items() if k != "attention_mask"} for s in singles]
    lengths = [s["input_ids"].shape[1] for s in singles]
    budget = max(lengths) + min(lengths)
    packed = TokenSwapCollator(tiny_processor, tiny_store, policy, pack_budget=budget)(examples)
    plan = greedy_pack(lengths, budget)
    check_packed_equals_alone(model, packed, singles, plan)
    assert calls and max(calls) > 1  # the packed rows went through the kernel, several samples per call


# ---------------------------------------------------------------------------- CUDA kernels (run by benchmarks/gpu_check.sh)
def real_shape_model(family: str, attn: str, root, dtype: torch.dtype):
    """``family`` at the released 2B/7B attention shape: 128-dim heads, 7 query heads per key/value head."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    from tokenswap.testing import build_tiny_model

    path = root / f"real-heads-{family}"
    if not path.exists():
        build_tiny_model(path, family=family, hidden_size=896, num_layers=2)  # 896 = 7 x 128
    config = AutoConfig.from_pretrained(path)
    tc = config.text_config
    tc.num_attention_heads, tc.num_key_value_heads, tc.head_dim = 7, 1, 128
    tc.rope_parameters = {**tc.rope_parameters, "mrope_section": [16, 24, 24]}  # sums to head_dim / 2
    torch.manual_seed(0)
    return AutoModelForImageTextToText.from_config(config, dtype=dtype, attn_implementation=attn)


BF16_UNIT_ROUNDOFF = 2.0**-8
"""bf16 keeps 8 significant bits (7 stored, 1 implicit): one rounding is exact to 2^-8 relative."""


def bf16_gradient_tolerance(k: int) -> float:
    """How far two bf16 evaluations of a packed row's gradients may differ (norm-wise, relative), for ``k`` tokens.

    Derivation. The packed row and its samples alone compute the same sums in other orders and blockings
    (attention over one row of several samples or over one sample; the matmuls' tiles; four backward passes
    accumulated into ``.grad`` against one), so their roundings differ while the exact values agree. Every
    language-model weight's gradient is a sum over the row's ``k`` tokens (dW = sum_t delta_t x_t^T; the vision
    tower's sums run over fewer patches). The rounding error of a ``k``-term sum grows as sqrt(k) u relative to the
    sum of the terms' magnitudes (Higham & Mary 2019, the probabilistic bound lambda sqrt(k) u; the worst case is
    k u), so one evaluation is off by about sqrt(k) u, and the difference of two independent ones by sqrt(2) times
    that:

        tol = sqrt(2 k) * u,  u = 2^-8  (lambda = 1: inside the matmuls bf16 products are summed in fp32 and rounded
                                         to bf16 once, far fewer roundings than the model counts)

    For the check's row (k = 212 tokens): tol = sqrt(424) / 256 = 8.0e-2. Measured on CPU (bf16, per-sample sdpa,
    the four packable families, both label layouts: ``test_real_head_shapes_pack_within_the_bf16_bound_on_cpu``):
    at most 2.07e-2 (qwen2_vl, ``visual.blocks.0.norm1.bias``; 1.3e-2 for the others), median 3.3e-3: a margin of
    3.9x. A real packing fault is far outside it: the same row with a token attending across samples (an all-ones
    attention mask over the packed row) moves every gradient by 0.77 to 1.98 (median 1.26), 10x the tolerance.
    """
    return math.sqrt(2 * k) * BF16_UNIT_ROUNDOFF


def check_real_shape_packs_like_one_at_a_time(family, attn, learn, root, device, dtype, loss_tol, grad_tol=None):
    """Packed vs alone at the released head shape; ``grad_tol`` None: :func:`bf16_gradient_tolerance` of the row.

    Returns:
        the largest relative gradient difference and the tolerance it was held to.
    """
    model = real_shape_model(family, attn, root, dtype).to(device).train()
    config = model.config
    assert config.text_config.head_dim == 128
    assert config.text_config.num_attention_heads == 7 * config.text_config.num_key_value_heads
    rng = np.random.default_rng(0)
    samples = [family_sample(config, rng, n, text, learn=learn) for n, text in ((1, 20), (0, 33), (2, 9), (1, 40))]
    rope = RopeIndex(family, config.vision_config.spatial_merge_size)
    packed, plan = pack_rows([s[0] for s in samples], [s[1] for s in samples], [s[2] for s in samples],
                             budget=sum(len(s[0]) for s in samples), rope_index=rope, pad_id=0,
                             image_pad_id=config.image_token_id)
    packed["pixel_values"] = torch.cat([s[3] for s in samples if s[2]]).to(dtype)
    packed["image_grid_thw"] = torch.tensor([g for s in samples for g in s[2]])
    packed = {k: v.to(device) if torch.is_tensor(v) else v for k, v in packed.items()}
    model.zero_grad()
    logits = model(**{k: v for k, v in packed.items() if k != "labels"}).logits[0].float()
    per_token_losses(logits, packed["labels"][0]).sum().backward()
    g_packed = grads(model)
    model.zero_grad()
    pos = 0
    for ids, labels, grids, pixels in samples:
        one = {"input_ids": torch.from_numpy(ids)[None].to(device),
               "mm_token_type_ids": torch.from_numpy((ids == config.image_token_id).astype(np.int64))[None].to(device)}
        if grids:
            one["pixel_values"] = pixels.to(dtype).to(device)
            one["image_grid_thw"] = torch.tensor(grids).to(device)
        alone = model(**one).logits[0].float()
        n = len(ids)
        lab = torch.from_numpy(labels).to(device)
        alone_losses = per_token_losses(alone, lab)
        torch.testing.assert_close(per_token_losses(logits[pos : pos + n], lab), alone_losses, rtol=loss_tol,
                                   atol=loss_tol)
        alone_losses.sum().backward()
        pos += n
    g_alone = grads(model)
    if grad_tol is None:
        grad_tol = bf16_gradient_tolerance(sum(len(s[0]) for s in samples))
    worst = 0.0
    for name, g in g_alone.items():
        # bf16 sums in a different order: compare each gradient as a whole, relative to its size.
        diff = float((g_packed[name].float() - g.float()).norm() / g.float().norm().clamp_min(1e-6))
        assert diff < grad_tol, f"{name}: relative gradient difference {diff:.3g} (tolerance {grad_tol:.3g})"
        worst = max(worst, diff)
    return worst, grad_tol


def test_real_head_shapes_pack_exactly_on_cpu(tmp_path_factory):
    """The CUDA check's 128-dim, 7:1 grouped-query model, here in fp32 through per-sample sdpa."""
    check_real_shape_packs_like_one_at_a_time("qwen2_vl", VARLEN_SDPA, "assistant", tmp_path_factory.getbasetemp(),
                                              "cpu", torch.float32, 1e-4, 1e-4)


@pytest.mark.parametrize("family", PACKABLE_FAMILIES)
def test_real_head_shapes_pack_within_the_bf16_bound_on_cpu(family, tmp_path_factory):
    """The CUDA check's bf16 tolerance (derived, not picked) against what bf16 gives on CPU: the derivation must
    hold where it can be measured, with room (see bf16_gradient_tolerance)."""
    worst, tol = check_real_shape_packs_like_one_at_a_time(family, VARLEN_SDPA, "assistant",
                                                           tmp_path_factory.getbasetemp(), "cpu", torch.bfloat16, 2e-2)
    assert tol == pytest.approx(math.sqrt(2 * 212) / 256)
    assert worst < tol / 2, f"bf16 on CPU differs by {worst:.3g}: under 2x margin to the derived {tol:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("learn", ["assistant", "all"])
@pytest.mark.parametrize("attn", ["flash_attention_2", VARLEN, FLEX, VARLEN_SDPA])
@pytest.mark.parametrize("family", PACKABLE_FAMILIES)
def test_cuda_kernels_pack_like_one_at_a_time(family, attn, learn, tmp_path_factory):
    """bf16 on CUDA at head_dim 128 + GQA 7:1: per-token losses and summed-loss gradients of the packed rows match
    the samples alone. gpu_check.sh's summary reports each kernel by its id here (flash_attention_2 skips without
    flash-attn: 'no flash-attn')."""
    if attn == "flash_attention_2":
        pytest.importorskip("flash_attn", reason="no flash-attn")
    if attn == VARLEN and torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("torch's varlen kernel needs compute capability 8.0")
    check_real_shape_packs_like_one_at_a_time(family, attn, learn, tmp_path_factory.getbasetemp(), "cuda",
                                              torch.bfloat16, 2e-2)  # gradients: bf16_gradient_tolerance(212)
