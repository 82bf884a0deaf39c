"""Trainer pass-through sections, model loading (families, QLoRA, seeded LoRA) and checkpoint resolution."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from transformers import TrainingArguments

from tokenswap.config import ConfigError, load_config
from tokenswap.errors import BusyError, InputError
from tokenswap.training import (
    COMPLETE_MARKER,
    TRAINER_OWNED,
    LoraConfig,
    ModelConfig,
    PairedTrainConfig,
    RunConfig,
    TrainConfig,
    build_training_arguments,
    load_model_and_processor,
    resolve_checkpoint,
    run_recipe,
    trainer_section,
)


@dataclasses.dataclass(kw_only=True)
class Recipe:
    train: PairedTrainConfig = dataclasses.field(default_factory=PairedTrainConfig)
    """Trainer options."""


RUN = RunConfig(output_dir="unused", pair="p", arm="text")


def test_every_trainer_field_is_a_key_except_the_owned_ones():
    ours = {f.name for f in dataclasses.fields(TrainConfig)}
    theirs = {f.name for f in dataclasses.fields(TrainingArguments) if f.init}
    assert theirs - ours == set(TRAINER_OWNED)
    assert "train_sampling_strategy" not in {f.name for f in dataclasses.fields(PairedTrainConfig)}


def test_trainer_fields_pass_through_from_yaml_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  use_liger_kernel: false\n  push_to_hub: false\n  optim: adamw_torch\n")
    cfg = load_config(Recipe, path, ["train.include_num_input_tokens_seen=true", "train.torch_compile=false",
                                     "train.adam_beta2=0.95", "train.lr_scheduler_kwargs={min_lr: 1.0e-6}"])
    assert cfg.train.include_num_input_tokens_seen is True and cfg.train.torch_compile is False
    assert cfg.train.optim == "adamw_torch" and cfg.train.adam_beta2 == 0.95
    assert cfg.train.lr_scheduler_kwargs == {"min_lr": 1e-6}
    # recipe defaults where they differ from TrainingArguments; the class's own elsewhere
    assert cfg.train.lr_scheduler_type == "cosine" and cfg.train.max_grad_norm == 1.0


@pytest.mark.parametrize(
    "override, match",
    [
        ("train.learning_rat=1", r"unknown key `train.learning_rat`.*did you mean `train.learning_rate`"),
        ("train.lr_scheduler_type=cosin", r"`train.lr_scheduler_type` must be one of .*did you mean 'cosine'"),
        ("train.optim=adam_w", r"`train.optim` must be one of"),
        ("train.per_device_train_batch_size=two", r"`train.per_device_train_batch_size` must be an integer"),
        ("train.learning_rate=-1e-5", r"`learning_rate` must be >= 0"),
        ("train.max_steps=0", r"`max_steps` must be -1"),
        ("train.gradient_accumulation_steps=0", r"`gradient_accumulation_steps` must be > 0"),
        ("train.learning_rate=.nan", r"`train.learning_rate` must be a number, got NaN"),
        ("train.output_dir=x", r"`train.output_dir` is set by the recipe: set `run.output_dir`"),
        ("train.train_sampling_strategy=random", r"is set by the recipe: the arms of a pair share the order"),
        ("train.push_to_hub=maybe", r"`train.push_to_hub` must be true or false"),
    ],
)
def test_trainer_field_problems_are_config_errors(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(Recipe, None, [override])


def test_documented_strategy_values_pass_written_plainly_in_yaml_and_as_overrides(tmp_path):
    # YAML 1.1 reads `no` as False; the Trainer documents the string "no".
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  save_strategy: no\n  logging_strategy: no\n  bf16: no\n  use_cpu: yes\n"
                    "  report_to: none\n")
    for cfg in (load_config(Recipe, path), load_config(Recipe, None, [
            "train.save_strategy=no", "train.logging_strategy=no", "train.bf16=no", "train.use_cpu=yes",
            "train.report_to=none"])):
        assert (cfg.train.save_strategy, cfg.train.logging_strategy, cfg.train.bf16) == ("no", "no", False)
        args = build_training_arguments(cfg.train, RunConfig(output_dir=str(tmp_path), pair="p", arm="text"))
        assert args.save_strategy == "no" and args.logging_strategy == "no" and args.use_cpu is True


def test_deprecated_gradient_checkpointing_alias_is_honoured():
    assert load_config(Recipe, None, ["train.gradient_checkpointing=false"]).train.activation_checkpointing is False
    assert load_config(Recipe, None, []).train.activation_checkpointing is True


@pytest.mark.compat
@pytest.mark.parametrize("value", [True, False])
def test_activation_checkpointing_reaches_the_trainer_on_every_release(value, tmp_path):
    # The configs use the name transformers took after 5.17; on 5.17 (the floor) it is gradient_checkpointing.
    cfg = load_config(Recipe, None, [f"train.activation_checkpointing={str(value).lower()}", "train.bf16=no",
                                     "train.use_cpu=yes", "train.report_to=none"])
    args = build_training_arguments(cfg.train, RunConfig(output_dir=str(tmp_path), pair="p", arm="text"))
    on = getattr(args, "activation_checkpointing", None)
    assert (on if on is not None else args.gradient_checkpointing) is value
    assert cfg.train.activation_checkpointing is value


def test_help_lists_every_trainer_field_with_its_documentation(capsys):
    with pytest.raises(SystemExit) as e:
        run_recipe(lambda cfg: pytest.fail("--help ran the recipe"), Recipe, ["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for name in ("use_liger_kernel", "push_to_hub", "include_num_input_tokens_seen", "torch_compile", "deepspeed"):
        assert f"train.{name}=" in out
    assert "Whether or not to use the Liger Kernel" in out or "Liger" in out
    assert "%%" not in out  # transformers' argparse escapes are read as argparse reads them


def test_training_arguments_carry_the_run_and_the_recipe_values(tmp_path):
    cfg = load_config(Recipe, None, ["train.use_cpu=true", "train.bf16=false", "train.report_to=[none]",
                                     "train.include_num_input_tokens_seen=true", "train.torch_compile=false"])
    run = RunConfig(output_dir=str(tmp_path), pair="p", arm="tokenswap", seed=7)
    args = build_training_arguments(cfg.train, run, train_sampling_strategy="sequential")
    assert (args.output_dir, args.run_name, args.seed) == (str(tmp_path), "p-tokenswap-s7", 7)
    assert args.remove_unused_columns is False and args.train_sampling_strategy == "sequential"
    assert args.include_num_input_tokens_seen == "all" and args.torch_compile is False


def test_a_value_the_trainer_rejects_exits_2_with_the_config_error(tmp_path, capsys):
    argv = ["train.use_cpu=true", "train.bf16=false", "train.load_best_model_at_end=true", "train.save_strategy=epoch"]
    cfg = load_config(Recipe, None, argv)
    with pytest.raises(ConfigError, match=r"^1 problem in train \(TrainingArguments\): train: "):
        build_training_arguments(cfg.train, RunConfig(output_dir=str(tmp_path), pair="p", arm="text"))

    def main(cfg):
        build_training_arguments(cfg.train, RunConfig(output_dir=str(tmp_path), pair="p", arm="text"))

    with pytest.raises(SystemExit) as e:  # through a recipe's entry: one line, exit 2
        run_recipe(main, Recipe, argv)
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith("error: 1 problem in train (TrainingArguments): train: ")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the paper's bf16 settings are valid on a CUDA machine")
def test_the_papers_bf16_settings_on_a_cpu_machine_say_which_keys_to_set(tmp_path):
    cfg = load_config(Recipe, None, ["train.bf16=true"])
    with pytest.raises(InputError) as e:  # exit status 2 through a recipe's entry
        build_training_arguments(cfg.train, RunConfig(output_dir=str(tmp_path), pair="p", arm="text"))
    assert "needs a GPU" in str(e.value) and "train.bf16" in str(e.value) and "configs/tiny/" in str(e.value)
    assert "train.bf16=false train.use_cpu=true" in str(e.value)
    cfg = load_config(Recipe, None, ["train.bf16=false", "train.use_cpu=true", "train.report_to=[none]"])
    assert build_training_arguments(cfg.train, RunConfig(output_dir=str(tmp_path), pair="p", arm="text")).use_cpu


def test_grpo_section_reaches_trl(tmp_path):
    from trl import GRPOConfig

    section = trainer_section(GRPOConfig, "GRPOSection")
    cfg = load_config(
        dataclasses.make_dataclass("G", [("train", section, dataclasses.field(default_factory=section))], kw_only=True),
        None,
        ["train.use_vllm=false", "train.num_generations=4", "train.beta=0.0", "train.use_cpu=true", "train.bf16=false",
         "train.per_device_train_batch_size=4", "train.report_to=[none]"],
    )
    args = build_training_arguments(cfg.train, RunConfig(output_dir=str(tmp_path), pair="p", arm="text"))
    assert isinstance(args, GRPOConfig)
    assert args.use_vllm is False and args.num_generations == 4 and args.beta == 0.0
    with pytest.raises(ConfigError, match="`num_generations` must be > 0"):
        load_config(dataclasses.make_dataclass("G2", [("train", section)], kw_only=True), None,
                    ["train.num_generations=0"])


# ---------------------------------------------------------------------------- model loading
def _adapters(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def test_lora_initialisation_follows_the_seed(tiny_qwen2vl):
    cfg = ModelConfig(name_or_path=tiny_qwen2vl, dtype="float32", attn_implementation="sdpa", lora=LoraConfig(r=4))
    torch.manual_seed(123)  # the ambient RNG must not matter
    a = _adapters(load_model_and_processor(cfg, seed=5)[0])
    torch.manual_seed(999)
    b = _adapters(load_model_and_processor(cfg, seed=5)[0])
    c = _adapters(load_model_and_processor(cfg, seed=6)[0])
    assert a and a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a if "lora_A" in k)


def test_lora_initialisation_without_a_seed_is_the_same_in_every_process(tiny_qwen2vl):
    # Each process of a run starts from its own ambient RNG state; the library default must not depend on it.
    cfg = ModelConfig(name_or_path=tiny_qwen2vl, dtype="float32", attn_implementation="sdpa", lora=LoraConfig(r=4))
    torch.manual_seed(1)
    a = _adapters(load_model_and_processor(cfg)[0])
    torch.manual_seed(2)
    ambient = torch.get_rng_state()
    b = _adapters(load_model_and_processor(cfg)[0])
    assert a and all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(torch.get_rng_state(), ambient)  # the caller's random state is not reseeded


def test_unsupported_family_names_the_supported_ones(tmp_path):
    from transformers import LlamaConfig

    LlamaConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"qwen2_vl.*qwen2_5_vl.*qwen3_vl"):
        load_model_and_processor(ModelConfig(name_or_path=str(tmp_path)))


def test_missing_local_model_folder_says_so(tmp_path):
    from tokenswap.errors import InputError

    with pytest.raises(InputError, match=r"model.name_or_path '.*nope' does not exist locally: no such folder"):
        load_model_and_processor(ModelConfig(name_or_path=str(tmp_path / "nope")))
    # the recipes take a value as `tokenswap eval --model` does: a weights file is a path, never a hub id
    with pytest.raises(InputError, match=r"model.name_or_path 'models/ckpt.safetensors' does not exist locally"):
        load_model_and_processor(ModelConfig(name_or_path="models/ckpt.safetensors"))
    # org/name could be a hub id: offline, the error says both what was looked for and why it failed
    with pytest.raises(FileNotFoundError, match=r"neither a local checkpoint folder .* nor loadable as a hub id"):
        load_model_and_processor(ModelConfig(name_or_path="outputs/image_sft_crossmath"))


def test_load_in_4bit_needs_lora():
    with pytest.raises(ValueError, match="also set `lora`"):
        ModelConfig(name_or_path="x", load_in_4bit=True)


def test_qlora_on_cpu_trains_only_the_adapters(tiny_qwen2vl):
    pytest.importorskip("bitsandbytes")
    import bitsandbytes as bnb

    cfg = ModelConfig(name_or_path=tiny_qwen2vl, dtype="float32", attn_implementation="sdpa",
                      lora=LoraConfig(r=4), load_in_4bit=True)
    model, _ = load_model_and_processor(cfg, seed=0)
    quantised = [n for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert quantised and all("language_model" in n for n in quantised)  # the vision tower stays unquantised
    assert model.base_model.model.model.language_model.layers[0].mlp.up_proj.base_layer.weight.quant_state is not None
    ids = torch.tensor([[3, 4, 5, 6, 7, 8]])
    model(input_ids=ids, labels=ids).loss.backward()
    trained = {n for n, p in model.named_parameters() if p.grad is not None}
    assert trained and all("lora_" in n for n in trained)


def test_qlora_in_bf16_hands_the_packed_kernel_bf16_queries(tiny_qwen2vl, monkeypatch):
    """torch's varlen kernel takes half-precision queries only; fp32 ones silently sent packed QLoRA to FlexAttention."""
    pytest.importorskip("bitsandbytes")
    import tokenswap.attention as attention
    from tokenswap.attention import use_packed_attention

    cfg = ModelConfig(name_or_path=tiny_qwen2vl, dtype="bfloat16", attn_implementation="sdpa",
                      lora=LoraConfig(r=4), load_in_4bit=True)
    model, _ = load_model_and_processor(cfg, seed=0)
    use_packed_attention(model, "sdpa", device="cpu")
    seen = []
    real = attention._sdpa
    monkeypatch.setattr(attention, "_sdpa", lambda module, q, *a, **k: seen.append(q.dtype) or real(module, q, *a, **k))
    ids = torch.tensor([[3, 4, 5, 6, 3, 4, 5]])
    position_ids = torch.tensor([[0, 1, 2, 3, 0, 1, 2]])  # two packed samples
    model(input_ids=ids, position_ids=position_ids, labels=ids).loss.backward()
    assert seen and set(seen) == {torch.bfloat16}, seen


def test_qlora_without_bitsandbytes_gives_the_install_line(tiny_qwen2vl, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real(name, *a))
    cfg = ModelConfig(name_or_path=tiny_qwen2vl, lora=LoraConfig(r=4), load_in_4bit=True)
    with pytest.raises(ImportError, match=r"pip install 'tokenswap\[gpu\]'"):
        load_model_and_processor(cfg)


# ---------------------------------------------------------------------------- checkpoints
def _checkpoint(root: Path, step: int, *, marker: bool, state: bool = True, weights: bool = True) -> Path:
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    if state:
        (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if weights:
        from safetensors.torch import save_file

        save_file({"w": torch.zeros(2)}, str(path / "model.safetensors"))
    if marker:
        (path / "tokenswap_state.rank0.json").write_text("{}")
        (path / COMPLETE_MARKER).write_text(json.dumps({"world_size": 1, "global_step": step}))
    return path


def test_latest_skips_checkpoints_killed_while_saving(tmp_path):
    done = _checkpoint(tmp_path, 2, marker=True)
    _checkpoint(tmp_path, 4, marker=False, state=False)  # killed before trainer_state.json
    assert resolve_checkpoint(str(tmp_path), "latest") == str(done)
    # a marker from a 2-rank run whose rank 1 never wrote its state is not complete either
    two = _checkpoint(tmp_path, 6, marker=True)
    (two / COMPLETE_MARKER).write_text(json.dumps({"world_size": 2, "global_step": 6}))
    assert resolve_checkpoint(str(tmp_path), "latest") == str(done)
    (two / "tokenswap_state.rank1.json").write_text("{}")
    assert resolve_checkpoint(str(tmp_path), "latest") == str(two)


def test_latest_skips_checkpoints_without_tokenswaps_record_saying_so_and_none_is_none(tmp_path, capsys):
    assert resolve_checkpoint(str(tmp_path / "absent"), "latest") is None
    assert resolve_checkpoint(str(tmp_path), "latest") is None
    done = _checkpoint(tmp_path, 2, marker=True)
    # trainer_state.json and weights, but no tokenswap record: killed between the two, or another tool's folder
    cut = _checkpoint(tmp_path, 3, marker=False)
    (tmp_path / "checkpoint-5").mkdir()
    (tmp_path / "checkpoint-5" / "trainer_state.json").write_text("{trunc")
    assert resolve_checkpoint(str(tmp_path), "latest") == str(done)
    assert f"{cut} is incomplete (no {COMPLETE_MARKER}" in capsys.readouterr().out
    assert resolve_checkpoint(str(tmp_path), None) is None


def test_an_explicit_incomplete_checkpoint_exits_2_naming_what_is_missing(tmp_path, capsys):
    two = _checkpoint(tmp_path, 6, marker=True)
    (two / COMPLETE_MARKER).write_text(json.dumps({"world_size": 2, "global_step": 6}))
    with pytest.raises(InputError, match="missing tokenswap_state.rank1.json"):
        resolve_checkpoint(str(tmp_path), str(two))


def test_latest_considers_only_folders_named_checkpoint_and_a_number(tmp_path):
    four = _checkpoint(tmp_path, 4, marker=True)
    for name in ("checkpoint-10-backup", "checkpoint-\u0663", "checkpoint-12.old", "tmp-checkpoint-20"):
        shutil.copytree(four, tmp_path / name)  # complete copies of step 4 under other names
    six = _checkpoint(tmp_path, 6, marker=True)
    assert resolve_checkpoint(str(tmp_path), "latest") == str(six)


def test_a_state_recording_more_log_than_the_log_holds_is_an_error_never_nul_padding(tiny_processor, tmp_path,
                                                                                  capsys):
    from tokenswap.collator import TokenSwapCollator
    from tokenswap.training import ResumableCollator

    log = tmp_path / "sample_ids.rank0.txt"
    log.write_text("a\nb\n")
    wrapped = ResumableCollator(TokenSwapCollator(tiny_processor, dummy_image=False), log_ids_to=str(log))
    with pytest.raises(InputError) as e:
        wrapped.restore({"log_bytes": 100, "stats": {}}, source="checkpoint-4/tokenswap_state.rank0.json")
    assert str(log) in str(e.value) and "checkpoint-4/tokenswap_state.rank0.json" in str(e.value)
    assert log.read_bytes() == b"a\nb\n"  # untouched: no NUL bytes
    log.unlink()
    with pytest.raises(InputError):  # a log that is gone lost every line the state counts
        wrapped.restore({"log_bytes": 4, "stats": {}})


HOSTILE_IDS = ["plain", "new\nline", "carriage\rreturn", "line\u2028separator", "para\u2029graph", "two words",
               "tab\there", "nel\x85", "50%", "%0A", "bell\x07", "", "vertical\x0btab", "file\x1csep"]


def test_sample_ids_with_line_breaks_cannot_break_or_forge_lines_of_the_log(tiny_processor, tmp_path):
    from tokenswap.collator import TokenSwapCollator, encode_sample_id, read_sample_ids
    from tokenswap.training import BOOKKEEPING_KEY, ResumableCollator

    log = tmp_path / "sample_ids.rank0.txt"
    wrapped = ResumableCollator(TokenSwapCollator(tiny_processor, dummy_image=False), log_ids_to=str(log))
    model = _Model()
    wrapped.attach(model)
    model.train()
    batches = [HOSTILE_IDS[i:i + 3] for i in range(0, len(HOSTILE_IDS), 3)]
    for ids in batches:
        batch = wrapped([{"id": sid, "messages": [{"role": "user", "content": "hi"},
                                                  {"role": "assistant", "content": "yo"}]} for sid in ids])
        assert len(batch[BOOKKEEPING_KEY]["ids"]) == 1
        model(**batch)
    text = log.read_text(encoding="utf-8")
    assert len(text.splitlines()) == len(batches)  # str.splitlines breaks at U+2028, \x85, \x1c too
    assert read_sample_ids(log) == batches
    assert encode_sample_id("mp-12") == "mp-12"  # ordinary ids are written as they are


def test_secret_fields_are_masked_by_name_in_every_written_config():
    from tokenswap.config import config_to_dict

    @dataclasses.dataclass
    class Section:
        hub_token: str | None = "hf_abc"
        api_key: str = "sk-1"
        include_num_input_tokens_seen: bool = True
        vllm_server_base_url: str = "http://user:pw@host:8000"
        unset_token: str | None = None

    @dataclasses.dataclass
    class Cfg:
        train: Section = dataclasses.field(default_factory=Section)

    saved = config_to_dict(Cfg())["train"]
    assert saved == {"hub_token": "<HUB_TOKEN>", "api_key": "<API_KEY>", "include_num_input_tokens_seen": True,
                     "vllm_server_base_url": "http://<CREDENTIALS>@host:8000", "unset_token": None}
    # every secret-looking field of the Trainer's own sections is caught by the same rule
    from tokenswap.training.trainer_args import TrainConfig

    assert config_to_dict(Recipe(train=PairedTrainConfig(hub_token="hf_x")))["train"]["hub_token"] == "<HUB_TOKEN>"
    assert "hub_token" in {f.name for f in dataclasses.fields(TrainConfig)}


@pytest.mark.integration
def test_a_dead_holder_never_locks_the_output_dir(tmp_path, capsys):
    import subprocess
    import sys

    from tokenswap.training import hold_output_dir

    out = tmp_path / "run"
    code = f"from tokenswap.training import hold_output_dir; hold_output_dir({str(out)!r}); print('held', flush=True); " \
           "import time; time.sleep(600)"
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(BusyError, match=rf"\(pid {holder.pid} on host"):
            hold_output_dir(str(out))
    finally:
        holder.kill()  # SIGKILL: no clean-up of any kind ran
        holder.wait()
    hold_output_dir(str(out))  # taken at once
    hold_output_dir(str(out))  # and again by the same process (a recipe's main called twice)


def test_resumable_collator_pickles_for_spawned_workers(tiny_processor, tmp_path):
    import pickle

    from tokenswap.collator import TokenSwapCollator
    from tokenswap.training import ResumableCollator

    wrapped = ResumableCollator(TokenSwapCollator(tiny_processor, dummy_image=False), log_ids_to=str(tmp_path / "ids"))
    example = {"id": "s", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    wrapped([example])
    clone = pickle.loads(pickle.dumps(wrapped))
    assert clone.log_ids_to == wrapped.log_ids_to and clone.collator.stats["samples"] == 1


class _Model(torch.nn.Module):
    """Records the keyword arguments each forward received."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, **kwargs):
        self.seen.append(sorted(kwargs))


def test_resumable_collator_counts_only_the_batches_the_model_trained_on(tiny_processor, tmp_path):
    from tokenswap.collator import TokenSwapCollator
    from tokenswap.training import BOOKKEEPING_KEY, ResumableCollator

    log = tmp_path / "ids.txt"
    wrapped = ResumableCollator(TokenSwapCollator(tiny_processor, dummy_image=False), log_ids_to=str(log))

    def batch(sid):
        return wrapped([{"id": sid, "messages": [{"role": "user", "content": "hi"},
                                                 {"role": "assistant", "content": "yo"}]}])

    first, second, prefetched = batch("a"), batch("b"), batch("c")  # as a loader (or its workers) runs ahead
    from collections import Counter

    assert [b[BOOKKEEPING_KEY]["ids"] for b in (first, second, prefetched)] == [["a"], ["b"], ["c"]]
    # each batch carries what it added to the collator's counters, keys first counted at 0 included
    added = Counter()
    for b in (first, second, prefetched):
        added.update(b[BOOKKEEPING_KEY]["stats"])
    assert added == wrapped.collator.stats and set(added) == set(wrapped.collator.stats)
    assert first[BOOKKEEPING_KEY]["stats"]["samples"] == 1
    assert not log.exists() and not wrapped.stats  # collated is not trained
    model = _Model()
    handle = wrapped.attach(model)
    model.train()
    model(**first)
    assert BOOKKEEPING_KEY not in model.seen[-1]
    assert log.read_text() == "a\n" and wrapped.stats["samples"] == 1
    checkpoint = wrapped.state()
    model.eval()
    model(**second)  # an evaluation forward is not training: taken off, not counted
    assert BOOKKEEPING_KEY not in model.seen[-1] and wrapped.stats["samples"] == 1
    model.train()
    model(**second)
    assert log.read_text() == "a\nb\n" and wrapped.stats["samples"] == 2
    wrapped.restore(checkpoint)  # resume: back to what had trained at the checkpoint
    assert log.read_text() == "a\n" and wrapped.stats == {**first[BOOKKEEPING_KEY]["stats"]}
    handle.remove()
    assert "c" not in log.read_text() and prefetched[BOOKKEEPING_KEY]["ids"] == ["c"]


def test_renamed_key_warnings_are_dropped_only_for_weights_loaded_from_that_checkpoint(
    tiny_qwen2vl, tmp_path, trainer_warnings
):
    import logging
    import types

    from tokenswap.training.checkpoint import _renamed_key_warnings_dropped

    log = logging.getLogger("transformers.trainer")
    cfg = ModelConfig(name_or_path=tiny_qwen2vl, dtype="float32", attn_implementation="sdpa")
    from_checkpoint, _ = load_model_and_processor(cfg, resume_from=tiny_qwen2vl)
    from_base, _ = load_model_and_processor(cfg)
    missing = "There were missing keys in the checkpoint model loaded: ['model.language_model.norm.weight']."
    for model, resume, kept in [(from_checkpoint, tiny_qwen2vl, False), (from_checkpoint, str(tmp_path), True),
                                (from_base, tiny_qwen2vl, True), (from_checkpoint, None, True)]:
        trainer_warnings.clear()
        with _renamed_key_warnings_dropped(types.SimpleNamespace(model=model), resume):
            log.warning(missing)
            log.warning("another warning")
        assert trainer_warnings == ([missing] if kept else []) + ["another warning"], (resume, kept)
    log.warning(missing)
    assert trainer_warnings[-1] == missing  # the filter is gone after the block


def test_configured_pixels_apply_without_deprecated_call_kwargs(tiny_qwen2vl):
    import warnings

    from PIL import Image

    cfg = ModelConfig(name_or_path=tiny_qwen2vl, dtype="float32", attn_implementation="sdpa",
                      min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 4)
    _, processor = load_model_and_processor(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # "Passing `min_pixels` and `max_pixels` to a processor call"
        out = processor(text=["<|vision_start|><|image_pad|><|vision_end|>a"], images=[Image.new("RGB", (300, 300))])
    # smart_resize floors 300 px to 28 under max_pixels=56*56 (the checkpoint's own 224*224 would give 16x16 patches)
    assert out["image_grid_thw"].tolist() == [[1, 2, 2]]


# ---------------------------------------------------------------------------- steps without targets
class _Echo(torch.nn.Module):
    def forward(self, input_ids=None, labels=None):
        return input_ids


def test_empty_steps_are_counted_from_what_trained_and_stop_the_run_past_the_share():
    from types import SimpleNamespace

    from tokenswap.training import EmptyStepCallback, NoTargetsError

    model = _Echo()
    guard = EmptyStepCallback(model, max_share=0.02, collator=SimpleNamespace(stats={"samples_skipped_too_long": 8}))
    args, state = SimpleNamespace(device=torch.device("cpu")), SimpleNamespace(global_step=0, max_steps=100)
    empty, learned = torch.full((2, 4), -100), torch.tensor([[-100, 5, 6, -100]])

    def step(*labels, train=True):
        model.train(train)
        for lab in labels:
            model(input_ids=lab, labels=lab)
        state.global_step += 1
        guard.on_step_end(args, state, None)

    step(empty, learned)  # one micro-batch with targets: the step trained
    step(empty)
    assert guard.empty_steps == 1
    step(learned, train=False)  # evaluation forwards are not training: nothing to judge
    model.train()
    model(input_ids=empty)  # labels popped by the Trainer (label smoothing): not judged either
    state.global_step += 1
    guard.on_step_end(args, state, None)
    step(empty, empty)
    assert guard.empty_steps == 2  # 2 of 100 steps: within max_share=0.02
    with pytest.raises(NoTargetsError, match=r"step 6 of 100 had no target token.*samples_skipped_too_long.*3 step\(s\) "
                                             r"without targets so far, more than collator.max_empty_step_share=0.02"):
        step(empty)


def test_max_empty_step_share_is_a_share():
    from tokenswap.training import CollatorConfig

    with pytest.raises(ValueError, match=r"`max_empty_step_share` must be in \[0, 1\], got 1.5"):
        CollatorConfig(max_empty_step_share=1.5)
