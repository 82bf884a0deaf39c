"""What a model's reply holds: JSON (the store build's extractor and judge and the bench builder ask for JSON and get
prose) and a think block before the final content (:func:`split_reasoning`, for every backend).

:func:`parse_json_response` tolerates code fences and prose around the object, and refuses (``ValueError``) what
Python's parser cannot take (nesting past the recursion limit, integers past the digit limit) like any reply
without an object.
"""

from __future__ import annotations

import itertools
import re

from tokenswap.files import json_loads

__all__ = ["MAX_STARTS", "parse_json_response", "split_reasoning"]

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


def split_reasoning(text: str, opened: bool = False) -> tuple[str, str | None]:
    """``(final content, reasoning)`` of a generation: the reasoning is what precedes the last ``</think>``.

    Args:
        text: the decoded generation.
        opened: the prompt ended with an open think block (:data:`OPEN_THINK`): a generation that never
            closes it (the budget ran out while reasoning) is all reasoning and has no final content.

    >>> split_reasoning("let me see</think>\\n\\nB")
    ('B', 'let me see')
    >>> split_reasoning("B"), split_reasoning("still thinking", opened=True)
    (('B', None), ('', 'still thinking'))
    """
    head, sep, tail = text.rpartition("</think>")
    if not sep:
        return ("", text) if opened else (text, None)
    return tail.lstrip("\n"), head.removeprefix("<think>").strip("\n")
