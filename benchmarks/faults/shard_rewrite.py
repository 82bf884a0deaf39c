"""Section ``shard_rewrite`` of benchmarks/faults.py: a store shard changed on disk under a live ``ImageStore`` and
collator: copied over in place (``cp``), a few bytes rewritten in place (``rsync --inplace``, a bad disk), truncated
in place (in a child process, where a memory-mapped read would die of SIGBUS), and replaced by rename (as
``StoreWriter`` writes). No concept may get another concept's picture: each is its own picture (pixels equal to the
intact store's) or text, counted as ``concepts_text_hash_mismatch`` and warned once naming the shard.
"""

from __future__ import annotations

import os
import random
import shutil
import warnings
from pathlib import Path

from ._common import PY, Tally, run

OUTCOME = (
    "no concept shown another's picture: each is its own (pixels equal to the intact store's) or "
    "text, counted (`concepts_text_hash_mismatch`) and warned once naming the shard; a truncation is no SIGBUS"
)


REWRITE_CONCEPTS = ["cat", "dog", "apple", "tree", "car", "boat", "house", "bird"]


def _noisy_store(root: Path, order: list[str]) -> Path:
    """One shard of 8 concepts, each a distinct ~12 kB picture (noise on its own colour); the shard's path."""
    from PIL import Image

    from tokenswap.store import StoreWriter

    colours = ["red", "blue", "green", "yellow", "purple", "orange", "black", "white"]
    with StoreWriter(root) as w:
        for concept in order:
            colour = colours[REWRITE_CONCEPTS.index(concept)]
            noise = Image.frombytes("RGB", (64, 64), random.Random(concept).randbytes(64 * 64 * 3))
            w.add(concept, Image.blend(Image.new("RGB", (64, 64), colour), noise, 0.5), source="faults")
    (shard,) = (root / "shards").glob("*.arrow")
    return shard


def _concept_sample(concept: str) -> dict:
    text = f"Draw a {concept} please"
    return {"id": concept, "messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}],
            "concepts": [{"message": 0, "start": 7, "end": 7 + len(concept), "key": concept}], "images": []}


def section_shard_rewrite(t: Tally, work: Path, model: Path) -> None:
    from transformers import AutoProcessor

    from tokenswap.collator import TokenSwapCollator
    from tokenswap.store import ImageStore

    processor = AutoProcessor.from_pretrained(model)

    def pictures(collator) -> tuple[dict, list[str]]:
        """Per concept: its pixels, or None when it stayed text; and the warnings the batch raised."""
        got = {}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for c in REWRITE_CONCEPTS:
                batch = collator([_concept_sample(c)])
                got[c] = batch["pixel_values"].clone() if "pixel_values" in batch else None
        return got, [str(w.message) for w in caught if "content hash" in str(w.message)]

    def judge(what: str, got: dict, ref: dict, warned: list[str], collator, expect_text: set[str], shard) -> None:
        wrong = [c for c, px in got.items() if px is not None and not (px.shape == ref[c].shape and (px == ref[c]).all())]
        text = {c for c, px in got.items() if px is None}
        counted = collator.stats["concepts_text_hash_mismatch"]
        ok = (not wrong and text == expect_text and counted == len(expect_text)
              and (len(warned) == 1 and str(shard) in warned[0] if expect_text else not warned))
        t.add("shard_rewrite", what, ok, f"wrong picture for {wrong}, text {sorted(text)} (expected "
              f"{sorted(expect_text)}), counted {counted}, warnings {warned[:1]}")

    def fresh(name: str, order=REWRITE_CONCEPTS):
        """A store whose every picture was read once (hashed, and then trusted while the file stays unchanged),
        and a collator with an empty pixel cache, so what it shows next comes from the file as it is then."""
        shard = _noisy_store(work / name, order)
        store = ImageStore(work / name)
        pictures(TokenSwapCollator(processor, store, max_length=512, dummy_image=False))
        return shard, store, TokenSwapCollator(processor, store, max_length=512, dummy_image=False)

    shard, _, collator = fresh("rewrite-ref")
    ref, _ = pictures(collator)
    if any(px is None for px in ref.values()):
        t.add("shard_rewrite", "intact store shows every concept's picture", False, str(collator.stats))
        return

    # cp over the live shard: a rebuild that put the concepts in another order (same inode, other bytes).
    shard, _, collator = fresh("rewrite-cp")
    other = _noisy_store(work / "rewrite-cp-rebuilt", REWRITE_CONCEPTS[::-1])
    shutil.copyfile(other, shard)
    got, warned = pictures(collator)
    judge("cp of a rebuilt shard over the live one", got, ref, warned, collator, set(REWRITE_CONCEPTS), shard)

    # rsync --inplace / a bad disk: 4 bytes inside one picture changed, the rest of the file as it was.
    shard, store, collator = fresh("rewrite-inplace")
    data = shard.read_bytes()
    at = data.index(store.get("apple")[0].load_bytes()) + 6000
    with open(shard, "r+b") as f:
        f.seek(at)
        f.write(bytes(b ^ 0xFF for b in data[at : at + 4]))
    got, warned = pictures(collator)
    judge("4 bytes of one picture rewritten in place", got, ref, warned, collator, {"apple"}, shard)

    # Replaced by rename, as StoreWriter and a rebuild write: the open reader keeps the file it indexed.
    shard, _, collator = fresh("rewrite-rename")
    other = _noisy_store(work / "rewrite-rename-rebuilt", REWRITE_CONCEPTS[::-1])
    os.replace(other, shard)
    got, warned = pictures(collator)
    judge("a rebuilt shard renamed over the live one", got, ref, warned, collator, set(), shard)

    # Truncated in place, in a child: a memory-mapped read past the new end is SIGBUS (rc -7), no message.
    shard = _noisy_store(work / "rewrite-truncate", REWRITE_CONCEPTS)
    half = shard.stat().st_size // 2
    code = f"""
import os, warnings
from tokenswap.store import ImageStore
store = ImageStore({str(work / "rewrite-truncate")!r})
before = {{c: store.get(c)[0].image_id for c in {REWRITE_CONCEPTS!r}}}
os.truncate({str(shard)!r}, {half})
served = refused = 0
for c in before:
    try:
        store.get(c)[0].load(); served += 1
    except Exception as e:
        refused += 1; message = str(e)
print(served, refused)
print(message)
"""
    proc = run([PY, "-c", code], 120)
    lines = proc.stdout.splitlines()
    ok = (proc.returncode == 0 and len(lines) >= 2 and sum(map(int, lines[0].split())) == 8
          and int(lines[0].split()[1]) >= 4 and str(shard) in lines[1] and "truncated in place" in lines[1])
    t.add("shard_rewrite", "a shard truncated in place under a reader (child process)", ok,
          f"rc {proc.returncode}, {proc.stdout[-300:]!r} {proc.stderr[-300:]!r}")
