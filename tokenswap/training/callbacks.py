"""Trainer callbacks the recipes install: swap epochs, swap statistics, and the stop for steps with no target."""

from __future__ import annotations

import torch
from transformers import TrainerCallback

from tokenswap.collator import TokenSwapCollator
from tokenswap.errors import IncompleteRunError
from tokenswap.ranks import print0


class EpochCallback(TrainerCallback):
    """Tell the collator the epoch, for ``resample_each_epoch`` swap policies."""

    def __init__(self, collator: TokenSwapCollator):
        self.collator = collator

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.collator.epoch = int(state.epoch or 0)


class SwapStatsCallback(TrainerCallback):
    """Adds the collator's swap statistics to every log line (W&B included).

    Logged (cumulative over the batches this process trained, read from a :class:`ResumableCollator`'s
    ``stats``): ``swap/images_per_sample``,
    ``swap/swapped_per_sample``, ``swap/text_by_policy``, ``swap/text_missing_image``,
    ``swap/text_corrupt_image``, ``swap/truncated_samples``, ``swap/dummy_images``, and what cuts
    and packing did: ``swap/tokens_truncated``, ``swap/images_dropped_truncation`` (image blocks cut
    whole at ``max_length``/``pack_budget``), ``swap/packed_rows``. Must run before the reporting
    callbacks; :func:`install_first` puts it there.
    """

    def __init__(self, collator):
        # Any object with the collator's ``stats`` mapping (checkpoint.py's ResumableCollator, which imports this
        # module, so it is not named here).
        self.collator = collator

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or "loss" not in logs:
            return
        s = self.collator.stats
        n = max(1, s["samples"])
        logs.update(
            {
                "swap/images_per_sample": s["images"] / n,
                "swap/swapped_per_sample": s["concepts_swapped"] / n,
                "swap/text_by_policy": s["concepts_text_by_policy"],
                "swap/text_missing_image": s["concepts_text_missing_image"],
                "swap/text_corrupt_image": s["concepts_text_corrupt_image"],
                "swap/truncated_samples": s["samples_truncated"],
                "swap/dummy_images": s["dummy_images"],
                "swap/tokens_truncated": s["tokens_truncated"],
                "swap/images_dropped_truncation": s["images_dropped_truncation"],
                "swap/packed_rows": s["packed_rows"],
            }
        )
        # Trainer.log stored a copy of `logs` in log_history before calling on_log: keep log_history.json complete.
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update({k: v for k, v in logs.items() if k.startswith("swap/")})


class NoTargetsError(IncompleteRunError):
    """Too many optimizer steps of a run had no target token (see :class:`EmptyStepCallback`): the run stopped
    without training what it was asked to (exit status 1, one line, through the recipe's entry)."""


class EmptyStepCallback(TrainerCallback):
    """Stops a run whose optimizer steps have nothing to learn, instead of training on zero targets with loss 0.

    A forward pre-hook on ``model`` counts the target tokens (``labels != -100``) of every training forward: the
    micro-batches that actually trained, whatever data-loader workers and prefetching do. At each step end the count
    is summed over the ranks (so every rank decides alike), and a step without any target counts as empty (a step
    whose forwards got no ``labels`` at all, as with label smoothing, is not judged). Once more
    than ``max_share`` of the run's ``max_steps`` were empty, :class:`NoTargetsError` names the step and the
    collator's refusal counts; before that each empty step is warned.

    Args:
        model: the model given to the Trainer.
        max_share: ``collator.max_empty_step_share``.
        collator: the collator, whose ``stats`` name the refusals in the error.
    """

    def __init__(self, model, max_share: float, collator=None):
        self.max_share = max_share
        self.collator = collator
        self.empty_steps = 0
        self._targets: torch.Tensor | None = None  # (targets, forwards with labels) of this step on this rank
        model.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module, args, kwargs):
        labels = kwargs.get("labels")
        if module.training and torch.is_tensor(labels):
            # Stays on the device: one sync per step, at step end.
            n = torch.stack([(labels != -100).sum(), torch.ones((), dtype=torch.int64, device=labels.device)])
            self._targets = n if self._targets is None else self._targets + n.to(self._targets.device)

    def on_step_end(self, args, state, control, **kwargs):
        import torch.distributed as dist

        counts = self._targets if self._targets is not None else torch.zeros(2, dtype=torch.int64)
        self._targets = None
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            device = "cpu" if dist.get_backend() == "gloo" else args.device
            counts = counts.to(device=device, dtype=torch.int64)
            dist.all_reduce(counts)
        targets, forwards = (int(v) for v in counts.tolist())
        # No forward saw labels: the Trainer computes the loss itself (label smoothing pops them), so nothing is known.
        if targets > 0 or forwards == 0:
            return
        self.empty_steps += 1
        refusals = {k: v for k, v in (self.collator.stats if self.collator is not None else {}).items()
                    if k.startswith(("samples_skipped_", "samples_dropped_", "samples_truncated", "batches_")) and v}
        what = (f"step {state.global_step} of {state.max_steps} had no target token on any rank (every label -100): its "
                f"samples were refused or cut before their answers (collator counts in this process: {refusals})")
        allowed = self.max_share * state.max_steps
        if self.empty_steps > allowed:
            raise NoTargetsError(
                f"{what}. {self.empty_steps} step(s) without targets so far, more than collator.max_empty_step_share="
                f"{self.max_share} of {state.max_steps} steps allows ({allowed:g}). Fix the data (the collator's "
                "warnings name the refused samples), or raise collator.max_empty_step_share"
            )
        print0(f"[tokenswap] warning: {what}; {self.empty_steps} such step(s) so far, up to {allowed:g} allowed")


def install_first(trainer, callback: TrainerCallback) -> None:
    """Register ``callback`` ahead of the reporting callbacks so values it adds to ``logs`` are reported."""
    trainer.callback_handler.callbacks.insert(0, callback)
