"""Static word vectors from co-occurrence counts, and the attention-weighted mix that makes
them contextual: the starting point of the course.

Pipeline: tokens -> vocabulary -> co-occurrence counts in a window -> positive pointwise
mutual information (PPMI) -> truncated SVD = one dense vector per word. This is the
count-based cousin of word2vec (Levy & Goldberg, "Neural word embedding as implicit matrix
factorization", NeurIPS 2014; Levy, Goldberg & Dagan, TACL 2015). Whatever the sentence, a
word gets the same vector; `contextual_vectors` and `alignment` show how attention
(Bahdanau et al., 2015; Vaswani et al., 2017) gives it a different one in each sentence.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Iterable, Sequence

import torch

from .attention import scaled_dot_product_attention

# ----------------------------------------------------------------------------------
# Vocabulary
# ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Vocabulary:
    """Words and their ids: id i is `words[i]`; ids are ordered by falling frequency."""

    words: list[str]
    counts: list[int]

    def __post_init__(self):
        self.index = {word: i for i, word in enumerate(self.words)}

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: str) -> bool:
        return word in self.index

    def id(self, word: str) -> int:
        if word not in self.index:
            raise KeyError(f"{word!r} is not in the vocabulary ({len(self)} words)")
        return self.index[word]

    def encode(self, tokens: Iterable[str]) -> torch.Tensor:
        """Token ids as a LongTensor [n]. Words outside the vocabulary are dropped, so the
        words on either side of a dropped one become neighbours (as in word2vec)."""
        return torch.tensor([self.index[t] for t in tokens if t in self.index], dtype=torch.long)


def build_vocabulary(tokens: Iterable[str], max_size: int | None = None, min_count: int = 1) -> Vocabulary:
    """The `max_size` most frequent words seen at least `min_count` times.

    Ties in frequency are broken alphabetically, so the ids never depend on hash order.
    """
    if min_count < 1:
        raise ValueError(f"min_count must be at least 1, got {min_count}")
    if max_size is not None and max_size < 1:
        raise ValueError(f"max_size must be a positive number of words, got {max_size}")
    counter = Counter(tokens)
    ranked = sorted((item for item in counter.items() if item[1] >= min_count), key=lambda wc: (-wc[1], wc[0]))
    ranked = ranked[:max_size]
    return Vocabulary([w for w, _ in ranked], [c for _, c in ranked])


# ----------------------------------------------------------------------------------
# Counts -> PPMI -> SVD vectors
# ----------------------------------------------------------------------------------


def cooccurrence_counts(token_ids: torch.Tensor, vocab_size: int, window: int) -> torch.Tensor:
    """How often each word appears within `window` positions of each other word.

    token_ids: LongTensor [n] of ids in [0, vocab_size). Returns float32 counts [V, V]:
    counts[a, b] = number of (i, j) with ids[i] = a, ids[j] = b and 1 <= |i - j| <= window.
    A position is never its own neighbour, and every pair is seen from both sides, so the
    matrix is symmetric (a word next to itself, "very very", still lands on the diagonal).
    """
    if not isinstance(token_ids, torch.Tensor) or token_ids.dim() != 1:
        raise ValueError(f"token_ids must be a 1-D tensor of ids, got {_shape_of(token_ids)}")
    if token_ids.is_floating_point() or token_ids.dtype == torch.bool:
        raise TypeError(f"token_ids must hold integer ids, got dtype {token_ids.dtype}")
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive int (neighbours on each side), got {window!r}")
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    if len(token_ids) and (token_ids.min() < 0 or token_ids.max() >= vocab_size):
        raise ValueError(
            f"token ids must lie in [0, vocab_size={vocab_size}); got min {token_ids.min().item()}, "
            f"max {token_ids.max().item()}"
        )
    ids = token_ids.long()
    counts = torch.zeros(vocab_size, vocab_size)  # [V, V]
    for offset in range(1, min(window, len(ids) - 1) + 1):
        left, right = ids[:-offset], ids[offset:]  # the pairs (i, i + offset)  [n - offset]
        ones = torch.ones(len(left))
        # accumulate=True: a pair that occurs many times must add up, not overwrite.
        counts.index_put_((left, right), ones, accumulate=True)
        counts.index_put_((right, left), ones, accumulate=True)
    return counts


def ppmi(counts: torch.Tensor) -> torch.Tensor:
    """Positive pointwise mutual information of a [V, C] word-by-context count matrix.

        PMI(w, c) = log( P(w, c) / (P(w) P(c)) ) = log( n(w, c) * N / (n(w) n(c)) )
        PPMI = max(PMI, 0), and 0 where n(w, c) = 0

    with N the total count, n(w) the row sums and n(c) the column sums. Negative PMI
    ("seen together less than chance") is unreliable for rare words, so it is clipped;
    log(0) = -inf and empty rows (0/0) both become 0. Keeps the input's dtype.
    """
    if not isinstance(counts, torch.Tensor) or counts.dim() != 2:
        raise ValueError(f"counts must be a 2-D tensor [words, contexts], got {_shape_of(counts)}")
    if not counts.is_floating_point():
        raise TypeError(f"counts must be floating point (e.g. counts.float()), got {counts.dtype}")
    if (counts < 0).any():
        raise ValueError("counts must be non-negative")
    total = counts.sum()  # N
    row = counts.sum(dim=1, keepdim=True)  # n(w)  [V, 1]
    col = counts.sum(dim=0, keepdim=True)  # n(c)  [1, C]
    seen = counts > 0
    # Where the pair was never seen the ratio is set to 1 (log 1 = 0) *before* the log, so
    # neither -inf nor the 0/0 of an empty row ever appears.
    ratio = torch.where(seen, counts * total / (row * col).clamp_min(torch.finfo(counts.dtype).tiny), 1.0)
    return torch.log(ratio).clamp_min(0.0)  # [V, C]


def svd_vectors(matrix: torch.Tensor, dim: int, power: float = 0.5) -> torch.Tensor:
    """Dense `dim`-dimensional rows from a truncated SVD: matrix ~ U S V^T, rows U_k S_k^power.

    power=1 keeps the exact low-rank factor; 0.5 (the usual choice for PPMI) shrinks the
    gap between the first, dominant direction and the rest. SVD fixes each singular
    vector only up to sign; we flip each column so its largest entry is positive, which
    makes the vectors the same on every machine.
    """
    if matrix.dim() != 2:
        raise ValueError(f"matrix must be 2-D, got shape {list(matrix.shape)}")
    if not 1 <= dim <= min(matrix.shape):
        raise ValueError(
            f"dim must be in [1, {min(matrix.shape)}] for a matrix of shape {list(matrix.shape)}, got {dim}"
        )
    u, s, _ = torch.linalg.svd(matrix, full_matrices=False)  # u [V, r], s [r]
    u, s = u[:, :dim], s[:dim]  # [V, dim], [dim]
    biggest = u.gather(0, u.abs().argmax(dim=0, keepdim=True))  # [1, dim]
    u = u * torch.where(biggest < 0, -1.0, 1.0).to(u.dtype)
    return u * s.pow(power)  # [V, dim]


def cosine_similarity(a: torch.Tensor, b: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Cosine of the angle between every row of a and every row of b.

    a: [..., N, d], b: [..., M, d] -> [..., N, M], entries in [-1, 1]. A zero vector has
    no direction: its similarity to everything is 0 (its norm is clamped to eps).
    """
    if a.dim() < 2 or b.dim() < 2:
        raise ValueError(f"a and b must be [..., rows, d]; got shapes {list(a.shape)} and {list(b.shape)}")
    if a.shape[-1] != b.shape[-1]:
        raise ValueError(f"a and b must have the same vector size d, got {a.shape[-1]} and {b.shape[-1]}")
    a_unit = a / a.norm(dim=-1, keepdim=True).clamp_min(eps)  # [..., N, d]
    b_unit = b / b.norm(dim=-1, keepdim=True).clamp_min(eps)  # [..., M, d]
    return a_unit @ b_unit.transpose(-2, -1)  # [..., N, M]


# ----------------------------------------------------------------------------------
# A whole static embedding, and questions to ask it
# ----------------------------------------------------------------------------------


@dataclasses.dataclass
class StaticVectors:
    """One vector per vocabulary word: `vectors[vocab.id(word)]`."""

    vocab: Vocabulary
    vectors: torch.Tensor  # [V, dim]

    def __getitem__(self, word: str) -> torch.Tensor:
        return self.vectors[self.vocab.id(word)]

    def similarity(self, word: str, other: str) -> float:
        return cosine_similarity(self[word][None], self[other][None]).item()

    def nearest(self, word: str, k: int = 5) -> list[tuple[str, float]]:
        """The k words whose vectors have the highest cosine with `word`'s (itself excluded)."""
        return nearest_neighbours(self.vectors, self.vocab, word, k)


def nearest_neighbours(
    vectors: torch.Tensor, vocab: Vocabulary, word: str, k: int = 5, similarity=cosine_similarity
) -> list[tuple[str, float]]:
    """The k nearest words to `word` by cosine similarity, as (word, cosine) pairs.

    `similarity(a [N, d], b [M, d]) -> [N, M]` is the cosine to use (a chapter passes the
    learner's own `cosine_similarity` here once it passes its check).
    """
    sims = similarity(vectors[vocab.id(word)][None], vectors)[0].clone()  # [V]
    sims[vocab.id(word)] = -float("inf")  # a word is trivially its own nearest neighbour
    best = sims.topk(min(k, len(vocab) - 1))
    return [(vocab.words[i], round(s, 4)) for s, i in zip(best.values.tolist(), best.indices.tolist())]


def fit_static_vectors(
    sentences: Sequence[Sequence[str]],
    dim: int = 50,
    window: int = 2,
    max_size: int | None = None,
    min_count: int = 1,
    counts_fn=cooccurrence_counts,
    ppmi_fn=ppmi,
) -> StaticVectors:
    """Tokenised sentences -> vocabulary -> summed co-occurrence counts -> PPMI -> SVD.

    Counting sentence by sentence keeps the window from reaching across a sentence end.
    `counts_fn` and `ppmi_fn` default to this module's; a chapter passes the learner's own
    functions, so the vectors it studies are built by the code the learner wrote.
    """
    vocab = build_vocabulary((t for s in sentences for t in s), max_size=max_size, min_count=min_count)
    counts = torch.zeros(len(vocab), len(vocab))  # [V, V]
    for sentence in sentences:
        ids = vocab.encode(sentence)
        if len(ids) > 1:
            counts += counts_fn(ids, len(vocab), window)
    return StaticVectors(vocab, svd_vectors(ppmi_fn(counts), min(dim, len(vocab))))


# ----------------------------------------------------------------------------------
# From static to contextual
# ----------------------------------------------------------------------------------


def alignment(decoder_states: torch.Tensor, encoder_states: torch.Tensor):
    """Dot-product attention of decoder states over encoder states (Luong-style "dot" score).

    decoder_states: [..., T, d] (queries), encoder_states: [..., S, d] (keys and values).
    scores = decoder_states @ encoder_states^T (no 1/sqrt(d) here), weights = softmax over
    the S source positions, context = weights @ encoder_states.
    Returns (context [..., T, d], weights [..., T, S]).
    """
    # The same computation as the Transformer's attention, with the scale switched off.
    return scaled_dot_product_attention(decoder_states, encoder_states, encoder_states, scale=1.0)


def contextual_vectors(vectors: torch.Tensor, sharpness: float = 5.0) -> torch.Tensor:
    """Give each word of a sentence a context-dependent vector: an attention-weighted
    average of the sentence's static vectors.

        x'_i = sum_j a_ij x_j,   a_ij = softmax_j( sharpness * cos(x_i, x_j) )

    vectors: [..., L, d] static vectors of one sentence. Every word scores every word by
    cosine similarity times `sharpness`, the scores go through softmax over the sentence,
    and the word's new vector is the weighted mean of the sentence's *static* vectors (the
    cosines only choose the weights). Same word, different sentence, different weights: a
    different vector. A zero vector has cosine 0 with everything. Returns [..., L, d].
    """
    if vectors.dim() < 2:
        raise ValueError(f"vectors must be [..., L, d] (one row per word), got shape {list(vectors.shape)}")
    unit = vectors / vectors.norm(dim=-1, keepdim=True).clamp_min(1e-8)  # [..., L, d]
    mixed, _ = scaled_dot_product_attention(unit, unit, vectors, scale=sharpness)
    return mixed  # [..., L, d]


def _shape_of(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)}"
    return type(value).__name__
