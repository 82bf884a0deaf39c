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


def test_gap_eval_recognition_key_is_the_recognition_form(tiny_bench, tiny_processor):
    """`gap_eval.recognition: true` (configs/demo/*.yaml) stays accepted: it adds the recognition form, the one switch
    the evaluator reads, so the callback built from it identifies pictures."""
    from tokenswap.training.builders import build_gap_callback
    from tokenswap.training.config import GapEvalConfig

    cfg = GapEvalConfig(bench=str(tiny_bench), recognition=True, limit=4)
    assert cfg.forms == ["text", "interleaved", "recognition"]
    assert GapEvalConfig(bench=str(tiny_bench), recognition=True, forms=["recognition"]).forms == ["recognition"]
    callback = build_gap_callback(cfg, tiny_processor, trainer=None)
    assert callback.evaluator.forms == ("text", "interleaved", "recognition") and callback.evaluator.plan.recognition
