"""A light core: the collator, the swap policy, the image store reader and the packing load none of the job
extras (training, evaluation, store building) and nothing of the rooms that need them, each in a fresh interpreter;
the rooms' exports still import from their packages. The evaluation through an endpoint loads no torch, and
scipy.stats loads where a test or distribution is asked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# What a user importing the collator into their own trainer must not pay for: the extras' packages, the HTTP
# client, the store builder, the model clients and the evaluator.
FORBIDDEN = (
    "httpx", "deepspeed", "trl", "wandb", "scipy", "matplotlib", "datasets", "accelerate", "peft",
    "tokenswap.store.build", "tokenswap.store.stages", "tokenswap.store.sources", "tokenswap.inference",
    "tokenswap.eval", "tokenswap.training",
)


def loaded_after(statement: str, forbidden: tuple[str, ...] = FORBIDDEN) -> list[str]:
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(m for m in {forbidden!r} if m in sys.modules)))"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.integration
@pytest.mark.parametrize("statement", [
    "import tokenswap.collator",
    "from tokenswap import TokenSwapCollator",
    "from tokenswap.swap import SwapPolicy",
    "from tokenswap.store.image_store import ImageStore",
    "from tokenswap.store import ImageStore",
    "import tokenswap.packing",
])
def test_the_core_loads_no_extra(statement):
    assert loaded_after(statement) == []


@pytest.mark.integration
def test_the_openai_eval_path_loads_no_torch_and_no_scipy():
    # What `tokenswap eval --backend openai` imports from its start to its gap.json (tokenswap/eval/cli.py).
    statement = ("import tokenswap.eval.cli, tokenswap.eval.form_runs, tokenswap.eval.gap, tokenswap.eval.mc, "
                 "tokenswap.eval.stats, tokenswap.inference.backends, tokenswap.inference.runs, "
                 "tokenswap.inference.openai_client, tokenswap.data.tokenswap_bench")
    assert loaded_after(statement, ("torch", "scipy", "tokenswap.inference.hf")) == []


@pytest.mark.integration
def test_a_whole_openai_eval_with_every_form_loads_no_torch(tiny_bench, tmp_path):
    # The imports above miss what a run imports inside its functions: the caption form's replies went through
    # tokenswap.inference.hf (torch, ~2 s of CPU inside the request window) to split off a think block.
    statement = "\n".join([
        "from tests.support import LoadLLMServer",
        "from tokenswap.cli import main",
        "with LoadLLMServer(lambda payload: 'Answer: B') as server:",
        f"    code = main(['eval', '--backend', 'openai', '--base-url', server.base_url, '--model', 'm', '--bench', "
        f"{str(tiny_bench)!r}, '--out', {str(tmp_path / 'out')!r}, '--forms', 'all'])",
        "assert code in (0, 1), code",  # 1: a form with 0 items; every form ran
    ])
    assert loaded_after(statement, ("torch", "scipy", "tokenswap.inference.hf", "datasets")) == []
    assert (tmp_path / "out" / "gap.json").exists()


def test_the_rooms_exports_still_import_from_their_packages():
    import tokenswap.crossmath
    import tokenswap.inference
    import tokenswap.rest
    import tokenswap.store
    import tokenswap.training

    for package in (tokenswap.store, tokenswap.inference, tokenswap.training, tokenswap.crossmath, tokenswap.rest):
        for name in package.__all__:
            assert getattr(package, name) is not None, f"{package.__name__}.{name}"
    from tokenswap.store import build_store
    from tokenswap.store.build import build_store as direct
    from tokenswap.training import build_image_store

    assert build_store is direct and callable(build_image_store)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        tokenswap.store.Nope  # noqa: B018
