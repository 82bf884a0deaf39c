"""A progress bar for stages that ask a model: rows done, requests/s, replies in flight, retries, errors, ETA."""

from __future__ import annotations

import time
from collections.abc import Iterable

from tokenswap.inference.types import ChatModel, RequestStats

__all__ = ["RequestProgress", "combined_stats"]


def combined_stats(models: Iterable[ChatModel]) -> dict:
    """The models' :class:`~tokenswap.inference.types.RequestStats` as one (:meth:`RequestStats.merge`)."""
    return RequestStats.merge(model.stats for model in models)


class RequestProgress:
    """A tqdm bar over rows whose postfix shows the models' request rate, in flight, retries and errors.

    tqdm gives the ETA when ``total`` is known. The postfix is refreshed at most twice a second, so a
    fast stage does not spend its time drawing.

    Args:
        total: rows to do (None: unknown, no ETA).
        desc: the bar's label.
        enabled: False draws nothing (other ranks, ``progress: false``).
        models: chat models whose ``stats`` the postfix sums (``None`` entries, a model not used, are left out).
    """

    def __init__(self, total: int | None, desc: str, enabled: bool, models: Iterable[ChatModel | None] = ()):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, desc=desc, disable=not enabled, dynamic_ncols=True, leave=False)
        self.models = [m for m in models if m is not None]
        self.t0 = time.monotonic()
        self._shown = 0.0

    def add_model(self, model: ChatModel | None) -> None:
        if model is not None:
            self.models.append(model)

    def update(self, n: int = 1) -> None:
        self.bar.update(n)
        now = time.monotonic()
        if self.models and now - self._shown >= 0.5 and not self.bar.disable:
            self._shown = now
            s = combined_stats(self.models)
            self.bar.set_postfix_str(
                f"{s.get('requests', 0) / max(now - self.t0, 1e-9):.1f} req/s, {s.get('in_flight', 0)} in flight, "
                f"{s.get('retries', 0)} retries, {s.get('errors', 0)} errors",
                refresh=False,
            )

    def close(self) -> None:
        self.bar.close()
