"""GapEvalCallback inside a short HF Trainer run on the tiny Qwen2-VL."""

from __future__ import annotations

import pytest
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from tokenswap.eval.callback import GapEvalCallback
from tokenswap.eval.gap import GapEvaluator
from tokenswap.families import load_checkpoint


class _Collator:
    """Text-only chat batches with the answer learned (labels = input ids, padding masked)."""

    def __init__(self, processor):
        self.processor = processor

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        texts = [
            self.processor.apply_chat_template(
                [{"role": "user", "content": r["q"]}, {"role": "assistant", "content": r["a"]}], tokenize=False
            )
            for r in rows
        ]
        batch = self.processor(text=texts, padding=True, return_tensors="pt")
        batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        return dict(batch)


class _ModeProbe(TrainerCallback):
    def __init__(self):
        self.modes = []

    def on_step_end(self, args, state, control, model=None, **kwargs):  # runs after the gap callback
        self.modes.append(model.training)


@pytest.mark.integration
def test_callback_logs_gap_metrics_and_restores_train_mode(tiny_qwen2vl, tmp_path, make_pairs):
    model, processor = load_checkpoint(tiny_qwen2vl)
    rows = [{"q": f"What is {i} plus {i}?", "a": str(2 * i)} for i in range(8)]
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=5,
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=rows, data_collator=_Collator(processor))
    evaluator = GapEvaluator(processor, make_pairs(4), batch_size=4, progress=False)
    callback = GapEvalCallback(trainer, evaluator, eval_steps=2)
    probe = _ModeProbe()
    trainer.add_callback(callback)
    trainer.add_callback(probe)
    trainer.train()

    logged = [h for h in trainer.state.log_history if "gap/acc_text" in h]
    assert [h["step"] for h in logged] == [2, 4, 5]  # every 2 steps, then train end at step 5
    for h in logged:
        for key in ("gap/acc_interleaved", "gap/abs", "gap/images_1/acc_text", "gap/images_2/abs"):
            assert key in h
        assert h["gap/abs"] == h["gap/acc_text"] - h["gap/acc_interleaved"]
    assert all(probe.modes) and len(probe.modes) == 5
    assert callback.last_result is not None and callback.last_result.overall.n == 4


def test_the_recognition_form_is_the_one_recognition_switch(tiny_bench, tiny_processor, tmp_path):
    """The form switches recognition on; the old key `gap_eval.recognition` is refused with one line pointing to it,
    as `tokenswap eval --recognition` is."""
    from tokenswap.config import ConfigError, load_config
    from tokenswap.training.builders import build_gap_callback
    from tokenswap.training.config import GapEvalConfig

    old = tmp_path / "old.yaml"
    old.write_text("recognition: true\n")
    with pytest.raises(ConfigError, match=r"`recognition` is gone: add `recognition` to `gap_eval.forms`"):
        load_config(GapEvalConfig, str(old), [])
    from tokenswap.cli import main as tokenswap_main

    assert tokenswap_main(["eval", "--model", "m", "--bench", "b", "--recognition"]) == 2
    cfg = GapEvalConfig(bench=str(tiny_bench), forms=["text", "interleaved", "recognition"], limit=4)
    callback = build_gap_callback(cfg, tiny_processor, trainer=None)
    assert callback.evaluator.forms == ("text", "interleaved", "recognition") and callback.evaluator.plan.recognition
