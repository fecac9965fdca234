"""The bench's fixed inputs: prompts, filler text of a given token length, a text for perplexity."""

from __future__ import annotations

DECODE_PROMPT = (
    "Write a long, detailed story about a lighthouse keeper who finds a message in a bottle. "
    "Describe the island, the weather, the keeper's daily routine and what the message says."
)

# A reply that repeats its prompt (an edit of code it is shown): where prompt lookup pays.
EDIT_PROMPT = (
    "Rename the function fib to fibonacci in this code and show the whole code:\n\n"
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n"
    "def main():\n    for i in range(10):\n        print(i, fib(i))\n"
)

QUALITY_PROMPTS = (
    "What is the capital of France?",
    "Give me three tips for staying healthy.",
    "Explain in two sentences why the sky is blue.",
)

# A fixed English text (written for this bench) for perplexity and as filler.
TEXT = (
    "The river town woke slowly. Fishermen pulled their boats onto the gravel and sorted the night's catch "
    "while the baker opened the shutters and set out the first loaves of bread. Children ran along the "
    "harbour wall, and an old man sat on a bench reading yesterday's newspaper. In the square, the market "
    "traders unfolded their tables and argued about the price of apples. The school bell rang at eight, "
    "and the streets grew quiet again. By noon the sun had burned away the morning mist, and the hills "
    "behind the town turned from grey to green. A train crossed the bridge to the north, carrying timber "
    "and a few passengers who looked out at the water. In the afternoon the wind picked up, the boats "
    "rocked against their moorings, and the gulls circled over the fish market, waiting for scraps. When "
    "evening came, lamps were lit in the windows one by one, and the smell of cooking drifted through the "
    "narrow lanes. People gathered in the tavern to talk about the weather, the harvest and the news from "
    "the city, where a new library had just opened and the mayor had promised to repair the old road."
)


def filler(tokenizer, tokens: int, tag: str = "") -> str:
    """A user message of about `tokens` tokens (before the chat template): `tag` then the text, repeated."""
    words = TEXT.split()
    out: list[str] = [tag] if tag else []
    i = 0
    step = 16
    while True:
        candidate = out + [words[(i + j) % len(words)] for j in range(step)]
        if len(tokenizer.encode(" ".join(candidate))) > tokens:
            if step == 1:
                break
            step //= 2
            continue
        out, i = candidate, i + step
    return " ".join(out)
