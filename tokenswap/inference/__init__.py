"""Everything that asks a model: one room for the store build, the bench builder and the evaluators.

- ``types``: :class:`Reply`, :class:`LLMRequestError`, the :class:`ChatModel` protocol.
- ``ordered``: :func:`map_ordered`, many calls in flight with outcomes in input order.

Backends (a local transformers model, any OpenAI-compatible endpoint), the concurrent client with
back-pressure and the response cache live here too, one file each, so a new engine is one file and
no build stage or evaluator changes.
"""

from tokenswap.inference.ordered import Outcome, map_ordered
from tokenswap.inference.types import ChatModel, LLMRequestError, Reply

__all__ = ["ChatModel", "LLMRequestError", "Outcome", "Reply", "map_ordered"]
