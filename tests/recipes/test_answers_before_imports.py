"""A recipe answers a config typo before it imports what it trains with (torch, transformers, peft: seconds).

The recipes parsed their config only after 8-12 s of imports. Now the Trainer's ``train:`` section is a
:class:`~tokenswap.training.trainer_args.TrainerSection` whose key names are read from the transformers/TRL source
files, and :func:`tokenswap.config.check_config_early` runs before any of those imports.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from tokenswap.config import ConfigError, check_config_early, parse_config
from tokenswap.training.trainer_args import PairedTrainConfig, TrainConfig, TrainerSection

ROOT = Path(__file__).resolve().parents[2]

# What the recipe's training imports load; none of it may be needed to answer a typo.
HEAVY = ("torch", "transformers", "peft", "trl", "deepspeed", "accelerate", "datasets")

RUN = """
import runpy, sys
sys.argv = [sys.argv[1], *sys.argv[2:]]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as e:
    heavy = [m for m in {heavy!r} if m in sys.modules]
    print(f"exit={{e.code}} heavy={{','.join(heavy) or '-'}}", file=sys.__stderr__)
"""


def answer(recipe: str, *argv: str) -> tuple[str, str]:
    """(the recipe's stderr without the probe's line, the probe's line) for ``python recipes/RECIPE.py ARGV``."""
    done = subprocess.run([sys.executable, "-c", RUN.format(heavy=HEAVY), f"recipes/{recipe}.py", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    *said, probe = done.stderr.rstrip("\n").splitlines()
    return "\n".join(said), probe


TYPOS = [
    ("post_train", "tiny/post_tokenswap.yaml", "PairedTrainConfig"),
    ("pretrain", "tiny/pretrain_tokenswap.yaml", "PairedTrainConfig"),
    ("image_sft", "tiny/image_sft_crossmath.yaml", "TrainConfig"),
    ("grpo", "tiny/grpo_crossmath.yaml", "GRPOTrainConfig"),
]


@pytest.mark.integration
@pytest.mark.parametrize("recipe, config, section", TYPOS, ids=[t[0] for t in TYPOS])
def test_a_typo_anywhere_is_answered_without_the_training_imports(recipe, config, section):
    said, probe = answer(recipe, "--config", config, "run.sed=1", "train.learnig_rate=1e-5", "train.seed=3",
                         "wandbb.mode=offline")
    assert probe == "exit=2 heavy=-", (probe, said)
    assert "unknown key `run.sed` for RunConfig; did you mean `run.seed`?" in said
    assert f"unknown key `train.learnig_rate` for {section}; did you mean `train.learning_rate`?" in said
    assert "`train.seed` is set by the recipe: set `run.seed`" in said
    assert "unknown key `wandbb`" in said and "did you mean `wandb`?" in said
    assert "Traceback" not in said


@pytest.mark.integration
def test_a_config_name_typo_is_answered_without_the_training_imports():
    said, probe = answer("post_train", "--config", "tiny/post_tokenswp.yaml")
    assert probe == "exit=2 heavy=-", (probe, said)
    assert "did you mean 'tiny/post_tokenswap.yaml'?" in said


@pytest.mark.integration
def test_a_value_only_the_trainer_section_can_check_still_fails_the_parse():
    # The early check reads the section's key names only; the value is the full parse's to refuse (after imports).
    said, probe = answer("post_train", "--config", "tiny/post_tokenswap.yaml", "train.learning_rate=fast")
    assert probe.startswith("exit=2 heavy=") and "transformers" in probe, probe
    assert "`train.learning_rate` must be a number, got 'fast'" in said


def _recipe_config(load_recipe, name: str) -> tuple[type, TrainerSection]:
    module = load_recipe(name)
    cls = next(v for k, v in vars(module).items() if k.endswith("Config") and dataclasses.is_dataclass(v)
               and any(f.name == "run" for f in dataclasses.fields(v)))
    return cls, next(f.default_factory for f in dataclasses.fields(cls) if f.name == "train")


@pytest.mark.parametrize("name", ["post_train", "image_sft", "grpo"])
def test_the_keys_read_from_source_are_the_built_sections_fields(load_recipe, name):
    # Drift guard: a transformers/TRL release that moves or reshapes the class makes known_keys() None (the early
    # check then leaves the section to the full parse), and this fails so that it is noticed.
    _, section = _recipe_config(load_recipe, name)
    keys = section.known_keys()
    assert keys is not None
    assert keys == {f.name for f in dataclasses.fields(section.resolve())}


def test_the_early_answer_is_the_full_parses_own_lines(load_recipe):
    cls, _ = _recipe_config(load_recipe, "post_train")
    argv = ["--config", "tiny/post_tokenswap.yaml", "collator.swap_probb=0.5", "train.num_train_epocs=1",
            "train.learning_rate=fast", "gap_eval.every_stepss=2"]
    with pytest.raises(ConfigError) as early:
        check_config_early(cls, argv)
    with pytest.raises(ConfigError) as full:
        parse_config(cls, argv)
    assert len(early.value.problems) == 3 and set(early.value.problems) < set(full.value.problems)
    assert any("learning_rate" in p for p in full.value.problems)  # a value only the built section checks


def test_a_section_whose_source_cannot_be_read_leaves_its_keys_to_the_full_parse(load_recipe):
    cls, _ = _recipe_config(load_recipe, "post_train")
    moved = TrainerSection("MovedConfig", PairedTrainConfig.resolve, (("transformers", "gone.py", "Nope"),))
    assert moved.known_keys() is None
    probe = dataclasses.make_dataclass("Probe", [("train", moved, dataclasses.field(default_factory=moved))])
    check_config_early(probe, ["train.anything=1"])  # nothing to say before the section is built
    with pytest.raises(ConfigError, match="unknown key `train.anything` for PairedTrainConfig"):
        parse_config(probe, ["train.anything=1"])


def test_the_stand_in_builds_the_same_section_every_time():
    assert TrainConfig.resolve() is TrainConfig.resolve()
    assert TrainConfig().learning_rate == 1e-5 and PairedTrainConfig().report_to == ["wandb"]
