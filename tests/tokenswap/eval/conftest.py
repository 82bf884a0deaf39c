"""Fixtures for the gap-evaluation tests: constructed item pairs and a tiny model that always answers "B"."""

from __future__ import annotations

import pytest
from PIL import Image

from tokenswap.eval.mc import MCItem

COLORS = ["red", "green", "blue", "yellow", "purple", "orange", "white", "black"]
CONCEPTS = ["cat", "dog", "apple", "car", "tree", "house"]


def _make_pairs(n: int = 8, subject: str = "high_school_biology") -> list[tuple[MCItem, MCItem]]:
    """Pairs with 0, 1 or 2 swapped images (item i has i % 3), answers cycling A-D, concept names set."""
    pairs = []
    for i in range(n):
        a, b = CONCEPTS[i % len(CONCEPTS)], CONCEPTS[(i + 1) % len(CONCEPTS)]
        text = MCItem(f"q{i}", subject, f"Is a {a} bigger than a {b}? ({i})", [a, b, "both", "neither"], i % 4)
        k = i % 3
        question = text.question.replace(a, "<image 1>", 1) if k >= 1 else text.question
        choices = [a, "<image 2>", "both", "neither"] if k >= 2 else list(text.choices)
        images = {j + 1: Image.new("RGB", (56, 56), COLORS[(i + j) % len(COLORS)]) for j in range(k)}
        names = {j + 1: [a, b][j] for j in range(k)}
        pairs.append((text, MCItem(text.id, subject, question, choices, text.answer, images, names)))
    return pairs


@pytest.fixture(scope="session")
def make_pairs():
    """``make_pairs(n, subject)``: constructed (text, interleaved) pairs (see :func:`_make_pairs`)."""
    return _make_pairs


@pytest.fixture(scope="session")
def always_b(tiny_qwen2vl, tmp_path_factory):
    """Checkpoint path of the tiny model fine-tuned to reply "B" (then end of turn) to any prompt."""
    import torch

    from tokenswap.eval.mc import build_conversation
    from tokenswap.families import load_checkpoint
    from tokenswap.inference.hf import build_inputs

    model, processor = load_checkpoint(tiny_qwen2vl)
    tok = processor.tokenizer
    answer = tok.encode("B", add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
    convs = [build_conversation(item) for pair in _make_pairs(6, "college_physics") for item in pair]
    batch = build_inputs(processor, convs)
    n, extra = batch["input_ids"].shape[0], len(answer)
    tail = torch.tensor(answer).repeat(n, 1)
    batch["input_ids"] = torch.cat([batch["input_ids"], tail], dim=1)
    batch["attention_mask"] = torch.cat([batch["attention_mask"], torch.ones(n, extra, dtype=torch.long)], dim=1)
    mm = batch["mm_token_type_ids"]
    batch["mm_token_type_ids"] = torch.cat([mm, torch.zeros(n, extra, dtype=mm.dtype)], dim=1)
    labels = torch.full_like(batch["input_ids"], -100)
    labels[:, -extra:] = tail
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(40):
        loss = model(**batch, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05, f"fine-tuning to always answer B did not converge (loss {loss.item():.3f})"
    out = tmp_path_factory.mktemp("always-b")
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out
