"""The on-disk image store: concept key -> scored images.

Format (one folder)::

    store.json                  format version, attribution, free-form build info
    shards/part-rRRR-SSSSSS.arrow  Arrow IPC stream files, immutable once written

Each shard row is one image of one concept (``image`` is null for a concept that was tried and
has no image, so a resumed build does not try it again). Shards are the same Arrow files that
``datasets.Dataset.from_file`` memory-maps, so :meth:`ImageStore.to_dataset` gives a normal
``datasets.Dataset`` that can be saved, sharded or pushed to a hub.

Reads are checked: an image's bytes are read with ``pread`` (a shard truncated in place under a
running reader is a short read, not the SIGBUS a memory map gives) and hashed against the image id,
their content address, before they are served (once per image and process while the shard file keeps its
inode, size, mtime and ctime). A shard rewritten in place (``cp`` or
``rsync --inplace`` over it) therefore never serves another concept's picture: the read raises
:class:`ImageMismatchError`, which the collator counts (``concepts_text_hash_mismatch``) and keeps as text.

Writes are atomic: a shard is written to a temporary name, fsynced and renamed. A process
killed mid-write leaves at most a ``*.tmp`` file, which readers ignore and writers delete.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from PIL import Image

from tokenswap.concepts import normalize_concept
from tokenswap.errors import InputError
from tokenswap.files import atomic_write, json_loads
from tokenswap.images import BadImageError, check_image_size, load_image

__all__ = [
    "CorruptImageError",
    "ImageMismatchError",
    "ImageStore",
    "StoreFormatError",
    "StoreImage",
    "StoreWriter",
    "image_id_of",
]

FORMAT = "tokenswap-image-store"
VERSION = 1
SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("concept", pa.string()),
        ("image_id", pa.string()),
        ("image", pa.binary()),
        ("source", pa.string()),
        ("score", pa.float32()),
        ("width", pa.int32()),
        ("height", pa.int32()),
        ("meta", pa.string()),
    ]
)
_SHARD = re.compile(r"part-r(\d{3})-(\d{6})\.arrow$")


class CorruptImageError(BadImageError):
    """Stored bytes that do not decode as a usable image (a :class:`~tokenswap.images.BadImageError`)."""


class ImageMismatchError(CorruptImageError):
    """Bytes read for an image that do not hash to its id: its shard changed on disk after the store was opened."""


class StoreFormatError(InputError):
    """A store file (``store.json`` or a shard) that is not what the format says; the message names the file."""


def _read_info(path: Path) -> dict:
    """``store.json`` as a dict, or a :class:`StoreFormatError` naming the file and what is wrong with it."""
    try:
        info = json_loads(path.read_bytes().decode("utf-8"))
    except OSError as e:
        raise StoreFormatError(f"{path}: cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise StoreFormatError(f"{path}: not UTF-8 text (byte {e.start}); the file is damaged") from None
    except ValueError as e:  # JSONDecodeError, nesting or digits Python's parser cannot take
        raise StoreFormatError(f"{path}: not valid JSON ({e}); the file is damaged (truncated or overwritten?)") from None
    if not isinstance(info, dict):
        raise StoreFormatError(
            f"{path}: expected a JSON object with \"format\": {FORMAT!r}, got a JSON {type(info).__name__}"
        )
    return info


def _open_table(path: Path) -> tuple[pa.Table, int]:
    """One shard as an Arrow table over a memory map, and the address the map starts at (or a StoreFormatError)."""
    fix = "restore the file, or delete it (its concepts then have no images) and rebuild them"
    try:
        mm = pa.memory_map(str(path))
        base = mm.read_buffer(1).address  # where the map starts: image offsets in the file are addresses - base
        mm.seek(0)
        table = pa.ipc.open_stream(mm).read_all()
    except (pa.ArrowException, OSError, ValueError) as e:
        raise StoreFormatError(
            f"{path}: not a readable Arrow IPC stream ({type(e).__name__}: {e}); the shard is damaged "
            f"(truncated or overwritten): {fix}"
        ) from None
    wrong = [f"{f.name} ({table.schema.field(f.name).type if f.name in table.schema.names else 'missing'}, "
             f"expected {f.type})" for f in SCHEMA if f.name not in table.schema.names
             or not table.schema.field(f.name).type.equals(f.type)]
    if wrong:
        raise StoreFormatError(f"{path}: not an image-store shard, wrong columns: {', '.join(wrong)}; {fix}")
    return table, base


def _read_shard(path: Path) -> pa.Table:
    """One shard as an Arrow table with every column of :data:`SCHEMA`, or a :class:`StoreFormatError`."""
    return _open_table(path)[0]


def _image_spans(column: pa.ChunkedArray, base: int, size: int) -> list[tuple[int, int] | bytes | None]:
    """Per row: ``(file offset, length)`` of the image bytes, the bytes themselves where the shard holds them
    in another form (a compressed buffer decoded in memory), or None for a row without an image."""
    spans: list[tuple[int, int] | bytes | None] = []
    for chunk in column.chunks:
        valid = chunk.is_valid().to_pylist()
        buffers = chunk.buffers()
        data = buffers[2]
        offsets = memoryview(buffers[1]).cast("i")[chunk.offset : chunk.offset + len(chunk) + 1] if buffers[1] else []
        in_file = data is not None and base <= data.address and data.address + data.size <= base + size
        for i in range(len(chunk)):
            if not valid[i]:
                spans.append(None)
            elif in_file:
                spans.append((data.address - base + offsets[i], offsets[i + 1] - offsets[i]))
            else:
                spans.append(chunk[i].as_py())
    return spans


def _identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """What changes when a file is replaced, truncated or written to (a write always moves ``st_ctime_ns``)."""
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_dev


def image_id_of(data: bytes) -> str:
    """Content address of encoded image bytes (stable across rebuilds and shards)."""
    return hashlib.sha1(data).hexdigest()[:16]


@dataclass(frozen=True)
class StoreImage:
    """One stored image of a concept; pixels are decoded only by :meth:`load`."""

    image_id: str
    key: str
    source: str
    score: float
    meta: dict = field(default_factory=dict, compare=False)
    _store: ImageStore | None = field(default=None, repr=False, compare=False)
    _loc: tuple[int, tuple[int, int] | bytes] = field(default=(-1, b""), repr=False, compare=False)

    def load_bytes(self) -> bytes:
        """The encoded image, checked against its content hash.

        Raises:
            ImageMismatchError: the bytes on disk are not this image's any more (its shard was rewritten or
                truncated in place after the store was opened); names the shard and the fix.
        """
        assert self._store is not None
        return self._store._read(self)

    def load(self) -> Image.Image:
        """Decode to an RGB PIL image.

        Raises:
            CorruptImageError: the bytes are not a readable image; names the concept and id.
            ImageMismatchError: the bytes are not this image's any more (see :meth:`load_bytes`).
        """
        what = f"image {self.image_id} of concept {self.key!r} in {self._store.root if self._store else '?'}"
        data = self.load_bytes()  # an ImageMismatchError names the shard: a changed file, not a bad picture
        try:
            # Size and aspect are checked before decoding: a store is data, and may hold a bomb.
            return load_image(data, what=what)
        except BadImageError as e:
            raise CorruptImageError(
                f"{e}; the stored image does not decode into a usable image: rebuild that concept or delete its "
                "shard row"
            ) from None


class ImageStore:
    """Read-only view of a store folder with O(1) lookup by concept.

    Args:
        root: the store folder.

    >>> import tempfile
    >>> root = tempfile.mkdtemp()
    >>> with StoreWriter(root) as w:
    ...     _ = w.add("Red Apple", Image.new("RGB", (8, 8), "red"), source="test", score=0.9)
    >>> store = ImageStore(root)
    >>> [im.source for im in store.get("the red apple")]
    ['test']
    """

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        info_path = self.root / "store.json"
        if not info_path.exists():
            raise FileNotFoundError(
                f"{self.root} is not an image store (no store.json); build one with "
                "`tokenswap build-store --config store_embedded.yaml` or tokenswap.store.build_embedded_store()"
            )
        self.info = _read_info(info_path)
        if self.info.get("format") != FORMAT:
            raise StoreFormatError(f"{info_path}: format is {self.info.get('format')!r}, expected {FORMAT!r}")
        self._paths: list[Path] = []
        self._fds: dict[int, int] = {}  # shard -> open descriptor, oldest first (bounded: a store may have 10k shards)
        self._verified: dict[int, tuple[tuple, set[int]]] = {}  # shard -> (file identity, offsets hashed under it)
        self._index: dict[str, list[StoreImage]] = {}
        self._attempted: set[str] = set()
        for path in _list_shards(self.root):
            shard = len(self._paths)
            self._paths.append(path)
            # The descriptor is opened before the map: reads go to the file this index was built from,
            # also after a rename puts another file at the path (the hash check covers any other case).
            self._fd(shard)
            table, base = _open_table(path)
            spans = _image_spans(table.column("image"), base, os.fstat(self._fds[shard]).st_size)
            cols = {n: table.column(n).to_pylist() for n in ("key", "image_id", "source", "score", "meta")}
            has_image = table.column("image").is_valid().to_pylist()
            for row, key in enumerate(cols["key"]):
                self._attempted.add(key)
                if not has_image[row]:
                    continue
                images = self._index.setdefault(key, [])
                if any(im.image_id == cols["image_id"][row] for im in images):
                    continue  # same picture written twice (e.g. two ranks); keep one
                try:
                    meta = json.loads(cols["meta"][row] or "{}")
                    if not isinstance(meta, dict) or not isinstance(key, str) or cols["score"][row] is None:
                        raise ValueError(f"expected a key, a score and a JSON object as meta, got key {key!r}, "
                                         f"score {cols['score'][row]!r}, meta {cols['meta'][row]!r:.80}")
                except ValueError as e:  # json.JSONDecodeError too
                    raise StoreFormatError(f"{path} row {row}: {e}; the shard is damaged: restore or delete it") from None
                images.append(
                    StoreImage(
                        image_id=cols["image_id"][row],
                        key=key,
                        source=cols["source"][row],
                        score=float(cols["score"][row]),
                        meta=meta,
                        _store=self,
                        _loc=(shard, spans[row]),
                    )
                )
            del table  # the map goes with it: reads are preads, which a file truncated under them cannot crash
        for images in self._index.values():
            images.sort(key=lambda im: -im.score)

    _MAX_OPEN = 64

    def _fd(self, shard: int) -> int:
        # A forked data-loader worker shares the parent's descriptors: fine, a pread moves no file offset.
        fd = self._fds.pop(shard, None)
        if fd is None:
            if len(self._fds) >= self._MAX_OPEN:
                os.close(self._fds.pop(next(iter(self._fds))))
            fd = os.open(self._paths[shard], os.O_RDONLY)
        self._fds[shard] = fd  # most recent last
        return fd

    def _read(self, image: StoreImage) -> bytes:
        shard, span = image._loc
        path = self._paths[shard]
        identity = None
        if isinstance(span, bytes):
            data, why = span, "the shard's decoded buffer"
        else:
            offset, length = span
            try:
                fd = self._fd(shard)
                identity = _identity(os.fstat(fd))
                data = os.pread(fd, length, offset)
                verified = self._verified.get(shard)
                # Hashed once per image and process while the file stays as it was (the same inode, size, mtime and
                # ctime before and after the read; any write moves ctime): a hash costs about as much as 1/15 of
                # decoding the PNG, and a re-decode after a pixel-cache eviction need not pay it again.
                if (verified is not None and verified[0] == identity and offset in verified[1]
                        and len(data) == length and _identity(os.fstat(fd)) == identity):
                    return data
            except OSError as e:
                raise ImageMismatchError(
                    f"{path}: image {image.image_id} of concept {image.key!r} cannot be read ({e.strerror or e}); "
                    "the shard was removed or damaged after the store was opened: restore it and restart"
                ) from None
            why = (f"the shard is {identity[1]} bytes now, the image ended at byte {offset + length} (truncated in "
                   "place?)" if len(data) < length else "its bytes changed")
        if image_id_of(data) != image.image_id:
            raise ImageMismatchError(
                f"{path}: image {image.image_id} of concept {image.key!r} does not match its content hash ({why}); "
                "the shard was rewritten or truncated in place after this process opened the store. Shards are "
                "immutable: write a new file and rename it over the old one (as StoreWriter does), then restart "
                "the run to read the store as it is now"
            )
        if identity is not None and _identity(os.fstat(self._fd(shard))) == identity:
            verified = self._verified.get(shard)
            if verified is None or verified[0] != identity:
                verified = self._verified[shard] = (identity, set())
            verified[1].add(span[0])
        return data

    def __getstate__(self) -> dict:
        # Descriptors are per process: a spawned worker opens its own (and the hash check still holds).
        return {**self.__dict__, "_fds": {}, "_verified": {}}

    def __del__(self) -> None:
        for fd in getattr(self, "_fds", {}).values():
            try:
                os.close(fd)
            except OSError:
                pass

    def __contains__(self, concept: str) -> bool:
        return normalize_concept(concept) in self._index

    def __len__(self) -> int:
        return len(self._index)

    def keys(self) -> list[str]:
        return list(self._index)

    @property
    def num_images(self) -> int:
        return sum(len(v) for v in self._index.values())

    def attempted(self, concept: str) -> bool:
        """Whether a build already processed this concept (with or without a result)."""
        return normalize_concept(concept) in self._attempted

    def get(self, concept: str) -> list[StoreImage]:
        """Images of a concept, best score first; ``[]`` when the store has none."""
        return self._index.get(normalize_concept(concept), [])

    def __iter__(self) -> Iterator[StoreImage]:
        for images in self._index.values():
            yield from images

    def to_dataset(self):
        """All shards as one memory-mapped ``datasets.Dataset`` (for saving, sharding, pushing)."""
        from datasets import Dataset, concatenate_datasets

        parts = []
        for p in _list_shards(self.root):
            _read_shard(p)  # datasets' own error names no file
            parts.append(Dataset.from_file(str(p)))
        if not parts:
            return Dataset.from_dict({n: [] for n in SCHEMA.names})
        return concatenate_datasets(parts)


def _list_shards(root: Path) -> list[Path]:
    shard_dir = root / "shards"
    if not shard_dir.is_dir():
        return []
    return sorted(p for p in shard_dir.iterdir() if _SHARD.search(p.name))


def encode_image(image: Image.Image | bytes, fmt: str = "PNG") -> bytes:
    if isinstance(image, bytes):
        return image
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return buf.getvalue()


class StoreWriter:
    """Appends images to a store in atomic, immutable shards.

    Rows are buffered and written every ``shard_size`` rows and on :meth:`flush`/``close``.
    Several processes may write to one store at once as long as each uses its own ``rank``.

    Args:
        root: store folder (created if missing).
        rank: writer id; shard names carry it so concurrent writers never collide.
        shard_size: rows per shard file.
        info: merged into ``store.json`` (e.g. attribution of an image source).
    """

    def __init__(self, root: str | os.PathLike, rank: int = 0, shard_size: int = 256, info: dict | None = None):
        self.root = Path(root)
        self.rank = rank
        self.shard_size = shard_size
        self._rows: list[dict] = []
        (self.root / "shards").mkdir(parents=True, exist_ok=True)
        for tmp in (self.root / "shards").glob(f"part-r{rank:03d}-*.tmp"):
            tmp.unlink()  # left by a writer killed mid-write; its rows were never committed
        if rank == 0 or not (self.root / "store.json").exists():
            self._update_info(info or {})
        self._taken = {
            int(m.group(2)) for p in _list_shards(self.root) if (m := _SHARD.search(p.name)) and int(m.group(1)) == rank
        }

    def _update_info(self, extra: dict) -> None:
        path = self.root / "store.json"
        info = _read_info(path) if path.exists() else {"format": FORMAT, "version": VERSION}
        for k, v in extra.items():
            if isinstance(v, dict) and isinstance(info.get(k), dict):
                info[k] = {**info[k], **v}
            else:
                info[k] = v
        atomic_write(path, json.dumps(info, indent=2, sort_keys=True).encode())

    def add(
        self,
        concept: str,
        image: Image.Image | bytes | None,
        source: str,
        score: float = 1.0,
        meta: dict[str, Any] | None = None,
    ) -> str | None:
        """Queue one image of ``concept`` (or ``image=None`` to record "tried, nothing found").

        Returns:
            The image id, or None for a no-image record.

        Raises:
            BadImageError: ``image`` is bytes whose header is unreadable or describes an image
                :func:`tokenswap.images.check_image_size` refuses.
        """
        data = None if image is None else encode_image(image)
        width = height = 0
        if isinstance(image, Image.Image):
            width, height = image.size
        elif data is not None:
            # Header only: a store must not take in a file no reader could use (a bomb, a sliver).
            what = f"image bytes for concept {concept!r} ({source})"
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                    with Image.open(io.BytesIO(data)) as im:
                        width, height = im.size
            except Exception as e:  # noqa: BLE001 - any header failure means "not a usable image"
                raise BadImageError(f"{what}: not a readable image ({type(e).__name__}: {e})") from None
            check_image_size(width, height, what=what)
        image_id = image_id_of(data) if data is not None else ""
        self._rows.append(
            {
                "key": normalize_concept(concept),
                "concept": concept,
                "image_id": image_id,
                "image": data,
                "source": source,
                "score": float(score),
                "width": width,
                "height": height,
                "meta": json.dumps(meta or {}, sort_keys=True),
            }
        )
        if len(self._rows) >= self.shard_size:
            self.flush()
        return image_id or None

    def flush(self, shard: int | None = None) -> None:
        """Commit queued rows as one new shard (atomic).

        Args:
            shard: its number (a writer that numbers its shards by what they hold, so that a batch redone after a
                failure keeps its name); default the next after this rank's highest. Shards are immutable: a
                number this rank has committed is refused (:meth:`free_shard` says whether one is).
        """
        if not self._rows:
            return
        number = self.next_shard if shard is None else shard
        if number in self._taken:
            raise ValueError(f"shard {number} of rank {self.rank} is committed in {self.root}; shards are immutable: "
                             "commit the rows under another number (StoreWriter.free_shard)")
        table = pa.Table.from_pylist(self._rows, schema=SCHEMA)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, SCHEMA) as writer:
            writer.write_table(table)
        path = self.root / "shards" / f"part-r{self.rank:03d}-{number:06d}.arrow"
        atomic_write(path, sink.getvalue().to_pybytes())
        self._taken.add(number)
        self._rows = []

    @property
    def next_shard(self) -> int:
        """Number a plain :meth:`flush` commits: one past this rank's highest (a redone flush after a kill reuses it)."""
        return max(self._taken, default=-1) + 1

    def free_shard(self, wanted: int) -> int:
        """``wanted`` if this rank has not committed a shard of that number, else :attr:`next_shard`."""
        return self.next_shard if wanted in self._taken else wanted

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
