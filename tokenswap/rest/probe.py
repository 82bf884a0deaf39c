"""Representation probe (REST RQ4): do a text and its rendering land in the same place, layer by layer?

For each pair (a text and the same text rendered as an image) the model is run twice: once on a
user turn holding only the image, once on a user turn holding only the text. At every layer
(index 0 = the input embeddings, after image features are merged in) we mean-pool the hidden
states over the image tokens (``input_ids == model.config.image_token_id``) and over the tokens
of the text, then report

- the mean cosine similarity of the paired means, per layer;
- text->image and image->text retrieval accuracy over all pairs, per layer: a query is correct
  iff its partner is *strictly* the most similar candidate (ties count as wrong, so collapsed
  representations score 0, not 1/N);
- the maximum of each curve over layers and where it occurs.

The paper pairs ImageNet images, labels and rendered labels; this probe needs no download and
uses rendered labels vs label text (built-in list of common object names, or ``--texts FILE``).

    tokenswap probe --model Qwen/Qwen2-VL-7B-Instruct --pairs 100 --out runs/probe
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from tokenswap.errors import InputError
from tokenswap.files import atomic_write_figure, atomic_write_json, atomic_write_text
from tokenswap.inputs import MODEL_HOLDS, from_hub, positive_int, require_model, require_output_dir, require_path
from tokenswap.script import CommandParser

__all__ = [
    "DEFAULT_LABELS",
    "cli_main",
    "collect_pair_states",
    "layer_similarity",
    "masked_mean",
    "pairwise_similarity",
    "probe_summary",
    "retrieval_accuracy",
    "run_probe",
]

DEFAULT_LABELS = [
    "goldfish", "great white shark", "hen", "ostrich", "bald eagle", "tree frog", "loggerhead turtle",
    "king penguin", "flamingo", "golden retriever", "tabby cat", "tiger", "lion", "brown bear", "ladybug",
    "monarch butterfly", "honeybee", "rabbit", "hamster", "zebra", "hippopotamus", "elephant", "giant panda",
    "orangutan", "koala", "jellyfish", "snail", "lobster", "pelican", "owl", "acoustic guitar", "violin",
    "grand piano", "accordion", "airliner", "ambulance", "bicycle", "canoe", "container ship", "fire engine",
    "forklift", "garbage truck", "mountain bike", "school bus", "sports car", "steam locomotive", "tractor",
    "backpack", "barometer", "bathtub", "beer bottle", "binoculars", "birdhouse", "bookcase", "broom",
    "candle", "cassette player", "castle", "cellular telephone", "chain saw", "church", "coffee mug",
    "computer keyboard", "cowboy hat", "crib", "desk", "digital clock", "dishwasher", "dumbbell", "envelope",
    "frying pan", "fountain pen", "hammer", "harmonica", "hourglass", "lampshade", "laptop", "lawn mower",
    "lighthouse", "mailbox", "microwave", "mosque", "padlock", "paintbrush", "parachute", "pizza", "banana",
    "strawberry", "orange", "lemon", "pineapple", "broccoli", "cauliflower", "mushroom", "pretzel",
    "cheeseburger", "ice cream", "volcano", "coral reef", "valley",
]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Pure functions on hidden states: testable on literal tensors.
# ---------------------------------------------------------------------------------------------


def masked_mean(hidden_states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the masked positions of every layer and sequence.

    Args:
        hidden_states: ``(L, B, T, H)``.
        mask: ``(B, T)`` bool; every row must select at least one position.

    Returns:
        ``(L, B, H)`` float32.

    Raises:
        ValueError: when a row of ``mask`` is empty (no image/text tokens found).
    """
    counts = mask.sum(dim=1)
    if (counts == 0).any():
        raise ValueError(f"mask selects no positions in rows {torch.nonzero(counts == 0).flatten().tolist()}")
    weights = mask.to(torch.float32)[None, :, :, None]
    return (hidden_states.to(torch.float32) * weights).sum(dim=2) / counts[None, :, None].to(torch.float32)


def pairwise_similarity(image_hidden: torch.Tensor, text_hidden: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of each pair at each layer: ``(L, N, H), (L, N, H) -> (L, N)``."""
    if image_hidden.shape != text_hidden.shape:
        raise ValueError(
            f"image and text states must match, got {tuple(image_hidden.shape)} vs {tuple(text_hidden.shape)}"
        )
    return F.cosine_similarity(image_hidden.float(), text_hidden.float(), dim=-1)


def layer_similarity(image_hidden: torch.Tensor, text_hidden: torch.Tensor) -> torch.Tensor:
    """Mean paired cosine similarity per layer: ``(L, N, H), (L, N, H) -> (L,)``.

    >>> x = torch.randn(3, 4, 8)
    >>> torch.allclose(layer_similarity(x, x), torch.ones(3))
    True
    """
    return pairwise_similarity(image_hidden, text_hidden).mean(dim=1)


def retrieval_accuracy(image_hidden: torch.Tensor, text_hidden: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-layer retrieval accuracy in both directions over the N pairs.

    Args:
        image_hidden: ``(L, N, H)`` pooled image-token states.
        text_hidden: ``(L, N, H)`` pooled text-token states of the same N items in the same order.

    Returns:
        ``{"image_to_text": (L,), "text_to_image": (L,)}``; a query counts only if its partner is
        strictly more similar than every other candidate.
    """
    if image_hidden.shape != text_hidden.shape:
        raise ValueError(
            f"image and text states must match, got {tuple(image_hidden.shape)} vs {tuple(text_hidden.shape)}"
        )
    img = F.normalize(image_hidden.float(), dim=-1)
    txt = F.normalize(text_hidden.float(), dim=-1)
    sim = img @ txt.transpose(1, 2)  # (L, N_image, N_text)
    n = sim.shape[-1]
    diag = torch.diagonal(sim, dim1=1, dim2=2)  # (L, N)
    off = sim.masked_fill(torch.eye(n, dtype=torch.bool), float("-inf"))
    return {
        "image_to_text": (diag > off.amax(dim=2)).float().mean(dim=1),
        "text_to_image": (diag > off.amax(dim=1)).float().mean(dim=1),
    }


def probe_summary(image_hidden: torch.Tensor, text_hidden: torch.Tensor) -> dict:
    """Per-layer curves and their maxima over layers (JSON-ready).

    Returns:
        ``{"n_pairs", "n_layers", "similarity": [...], "image_to_text": [...], "text_to_image": [...],
        "max": {curve: {"value", "layer"}}}``.
    """
    curves = {
        "similarity": layer_similarity(image_hidden, text_hidden),
        **retrieval_accuracy(image_hidden, text_hidden),
    }
    return {
        "n_pairs": image_hidden.shape[1],
        "n_layers": image_hidden.shape[0],
        **{name: [round(float(v), 6) for v in curve] for name, curve in curves.items()},
        "max": {name: {"value": float(curve.max()), "layer": int(curve.argmax())} for name, curve in curves.items()},
    }


# ---------------------------------------------------------------------------------------------
# Model side: hidden states of paired inputs.
# ---------------------------------------------------------------------------------------------


def _text_batch(processor, texts: Sequence[str]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Left-padded text-only prompts and the mask of the tokens that spell each text."""
    tokenizer = processor.tokenizer
    ids, masks = [], []
    for text in texts:
        prompt = processor.apply_chat_template(
            [{"role": "user", "content": [{"type": "text", "text": text}]}], tokenize=False
        )
        # The user turn is last, so the last occurrence is the content (not e.g. the system prompt).
        start = prompt.rfind(text)
        if start < 0:
            raise ValueError(
                f"text {text!r} does not appear verbatim in its chat prompt; strip odd whitespace from it"
            )
        end = start + len(text)
        enc = tokenizer(prompt, return_offsets_mapping=True, add_special_tokens=False)
        ids.append(enc["input_ids"])
        masks.append([s < end and e > start and e > s for s, e in enc["offset_mapping"]])
    width = max(map(len, ids))
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
    attention = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
    mask = torch.tensor([[False] * (width - len(m)) + m for m in masks])
    return {"input_ids": input_ids, "attention_mask": attention}, mask


@torch.no_grad()
def _hidden(model, batch) -> torch.Tensor:
    out = model(**batch, output_hidden_states=True)
    return torch.stack(out.hidden_states)  # (L+1, B, T, H)


@torch.no_grad()
def collect_pair_states(model, processor, texts: Sequence[str], images: Sequence, batch_size: int = 8):
    """Pooled hidden states of the image tokens and of the text tokens for each pair.

    Args:
        model: a Qwen2-VL-family ``*ForConditionalGeneration`` model.
        processor: its processor.
        texts: N texts.
        images: N images, ``images[i]`` showing ``texts[i]``.
        batch_size: pairs per forward pass.

    Returns:
        ``(image_hidden, text_hidden)``, each ``(L+1, N, H)`` float32 on CPU.
    """
    from tokenswap.inference.hf import build_inputs

    if len(texts) != len(images):
        raise ValueError(f"need one image per text, got {len(texts)} texts and {len(images)} images")
    was_training = model.training
    model.eval()
    image_token_id = model.config.image_token_id
    image_states, text_states = [], []
    for start in range(0, len(texts), batch_size):
        chunk_images = images[start : start + batch_size]
        convs = [[{"role": "user", "content": [{"type": "image", "image": im}]}] for im in chunk_images]
        batch = build_inputs(processor, convs, add_generation_prompt=False).to(model.device)
        image_mask = batch["input_ids"] == image_token_id
        image_states.append(masked_mean(_hidden(model, batch), image_mask).cpu())
        text_batch, text_mask = _text_batch(processor, texts[start : start + batch_size])
        text_batch = {k: v.to(model.device) for k, v in text_batch.items()}
        text_states.append(masked_mean(_hidden(model, text_batch), text_mask.to(model.device)).cpu())
    model.train(was_training)
    return torch.cat(image_states, dim=1), torch.cat(text_states, dim=1)


def run_probe(
    model, processor, texts: Sequence[str], out_dir: str | Path, batch_size: int = 8, model_name: str = ""
) -> dict:
    """Render ``texts``, probe the model, and write ``probe.json``, ``probe.md`` and ``probe.png``.

    Returns:
        The :func:`probe_summary` dict plus ``model`` and ``texts``.
    """
    from tokenswap.rest.render import render_text

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    images = [render_text(t) for t in texts]
    image_hidden, text_hidden = collect_pair_states(model, processor, texts, images, batch_size=batch_size)
    summary = {"model": model_name, **probe_summary(image_hidden, text_hidden), "texts": list(texts)}
    atomic_write_json(out / "probe.json", summary)
    _write_markdown(summary, out / "probe.md")
    _plot(summary, out / "probe.png")
    return summary


def _write_markdown(summary: dict, path: Path) -> None:
    lines = [
        f"# Representation probe: {summary['model'] or 'model'} ({summary['n_pairs']} text/rendered-text pairs)",
        "",
        "Layer 0 = input embeddings. Similarity = mean cosine of paired mean image-token and text-token states; "
        "retrieval counts a query only when its partner is strictly the most similar.",
        "",
        "| layer | cosine | image→text | text→image |",
        "|---|---|---|---|",
    ]
    for layer in range(summary["n_layers"]):
        lines.append(
            f"| {layer} | {summary['similarity'][layer]:.4f} | {summary['image_to_text'][layer]:.3f} "
            f"| {summary['text_to_image'][layer]:.3f} |"
        )
    lines += ["", "| max over layers | value | layer |", "|---|---|---|"]
    lines += [f"| {name} | {m['value']:.4f} | {m['layer']} |" for name, m in summary["max"].items()]
    atomic_write_text(path, "\n".join(lines) + "\n")


def _plot(summary: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    layers = list(range(summary["n_layers"]))
    fig = Figure(figsize=(9, 3.4))
    left, right = fig.subplots(1, 2)
    left.plot(layers, summary["similarity"], marker="o")
    left.set_xlabel("layer")
    left.set_ylabel("cosine(image, text)")
    left.set_title("paired similarity")
    right.plot(layers, summary["image_to_text"], marker="o", label="image→text")
    right.plot(layers, summary["text_to_image"], marker="s", label="text→image")
    right.set_ylim(-0.02, 1.02)
    right.set_xlabel("layer")
    right.set_ylabel("retrieval accuracy")
    right.set_title(f"retrieval over {summary['n_pairs']} pairs")
    right.legend(fontsize=8)
    fig.tight_layout()
    atomic_write_figure(path, fig, dpi=100)


def cli_main(argv: list[str] | None = None) -> int:
    """Entry point of ``tokenswap probe``."""
    parser = CommandParser(prog="tokenswap probe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="checkpoint folder or hub id (Qwen2-VL family)")
    parser.add_argument("--pairs", type=positive_int, default=100, help="number of text/rendered-text pairs")
    parser.add_argument("--texts", default=None, help="file with one text per line (default: built-in labels)")
    parser.add_argument("--out", default="probe_out", help="output folder")
    parser.add_argument("--batch-size", type=positive_int, default=8, help="pairs per forward pass")
    args = parser.parse_args(argv)

    from tokenswap.families import check_checkpoint, load_checkpoint

    require_model(args.model)
    if os.path.isdir(args.model):
        check_checkpoint(args.model, "--model")
    if args.texts:
        require_path(args.texts, "--texts", kind="file")
        try:
            lines = Path(args.texts).read_bytes().decode("utf-8").splitlines()
        except UnicodeDecodeError as e:
            raise InputError(f"--texts {args.texts!r} is not UTF-8 text (byte {e.start}); save it as UTF-8") from None
        pool = [line.strip() for line in lines if line.strip()]
        if len(pool) < max(args.pairs, 2):
            raise InputError(f"--pairs {args.pairs} needs {max(args.pairs, 2)} texts, but --texts {args.texts!r} "
                             f"holds {len(pool)} (one text per line, blank lines skipped); add texts or lower --pairs")
    else:
        pool = DEFAULT_LABELS
    if not 2 <= args.pairs <= len(pool):
        raise InputError(f"--pairs must be in [2, {len(pool)}] for the built-in labels, got {args.pairs}; pass "
                         "--texts FILE (one text per line) for more")
    require_output_dir(args.out)
    with from_hub(args.model, "--model", MODEL_HOLDS):
        model, processor = load_checkpoint(args.model)
    if torch.cuda.is_available():
        model = model.to("cuda")
    summary = run_probe(
        model, processor, pool[: args.pairs], args.out, batch_size=args.batch_size, model_name=args.model
    )
    best = summary["max"]
    print(
        f"probe: {summary['n_pairs']} pairs, {summary['n_layers']} layers; "
        f"max cosine {best['similarity']['value']:.3f} "
        f"(layer {best['similarity']['layer']}), max image→text {best['image_to_text']['value']:.3f}, "
        f"max text→image {best['text_to_image']['value']:.3f}; written to {args.out}"
    )
    return 0
