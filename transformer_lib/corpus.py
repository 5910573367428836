"""Text that needs no download: English prose from CPython's own help pages
(`pydoc_data.topics`, the text behind `help("if")`), a tokenizer for it, and a small,
hand-written "apple" corpus in which one word has two senses (the fruit and the company).

The help pages change from one Python release to the next, and the chapters print counts,
vocabularies and trained results drawn from them. So the course reads a frozen copy, the
`pydoc_data.topics` of CPython 3.11.7 (`data/pydoc_topics.json.gz`, 137 KB; the Python
documentation, under the PSF License), and every Python the course supports sees the same text.

The apple corpus is chapter 01's version of the classic 苹果 example (eating an apple vs.
an Apple product launch): every sentence is generated from templates written for this
course, with a seeded random choice of fillers, so it is the same on every machine.
"""

from __future__ import annotations

import random
import re

# One token = a run of lowercase letters, optionally with an apostrophe part ("don't").
# Digits and punctuation are dropped: this chapter is about words.
_TOKEN = re.compile(r"[a-z]+(?:'[a-z]+)?")


def tokenize(text: str) -> list[str]:
    """Lowercase `text` and split it into word tokens.

    >>> tokenize("The 'if' statement: it selects exactly one suite.")
    ['the', 'if', 'statement', 'it', 'selects', 'exactly', 'one', 'suite']
    """
    if not isinstance(text, str):
        raise TypeError(f"tokenize expects a str, got {type(text).__name__}")
    return _TOKEN.findall(text.replace("\u2019", "'").lower())


_PROSE_PUNCTUATION = set(".,;:!?'\"*-\u201c\u201d\u2019")


def _is_prose(paragraph: str) -> bool:
    """True for a paragraph of English sentences, False for grammar rules, code
    examples and section underlines, which would teach the vectors Python syntax."""
    stripped = paragraph.strip()
    if not stripped or "::=" in stripped or ">>>" in stripped:
        return False
    if set(stripped) <= set("*=-~^ "):  # a heading underline
        return False
    # Prose is almost all letters, spaces and sentence punctuation; code and tables
    # are dense with ( ) [ ] = _ | + and digits.
    wordy = sum(ch.isalpha() or ch.isspace() or ch in _PROSE_PUNCTUATION for ch in stripped)
    return wordy / len(stripped) >= 0.9 and len(stripped.split()) >= 6


def pydoc_topics() -> dict[str, str]:
    """CPython 3.11.7's `pydoc_data.topics.topics` (topic name -> help text), whatever Python runs this."""
    import gzip
    import json
    from pathlib import Path

    with gzip.open(Path(__file__).with_name("data") / "pydoc_topics.json.gz", "rt", encoding="utf-8") as f:
        return json.load(f)["topics"]


def pydoc_paragraphs() -> list[str]:
    """The prose paragraphs of Python's built-in help topics, in a fixed (sorted) order.

    About 0.5 MB of text ships with every CPython as `pydoc_data.topics.topics`
    (a dict: topic name -> help text); the course reads its frozen 3.11.7 copy (see above).
    Code blocks and grammar rules are left out.
    """
    topics = pydoc_topics()
    paragraphs = []
    for name in sorted(topics):
        for paragraph in re.split(r"\n\s*\n", topics[name]):
            if _is_prose(paragraph):
                paragraphs.append(" ".join(paragraph.split()))
    return paragraphs


def pydoc_tokens() -> list[str]:
    """All prose of `pydoc_data.topics` as one list of lowercase word tokens (~60k)."""
    return [token for paragraph in pydoc_paragraphs() for token in tokenize(paragraph)]


# ----------------------------------------------------------------------------------
# The apple corpus: one word, two senses.
# ----------------------------------------------------------------------------------

FRUITS = ["apple", "pear", "banana", "peach", "cherry", "plum", "grape", "mango"]
COMPANIES = ["apple", "microsoft", "google", "samsung", "amazon", "intel", "nokia", "ibm"]

_TASTES = ["sweet", "ripe", "juicy", "fresh", "sour", "soft"]
_PRODUCTS = ["phone", "laptop", "tablet", "chip", "software", "smartphone"]

# Each template has {fruit} or {company} slots and fixed words chosen so that the two
# senses share almost no context: fruit sentences talk about eating, trees, taste and
# kitchens; company sentences about products, shares, profit and engineers.
_FRUIT_TEMPLATES = [
    "she ate a {taste} {fruit} after lunch",
    "he peeled the {fruit} with a small knife",
    "we picked a {taste} {fruit} from the tree in the orchard",
    "the {fruit} tasted {taste} and {taste}",
    "my grandmother baked a {fruit} pie in the kitchen",
    "a {taste} {fruit} is a healthy snack for children",
    "they squeezed the {fruit} to make juice for breakfast",
    "the farmer sold a basket of {fruit} at the market",
    "i sliced a {fruit} and a {fruit} for the fruit salad",
    "the {fruit} tree was full of {taste} fruit this summer",
]
_COMPANY_TEMPLATES = [
    "{company} released a new {product} at its launch event",
    "shares of {company} rose after the company reported record profit",
    "{company} hired engineers to design its next {product}",
    "the chief executive of {company} announced a cheaper {product}",
    "investors expect {company} to report higher revenue this quarter",
    "{company} and {company} compete to sell the best {product}",
    "analysts said the {product} from {company} sold well in stores",
    "the company {company} opened an office and hired developers",
    "{company} updated the software on its {product} last week",
    "regulators fined {company} for how the company sold its {product}",
]


def _fill(template: str, rng: random.Random, slot: str, words: list[str], apple_share: float) -> str:
    def pick(kind: str) -> str:
        if kind == slot:
            # Give "apple" a fixed share of each sense, so it is frequent in both.
            return "apple" if rng.random() < apple_share else rng.choice([w for w in words if w != "apple"])
        if kind == "taste":
            return rng.choice(_TASTES)
        return rng.choice(_PRODUCTS)

    return re.sub(r"\{(\w+)\}", lambda m: pick(m.group(1)), template)


def apple_corpus(n_sentences: int = 600, seed: int = 0, apple_share: float = 0.3) -> list[str]:
    """`n_sentences` short English sentences, half about fruit and half about companies.

    "apple" fills a fruit slot or a company slot with probability `apple_share`; the other
    fillers never cross over (a pear is never a company). Same seed, same sentences.
    """
    if n_sentences < 2:
        raise ValueError(f"n_sentences must be at least 2 (one per sense), got {n_sentences}")
    if not 0.0 < apple_share <= 1.0:
        raise ValueError(f"apple_share must be in (0, 1], got {apple_share}")
    rng = random.Random(seed)
    sentences = []
    for i in range(n_sentences):
        if i % 2 == 0:
            template = rng.choice(_FRUIT_TEMPLATES)
            sentences.append(_fill(template, rng, "fruit", FRUITS, apple_share))
        else:
            template = rng.choice(_COMPANY_TEMPLATES)
            sentences.append(_fill(template, rng, "company", COMPANIES, apple_share))
    return sentences


# Two sentences the vectors never saw, one per sense (苹果 as fruit, 苹果 as company).
APPLE_FRUIT_SENTENCE = "she ate a ripe apple and a sweet pear"
APPLE_COMPANY_SENTENCE = "apple and microsoft released a new phone"


# ----------------------------------------------------------------------------------
# One train/validation split of the help prose, shared by every chapter and benchmark.
# ----------------------------------------------------------------------------------

VAL_PARTS = 10  # validation is the last 1/VAL_PARTS of the paragraphs: a 90/10 split


def char_splits() -> tuple[str, str]:
    """The course's language-modelling text, split once: `(train_text, val_text)`.

    The prose paragraphs of `pydoc_paragraphs()`, each distinct paragraph once (the help
    topics repeat whole sections: the "while" topic is also part of "compound", so without
    this the validation text would partly be training text), one paragraph per line.
    The last 10% of those paragraphs (rounded up) are the validation text and the first 90%
    the training text, as nanoGPT splits its Shakespeare: a contiguous tail, not a random
    sample. No randomness at all: every chapter, test and benchmark sees the same two strings.

    On CPython 3.11 (the course's pin): 1,331 distinct paragraphs, 1,197 for training
    (264,147 characters) and 134 for validation (25,885 characters). Other Python versions
    ship other help text, and so other sizes.
    """
    distinct = list(dict.fromkeys(pydoc_paragraphs()))  # first occurrence of each, in order
    n_val = -(-len(distinct) // VAL_PARTS)  # ceil(len / 10): at least one paragraph
    train, val = distinct[:-n_val], distinct[-n_val:]
    return "\n".join(train), "\n".join(val)
