"""Log the modality gap during training: a ``transformers.TrainerCallback`` around :class:`GapEvaluator`.

Metrics go through ``trainer.log`` so every reporting integration (W&B, TensorBoard, ...) and
``trainer.state.log_history`` receive them. The callback runs on every rank: under DeepSpeed
ZeRO-3 each forward gathers parameter shards collectively, so all ranks must evaluate together
(the evaluator pads shards so the number of calls matches).
"""

from __future__ import annotations

from transformers import TrainerCallback

from tokenswap.eval.gap import GapEvaluator, GapResult

__all__ = ["GapEvalCallback"]


class GapEvalCallback(TrainerCallback):
    """Evaluate the gap every ``eval_steps`` optimizer steps and at the end of training.

    Args:
        trainer: the trainer whose model is evaluated and whose ``log`` receives the metrics
            (``gap/acc_text``, ``gap/acc_interleaved``, ``gap/abs``, ``gap/rel``, ``gap/retention``,
            ``gap/images_K/...``; with the recognition control ``gap/recognition_naming``,
            ``gap/recognition_mc``, ``gap/recognition_rate``, ``gap/recognised_only/abs`` and
            ``gap/controlled/...``; with the ``both`` form ``gap/acc_both``, ``gap/load`` and ``gap/content``;
            with ``both`` or recognition the split of the gap ``gap/components/{load,recognition,rest}``; and each
            control's own ``gap/n_<form>``: an item without concept names is skipped in the forms that need them,
            as in ``tokenswap eval``, and a form left with no item is logged with n 0, never raised).
        evaluator: a :class:`GapEvaluator` on the held-out pairs (inputs are built once and reused).
        eval_steps: evaluate when ``global_step`` is a multiple of this; 0 for train end only.
        at_train_end: also evaluate when training ends (skipped if that step was just evaluated).
        prefix: metric name prefix.

    Example::

        trainer = SFTTrainer(...)
        trainer.add_callback(GapEvalCallback(trainer, GapEvaluator(processor, heldout), eval_steps=200))
    """

    def __init__(
        self,
        trainer,
        evaluator: GapEvaluator,
        eval_steps: int = 500,
        at_train_end: bool = True,
        prefix: str = "gap/",
    ):
        if eval_steps < 0:
            raise ValueError(f"eval_steps must be >= 0 (0 = only at train end), got {eval_steps}")
        self.trainer = trainer
        self.evaluator = evaluator
        self.eval_steps = eval_steps
        self.at_train_end = at_train_end
        self.prefix = prefix
        self.last_result: GapResult | None = None
        self._last_step = -1

    def _run(self, state, control) -> None:
        # trainer.model is the unwrapped module (DeepSpeed/DDP engines wrap it in model_wrapped);
        # under ZeRO-3 its hooks gather parameters on forward, on all ranks at once.
        self.last_result = self.evaluator.evaluate(self.trainer.model)
        self._last_step = state.global_step
        # Trainer.log clears control.should_log, which would drop this step's loss line.
        should_log = control.should_log
        self.trainer.log(self.last_result.metrics(self.prefix))
        control.should_log = should_log

    def on_step_end(self, args, state, control, **kwargs):
        if self.eval_steps and state.global_step % self.eval_steps == 0 and state.global_step != self._last_step:
            self._run(state, control)
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self.at_train_end and state.global_step != self._last_step:
            self._run(state, control)
        return control
