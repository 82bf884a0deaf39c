"""Fixtures for the store tests: a local OpenAI-compatible server, tiny CLIP and diffusers checkpoints."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class FakeOpenAI:
    """An OpenAI-compatible ``/chat/completions`` endpoint on 127.0.0.1 whose replies a test scripts.

    ``reply`` maps the request payload to a string (the assistant content) or to an int HTTP
    error code. Every request payload and its headers are recorded.
    """

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.reply: Callable[[dict], str | int] = lambda payload: '{"concepts": []}'
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append(body)
                fake.headers.append(dict(self.headers))
                if self.path != "/v1/chat/completions":
                    self.send_response(404)
                    self.end_headers()
                    return
                out = fake.reply(body)
                if isinstance(out, int):
                    self.send_response(out)
                    self.end_headers()
                    self.wfile.write(b'{"error": "scripted failure"}')
                    return
                data = json.dumps({"choices": [{"message": {"role": "assistant", "content": out}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_openai():
    server = FakeOpenAI()
    yield server
    server.close()


@pytest.fixture(scope="session")
def tiny_clip(tmp_path_factory):
    """Path of a tiny random CLIP (hidden 32, image 32, patch 8) with a locally trained tokenizer."""
    return build_tiny_clip(tmp_path_factory.mktemp("tiny-clip"))


def build_tiny_clip(path):
    """Save a tiny random CLIP into ``path`` and return it as a string (also used by benchmarks/faults.py)."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizerFast

    tokenizer = _clip_tokenizer(path / "tok")
    config = CLIPConfig(
        text_config=dict(
            vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, max_position_embeddings=77, bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        ),
        vision_config=dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32,
            patch_size=8,
        ),
        projection_dim=16,
    )
    CLIPModel(config).save_pretrained(path)
    image_processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(path)
    assert isinstance(tokenizer, CLIPTokenizerFast)
    return str(path)


def _clip_tokenizer(path):
    """A CLIP-style byte-level BPE tokenizer trained in well under a second (no download)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import CLIPTokenizerFast

    corpus = [
        "An image describing a red apple", "a cat and a dog", "generate an image of a bicycle",
        "the sun over the mountain", "pizza banana train rocket", "an image of a house by the sea",
    ] * 20
    tok = Tokenizer(models.BPE(unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|startoftext|>", "<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    bos, eos = tok.token_to_id("<|startoftext|>"), tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|startoftext|> $A <|endoftext|>", special_tokens=[("<|startoftext|>", bos), ("<|endoftext|>", eos)]
    )
    fast = CLIPTokenizerFast(
        tokenizer_object=tok, bos_token="<|startoftext|>", eos_token="<|endoftext|>",
        unk_token="<|endoftext|>", pad_token="<|endoftext|>", model_max_length=77,
    )
    fast.save_pretrained(path)
    return CLIPTokenizerFast.from_pretrained(path)


@pytest.fixture(scope="session")
def tiny_sd(tmp_path_factory):
    """Path of a tiny random StableDiffusionPipeline (UNet sample_size 8) saved with save_pretrained."""
    import torch
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    path = tmp_path_factory.mktemp("tiny-sd")
    tokenizer = _clip_tokenizer(path / "_tok")
    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 32),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32, attention_head_dim=4, norm_num_groups=8,
    )
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), block_out_channels=(8, 8), latent_channels=4,
        norm_num_groups=8, layers_per_block=1, sample_size=16,
    )
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, max_position_embeddings=77, bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        )
    )
    pipe = StableDiffusionPipeline(
        unet=unet, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
        scheduler=DDIMScheduler(beta_schedule="scaled_linear", clip_sample=False, set_alpha_to_one=False),
        safety_checker=None, feature_extractor=None, requires_safety_checker=False,
    )
    pipe.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def embedded_build(tmp_path_factory):
    """Folder of the offline ``store_embedded.yaml`` build, run once through the real CLI entry point."""
    from tokenswap.cli import main

    out = tmp_path_factory.mktemp("embedded")
    assert main(["build-store", "--config", "store_embedded.yaml", f"output_dir={out}"]) == 0
    return out


def _load_hostile():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("ts_hostile", Path(__file__).with_name("hostile.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def hostile():
    """The helpers of ``hostile.py``: bomb_png, sliver_png, truncated_jpeg, hostile_files."""
    return _load_hostile()
