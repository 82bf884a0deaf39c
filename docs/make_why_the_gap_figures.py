"""Draw the figures of docs/why_the_gap.md: every control of ``tokenswap eval --forms all`` and ``tokenswap leaderboard``
run for real, over a loopback server that plays six scripted models.

Nothing here is a measurement of a real model. Each scripted model answers by fixed rules with four knobs, so the
figures show what each control can separate when the truth is known:

* ``text``: the share of items it can answer at all (the rest are wrong in every form);
* ``recognise``: the share of concepts whose picture it identifies (and names in a caption);
* ``load``: per image sent, the chance an item with pictures goes wrong whatever the pictures show;
* ``unused``: the chance an item whose every picture it identified still goes wrong when the words are gone
  (recognised, not used in the reasoning).

The commands are the ones a user runs (``tokenswap eval --backend openai ... --forms all``, ``tokenswap
leaderboard``); the server decodes every picture it is sent and looks it up by its pixels.

    python docs/make_why_the_gap_figures.py            # writes docs/why_the_gap_*.png, prints the board's summary
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import re
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: its tokenswap and tests.support

from tests.support import LoadLLMServer
from tokenswap.cli import main as tokenswap_main
from tokenswap.data.items import LETTERS, MCItem
from tokenswap.data.tokenswap_bench import write_tokenswap_bench
from tokenswap.eval.forms import CAPTION_PROMPT, rendered_word
from tokenswap.swap import unit_hash as draw  # the scripted models' only source of chance

DOCS = Path(__file__).resolve().parent
CONCEPTS = ["cat", "dog", "car", "apple", "house", "tree", "bird", "fish", "chair", "clock", "horse", "boat",
            "bread", "shoe", "train", "flower", "lamp", "key", "cup", "bell", "moon", "drum", "kite", "egg",
            "bridge", "candle", "guitar", "hammer", "ladder", "lemon", "mirror", "pencil", "rabbit", "robot",
            "sock", "spoon", "tiger", "tomato", "violin", "whale", "anchor", "banana", "camel", "castle", "cloud",
            "crown", "dragon", "feather", "globe", "helmet", "island", "jacket", "kettle", "leaf", "magnet",
            "needle", "owl", "piano", "rocket", "saddle"]
# name -> (text, recognise, load, unused)
MODELS = {
    "model-a": (0.90, 0.98, 0.010, 0.03),
    "model-b": (0.85, 0.95, 0.020, 0.06),
    "model-c": (0.85, 0.88, 0.035, 0.04),
    "model-d": (0.80, 0.85, 0.015, 0.10),
    "model-e": (0.75, 0.78, 0.040, 0.05),
    "model-f": (0.70, 0.72, 0.025, 0.08),
}


def picture(concept: str) -> Image.Image:
    i = CONCEPTS.index(concept)
    return Image.new("RGB", (48 + 2 * i, 48), (40 + 9 * i, 250 - 9 * i, (97 * i) % 256))


def pixels(image: Image.Image) -> bytes:
    array = np.asarray(image.convert("RGB"))
    return hashlib.sha256(repr(array.shape).encode() + array.tobytes()).digest()


def bench_items(n: int, seed: int) -> list[tuple[MCItem, MCItem]]:
    """``n`` items naming 1 to 4 concepts each (a concept may repeat, as a repeated ``<image N>`` tag)."""
    rng = np.random.default_rng(seed)
    pairs = []
    for i in range(n):
        k = 1 + i % 4
        words = list(rng.choice(CONCEPTS, size=k, replace=False))
        text = f"[q{i}] Which of these goes with " + ", then ".join(f"the {w}" for w in words) + "?"
        tagged = f"[q{i}] Which of these goes with " + ", then ".join(f"the <image {t + 1}>" for t in range(k)) + "?"
        if k >= 3 and i % 3 == 0:  # the first concept named once more: two image parts for one picture
            text, tagged = text + f" Think of the {words[0]}.", tagged + " Think of the <image 1>."
        choices, answer = ["first", "second", "third", "fourth"], int(rng.integers(4))
        pairs.append((MCItem(f"q{i}", "scripted", text, choices, answer),
                      MCItem(f"q{i}", "scripted", tagged, choices, answer, {t + 1: picture(w) for t, w in enumerate(words)})))
    return pairs


class ScriptedModels:
    """``reply(payload)`` for :class:`tests.support.LoadLLMServer`: the model named in the request answers."""

    def __init__(self, pairs: list[tuple[MCItem, MCItem]]):
        self.seen = {pixels(picture(c)): (c, "picture") for c in CONCEPTS}
        self.seen.update({pixels(rendered_word(c)): (c, "word") for c in CONCEPTS})
        self.items = {}
        for text, _ in pairs:
            self.items[re.search(r"\[(q\d+)\]", text.question).group(1)] = (
                re.findall(r"the (\w+)", text.question.split("with", 1)[1]), LETTERS[text.answer])

    def reply(self, payload: dict) -> str:
        name = payload["model"]
        p_text, p_recognise, load, unused = MODELS[name]
        parts = payload["messages"][-1]["content"]
        parts = [{"type": "text", "text": parts}] if isinstance(parts, str) else parts
        text = "".join(p["text"] for p in parts if p["type"] == "text")
        shown = [self.seen[pixels(Image.open(io.BytesIO(base64.b64decode(p["image_url"]["url"].split(",", 1)[1]))))]
                 for p in parts if p["type"] == "image_url"]

        def knows(concept: str) -> bool:
            return draw(name, concept, "recognise") < p_recognise

        if text.strip() == CAPTION_PROMPT.split("\n", 1)[1]:
            (concept, _), = shown
            return f"A picture of a {concept}." if knows(concept) else "A small coloured square."
        if "Which concept does this image show?" in text:
            (concept, _), = shown
            options = dict(re.findall(r"^([ABCD])\. (.+)$", text, flags=re.M))
            right = next(k for k, v in options.items() if v == concept)
            return f"Answer: {right if knows(concept) else next(k for k in options if k != right)}"
        qid = re.search(r"\[(q\d+)\]", text).group(1)
        words, gold = self.items[qid]
        wrong = LETTERS[(LETTERS.index(gold) + 1) % 4]
        if draw(name, qid, "text") >= p_text:
            return f"Answer: {wrong}"
        if shown and draw(name, qid, "load") < load * len(shown):
            return f"Answer: {wrong}"
        in_words = {w for w in words if re.search(rf"\b{w}\b", text)}
        pictured = {c for c, kind in shown if kind == "word" or knows(c)}
        if not set(words) <= in_words | pictured:
            return f"Answer: {wrong}"
        if not set(words) <= in_words and draw(name, qid, "unused") < unused and all(k == "picture" for _, k in shown):
            return f"Answer: {wrong}"  # every picture identified, yet not used without its word
        return f"Answer: {gold}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DOCS, help="where the three PNGs go (default: docs/)")
    parser.add_argument("--work", type=Path, default=None, help="keep the runs and the board here (default: a temp folder)")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="why-the-gap-"))
    pairs = bench_items(args.items, args.seed)
    write_tokenswap_bench(pairs, work / "bench")
    models = ScriptedModels(pairs)
    with LoadLLMServer(reply=models.reply) as server:
        for name in MODELS:
            rc = tokenswap_main(["eval", "--backend", "openai", "--base-url", server.base_url, "--model", name,
                                 "--bench", str(work / "bench"), "--forms", "all", "--family", "qwen2_vl",
                                 "--concurrency", "16", "--out", str(work / "runs" / name)])
            if rc != 0:
                return rc
    rc = tokenswap_main(["leaderboard", *(str(work / "runs" / n) for n in MODELS), "--out", str(work / "board")])
    if rc != 0:
        return rc
    args.out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(work / "runs" / "model-c" / "gap_forms.png", args.out / "why_the_gap_forms.png")
    shutil.copyfile(work / "board" / "leaderboard_by_images.png", args.out / "why_the_gap_by_images.png")
    shutil.copyfile(work / "board" / "leaderboard_components.png", args.out / "why_the_gap_components.png")
    print(f"runs and board in {work}; figures in {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
