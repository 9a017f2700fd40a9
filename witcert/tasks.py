"""RULER-style long-context probes of our own (deterministic from a seed, no downloads).

Each ``make(task, n_tokens, tokenizer, seed)`` returns a ``Sample(prompt_ids, answers, task)``:
a haystack of filler sentences of about ``n_tokens`` tokens with needles inserted at random
depths, then a question. ``score(sample, text)`` is 1 when every expected answer string occurs
in the generated text.

* ``single``   one key, one value ("the special magic number for <key> is <value>").
* ``multikey`` four needles with different keys; the question asks for one of them.
* ``multivalue`` one key with two values; both must be recalled.
* ``vartrack`` a chain ``VAR A = v; VAR B = VAR A; VAR C = VAR B``; asks for the value of the last.
"""

from __future__ import annotations

import dataclasses
import random

TASKS = ("single", "multikey", "multivalue", "vartrack")

_WORDS = (
    "apple river candle marble harbor violet engine falcon meadow copper lantern orchid pepper "
    "saddle thunder velvet walnut anchor basket cobalt dragon ember forest glacier hammer island "
    "jasmine kettle lemon magnet nectar otter pirate quartz raven silver tiger umbrella valley willow"
).split()
_FILLER = (
    "The grass is green and the sky is blue.",
    "The sun is warm and the wind is calm.",
    "Ships leave the harbour early in the morning.",
    "The old library keeps ledgers of cargo and ports.",
    "Rivers run to the sea through quiet valleys.",
    "Farmers bring bread and cheese to the market.",
    "A clock in the tower strikes every hour.",
    "Children play by the fountain in the square.",
)


@dataclasses.dataclass
class Sample:
    task: str
    prompt_ids: list[int]
    answers: list[str]
    needle_token_spans: list[tuple[int, int]]


def _haystack(tok, n_tokens: int, rng: random.Random) -> list[str]:
    sents, count = [], 0
    while count < n_tokens:
        s = rng.choice(_FILLER)
        sents.append(s)
        count += len(tok(" " + s, add_special_tokens=False)["input_ids"])
    return sents


def make(task: str, n_tokens: int, tok, seed: int = 0) -> Sample:
    if task not in TASKS:
        raise ValueError(f"task: expected one of {TASKS}, got {task!r}")
    if n_tokens < 64:
        raise ValueError("n_tokens: at least 64")
    rng = random.Random(f"{task}:{n_tokens}:{seed}")
    num = lambda: str(rng.randint(100000, 999999))  # noqa: E731
    if task == "single":
        key, val = rng.choice(_WORDS), num()
        needles = [f"The special magic number for {key} is {val}."]
        question = f"What is the special magic number for {key}?"
        lead, answers = f"The special magic number for {key} is", [val]
    elif task == "multikey":
        keys = rng.sample(_WORDS, 4)
        vals = [num() for _ in keys]
        needles = [f"The special magic number for {k} is {v}." for k, v in zip(keys, vals)]
        i = rng.randrange(4)
        question = f"What is the special magic number for {keys[i]}?"
        lead, answers = f"The special magic number for {keys[i]} is", [vals[i]]
    elif task == "multivalue":
        key = rng.choice(_WORDS)
        vals = [num(), num()]
        needles = [f"One of the special magic numbers for {key} is {v}." for v in vals]
        question = f"What are the two special magic numbers for {key}?"
        lead, answers = f"The two special magic numbers for {key} are", vals
    else:
        names = rng.sample(["AX", "BQ", "CZ", "DW", "EK", "FM", "GT"], 3)
        val = num()
        needles = [f"VAR {names[0]} = {val}.", f"VAR {names[1]} = VAR {names[0]}.", f"VAR {names[2]} = VAR {names[1]}."]
        question = f"What is the value of VAR {names[2]}?"
        lead, answers = f"VAR {names[2]} =", [val]
    hay = _haystack(tok, n_tokens, rng)
    depths = sorted(rng.randrange(1, len(hay)) for _ in needles)
    for off, (d, nd) in enumerate(zip(depths, needles)):
        hay.insert(d + off, nd)
    context = " ".join(hay)
    msgs = [{"role": "user", "content": f"Read the text and answer the question.\n\n{context}\n\n{question}"}]
    prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) + lead
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    spans = []
    for nd in needles:
        c = prompt.find(nd)
        spans.append((len(tok(prompt[:c], add_special_tokens=False)["input_ids"]),
                      len(tok(prompt[: c + len(nd)], add_special_tokens=False)["input_ids"])))
    return Sample(task=task, prompt_ids=ids, answers=answers, needle_token_spans=spans)


def score(sample: Sample, text: str) -> int:
    return int(all(a in text for a in sample.answers))
