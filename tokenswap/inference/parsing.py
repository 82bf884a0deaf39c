"""JSON out of a model's reply: the store build's extractor and judge and the bench builder ask for JSON and get prose.

:func:`parse_json_response` tolerates code fences and prose around the object, and refuses (``ValueError``) what
Python's parser cannot take (nesting past the recursion limit, integers past the digit limit) like any reply
without an object.
"""

from __future__ import annotations

import itertools
import re

from tokenswap.files import json_loads

__all__ = ["MAX_STARTS", "parse_json_response"]

MAX_STARTS = 64
"""How many fenced blocks and ``{`` positions :func:`parse_json_response` tries before giving up."""

_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.DOTALL)


def parse_json_response(text: str) -> dict:
    """Extract the JSON object from a model reply, tolerating code fences and prose around it.

    Tries, in order: the whole reply, each fenced block, then the first ``{...}`` that decodes.

    Raises:
        ValueError: no JSON object in the reply; the message quotes its start.

    >>> parse_json_response('Sure! ```json\\n{"a": 1}\\n``` Hope that helps.')
    {'a': 1}
    >>> parse_json_response('The answer is {"a": [1, 2]} as requested.')
    {'a': [1, 2]}
    """
    candidates = [text.strip()] + [m.group(1).strip() for m in itertools.islice(_FENCE.finditer(text), MAX_STARTS)]
    for candidate in candidates:
        try:
            value = json_loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    import json

    decoder = json.JSONDecoder()
    # Bounded: a reply of 100,000 "{" would otherwise be decoded from each of them, each as deep as it goes.
    for m in itertools.islice(re.finditer(r"\{", text), MAX_STARTS):
        try:
            value, _ = decoder.raw_decode(text, m.start())
        except (ValueError, RecursionError):
            continue
        if isinstance(value, dict):
            return value
    preview = text[:200].replace("\n", " ")
    raise ValueError(f"no JSON object found in model reply: {preview!r}")
