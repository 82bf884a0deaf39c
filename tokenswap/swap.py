"""Which concepts become images, and how a message is split around them.

Every decision is a pure function of ``(seed, sample_id, concept index, epoch)``: no RNG
state. Paired arms, resumed runs and any number of data-loader workers therefore agree
exactly on what was swapped.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokenswap.concepts import Concept

__all__ = ["SwapPolicy", "interleave", "unit_hash"]


def unit_hash(*parts: object) -> float:
    """Deterministic uniform number in [0, 1) from the given parts (stable across processes).

    >>> unit_hash(0, "s1", 3, 0) == unit_hash(0, "s1", 3, 0)
    True
    """
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@dataclass(frozen=True)
class SwapPolicy:
    """Decides which concepts of a sample are shown as images.

    Args:
        swap_prob: probability that an eligible concept is swapped.
        max_images: at most this many swapped concepts per sample (the ones with the smallest
            hash win, so the choice is still deterministic); ``None`` for no limit.
        roles: roles whose messages may be swapped. Assistant text is never swapped by default
            because the assistant targets must stay identical across arms.
        seed: changes every decision at once; the two arms of a pair share it.
        resample_each_epoch: if False (the paper's static augmentation) the epoch is ignored.
    """

    swap_prob: float = 1.0
    max_images: int | None = None
    roles: tuple[str, ...] = ("user",)
    seed: int = 0
    resample_each_epoch: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.swap_prob <= 1.0:
            raise ValueError(f"swap_prob must be in [0, 1], got {self.swap_prob}")
        if self.max_images is not None and self.max_images < 0:
            raise ValueError(f"max_images must be >= 0 or None, got {self.max_images}")
        object.__setattr__(self, "roles", tuple(self.roles))

    def _epoch(self, epoch: int) -> int:
        return epoch if self.resample_each_epoch else 0

    def decide(self, sample_id: object, concepts: Sequence[Concept], roles: Sequence[str], epoch: int = 0) -> list[bool]:
        """Return one flag per concept: True where it is shown as an image.

        Args:
            sample_id: the sample's stable id.
            concepts: the sample's concepts, in a fixed order (index k enters the hash).
            roles: role of every message of the conversation.
            epoch: current epoch (ignored unless ``resample_each_epoch``).
        """
        e = self._epoch(epoch)
        scores = [unit_hash(self.seed, sample_id, k, e, "swap") for k in range(len(concepts))]
        chosen = [
            roles[c.message] in self.roles and scores[k] < self.swap_prob for k, c in enumerate(concepts)
        ]
        if self.max_images is not None and sum(chosen) > self.max_images:
            keep = sorted((k for k, f in enumerate(chosen) if f), key=lambda k: scores[k])[: self.max_images]
            chosen = [k in set(keep) for k in range(len(concepts))]
        return chosen

    def pick(self, sample_id: object, k: int, n_candidates: int, epoch: int = 0) -> int:
        """Index of the image used for concept ``k`` among ``n_candidates`` store images."""
        if n_candidates <= 0:
            raise ValueError("pick() needs at least one candidate image")
        return int(unit_hash(self.seed, sample_id, k, self._epoch(epoch), "pick") * n_candidates)


def interleave(text: str, spans: Sequence[tuple[int, int, Any]]) -> list[dict]:
    """Split ``text`` into a chat content list with ``image`` parts replacing the spans.

    Surrounding text is kept byte for byte (no whitespace is added or removed), empty text
    parts are omitted, and spans must be sorted and disjoint.

    Args:
        text: the message text.
        spans: ``(start, end, image)`` triples.

    Returns:
        ``[{"type": "text", "text": ...} | {"type": "image", "image": ...}, ...]``

    >>> interleave("a cat sat", [(2, 5, "IMG")])
    [{'type': 'text', 'text': 'a '}, {'type': 'image', 'image': 'IMG'}, {'type': 'text', 'text': ' sat'}]
    """
    parts: list[dict] = []
    pos = 0
    for start, end, image in spans:
        if start < pos:
            raise ValueError(f"interleave: spans must be sorted and disjoint, got start {start} < previous end {pos}")
        if start > pos:
            parts.append({"type": "text", "text": text[pos:start]})
        parts.append({"type": "image", "image": image})
        pos = end
    if pos < len(text):
        parts.append({"type": "text", "text": text[pos:]})
    return parts
