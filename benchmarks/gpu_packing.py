"""Tokens/s per GPU, MFU and peak memory, padded vs packed, for Qwen2-VL-2B- and 7B-shaped models built from config.

    python benchmarks/gpu_packing.py                  # one CUDA GPU, bf16, packed kernel picked by --attn auto
    python benchmarks/gpu_packing.py --shape 7b --lora 16 --arms packed --steps 6   # the 7B-shaped LoRA step
    python benchmarks/gpu_packing.py --shape tiny --device cpu --attn auto --steps 1   # smoke test (CI)

The models have the released checkpoints' shapes (2B: hidden 1536, 28 layers, 12 query / 2 KV heads of 128,
MLP 8960, tied embeddings; 7B: hidden 3584, 28 layers, 28 / 4 heads, MLP 18944, untied 152,064-row vocabulary;
both with a 32-block 1280-wide vision tower) and random weights, built in memory on the device (nothing is
downloaded or written). The tokenizer is a small trained one, so the 2B shape's embedding is smaller than the
real one (the FLOP count uses each model's own parameters). Vision blocks frozen, merger trained (the recipes'
default); ``--lora R`` trains LoRA adapters on the language model instead (peft, the recipes' target modules).
Gradient checkpointing on. Data: the long-tailed Magpie-like conversations of ``benchmarks/packing.py``
(response tokens p5/p50/p95 200/630/2000, 0-3 images of 258 tokens), batches of 4, ``max_length`` 4096;
packed = the same batches in one row each (``pack_budget`` 16384). Padded batches run
``resolve_attn_implementation(--attn)`` (flash-attention 2 when installed, else sdpa); packed rows run the
kernel :mod:`tokenswap.attention` picks, named in the output. Steps alternate between the arms; the first two
of each are warm-up. MFU uses :mod:`tokenswap.throughput`'s formula and peak table.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # this checkout's tokenswap, not an installed one
from packing import WORDS, long_tailed_samples  # noqa: E402

from tokenswap.attention import packed_attention_choice, resolve_packed_attention  # noqa: E402
from tokenswap.collator import TokenSwapCollator  # noqa: E402
from tokenswap.throughput import model_flop_counts, no_peak_reason, peak_tflops_of, window_flops  # noqa: E402
from tokenswap.training import resolve_attn_implementation  # noqa: E402

SHAPES = {
    "7b": dict(hidden=3584, layers=28, heads=28, kv=4, mlp=18944, vit_depth=32, vit_dim=1280, vit_heads=16,
               vocab=152064, tied=False),
    "2b": dict(hidden=1536, layers=28, heads=12, kv=2, mlp=8960, vit_depth=32, vit_dim=1280, vit_heads=16),
    "tiny": dict(hidden=128, layers=2, heads=2, kv=1, mlp=256, vit_depth=1, vit_dim=32, vit_heads=2),
}


def build(out: Path, shape: dict, device: str, dtype: torch.dtype, attn: str):
    """The processor (written to ``out``) and a random-weight model of ``shape`` built on ``device``."""
    from transformers import AutoProcessor, Qwen2VLForConditionalGeneration

    from tokenswap.testing import build_tiny_qwen2vl, tiny_qwen2vl_config

    processor = AutoProcessor.from_pretrained(build_tiny_qwen2vl(
        out, corpus=[" ".join(WORDS)] * 4, vocab_size=1024, min_pixels=56 * 56, max_pixels=448 * 448, seed=0))
    half = shape["hidden"] // shape["heads"] // 2  # the released models' mrope split: 1/4, 3/8, 3/8 of head_dim/2
    config = tiny_qwen2vl_config(
        processor.tokenizer, hidden_size=shape["hidden"], num_layers=shape["layers"], num_heads=shape["heads"],
        num_kv_heads=shape["kv"], intermediate_size=shape["mlp"], rope_theta=1e6,
        mrope_section=[half - 2 * (3 * half // 8), 3 * half // 8, 3 * half // 8],
        vision_depth=shape["vit_depth"], vision_embed_dim=shape["vit_dim"], vision_num_heads=shape["vit_heads"],
        vision_mlp_ratio=4,
    )
    if "vocab" in shape:
        config.text_config.vocab_size = config.vocab_size = shape["vocab"]
    if shape.get("tied", True) is False:
        config.tie_word_embeddings = config.text_config.tie_word_embeddings = False
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2VLForConditionalGeneration._from_config(config, dtype=dtype, attn_implementation=attn)
    return processor, model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="2b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--attn", default="auto", help="model.attn_implementation (auto picks per machine)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--steps", type=int, default=12, help="timed steps per arm (after 2 warm-up steps each)")
    parser.add_argument("--lora", type=int, default=0, help="LoRA rank on the language model (0: full training)")
    parser.add_argument("--arms", default="padded,packed", help="comma-separated: padded, packed")
    parser.add_argument("--peak-tflops", type=float, default=None, help="default: the table by GPU name")
    parser.add_argument("--out", default=None, help="JSON results file")
    args = parser.parse_args()
    device_kind = "cuda" if args.device.startswith("cuda") else "cpu"
    padded_impl = resolve_attn_implementation(args.attn)
    packed_name, why = packed_attention_choice(args.attn, device_kind)
    packed_impl = resolve_packed_attention(args.attn, device_kind)
    print(f"gpu_packing: padded attention {padded_impl}; packed attention: {packed_name} ({packed_impl}; {why})")
    tmp = Path(tempfile.mkdtemp(prefix="gpu-packing-"))
    dtype = getattr(torch, args.dtype)
    processor, model = build(tmp / "processor", SHAPES[args.shape], args.device, dtype, padded_impl)
    rng = np.random.default_rng(1)
    paths = []
    for k in range(8):
        p = tmp / f"image{k}.png"
        Image.fromarray(rng.integers(0, 256, (448, 448, 3), dtype=np.uint8)).save(p)
        paths.append(str(p))
    n = 4 * (args.steps + 2)
    samples = long_tailed_samples(n, processor.tokenizer, paths)
    dtype = getattr(torch, args.dtype)
    pixel_dtype = args.dtype if args.dtype in ("bfloat16", "float16", "float32") else "float32"
    collators = {
        "padded": TokenSwapCollator(processor, None, arm="text", max_length=4096, pixel_dtype=pixel_dtype),
        "packed": TokenSwapCollator(processor, None, arm="text", max_length=4096, pack_budget=16384,
                                    pixel_dtype=pixel_dtype),
    }
    arms = {arm: collators[arm] for arm in args.arms.split(",")}
    impls = {"padded": padded_impl, "packed": packed_impl}
    model.train()
    for name, p in model.model.visual.named_parameters():
        p.requires_grad_(name.startswith("merger."))
    if args.lora:
        from peft import get_peft_model

        from tokenswap.training import LoraConfig, peft_lora_config

        model = get_peft_model(model, peft_lora_config(LoraConfig(r=args.lora)))
    # Non-reentrant: with LoRA the checkpointed blocks' inputs need no grad for the adapters to get theirs.
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    counts = model_flop_counts(model)
    peak = args.peak_tflops
    if peak is None and args.device.startswith("cuda"):
        peak = peak_tflops_of(torch.cuda.get_device_name())
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)

    results = {arm: {"s": 0.0, "tokens": 0, "slots": 0, "flops": 0.0, "images": 0, "peak_gib": 0.0} for arm in arms}
    for step in range(args.steps + 2):
        batch_samples = samples[4 * step : 4 * step + 4]
        for arm, collator in arms.items():
            if model.config._attn_implementation != impls[arm]:
                model.set_attn_implementation(impls[arm])
            if device_kind == "cuda":
                torch.cuda.reset_peak_memory_stats()
            before = dict(collator.stats)
            batch = collator(batch_samples)
            batch = {k: v.to(args.device) if torch.is_tensor(v) else v for k, v in batch.items()}
            sync()
            t0 = time.perf_counter()
            model(**batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            sync()
            dt = time.perf_counter() - t0
            if step < 2:
                continue
            d = {k: collator.stats[k] - before.get(k, 0) for k in ("tokens", "token_slots", "images",
                                                                   "image_patches", "token_sq", "patch_sq")}
            r = results[arm]
            r["s"] += dt
            r["tokens"] += d["tokens"]
            r["slots"] += d["token_slots"]
            r["images"] += d["images"]
            r["flops"] += window_flops(counts, d["tokens"], d["token_sq"], d["image_patches"], d["patch_sq"])
            if device_kind == "cuda":
                r["peak_gib"] = max(r["peak_gib"], torch.cuda.max_memory_allocated() / 2**30)
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    training = f"LoRA r={args.lora}" if args.lora else "full LLM"
    print(f"gpu_packing: {args.shape} shape, {training}, {args.dtype}, {device}, {args.steps} timed steps per arm")
    print(f"{'arm':<8}{'attention':>24}{'tokens/s/GPU':>14}{'images/s':>10}{'padding':>9}{'TFLOP/s':>9}{'MFU':>8}"
          f"{'peak GiB':>10}")
    for arm, r in results.items():
        tflops = r["flops"] / r["s"] / 1e12
        r.update(tokens_per_s=r["tokens"] / r["s"], images_per_s=r["images"] / r["s"],
                 padding=1 - r["tokens"] / r["slots"], tflops=tflops, mfu=None if peak is None else tflops / peak)
        mfu = "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
        r["attention"] = impls[arm]
        print(f"{arm:<8}{impls[arm]:>24}{r['tokens_per_s']:>14.0f}{r['images_per_s']:>10.1f}"
              f"{100 * r['padding']:>8.1f}%{tflops:>9.1f}{mfu:>8}{r['peak_gib']:>10.1f}")
    if peak is None:
        print(f"gpu_packing: MFU n/a: {no_peak_reason(device if device_kind == 'cuda' else None)}")
    ratio = None
    if len(results) == 2:
        ratio = results["packed"]["tokens_per_s"] / results["padded"]["tokens_per_s"]
        print(f"gpu_packing: non-pad tokens/s packed/padded {ratio:.2f}x")
    if args.out:
        Path(args.out).write_text(json.dumps({"device": device, "shape": args.shape, "lora": args.lora,
                                              "attn": args.attn, "packed_attention": packed_name,
                                              "peak_tflops": peak, "arms": results, "ratio": ratio}, indent=2))


if __name__ == "__main__":
    main()
