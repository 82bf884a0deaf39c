"""Opening untrusted images the way transformers does, without letting one hostile file stop a run.

:func:`load_image` is the one entry point for every image that comes from data (native LLaVA
images, store builds, retrieval). It turns every way an image can be unusable into one
:class:`BadImageError` naming the image, so callers can skip and count it:

- **Size before decoding.** ``Image.open`` only reads the header, so the pixel count is checked
  before any pixel is decoded: a 30000x30000 PNG of 109 KB (a decompression bomb) costs nothing.
- **Shapes the Qwen-VL processor refuses.** ``smart_resize`` raises for an aspect ratio above
  200 and divides by zero for an empty image; both are refused here, with the file named.
- **Broken files.** Unknown formats, truncated data and decoder errors.

Colour handling matches the official processor path exactly, which differs by source:

- A path or encoded bytes is loaded like ``transformers.image_utils.load_image`` (what
  ``processor(images=[path])`` and chat templates with image paths use): EXIF orientation is
  applied, then ``convert("RGB")``, which drops an alpha channel without compositing (as the
  default torchvision backend decodes a path; a palette image's transparent colour is dropped
  too, so the PIL backend, which would composite that one colour, is not matched there).
- An in-memory ``PIL.Image`` is converted like the image processor converts a PIL input
  (``transformers.image_transforms.convert_to_rgb``): transparency (RGBA, LA, P with a
  transparent colour) is composited onto white, and EXIF orientation is not applied.

In both cases the returned RGB image gives the processor the same pixels as passing the
original source to the processor directly.
"""

from __future__ import annotations

import io
import os
import warnings

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from tokenswap.errors import InputError

__all__ = [
    "DEFAULT_MAX_IMAGE_PIXELS",
    "MAX_ASPECT_RATIO",
    "BadImageError",
    "ImageSource",
    "StoredPicture",
    "check_image_size",
    "load_image",
]

DEFAULT_MAX_IMAGE_PIXELS = 50_000_000
"""Largest width·height decoded (50 MP: a 48-MP 8000x6000 phone photo passes, a 12000² PNG does not).

The processor resizes every image to at most ~1-16 MP, so bigger sources only cost memory:
a 12000² PNG took +1.9 GB in the processor. PIL's own bomb limit (2·``Image.MAX_IMAGE_PIXELS``)
still applies on top of this one.
"""

MAX_ASPECT_RATIO = 200
"""``transformers.models.qwen2_vl...smart_resize`` raises for ``max(h, w) / min(h, w) > 200``."""

ImageSource = str | os.PathLike | bytes | bytearray | memoryview | Image.Image


class BadImageError(ValueError):
    """An image that cannot be used; the message names the image and the reason."""


def check_image_size(width: int, height: int, *, what: str, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> None:
    """Refuse image dimensions the processor cannot use or that cost too much memory to decode.

    Raises:
        BadImageError: empty, more than ``max_pixels`` pixels, or aspect ratio above 200.
    """
    if width < 1 or height < 1:
        raise BadImageError(f"{what}: image is {width}x{height}, it has no pixels")
    if width * height > max_pixels:
        raise BadImageError(
            f"{what}: image is {width}x{height} ({width * height:,} pixels), more than max_pixels={max_pixels:,}; "
            "it is refused before decoding (a decompression bomb or an oversized scan). Downscale it, or raise "
            "the limit if the memory is there"
        )
    ratio = max(width, height) / min(width, height)
    if ratio > MAX_ASPECT_RATIO:
        raise BadImageError(
            f"{what}: image is {width}x{height}, aspect ratio {ratio:.1f} is above {MAX_ASPECT_RATIO}, which the "
            "Qwen-VL image processor refuses; crop or pad it"
        )


def load_image(source: ImageSource, *, what: str, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> Image.Image:
    """Open an image from a path, encoded bytes or a PIL image, checked and converted to RGB.

    Args:
        source: a file path, the encoded bytes of an image file, or a ``PIL.Image.Image``.
        what: names the image in error messages (file, sample id, concept).
        max_pixels: largest width·height accepted; checked from the header before decoding.

    Returns:
        A decoded RGB ``PIL.Image.Image`` (see the module docstring for the exact colour rules).

    Raises:
        BadImageError: missing or unreadable file, unknown format, truncated or corrupt data,
            too many pixels, an empty image or an aspect ratio the processor refuses.
        TypeError: ``source`` is none of the accepted types (a programming error, not bad data).
    """
    if isinstance(source, Image.Image):
        check_image_size(*source.size, what=what, max_pixels=max_pixels)
        try:
            return _to_rgb_like_processor(source)
        except Exception as e:  # a lazily opened image decodes here; see _open for why this is broad
            raise BadImageError(f"{what}: the image does not decode ({type(e).__name__}: {e})") from None
    if isinstance(source, (bytes, bytearray, memoryview)):
        if not len(source):
            raise BadImageError(f"{what}: the image bytes are empty")
        return _open(io.BytesIO(bytes(source)), what, max_pixels)
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not os.path.isfile(path):
            raise BadImageError(f"{what}: no such image file {path!r}")
        return _open(path, what, max_pixels)
    raise TypeError(f"{what}: expected an image path, image bytes or a PIL image, got {type(source).__name__}")


def _open(fp, what: str, max_pixels: int) -> Image.Image:
    with warnings.catch_warnings():
        # Our own limit is checked below from the header; PIL's warning would only add noise.
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            image = Image.open(fp)
        except UnidentifiedImageError:
            raise BadImageError(f"{what}: not an image file in a format PIL can read") from None
        except Image.DecompressionBombError as e:
            raise BadImageError(f"{what}: refused before decoding as a decompression bomb ({e})") from None
        except Exception as e:  # noqa: BLE001 - see below
            raise BadImageError(f"{what}: the image does not decode, bad header ({type(e).__name__}: {e})") from None
        with image:  # closes the file on refusal too
            check_image_size(*image.size, what=what, max_pixels=max_pixels)
            try:
                image.load()
                # The same steps, in the same order, as transformers.image_utils.load_image.
                rgb = ImageOps.exif_transpose(image).convert("RGB")
            except Exception as e:  # noqa: BLE001
                # PIL's decoders raise OSError for truncated data but also ValueError, SyntaxError,
                # EOFError, struct.error or IndexError on crafted files; every one means "unusable
                # image" here, and letting any through would stop training for one file.
                raise BadImageError(f"{what}: the image does not decode ({type(e).__name__}: {e})") from None
    # convert("RGB") keeps a palette image's transparent colour as info["transparency"]; the
    # processor would then composite that colour onto white, which the default (torchvision)
    # backend does not do for the same file given as a path. Without the key both agree.
    rgb.info.pop("transparency", None)
    return rgb


def _to_rgb_like_processor(image: Image.Image) -> Image.Image:
    from transformers.image_transforms import convert_to_rgb

    # Always through transformers' function: an RGB image can carry a transparent colour too.
    return Image.fromarray(np.asarray(convert_to_rgb(image, return_numpy=True)))


class StoredPicture:
    """A dataset's picture kept as stored (its encoded bytes), decoded each time its pixels are needed.

    A bench of thousands of pictures is loaded in a moment and holds its files' bytes, not every picture's pixels:
    :meth:`decode` gives what ``datasets.Image(mode).decode_example`` gives for the same bytes (loaded, turned
    upright by its EXIF orientation, converted to ``mode``), the evaluators' request builders decode a picture when
    a request first shows it, and a backend that prepares each picture once (``tokenswap eval --backend openai``)
    never decodes it again. Nothing is cached but the digest (:func:`tokenswap.inference.pictures.picture_digest`
    keeps it here), so concurrent requests can decode the same picture safely.

    Args:
        data: the encoded file.
        mode: the PIL mode the column declares (``None``: as decoded).
        where: names the picture in errors (the dataset, row and column).

    Raises:
        ValueError: (from the constructor) the bytes are no picture a reader knows or are damaged where that shows
            without decoding (a PNG's chunk checksums): a bench that cannot be used is refused when it is loaded.
    """

    __slots__ = ("data", "mode", "where", "digest", "__weakref__")

    def __init__(self, data: bytes, mode: str | None = None, where: str = "a stored picture"):
        self.data, self.mode, self.where = bytes(data), mode, where
        self.digest: str | None = None  # set by picture_digest, once
        try:
            with Image.open(io.BytesIO(self.data)) as probe:
                probe.verify()
        except Exception as e:  # noqa: BLE001 - PIL raises many kinds for a damaged file
            raise ValueError(self._undecodable(e)) from None

    def _undecodable(self, error: BaseException) -> str:
        return (f"{self.where} does not decode ({type(error).__name__}: {error}); replace it or drop that row")

    def decode(self) -> Image.Image:
        """The picture's pixels, a new image at each call.

        Raises:
            InputError: the data is cut or damaged inside (what opening alone cannot see), naming the picture: the
                run stops there with what it answered kept, and the same command resumes once it is replaced.
        """
        try:
            image = Image.open(io.BytesIO(self.data))
            image.load()
            if image.getexif().get(Image.ExifTags.Base.Orientation) is not None:
                image = ImageOps.exif_transpose(image)
            if self.mode and self.mode != image.mode:
                image = image.convert(self.mode)
        except Exception as e:  # noqa: BLE001
            raise InputError(self._undecodable(e)) from None
        return image

    def rgb(self) -> Image.Image:
        """:meth:`decode`, as RGB: what a request shows."""
        image = self.decode()
        return image if image.mode == "RGB" else image.convert("RGB")

    def __repr__(self) -> str:
        return f"StoredPicture({len(self.data):,} bytes, {self.where})"
