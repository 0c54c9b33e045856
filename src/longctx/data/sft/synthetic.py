"""The embedded SFT set: generated multi-turn conversations with long-range answers.

The user states synthetic facts ("The code of the blue door is 4821.", "Alice lives in
Oslo.") and asks for some of them turns later, with filler tasks (arithmetic, sorting,
reversing words, ...) in between and distractor facts of the same kind; the last turn
always asks for an earlier fact. Answers thus depend on turns that skipped positions
(SkipAlign) move far away. Conversation i is drawn from `np.random.default_rng([seed, i])`,
so a larger set extends a smaller one. The default 4,000 conversations have 3-8 user turns
and fit windows of 512 tokens and up (lengths in docs/sft.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

EMBEDDED_SAMPLES = 4000


_COLORS = ("blue", "red", "green", "yellow", "black", "white", "silver", "golden", "purple", "orange", "grey", "brown")
_OBJECTS = ("door", "gate", "box", "safe", "locker", "chest", "cabinet", "vault", "drawer", "suitcase")
_NAMES = (
    "Alice",
    "Bruno",
    "Clara",
    "Daniel",
    "Elena",
    "Farid",
    "Greta",
    "Hugo",
    "Irene",
    "Jonas",
    "Kira",
    "Liam",
    "Mona",
    "Nadia",
    "Oscar",
    "Paula",
    "Quinn",
    "Rosa",
    "Samir",
    "Tara",
)
_CITIES = (
    "Lisbon",
    "Oslo",
    "Cairo",
    "Lima",
    "Quito",
    "Dublin",
    "Prague",
    "Nairobi",
    "Hanoi",
    "Perth",
    "Tallinn",
    "Bogota",
    "Seoul",
    "Vienna",
    "Accra",
    "Riga",
)
_PETS = ("cat", "dog", "parrot", "horse", "turtle", "rabbit", "goat", "owl")
_WORDS = (
    "apple",
    "river",
    "stone",
    "cloud",
    "garden",
    "window",
    "candle",
    "forest",
    "bridge",
    "pepper",
    "mirror",
    "castle",
    "rocket",
    "violin",
    "pencil",
    "island",
    "dragon",
    "butter",
    "planet",
    "ladder",
    "tiger",
    "lemon",
    "anchor",
    "button",
    "meadow",
    "silver",
    "thunder",
    "harbor",
    "orchid",
    "marble",
)
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_SYSTEM = "You are a helpful assistant. Remember what the user tells you and answer from it."
_INTROS = ("Please remember these facts.", "Here is some information for later.", "Keep these details in mind.")
_ACKS = ("Understood, I will remember that.", "Got it.", "Noted, I will keep it in mind.")


def embedded_conversations(num_samples: int = EMBEDDED_SAMPLES, seed: int = 0) -> list[list[dict[str, str]]]:
    """The embedded multi-turn SFT set: `num_samples` Tulu-style message lists (module docstring)."""
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
    return [_conversation(np.random.default_rng([seed, index])) for index in range(num_samples)]


def _pick(rng: np.random.Generator, options: Sequence[str]) -> str:
    return options[int(rng.integers(len(options)))]


def _facts(rng: np.random.Generator, count: int) -> list[tuple[str, str, str]]:
    """`count` (statement, question, answer) facts about distinct keys."""
    facts: list[tuple[str, str, str]] = []
    keys: set[tuple[str, ...]] = set()
    while len(facts) < count:
        kind = int(rng.integers(3))
        if kind == 0:
            color, thing, code = _pick(rng, _COLORS), _pick(rng, _OBJECTS), int(rng.integers(1000, 10000))
            key: tuple[str, ...]
            key, statement = ("code", color, thing), f"The code of the {color} {thing} is {code}."
            question = f"What is the code of the {color} {thing}?"
        elif kind == 1:
            name, city = _pick(rng, _NAMES), _pick(rng, _CITIES)
            key, statement, question = ("city", name), f"{name} lives in {city}.", f"Where does {name} live?"
        else:
            name, pet, age = _pick(rng, _NAMES), _pick(rng, _PETS), int(rng.integers(2, 20))
            key, statement = ("age", name, pet), f"{name}'s {pet} is {age} years old."
            question = f"How old is {name}'s {pet}?"
        if key not in keys:
            keys.add(key)
            facts.append((statement, question, statement))
    return facts


def _filler(rng: np.random.Generator) -> tuple[str, str]:
    """A self-contained (question, answer) task."""
    task = int(rng.integers(6))
    if task == 0:
        a, b = (int(x) for x in rng.integers(10, 100, size=2))
        return f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}."
    if task == 1:
        numbers = [int(x) for x in rng.choice(100, size=int(rng.integers(3, 8)), replace=False)]
        listed = ", ".join(map(str, numbers))
        return f"Sort these numbers from smallest to largest: {listed}.", ", ".join(map(str, sorted(numbers))) + "."
    words = [str(w) for w in rng.choice(_WORDS, size=int(rng.integers(3, 8)), replace=False)]
    if task == 2:
        return f"Write these words in reverse order: {' '.join(words)}.", " ".join(reversed(words)) + "."
    if task == 3:
        return f'How many letters are in the word "{words[0]}"?', f'The word "{words[0]}" has {len(words[0])} letters.'
    if task == 4:
        day = int(rng.integers(7))
        return f"Which day comes after {_DAYS[day]}?", f"{_DAYS[(day + 1) % 7]} comes after {_DAYS[day]}."
    return f"Rewrite in capital letters: {' '.join(words)}.", " ".join(words).upper() + "."


def _conversation(rng: np.random.Generator) -> list[dict[str, str]]:
    facts = _facts(rng, int(rng.integers(3, 7)))
    told = int(rng.integers(2, min(4, len(facts)) + 1))
    messages = [{"role": "system", "content": _SYSTEM}] if rng.random() < 0.3 else []
    intro = " ".join([_pick(rng, _INTROS), *(statement for statement, _, _ in facts[:told])])
    messages += [{"role": "user", "content": intro}, {"role": "assistant", "content": _pick(rng, _ACKS)}]
    unasked = list(range(told))
    turns = int(rng.integers(2, 8))
    for turn in range(turns):
        roll = rng.random()
        if turn == turns - 1 or (roll < 0.3 and unasked):
            pool = unasked if unasked else list(range(told))
            fact = pool.pop(int(rng.integers(len(pool))))
            question, answer = facts[fact][1], facts[fact][2]
        elif roll < 0.45 and told < len(facts):
            question, answer = f"One more thing: {facts[told][0]}", _pick(rng, _ACKS)
            unasked.append(told)
            told += 1
        else:
            question, answer = _filler(rng)
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    return messages
