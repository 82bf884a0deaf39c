"""Draw docs/tokenswap_arms.png, the README's picture: one training sample in the text arm and in the TokenSwap arm.

    python docs/make_tokenswap_arms.py            # offline; the pictogram comes from the installed OpenMoji set

The sample and its concept span are the README's collator example; the pictogram is what the embedded store's
``openmoji`` source draws for "cat" (OpenMoji, CC BY-SA 4.0, so the figure is shared under that licence too).
"""

from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from tokenswap.store.sources import DEJAVU_SANS, OpenMojiSource

OUT = Path(__file__).with_name("tokenswap_arms.png")
W, H, PAD = 1000, 320, 24
QUESTION = ("Why does a ", "cat", " purr?")
ANSWER = "Mostly contentment, sometimes stress."


def main() -> None:
    font = ImageFont.truetype(DEJAVU_SANS, 22)
    bold = ImageFont.truetype(DEJAVU_SANS.replace("DejaVuSans.ttf", "DejaVuSans-Bold.ttf"), 22)
    small = ImageFont.truetype(DEJAVU_SANS, 16)
    picture = OpenMojiSource(size=64).render("cat")
    img = Image.new("RGB", (W, H), "white")
    d = ImageDraw.Draw(img)

    def row(y: int, label: str, swapped: bool) -> None:
        d.text((PAD, y + 20), label, font=bold, fill=(40, 40, 40))
        x = 255
        d.rounded_rectangle((x - 12, y, W - PAD, y + 76), radius=10, outline=(150, 150, 150), width=2)
        d.text((x, y + 8), "user:", font=small, fill=(110, 110, 110))
        x += 60
        before, concept, after = QUESTION
        d.text((x, y + 24), before, font=font, fill="black")
        x += d.textlength(before, font=font)
        if swapped:
            img.paste(picture, (int(x), y + 6))
            x += picture.width + 6
        else:
            d.text((x, y + 24), concept, font=bold, fill=(20, 90, 200))
            x += d.textlength(concept, font=bold)
        d.text((x, y + 24), after if not swapped else after.lstrip(), font=font, fill="black")
        d.text((640, y + 8), "assistant (learned):", font=small, fill=(110, 110, 110))
        d.text((640, y + 32), ANSWER, font=small, fill="black")

    row(PAD, "text arm", swapped=False)
    row(PAD + 100, "TokenSwap arm", swapped=True)
    d.text((PAD, 232), "Same samples, same order, same answers: only the concept's rendering differs.",
           font=small, fill=(40, 40, 40))
    d.text((PAD, 258), "Modality gap = accuracy on a question as text \u2212 accuracy on the same question with "
           "its concepts", font=small, fill=(40, 40, 40))
    d.text((PAD, 280), "shown as pictures (TokenSwap-Bench, CrossMath, REST).   Pictogram: OpenMoji, CC BY-SA 4.0.",
           font=small, fill=(40, 40, 40))
    img.save(OUT, optimize=True)
    print(OUT)


if __name__ == "__main__":
    main()
