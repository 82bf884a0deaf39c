"""Every file under configs/ loads: recipe/tool YAMLs into their dataclass, accelerate YAMLs, DeepSpeed JSONs."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml

from tokenswap.config import load_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
# accelerate and DeepSpeed files are those tools' own formats, checked separately below.
OWN_FORMAT_DIRS = {CONFIGS / "accelerate", CONFIGS / "deepspeed"}
CONFIG_YAMLS = sorted(p for p in CONFIGS.rglob("*.yaml") if p.parent not in OWN_FORMAT_DIRS)
RECIPE_PREFIXES = ("post_", "pretrain_", "image_sft_", "grpo_")


def recipe_module(name: str):
    """Import recipes/<name>.py by path (recipes/ is not a package)."""
    module_name = f"_recipe_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, ROOT / "recipes" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        # Registered before exec: dataclasses resolve their annotations through sys.modules.
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]


def config_class(path: Path) -> type:
    """The dataclass a YAML file is for, by file-name prefix (longest prefix first)."""
    name = path.name
    if name.startswith("post_"):
        return recipe_module("post_train").PostTrainConfig
    if name.startswith("pretrain_"):
        return recipe_module("pretrain").PretrainConfig
    if name.startswith("image_sft_"):
        return recipe_module("image_sft").ImageSFTConfig
    if name.startswith("grpo_"):
        return recipe_module("grpo").GRPORecipeConfig
    if name.startswith("store_"):
        from tokenswap.store.build import StoreBuildConfig

        return StoreBuildConfig
    if name.startswith("bench_"):
        from tokenswap.eval.bench_builder import BenchBuildConfig

        return BenchBuildConfig
    pytest.fail(
        f"{path.relative_to(ROOT)}: no config class for this file-name prefix; "
        "map the new prefix in tests/test_configs.py:config_class"
    )


def test_there_are_configs_to_check():
    assert len(CONFIG_YAMLS) >= 10
    assert list((CONFIGS / "accelerate").glob("*.yaml")) and list((CONFIGS / "deepspeed").glob("*.json"))


@pytest.mark.parametrize("path", CONFIG_YAMLS, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_yaml_loads_into_its_dataclass(path):
    cfg = load_config(config_class(path), path)
    assert type(cfg) is config_class(path)


@pytest.mark.parametrize(
    "path",
    [p for p in CONFIG_YAMLS if p.name.startswith(RECIPE_PREFIXES) and p.parent.name != "tiny"],
    ids=lambda p: str(p.relative_to(CONFIGS)),
)
def test_recipe_yaml_opens_with_its_launch_command(path):
    header = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    assert header, f"{path.name} must open with a comment block (recipe, assumptions, launch line)"
    assert any("accelerate launch" in line for line in header), f"{path.name}: no `accelerate launch` line in its header"


@pytest.mark.parametrize("path", sorted((CONFIGS / "accelerate").glob("*.yaml")), ids=lambda p: p.name)
def test_accelerate_yaml(path):
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict) and data.get("distributed_type"), f"{path.name} has no distributed_type"
    ds = data.get("deepspeed_config", {}).get("deepspeed_config_file")
    if ds is not None:
        assert (ROOT / ds).is_file(), f"{path.name} points at a missing DeepSpeed file {ds}"


@pytest.mark.parametrize("path", sorted((CONFIGS / "deepspeed").glob("*.json")), ids=lambda p: p.name)
def test_deepspeed_json(path):
    data = json.loads(path.read_text())
    assert data["zero_optimization"]["stage"] in (0, 1, 2, 3)
