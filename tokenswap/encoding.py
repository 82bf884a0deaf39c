"""Token ids of rendered conversations, and which tokens carry loss, at the tokenizer's own speed.

The collator renders a conversation to one string and needs, per token, its id and whether it
holds a character of a learned range (the assistant's text). ``tokenizer(texts,
return_offsets_mapping=True)`` answers both, but most of a warm batch's tokenizing time then goes
to offsets: computing them in Rust, then turning every token's ``(start, end)`` into Python tuples
and arrays. :class:`TemplateEncoder` gets the same answer two cheaper ways:

* the Rust backend is called directly (``encode_batch``) when it is in the state ``tokenizer(...)``
  would set (no padding, no truncation, special tokens matched whole), instead of through the
  wrapper, which builds Python lists of every field;
* for byte-level BPE tokenizers (every Qwen family), ids alone locate the text: each ordinary
  token stands for as many bytes as its vocabulary string has characters, each special token for
  its UTF-8 content. The byte span of every token is then a cumulative sum, and a token is learned
  when its bytes overlap the learned range's bytes, which is the offsets rule in bytes. This path
  runs without offsets (``encode_batch_fast``) and is used only when it is exact: no normalizer but
  NFC and NFC text, no offset trimming, no added token that strips whitespace, each row's bytes
  summing to its text's; and the first batch is computed both ways and must agree, else the
  offsets are used from then on (warned).
"""

from __future__ import annotations

import json
import logging
import unicodedata
import warnings
import weakref
from itertools import chain

import numpy as np
from tokenizers import Tokenizer
from tokenizers.models import BPE
from tokenizers.pre_tokenizers import ByteLevel

__all__ = ["TemplateEncoder", "token_byte_lengths"]

logger = logging.getLogger(__name__)

_BYTE_LENGTHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _components(component) -> list[dict]:
    """Every component dict of a normalizer / decoder / post-processor (``Sequence`` walked); [] for None."""
    if component is None:
        return []
    out, todo = [], [json.loads(component.__getstate__())]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            if "type" in node:
                out.append(node)
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return out


def _why_not_byte_level(backend: Tokenizer) -> str | None:
    """Why ids alone do not locate the text for this backend, or None when they do."""
    if not isinstance(backend.model, BPE) or backend.model.byte_fallback:
        return "not a byte-level BPE model"
    normalizers = [c["type"] for c in _components(backend.normalizer)]
    if any(t not in ("NFC", "Sequence") for t in normalizers):
        return f"normalizer {normalizers} changes the text"
    if "ByteLevel" not in [c["type"] for c in _components(backend.decoder)]:
        return "no byte-level decoder"
    post = _components(backend.post_processor)
    if any(c["type"] == "ByteLevel" and c.get("trim_offsets") for c in post):
        return "the post-processor trims offsets"
    for token in backend.get_added_tokens_decoder().values():
        if token.lstrip or token.rstrip or token.single_word:
            return f"added token {token.content!r} strips whitespace or matches single words"
    return None


class _ByteTable:
    """Per tokenizer: bytes per token id (None: use offsets) and whether a batch has confirmed them."""

    def __init__(self, size: int, table: np.ndarray | None):
        self.size = size
        self.table = table
        self.checked = False


def _byte_table(tokenizer) -> _ByteTable | None:
    backend = getattr(tokenizer, "_tokenizer", None)
    if not isinstance(backend, Tokenizer):
        return None
    size = backend.get_vocab_size(with_added_tokens=True)
    try:
        cached = _BYTE_LENGTHS.get(tokenizer)
    except TypeError:  # not weak-referenceable or not hashable: no cache
        cached = None
    if cached is not None and cached.size == size:
        return cached
    table = None
    why = _why_not_byte_level(backend)
    if why is None:
        vocab = backend.get_vocab(with_added_tokens=False)
        added = backend.get_added_tokens_decoder()
        if not set("".join(vocab)) <= set(ByteLevel.alphabet()):
            why = "vocabulary strings outside the byte-level alphabet"
        else:
            table = np.zeros(max([*vocab.values(), *added, -1]) + 1, dtype=np.int64)
            for s, i in vocab.items():
                table[i] = len(s)  # one alphabet character per byte
            for i, token in added.items():
                table[i] = len(token.content.encode("utf-8"))
    if why is not None:
        logger.info("token offsets computed by the tokenizer (%s)", why)
    state = _ByteTable(size, table)
    try:
        _BYTE_LENGTHS[tokenizer] = state
    except TypeError:
        pass
    return state


def token_byte_lengths(tokenizer) -> np.ndarray | None:
    """Bytes of the original text each token id stands for, or None when ids do not determine it.

    Cached per tokenizer object (and recomputed when its vocabulary grows).
    """
    state = _byte_table(tokenizer)
    return None if state is None else state.table


class TemplateEncoder:
    """``texts`` -> per text ``(ids, learnable)``: int64 token ids and a bool mask of learned tokens.

    A token is learned when one of its characters lies in one of the text's ``learn_ranges``
    (character ``[lo, hi)`` ranges), as with ``return_offsets_mapping``; ``learn_ranges=None``
    learns every token. The ids equal ``tokenizer(texts, add_special_tokens=False)["input_ids"]``.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        # Shared by the encoders of one tokenizer: the first batch is cross-checked once per process,
        # not once per collator (a fresh collator per stage or epoch would pay a second tokenization).
        self._state = _byte_table(tokenizer)
        backend = getattr(tokenizer, "_tokenizer", None)
        self._nfc_only = self._bytes is not None and any(
            c["type"] == "NFC" for c in _components(backend.normalizer)
        )

    @property
    def _bytes(self) -> np.ndarray | None:
        return None if self._state is None else self._state.table

    # ---------------------------------------------------------------- tokenizing
    def _backend(self) -> Tokenizer | None:
        """The Rust tokenizer when it is in the state ``tokenizer(...)`` would put it in, else None."""
        backend = getattr(self.tokenizer, "_tokenizer", None)
        if (
            isinstance(backend, Tokenizer)
            and backend.padding is None
            and backend.truncation is None
            and backend.encode_special_tokens == bool(getattr(self.tokenizer, "split_special_tokens", False))
        ):
            return backend
        return None

    def ids_and_offsets(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per text: ids and ``(n, 2)`` character offsets, as ``tokenizer(..., return_offsets_mapping=True)``."""
        backend = self._backend()
        if backend is not None:
            out = []
            for e in backend.encode_batch(texts, add_special_tokens=False):
                ids = np.array(e.ids, dtype=np.int64)
                flat = np.fromiter(chain.from_iterable(e.offsets), dtype=np.int64, count=2 * len(ids))
                out.append((ids, flat.reshape(-1, 2)))
            return out
        # The wrapper resets the backend's padding / truncation first, so it gives the same ids.
        enc = self.tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
        return [
            (np.asarray(ids, dtype=np.int64), np.asarray(enc["offset_mapping"][r], dtype=np.int64).reshape(-1, 2))
            for r, ids in enumerate(enc["input_ids"])
        ]

    def ids(self, texts: list[str]) -> list[np.ndarray]:
        backend = self._backend()
        if backend is not None:
            # encode_batch_fast (tokenizers >= 0.21) skips the offsets; ids are the same either way.
            encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
            return [np.array(e.ids, dtype=np.int64) for e in encode(texts, add_special_tokens=False)]
        enc = self.tokenizer(texts, add_special_tokens=False)
        return [np.asarray(ids, dtype=np.int64) for ids in enc["input_ids"]]

    # ---------------------------------------------------------------- learned tokens
    @staticmethod
    def _from_offsets(offsets: np.ndarray, ranges) -> np.ndarray:
        learnable = np.zeros(len(offsets), dtype=bool)
        for lo, hi in ranges:
            learnable |= (offsets[:, 1] > lo) & (offsets[:, 0] < hi)
        return learnable

    def _from_bytes(self, ids: np.ndarray, text: str, ranges) -> np.ndarray | None:
        lengths = self._bytes[ids]
        ends = np.cumsum(lengths)
        if len(ends) and ends[-1] != len(text.encode("utf-8")):
            return None  # the ids do not cover the text byte for byte: use offsets for this batch
        starts = ends - lengths
        learnable = np.zeros(len(ids), dtype=bool)
        for lo, hi in ranges:
            lo_b = len(text[:lo].encode("utf-8"))
            hi_b = lo_b + len(text[lo:hi].encode("utf-8"))
            learnable |= (ends > lo_b) & (starts < hi_b)
        return learnable

    def _by_offsets(self, texts: list[str], learn_ranges) -> list[tuple[np.ndarray, np.ndarray]]:
        return [(ids, self._from_offsets(offsets, ranges))
                for (ids, offsets), ranges in zip(self.ids_and_offsets(texts), learn_ranges)]

    def _by_bytes(self, texts: list[str], learn_ranges) -> list[tuple[np.ndarray, np.ndarray]] | None:
        """The rows from ids and byte lengths, or None where that is not exact for this batch."""
        if self._bytes is None or (self._nfc_only and not all(unicodedata.is_normalized("NFC", t) for t in texts)):
            return None
        rows = []
        for ids, text, ranges in zip(self.ids(texts), texts, learn_ranges):
            if len(ids) and ids.max() >= len(self._bytes):
                return None  # a token added after the table was built
            learnable = self._from_bytes(ids, text, ranges)
            if learnable is None:
                return None
            rows.append((ids, learnable))
        return rows

    def __call__(
        self, texts: list[str], learn_ranges: list[list[tuple[int, int]]] | None
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        if learn_ranges is None:
            return [(ids, np.ones(len(ids), dtype=bool)) for ids in self.ids(texts)]
        rows = self._by_bytes(texts, learn_ranges)
        if rows is None:
            return self._by_offsets(texts, learn_ranges)
        if self._state.checked:
            return rows
        self._state.checked = True
        reference = self._by_offsets(texts, learn_ranges)
        if all(np.array_equal(a, c) and np.array_equal(b, d) for (a, b), (c, d) in zip(rows, reference)):
            return rows
        warnings.warn(
            "token byte lengths disagree with the tokenizer's offsets on this tokenizer; using offsets", stacklevel=3
        )
        self._state.table = None
        return reference
