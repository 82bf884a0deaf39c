"""Representation probe: pure functions on literal tensors, then the real model path."""

from __future__ import annotations

import torch
from PIL import Image

from tokenswap.rest.probe import (
    collect_pair_states,
    layer_similarity,
    masked_mean,
    probe_summary,
    retrieval_accuracy,
)


def test_identical_states_give_similarity_one_and_perfect_retrieval():
    states = torch.randn(4, 6, 16)
    torch.testing.assert_close(layer_similarity(states, states.clone()), torch.ones(4))
    retrieval = retrieval_accuracy(states, states.clone())
    torch.testing.assert_close(retrieval["image_to_text"], torch.ones(4))
    torch.testing.assert_close(retrieval["text_to_image"], torch.ones(4))
    summary = probe_summary(states, states)
    assert abs(summary["max"]["similarity"]["value"] - 1.0) < 1e-6


def test_opposite_and_collapsed_states():
    states = torch.randn(2, 3, 8)
    torch.testing.assert_close(layer_similarity(states, -states), -torch.ones(2))
    collapsed = torch.ones(2, 3, 8)  # every pair equally similar: ties count as failures
    assert retrieval_accuracy(collapsed, collapsed)["image_to_text"].tolist() == [0.0, 0.0]


def test_retrieval_directions_differ_on_a_constructed_case():
    # One layer, 2-d: image 0 and 1 both point at text 0's direction.
    image = torch.tensor([[[1.0, 0.0], [1.0, 0.1]]])
    text = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    r = retrieval_accuracy(image, text)
    assert r["image_to_text"].tolist() == [0.5]  # image 1 retrieves text 0
    assert r["text_to_image"].tolist() == [1.0]  # text 1 still prefers image 1


def test_masked_mean():
    hidden = torch.arange(12, dtype=torch.float32).reshape(1, 1, 4, 3)
    mask = torch.tensor([[False, True, False, True]])
    torch.testing.assert_close(masked_mean(hidden, mask), torch.tensor([[[6.0, 7.0, 8.0]]]))


def test_model_path_identical_inputs_give_one(tiny_qwen2vl):
    """Through the tiny model: image-token means of the same image twice have cosine 1 at every layer."""
    from tokenswap.families import load_checkpoint

    model, processor = load_checkpoint(tiny_qwen2vl)
    texts = ["tiger", "banana", "violin"]
    images = [Image.new("RGB", (120, 60), c) for c in ("white", "red", "blue")]
    image_hidden, text_hidden = collect_pair_states(model, processor, texts, images, batch_size=2)
    n_layers = model.config.text_config.num_hidden_layers + 1
    assert image_hidden.shape == text_hidden.shape == (n_layers, 3, model.config.text_config.hidden_size)
    torch.testing.assert_close(layer_similarity(image_hidden, image_hidden), torch.ones(n_layers))
    # Batching must not change the pooled states (left padding is masked out).
    single_image, single_text = collect_pair_states(model, processor, texts[:1], images[:1], batch_size=1)
    torch.testing.assert_close(single_image[:, 0], image_hidden[:, 0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(single_text[:, 0], text_hidden[:, 0], atol=1e-4, rtol=1e-4)
