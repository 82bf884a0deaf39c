"""Qwen2's real tokenizer, built offline from the BPE ranks that ship inside the ``dashscope`` package.

Qwen2, Qwen2.5, Qwen2-VL, Qwen2.5-VL and Qwen3-VL share one vocabulary: 151,643 byte-level BPE
ranks (``qwen.tiktoken``) plus special tokens from id 151643. :func:`build_qwen_tokenizer` turns the
ranks into a ``Qwen2Tokenizer``: the vocabulary is the ranks, each token's merges are the splits of
it into two tokens (ordered by the merged token's rank, as tiktoken merges the lowest-ranked pair
first), pre-tokenization is Qwen2's split regex then byte-level, normalisation is NFC, and the
special tokens get the ids of the Qwen2-VL / Qwen2.5-VL / Qwen3-VL ``tokenizer_config.json``.
The result is saved once under ``~/.cache/tokenswap`` (or ``$TOKENSWAP_CACHE``) and loaded from
there afterwards, offline. Qwen3.5 has a different, larger vocabulary that no package ships.

:func:`qwen_tiktoken` is the reference it is checked against: tiktoken with the same ranks and regex.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import unicodedata
from pathlib import Path

__all__ = [
    "QWEN_ADDED_TOKENS",
    "QWEN_MODEL_VOCAB_SIZE",
    "QWEN_NUM_RANKS",
    "QWEN_PRETOKENIZE_REGEX",
    "build_qwen_tokenizer",
    "nfc",
    "qwen_ranks",
    "qwen_tiktoken",
    "qwen_tiktoken_path",
]

QWEN_NUM_RANKS = 151643
"""Number of BPE ranks (ids 0..151642); special tokens start right after."""

QWEN_MODEL_VOCAB_SIZE = 151936
"""Embedding rows of the released 2B-8B checkpoints (the vocabulary padded to a multiple of 128)."""

# Qwen2's split regex, identical to the one in Qwen's own tiktoken-based tokenizer (tokenization_qwen.py);
# note \p{N} alone (one digit per pre-token), unlike GPT-4's \p{N}{1,3}.
QWEN_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# (token, special) from id 151643 on, as in the released Qwen2-VL / Qwen2.5-VL / Qwen3-VL
# tokenizer_config.json (Qwen2-VL stops at <|video_pad|>; the later ids are unused there).
QWEN_ADDED_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]


def qwen_tiktoken_path() -> Path:
    """Path of ``qwen.tiktoken`` inside the installed ``dashscope`` package (not imported: it is heavy).

    Raises:
        FileNotFoundError: ``dashscope`` is not installed, or ships no ranks file; the message has the install line.
    """
    spec = importlib.util.find_spec("dashscope")
    if spec is not None and spec.submodule_search_locations:
        path = Path(list(spec.submodule_search_locations)[0]) / "resources" / "qwen.tiktoken"
        if path.is_file():
            return path
    raise FileNotFoundError(
        "the Qwen BPE ranks (dashscope/resources/qwen.tiktoken) were not found; install them with "
        "`pip install dashscope==2.0.2` (or `pip install -e '.[dev]'`)"
    )


def qwen_ranks(path: str | os.PathLike | None = None) -> dict[bytes, int]:
    """``{token bytes: rank}`` from a tiktoken ranks file (``base64 rank`` per line)."""
    ranks: dict[bytes, int] = {}
    for line in Path(path or qwen_tiktoken_path()).read_text().splitlines():
        if not line:
            continue
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    if len(ranks) != QWEN_NUM_RANKS or sorted(ranks.values()) != list(range(QWEN_NUM_RANKS)):
        raise ValueError(f"{path}: expected ranks 0..{QWEN_NUM_RANKS - 1}, got {len(ranks)} tokens")
    return ranks


def _cache_root() -> Path:
    return Path(os.environ.get("TOKENSWAP_CACHE") or Path.home() / ".cache" / "tokenswap")


def build_qwen_tokenizer(cache_dir: str | os.PathLike | None = None, ranks_path: str | os.PathLike | None = None):
    """Qwen2's tokenizer (a ``Qwen2Tokenizer``), from the cache or built from the ranks once (~10 s).

    Args:
        cache_dir: folder for the built tokenizer (default ``$TOKENSWAP_CACHE`` or ``~/.cache/tokenswap``);
            a sub-folder keyed by the ranks file's hash is used, so a different ranks file rebuilds.
        ranks_path: ``qwen.tiktoken`` to use (default: the one in ``dashscope``).

    Returns:
        The tokenizer: eos ``<|im_end|>``, pad ``<|endoftext|>``, no chat template (the tiny kit sets one).
    """
    from transformers import Qwen2Tokenizer

    ranks_path = Path(ranks_path or qwen_tiktoken_path())
    digest = hashlib.sha256(ranks_path.read_bytes()).hexdigest()[:12]
    folder = Path(cache_dir or _cache_root()) / f"qwen2-tokenizer-{digest}"
    if (folder / "tokenizer.json").is_file():
        return Qwen2Tokenizer.from_pretrained(folder)

    tok = _from_ranks(qwen_ranks(ranks_path))
    # Written beside the target then renamed, so a concurrent or killed build never leaves half a tokenizer.
    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    tok.save_pretrained(tmp)
    try:
        tmp.rename(folder)
    except OSError:  # another process finished first: use its copy
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return Qwen2Tokenizer.from_pretrained(folder)


def _from_ranks(ranks: dict[bytes, int]):
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_encoder = bytes_to_unicode()

    def to_str(b: bytes) -> str:
        return "".join(byte_encoder[x] for x in b)

    vocab = {to_str(t): r for t, r in ranks.items()}
    merges = []
    for token, rank in ranks.items():
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], left, right))
    merges.sort()
    tok = Qwen2Tokenizer(
        vocab=vocab,
        merges=[(to_str(a), to_str(b)) for *_, a, b in merges],
        unk_token=None,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
    )
    tok.add_tokens([AddedToken(t, special=s, normalized=False) for t, s in QWEN_ADDED_TOKENS])
    for i, (t, _) in enumerate(QWEN_ADDED_TOKENS):
        got = tok.convert_tokens_to_ids(t)
        if got != QWEN_NUM_RANKS + i:
            raise RuntimeError(f"{t} got id {got}, expected {QWEN_NUM_RANKS + i}")
    tok.eos_token = "<|im_end|>"
    tok.add_special_tokens({"additional_special_tokens": [t for t, s in QWEN_ADDED_TOKENS[1:] if s]})
    return tok


def qwen_tiktoken(ranks_path: str | os.PathLike | None = None):
    """A ``tiktoken.Encoding`` over the same ranks, regex and special tokens (the reference implementation).

    tiktoken does not normalise: apply ``unicodedata.normalize("NFC", text)`` before comparing with the
    Hugging Face tokenizer, which does.
    """
    import tiktoken

    return tiktoken.Encoding(
        name="qwen",
        pat_str=QWEN_PRETOKENIZE_REGEX,
        mergeable_ranks=qwen_ranks(ranks_path),
        special_tokens={t: QWEN_NUM_RANKS + i for i, (t, _) in enumerate(QWEN_ADDED_TOKENS)},
    )


def nfc(text: str) -> str:
    """NFC, as the tokenizer's normaliser applies it."""
    return unicodedata.normalize("NFC", text)
