"""Shared fixtures: offline environment, seeding, one tiny Qwen2-VL checkpoint per session and tiny checkpoints of every family."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

# The tests import their own support module (`tests.support`) and the demo (`examples.demo`) from the checkout;
# pytest's importlib mode puts no folder on sys.path. Appended: the installed packages keep precedence.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.append(_ROOT)

# Set before transformers/wandb import anywhere in the test process.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# CI explores the same examples every run (a red CI must be reproducible); locally each run explores new ones.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def pytest_collection_modifyitems(config, items):
    import torch

    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        # The marker, not item.keywords: keywords also hold every parent's name, so a checkout folder named
        # `gpu` would skip the whole suite.
        if item.get_closest_marker("gpu") is not None and not torch.cuda.is_available():
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _seed():
    import numpy as np
    import torch

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def tiny_qwen2vl(tmp_path_factory):
    """Path of a tiny random-weight Qwen2-VL checkpoint (model + processor), built once per session."""
    from tokenswap.testing import build_tiny_qwen2vl

    return build_tiny_qwen2vl(tmp_path_factory.mktemp("tiny-qwen2vl"))


@pytest.fixture(scope="session")
def tiny_processor(tiny_qwen2vl):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(tiny_qwen2vl)


@pytest.fixture(scope="session")
def tiny_family(tmp_path_factory):
    """``get(family, tokenizer="trained") -> path``: a tiny checkpoint of any family, built once per session.

    ``tokenizer="qwen"`` uses Qwen2's real vocabulary (built from dashscope's ranks, cached under
    ``~/.cache/tokenswap``) with a 32-wide model, so the 151,936-row embedding stays small.
    """
    from tokenswap.testing import build_tiny_model

    built = {}

    def get(family: str, tokenizer: str = "trained"):
        if (family, tokenizer) not in built:
            out = tmp_path_factory.mktemp(f"tiny-{family}-{tokenizer}")
            built[family, tokenizer] = build_tiny_model(
                out, family=family, tokenizer=tokenizer, hidden_size=32 if tokenizer == "qwen" else 64
            )
        return built[family, tokenizer]

    return get


@pytest.fixture(scope="session")
def family_processor(tiny_family):
    """``get(family, tokenizer="trained") -> processor`` of :func:`tiny_family`'s checkpoint, loaded once."""
    from transformers import AutoProcessor

    loaded = {}

    def get(family: str, tokenizer: str = "trained"):
        if (family, tokenizer) not in loaded:
            loaded[family, tokenizer] = AutoProcessor.from_pretrained(tiny_family(family, tokenizer))
        return loaded[family, tokenizer]

    return get


ASSETS = __import__("pathlib").Path(__file__).parent / "assets"

@pytest.fixture(scope="session")
def tiny_store(tmp_path_factory):
    """ImageStore of drawn shapes and colours covering swap_tiny.jsonl except 'dog'; two images for 'apple'."""
    from tokenswap.testing import build_tiny_store

    return build_tiny_store(tmp_path_factory.mktemp("tiny-store"))


@pytest.fixture(scope="session")
def swap_samples():
    import json

    return [json.loads(line) for line in (ASSETS / "swap_tiny.jsonl").read_text().splitlines()]


@pytest.fixture(scope="session")
def tiny_bench(tmp_path_factory, tiny_store):
    """A 6-item bench in the TokenSwap-Bench hub layout whose interleaved form shows tiny-store pictures."""
    from tokenswap.testing import build_tiny_bench

    return build_tiny_bench(tmp_path_factory.mktemp("tiny-bench"), tiny_store)


@pytest.fixture
def free_port():
    """A TCP port free right now on 127.0.0.1, so back-to-back 2-rank launches never share a rendezvous port."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def trainer_warnings():
    """Messages ``transformers.trainer`` logs at WARNING or above during the test, in order.

    The suite runs transformers at ``TRANSFORMERS_VERBOSITY=error``, so the logger is opened to warnings
    for the test and restored after it.
    """
    import logging

    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    log = logging.getLogger("transformers.trainer")
    handler, level = Collect(), log.level
    log.addHandler(handler)
    log.setLevel(logging.WARNING)
    yield seen
    log.removeHandler(handler)
    log.setLevel(level)


@pytest.fixture(scope="session")
def read_wandb_offline():
    """``read_wandb_offline(path) -> RunRecord``: a W&B offline run read back (tests/wandb_offline.py; the library's
    ``compare`` reads run folders only)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("wandb_offline", Path(__file__).with_name("wandb_offline.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.read_wandb_offline
