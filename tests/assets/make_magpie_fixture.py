"""Write ``magpie_fixture.jsonl``: a small, deterministic instruction set in raw Magpie-Pro format.

Rows look like ``Magpie-Align/Magpie-Pro-300K-Filtered`` (``uuid``, ``conversations`` of
``{"from": "human" | "gpt", "value"}``, plus two metadata columns loaders must ignore). User
queries mention everyday concepts the embedded OpenMoji store can draw (foods, animals,
vehicles, weather, objects, plants), so the demo and tests have real swaps; about one row in
ten has no such concept (coding, arithmetic), as in real instruction data. Written by us from
templates; no third-party text.

A development script, kept with the tests (the package ships its output only). Run from the repo root
(output is byte-identical on every run)::

    python tests/assets/make_magpie_fixture.py
"""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path

N_ROWS = 320
SEED = 20260101

CONCEPTS = {
    "food": [
        "apple", "banana", "grapes", "lemon", "pineapple", "strawberry", "cherries", "peach", "pear", "watermelon",
        "mango", "avocado", "carrot", "broccoli", "potato", "tomato", "onion", "garlic", "mushroom", "cucumber",
        "eggplant", "bread", "croissant", "cheese", "egg", "pizza", "hamburger", "taco", "burrito", "sushi",
        "spaghetti", "rice", "pancakes", "cookie", "doughnut", "cake", "popcorn", "sandwich", "bagel", "pretzel",
        "dumpling", "ramen", "green salad", "chocolate bar", "honey pot",
    ],
    "drink": ["coffee", "milk glass", "wine glass", "beer mug", "hot beverage"],
    "animal": [
        "dog", "cat", "horse", "cow", "pig", "sheep", "goat", "chicken", "rabbit", "fox", "bear", "panda", "koala",
        "tiger", "lion", "elephant", "giraffe", "zebra", "monkey", "gorilla", "kangaroo", "camel", "deer", "wolf",
        "owl", "eagle", "duck", "penguin", "parrot", "flamingo", "peacock", "swan", "frog", "turtle", "snake",
        "lizard", "crocodile", "dolphin", "whale", "shark", "octopus", "butterfly", "honeybee", "spider", "snail",
        "hedgehog", "otter", "beaver", "hamster",
    ],
    "vehicle": [
        "car", "bicycle", "bus", "train", "airplane", "helicopter", "motorcycle", "rocket", "sailboat", "ship",
        "canoe", "tractor", "taxi", "ambulance", "fire engine", "police car", "truck", "skateboard", "tram",
        "kick scooter",
    ],
    "weather": ["sun", "cloud", "umbrella", "snowflake", "snowman", "rainbow", "tornado", "fog", "thermometer",
                "cyclone", "volcano", "mountain", "crescent moon", "comet"],
    "object": [
        "laptop", "keyboard", "computer mouse", "camera", "television", "radio", "telephone", "mobile phone",
        "guitar", "violin", "drum", "trumpet", "saxophone", "book", "pencil", "scissors", "hammer", "wrench",
        "screwdriver", "light bulb", "candle", "backpack", "glasses", "sunglasses", "running shoe", "dress",
        "t-shirt", "jeans", "scarf", "gloves", "coat", "chair", "bed", "door", "window", "bathtub", "mirror",
        "broom", "bucket", "basket", "soap", "sponge", "toothbrush", "calendar", "envelope", "compass", "tent",
    ],
    "place": ["house", "castle", "school", "hospital", "bank", "hotel", "factory", "stadium", "church"],
    "plant": ["cactus", "rose", "sunflower", "tulip", "seedling", "palm tree", "evergreen tree", "maple leaf", "herb"],
    "sport": ["soccer ball", "basketball", "baseball", "football", "trophy", "bowling"],
}

# (category, instruction, response). {a} is a concept of the category; {b} (when present) a second one.
TEMPLATES = [
    ("food", "What are the main nutritional benefits of eating {a} regularly?",
     "{A} can be part of a balanced diet. It provides fibre, vitamins and minerals in varying amounts, and it "
     "is most beneficial when eaten as part of varied meals rather than in large quantities on its own. If you "
     "have specific dietary needs, a registered dietitian can tailor advice to you."),
    ("food", "Can you suggest a simple recipe that uses {a} and {b}?",
     "Here is an easy idea: prepare the {a} first, then combine it with the {b} in a pan over medium heat. "
     "Season with salt, pepper and a little olive oil, taste as you go, and serve warm. The whole dish takes "
     "about twenty minutes and scales easily for more people."),
    ("food", "How should I store {a} so that it stays fresh for as long as possible?",
     "Keep {a} in a cool, dry place away from direct sunlight, or in the refrigerator if it is already cut or "
     "cooked. An airtight container limits moisture loss, and checking it every couple of days lets you use it "
     "before it spoils."),
    ("food", "I'm planning a picnic. Is {a} a good thing to bring, and what else would go well with it?",
     "Yes, {a} travels reasonably well if you pack it in a sealed container and keep it cool. Pair it with "
     "something fresh, a simple dip and plenty of water, and bring napkins and a small cutting board."),
    ("food", "Write a short, cheerful poem about {a}.",
     "Oh {a}, bright and bold,\nA little treasure to behold,\nOn sunny days or winter nights,\nYou bring the "
     "table small delights."),
    ("food", "Explain the difference in taste and texture between {a} and {b}.",
     "{A} and {b} differ mostly in texture and sweetness. {A} tends to have its own distinct flavour profile, "
     "while {b} is usually described differently by people who try both side by side. The best way to "
     "understand the contrast is a small tasting with each prepared simply."),
    ("drink", "Is it healthy to have a {a} every day?",
     "In moderation, a daily {a} is fine for most adults. Pay attention to added sugar and portion size, and "
     "talk to a doctor if you have a condition that might be affected."),
    ("drink", "What snack pairs nicely with a {a} in the afternoon?",
     "A light snack works best: something with a bit of crunch and not too much sugar. Nuts, crackers or a "
     "piece of fruit balance a {a} without spoiling your appetite for dinner."),
    ("animal", "What does a {a} eat in the wild, and how does its diet change with the seasons?",
     "In the wild, a {a} eats what its habitat provides. Its diet shifts with the seasons as food becomes more "
     "or less available, and many animals build up reserves before the leaner months. Field guides for your "
     "region give specifics."),
    ("animal", "Can you give me three fun facts about the {a} for my daughter's school project?",
     "Sure! 1. The {a} has adaptations that suit its environment remarkably well. 2. Scientists study its "
     "behaviour to learn how animals communicate. 3. Many cultures feature the {a} in stories and art. A "
     "picture and a short caption for each fact would make a lovely poster."),
    ("animal", "How is a {a} different from a {b}?",
     "A {a} and a {b} differ in size, habitat, diet and behaviour. Comparing where each lives and what it eats "
     "is a good starting point; from there, look at how each raises its young and how it avoids predators."),
    ("animal", "Write a children's story opening about a brave little {a}.",
     "Once upon a time, at the edge of a quiet forest, lived a little {a} who was smaller than all the others. "
     "Every morning it watched the horizon and wondered what lay beyond the hills. One day, a strange sound "
     "echoed through the trees, and the little {a} decided it was time to find out."),
    ("animal", "I want to draw a {a}. What shapes should I start with?",
     "Start with simple shapes: an oval or circle for the body, a smaller one for the head, and lines for the "
     "limbs. Once the proportions look right, refine the outline, add details such as the eyes and texture, "
     "and finish with shading."),
    ("animal", "Is a {a} a good pet for a family with small children?",
     "It depends on the family and the animal's needs. Research how much space, time and care a {a} requires, "
     "whether it is legal to keep where you live, and how it typically behaves around children before deciding."),
    ("vehicle", "What should I check before buying a used {a}?",
     "Inspect the overall condition, ask for the maintenance history, and test it yourself before paying. For "
     "a {a}, look closely at wear on the parts that move the most and ask a qualified mechanic to look at "
     "anything you are unsure about."),
    ("vehicle", "Is it faster to travel across the city by {a} or by {b}?",
     "It depends on traffic, distance and routes. A {a} can be quicker in some conditions, while a {b} may win "
     "during rush hour. Checking a journey planner at the time you intend to travel gives the most reliable "
     "answer."),
    ("vehicle", "Explain to a ten-year-old how a {a} works.",
     "Think of a {a} as a machine that turns energy into movement. Something provides the power, a system "
     "passes that power to the parts that move, and the driver or rider controls where it goes and how fast."),
    ("vehicle", "Write a haiku about riding a {a} at dawn.",
     "Quiet morning roads\nthe {a} hums beneath the sky\nlight spills on the world"),
    ("weather", "How should I prepare my garden when the forecast shows a {a}?",
     "Secure anything loose, protect young plants, and check drainage. When a {a} is expected, it also helps "
     "to move pots to a sheltered spot and to avoid working outside while conditions are at their worst."),
    ("weather", "Why do we sometimes see a {a} and what causes it?",
     "A {a} appears when particular atmospheric conditions line up: temperature, moisture and light or wind "
     "interact in a specific way. Meteorology textbooks and national weather services explain the physics in "
     "accessible terms."),
    ("weather", "Describe a winter morning with a {a} in three sentences.",
     "The morning began quietly, with the {a} setting the mood over the sleeping town. Frost clung to the "
     "windows while the streets slowly filled with people in thick coats. By noon, the light had changed and "
     "the whole scene felt calm and new."),
    ("object", "How do I clean a {a} without damaging it?",
     "Use a soft cloth and a mild cleaner suitable for the material, and never soak it unless the manufacturer "
     "says that is safe. For a {a}, check the care instructions first and test any product on a small, hidden "
     "area."),
    ("object", "What should I look for when buying a new {a} on a budget?",
     "Decide what you really need, compare a few models in your price range, and read reviews that mention "
     "durability. A mid-range {a} from a reputable brand often lasts longer than the cheapest option."),
    ("object", "Can you write a product description for a handmade {a}?",
     "Crafted by hand with care, this {a} combines everyday practicality with a distinctive, personal touch. "
     "Each piece is unique, made from quality materials, and designed to be used and enjoyed for years."),
    ("object", "My {a} stopped working properly. What are some common fixes I can try at home?",
     "First check the simple things: is it clean, undamaged and being used as intended? Many problems with a "
     "{a} come from wear or small misalignments that are easy to fix. If basic checks do not help, contact the "
     "manufacturer or a repair shop rather than forcing it."),
    ("object", "I'm packing for a weekend trip. Should I bring a {a} and a {b}?",
     "If you will actually use them, yes. A {a} and a {b} can both be handy on a short trip, but pack light: "
     "lay everything out first and remove anything you would not miss for two days."),
    ("place", "What is daily life like for people who work in a {a}?",
     "Work in a {a} usually follows a routine shaped by the people it serves. Staff coordinate closely, handle "
     "unexpected situations, and often work shifts. It can be demanding but also rewarding."),
    ("place", "Write a short mystery scene that takes place in an old {a}.",
     "The door of the old {a} creaked open at midnight. Inspector Lane raised her lantern and noticed fresh "
     "footprints in the dust, leading towards a room that had been locked for years."),
    ("plant", "How often should I water a {a} kept indoors?",
     "Water a {a} when the top of the soil feels dry rather than on a fixed schedule. Indoor conditions vary, "
     "so light, temperature and pot size all matter. Good drainage prevents most problems."),
    ("plant", "What does the {a} symbolise in different cultures?",
     "The {a} carries different meanings around the world, often linked to growth, resilience or celebration. "
     "Local traditions, literature and art are the best sources for how a particular culture sees it."),
    ("sport", "Give me a beginner's weekly practice plan for playing with a {a}.",
     "Practise three times a week for about forty minutes: warm up for ten minutes, spend twenty on basic "
     "skills, and finish with a short game and a cool-down. Track your progress and add one new skill each "
     "week."),
    ("mixed", "My son loves the {a} and the {b}. Can you invent a bedtime story that includes both?",
     "Once there was a {a} who dreamed of adventure. One evening it met a {b}, and together they set off along "
     "the moonlit path behind the house. They helped each other over every obstacle, and when they finally "
     "came home, they had become the best of friends. The end."),
    ("mixed", "Create a riddle whose answer is {a}.",
     "I am something you may have seen many times; think of {a_hint}. What am I? Answer: a {a}."),
    ("mixed", "Describe a {a} to someone who has never seen one.",
     "A {a} is something you would recognise by its shape, colour and size once you have seen it. Imagine it "
     "in a familiar setting: how big it would be next to your hand, what it would feel like, and how people "
     "use or encounter it in daily life."),
    ("mixed", "Plan a themed birthday party for a six-year-old around the {a}.",
     "Decorate with {a} pictures and matching colours, bake a cake with a {a} on top, and plan two simple games "
     "built around the theme. End with a craft table where each child makes a {a} to take home."),
]

NO_CONCEPT = [
    ("Write a Python function that returns the n-th Fibonacci number using iteration.",
     "def fibonacci(n: int) -> int:\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a"),
    ("What is 17 multiplied by 23? Show your working.",
     "17 x 23 = 17 x 20 + 17 x 3 = 340 + 51 = 391."),
    ("Explain the difference between a list and a tuple in Python.",
     "A list is mutable: you can add, remove and change items. A tuple is immutable once created, which makes "
     "it hashable when its items are, so it can be used as a dictionary key."),
    ("How can I improve my focus when studying for exams?",
     "Work in short, timed sessions with breaks, remove distractions, and test yourself actively instead of "
     "rereading. Regular sleep and exercise make a measurable difference as well."),
    ("Summarise the main ideas of supply and demand.",
     "When prices rise, buyers usually want less and sellers want to offer more; when prices fall, the "
     "opposite happens. The market tends towards the price at which the two quantities match."),
    ("Solve for x: 3x + 7 = 22.",
     "Subtract 7 from both sides: 3x = 15. Divide by 3: x = 5."),
    ("Write a SQL query that counts orders per customer.",
     "SELECT customer_id, COUNT(*) AS n_orders\nFROM orders\nGROUP BY customer_id\nORDER BY n_orders DESC;"),
    ("Give me tips for writing a strong cover letter.",
     "Tailor it to the role, open with why you are interested, give two concrete achievements that match the "
     "job, and close with a clear, polite call to action. Keep it under one page."),
]

HINTS = ["something that appears in picture books", "an everyday sight", "something children can name early"]


def _fill(text: str, a: str, b: str, rng: random.Random) -> str:
    return text.format(a=a, b=b, A=a[:1].upper() + a[1:], a_hint=rng.choice(HINTS))


def make_rows(n_rows: int = N_ROWS, seed: int = SEED) -> list[dict]:
    """Build the fixture rows (pure function of its arguments)."""
    rng = random.Random(seed)
    all_concepts = sorted({c for cs in CONCEPTS.values() for c in cs})
    rows = []
    for i in range(n_rows):
        if i % 10 == 9:
            query, answer = NO_CONCEPT[(i // 10) % len(NO_CONCEPT)]
        else:
            category, query, answer = TEMPLATES[rng.randrange(len(TEMPLATES))]
            pool = all_concepts if category == "mixed" else CONCEPTS[category]
            a, b = rng.sample(pool, 2)
            query, answer = _fill(query, a, b, rng), _fill(answer, a, b, rng)
        row_uuid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        rows.append(
            {
                "uuid": row_uuid,
                "conversations": [{"from": "human", "value": query}, {"from": "gpt", "value": answer}],
                "task_category": "Information seeking" if i % 10 != 9 else "Coding & Debugging",
                "difficulty": rng.choice(["easy", "medium", "hard"]),
            }
        )
    return rows


def main() -> None:
    out = Path(__file__).resolve().parents[2] / "tokenswap" / "assets" / "magpie_fixture.jsonl"
    with open(out, "w", encoding="utf-8") as f:
        for row in make_rows():
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {N_ROWS} rows to {out}")


if __name__ == "__main__":
    main()
