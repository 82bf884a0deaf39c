"""Validity filter: does a store image depict its concept as the text means it?

TokenSwap's validity filter judges each image *in context* with one-at-a-time restoration: the
judge sees the message with only the target span replaced by the image and every other
concept left as text, so a picture is never blamed for the other swaps of the sample.
"""

from __future__ import annotations

from PIL import Image

from tokenswap.inference import ChatModel
from tokenswap.inference.parsing import parse_json_response
from tokenswap.swap import interleave

__all__ = ["ValidityJudge"]

JUDGE_PROMPT = (
    'In the message below, one phrase was replaced by the picture shown in its place. The phrase was "{concept}".\n\n'
)
JUDGE_QUESTION = (
    '\n\nDoes the picture clearly show "{concept}" in the sense the message uses it, so that a reader could '
    'recover the phrase from the picture? Answer with JSON only: {{"valid": true or false, "reason": "..."}}.'
)


class ValidityJudge:
    """Ask a vision-language chat model whether an image faithfully stands in for a concept.

    Args:
        chat_model: a :class:`tokenswap.inference.ChatModel` that accepts image parts.
    """

    def __init__(self, chat_model: ChatModel):
        self.chat_model = chat_model

    def judge(self, text: str, start: int, end: int, concept: str, image: Image.Image) -> dict:
        """Judge one image for the span ``text[start:end]``.

        Args:
            text: the full message the concept occurs in (other concepts stay as text).
            start: first character of the target span.
            end: one past its last character.
            concept: the concept key, named in the question.
            image: the candidate image.

        Returns:
            ``{"valid": bool | None, "reason": str}``; ``valid`` is None when the judge's reply
            was not usable JSON twice in a row.
        """
        parts = [{"type": "text", "text": JUDGE_PROMPT.format(concept=concept)}]
        parts += interleave(text, [(start, end, image)])
        parts.append({"type": "text", "text": JUDGE_QUESTION.format(concept=concept)})
        messages = [{"role": "user", "content": parts}]
        for _ in range(2):
            reply = self.chat_model.chat(messages)
            try:
                verdict = parse_json_response(reply)
                valid = verdict["valid"]
                if isinstance(valid, str):
                    valid = valid.strip().lower() in ("true", "yes")
                return {"valid": bool(valid), "reason": str(verdict.get("reason", ""))[:300]}
            except (ValueError, KeyError):
                messages = messages + [
                    {"role": "assistant", "content": reply},
                    {"role": "user", "content": 'Answer with JSON only: {"valid": true or false, "reason": "..."}.'},
                ]
        return {"valid": None, "reason": "judge reply was not JSON"}
