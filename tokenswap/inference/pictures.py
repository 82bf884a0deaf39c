"""A picture's digest, computed once per picture: the key the evaluators' records and the request path share.

``tokenswap eval`` names each distinct picture by its digest (the captioning records, the recognition items) and
the ``openai`` backend encodes each picture once per run under it, whatever the number of requests and forms that
send it (:class:`tokenswap.inference.backends.OpenAIBackend`).
"""

from __future__ import annotations

import hashlib
import weakref

from tokenswap.images import StoredPicture

__all__ = ["picture_digest"]

# id of a live PIL image -> (a weak reference to it, its digest). A bench's pictures are read once and never
# changed, so hashing their pixels again for each request would be pure waste; the entry goes with the image.
_PIL_DIGESTS: dict[int, tuple[weakref.ref, str]] = {}


def _pixels_digest(image) -> str:
    h = hashlib.blake2b(digest_size=8)
    h.update(f"{image.mode}{image.size}".encode())
    h.update(image.tobytes())
    return h.hexdigest()


def picture_digest(image) -> str:
    """A stable hex digest of a picture (encoded bytes as given, or a PIL image's mode, size and pixels; a
    :class:`tokenswap.images.StoredPicture` has its decoded pixels' digest, the one its PIL image would have).

    A PIL image's digest is remembered while the image lives: an image changed in place after its first digest
    keeps the first one (the pictures of a bench or a store are never changed).
    """
    if isinstance(image, bytes):
        return hashlib.blake2b(image, digest_size=8).hexdigest()
    if isinstance(image, StoredPicture):  # the digest of its pixels, as the decoded picture's, kept with it
        if image.digest is None:
            image.digest = _pixels_digest(image.decode())
        return image.digest
    key = id(image)
    known = _PIL_DIGESTS.get(key)
    if known is not None and known[0]() is image:
        return known[1]
    digest = _pixels_digest(image)
    try:
        ref = weakref.ref(image, lambda _, key=key: _PIL_DIGESTS.pop(key, None))
    except TypeError:  # an object that takes no weak reference: digested each time
        return digest
    _PIL_DIGESTS[key] = (ref, digest)
    return digest
