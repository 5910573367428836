"""Checkers for chapter 01, from static to contextual vectors: co-occurrence counts, PPMI,
cosine similarity, and dot-product alignment (the first attention).

Each checker is data: deterministic cases, the library's reference, and a catalogue of
the wrong answers learners tend to write, so a failure can say what went wrong.
"""

import torch

from ..static_vectors import alignment, cooccurrence_counts, cosine_similarity, ppmi
from .core import Case, Checker, Mistake

# ----------------------------------------------------------------------------------
# cooccurrence_counts(token_ids, vocab_size, window) -> [V, V]
# ----------------------------------------------------------------------------------


def _cooccurrence_cases():
    g = torch.Generator().manual_seed(101)
    ids = lambda *values: torch.tensor(values, dtype=torch.long)  # noqa: E731
    return [
        Case("tiny text, window 1", (ids(0, 1, 2, 1, 0), 3, 1)),
        Case("repeats, window 2, an unused word", (ids(0, 0, 1, 2, 0, 1, 1), 4, 2)),
        Case("window longer than the text", (ids(2, 0, 1), 3, 5)),
        Case("a single token", (ids(1), 2, 2)),
        Case("random text, window 3", (torch.randint(0, 6, (30,), generator=g), 6, 3)),
        Case("random text, window 2", (torch.randint(0, 8, (50,), generator=g), 8, 2), hidden=True),
        Case("random text, window 4", (torch.randint(0, 5, (40,), generator=g), 5, 4), hidden=True),
        Case("one word repeated", (ids(1, 1, 1, 1), 2, 2), hidden=True),
        Case("large vocabulary, few words used", (torch.randint(0, 20, (12,), generator=g), 20, 1), hidden=True),
    ]


def _counts_one_side(token_ids, vocab_size, window):
    counts = torch.zeros(vocab_size, vocab_size)
    for i in range(len(token_ids)):
        for j in range(i + 1, min(i + window + 1, len(token_ids))):
            counts[token_ids[i], token_ids[j]] += 1
    return counts


def _counts_self_included(token_ids, vocab_size, window):
    counts = torch.zeros(vocab_size, vocab_size)
    for i in range(len(token_ids)):
        for j in range(max(0, i - window), min(i + window + 1, len(token_ids))):
            counts[token_ids[i], token_ids[j]] += 1
    return counts


def _counts_window_short(token_ids, vocab_size, window):
    counts = torch.zeros(vocab_size, vocab_size)
    for i in range(len(token_ids)):
        for j in range(max(0, i - window + 1), min(i + window, len(token_ids))):
            if j != i:
                counts[token_ids[i], token_ids[j]] += 1
    return counts


def _counts_no_accumulate(token_ids, vocab_size, window):
    counts = torch.zeros(vocab_size, vocab_size)
    for offset in range(1, window + 1):
        if offset >= len(token_ids):
            break
        left, right = token_ids[:-offset], token_ids[offset:]
        counts[left, right] += 1  # repeated (left, right) pairs are written once, not added up
        counts[right, left] += 1
    return counts


check_cooccurrence_counts = Checker(
    name="cooccurrence_counts",
    reference=cooccurrence_counts,
    make_cases=_cooccurrence_cases,
    mistakes=[
        Mistake(
            "counts only the neighbours on one side (the words after each word), so the matrix is not symmetric",
            "Count the neighbours on both sides: every j with 1 <= |i - j| <= window; then counts equals counts.T.",
            _counts_one_side,
        ),
        Mistake(
            "counts each word as its own neighbour (the loop over j includes j == i), inflating the diagonal",
            "Skip j == i: only positions at distance 1 to window are neighbours.",
            _counts_self_included,
        ),
        Mistake(
            "looks only window - 1 positions away (an off-by-one in the range of j)",
            "Neighbours are at distances 1, 2, ..., window inclusive: range(i - window, i + window + 1) minus i itself.",
            _counts_window_short,
        ),
        Mistake(
            "adds 1 with `counts[a, b] += 1` on index tensors: a pair that repeats is counted once, not added up",
            "Indexed `+=` does not accumulate duplicate indices. Use counts.index_put_((a, b), ones, accumulate=True), "
            "or a plain Python loop over positions.",
            _counts_no_accumulate,
        ),
    ],
)

# ----------------------------------------------------------------------------------
# ppmi(counts) -> [V, C]
# ----------------------------------------------------------------------------------


def _ppmi_cases():
    g = torch.Generator().manual_seed(102)

    def random_counts(rows, cols, high, dtype=torch.float32, symmetric=False):
        counts = torch.randint(0, high, (rows, cols), generator=g).to(dtype)
        counts = counts * (torch.rand(rows, cols, generator=g) < 0.7)  # some pairs never seen
        return counts + counts.T if symmetric else counts

    with_empty = random_counts(5, 5, 6, symmetric=True)
    with_empty[3, :] = 0
    with_empty[:, 3] = 0
    hidden_empty = random_counts(6, 6, 9)
    hidden_empty[0, :] = 0
    hidden_empty[:, 4] = 0
    return [
        Case("counts of a tiny text", (cooccurrence_counts(torch.tensor([0, 1, 2, 1, 0, 2, 2]), 3, 2),)),
        Case("an unused word (empty row and column)", (with_empty,)),
        Case("non-symmetric counts (words x contexts)", (random_counts(4, 4, 8),)),
        Case("float64 counts", (random_counts(5, 5, 20, dtype=torch.float64, symmetric=True),)),
        Case("random symmetric counts", (random_counts(7, 7, 10, symmetric=True),), hidden=True),
        Case("non-symmetric, empty row and column", (hidden_empty,), hidden=True),
        Case("large float64 counts", (random_counts(6, 6, 1000, dtype=torch.float64),), hidden=True),
        Case("all counts equal (PMI 0 everywhere)", (torch.full((3, 3), 4.0),), hidden=True),
    ]


def _pmi_ratio(counts):
    total = counts.sum()
    return counts * total / (counts.sum(dim=1, keepdim=True) * counts.sum(dim=0, keepdim=True))


def _ppmi_negative_kept(counts):
    return torch.where(counts > 0, torch.where(counts > 0, _pmi_ratio(counts), 1.0).log(), 0.0)


def _ppmi_neg_inf(counts):
    return _pmi_ratio(counts).log()


def _ppmi_nan_empty_rows(counts):
    return _pmi_ratio(counts).log().clamp_min(0.0)


def _ppmi_no_keepdim(counts):
    total = counts.sum()
    row, col = counts.sum(dim=1), counts.sum(dim=0)  # [V] each: broadcast as a row, [1, V]
    ratio = torch.where(counts > 0, counts * total / (row * col).clamp_min(1e-30), 1.0)
    return ratio.log().clamp_min(0.0)


check_ppmi = Checker(
    name="ppmi",
    reference=ppmi,
    make_cases=_ppmi_cases,
    mistakes=[
        Mistake(
            "keeps the negative PMI values (no clipping at zero)",
            "PPMI is max(PMI, 0): finish with .clamp_min(0) (or torch.clamp(pmi, min=0)).",
            _ppmi_negative_kept,
        ),
        Mistake(
            "leaves log(0) = -inf where a pair was never seen (and keeps negative values)",
            "Pairs with count 0 must get PPMI 0: compute the log only where counts > 0 (torch.where), "
            "then clip at zero.",
            _ppmi_neg_inf,
        ),
        Mistake(
            "returns NaN for a word that never occurs (an empty row or column makes 0 / 0)",
            "Use torch.where(counts > 0, ratio, 1.0) before the log, so unseen pairs (and whole empty rows) give 0.",
            _ppmi_nan_empty_rows,
        ),
        Mistake(
            "takes the row sums without keepdim=True, so n(w) is broadcast along the wrong axis",
            "Use counts.sum(dim=1, keepdim=True) for n(w) [V, 1] and counts.sum(dim=0, keepdim=True) for n(c) [1, C].",
            _ppmi_no_keepdim,
        ),
    ],
    atol=1e-5,
)

# ----------------------------------------------------------------------------------
# cosine_similarity(a, b) -> [..., N, M]
# ----------------------------------------------------------------------------------


def _cosine_cases():
    g = torch.Generator().manual_seed(103)
    r = lambda *shape, dtype=torch.float32: torch.randn(*shape, generator=g, dtype=dtype)  # noqa: E731
    with_zero = r(3, 4)
    with_zero[1] = 0.0
    a = r(3, 5)
    hidden_zero = r(4, 6)
    hidden_zero[2] = 0.0
    return [
        Case("3 vectors vs 4 vectors", (r(3, 6), r(4, 6))),
        Case("a zero vector in a", (with_zero, r(2, 4))),
        Case("scaled copies (cosine ignores length)", (a, 7.0 * a)),
        Case("batched [2, 3, 5] vs [2, 4, 5]", (r(2, 3, 5), r(2, 4, 5))),
        Case("float64", (r(2, 3, dtype=torch.float64), r(5, 3, dtype=torch.float64))),
        Case("one vector vs many", (r(1, 8), r(6, 8)), hidden=True),
        Case("zero vectors on both sides", (hidden_zero, torch.cat([r(2, 6), torch.zeros(1, 6)])), hidden=True),
        Case("large values", (1e3 * r(4, 3), 1e3 * r(3, 3)), hidden=True),
        Case("batched float64", (r(3, 2, 4, dtype=torch.float64), r(3, 5, 4, dtype=torch.float64)), hidden=True),
    ]


def _cosine_plain_dot(a, b):
    return a @ b.transpose(-2, -1)


def _cosine_wrong_dim(a, b):
    a = a / a.norm(dim=-2, keepdim=True).clamp_min(1e-8)
    b = b / b.norm(dim=-2, keepdim=True).clamp_min(1e-8)
    return a @ b.transpose(-2, -1)


def _cosine_only_a(a, b):
    return (a / a.norm(dim=-1, keepdim=True).clamp_min(1e-8)) @ b.transpose(-2, -1)


def _cosine_zero_nan(a, b):
    return (a / a.norm(dim=-1, keepdim=True)) @ (b / b.norm(dim=-1, keepdim=True)).transpose(-2, -1)


check_cosine_similarity = Checker(
    name="cosine_similarity",
    reference=cosine_similarity,
    make_cases=_cosine_cases,
    mistakes=[
        Mistake(
            "returns the plain dot product a @ b^T (the vectors were not normalised)",
            "Divide every row of a and of b by its length first: a / a.norm(dim=-1, keepdim=True).",
            _cosine_plain_dot,
        ),
        Mistake(
            "normalises over the wrong dim (dim=-2, across the vectors instead of along each vector)",
            "Each vector is a row: take the norm along its features, a.norm(dim=-1, keepdim=True).",
            _cosine_wrong_dim,
        ),
        Mistake(
            "normalises a but not b",
            "Both sides need unit length: normalise the rows of b too.",
            _cosine_only_a,
        ),
        Mistake(
            "divides by a zero length for a zero vector, which gives NaN",
            "Clamp the norms before dividing: a.norm(dim=-1, keepdim=True).clamp_min(1e-8); a zero vector "
            "then has cosine 0 with everything.",
            _cosine_zero_nan,
        ),
    ],
    atol=1e-5,
)

# ----------------------------------------------------------------------------------
# alignment(decoder_states, encoder_states) -> (context [..., T, d], weights [..., T, S])
# ----------------------------------------------------------------------------------


def _alignment_cases():
    g = torch.Generator().manual_seed(104)
    r = lambda *shape, dtype=torch.float32: torch.randn(*shape, generator=g, dtype=dtype)  # noqa: E731
    return [
        Case("one decoder state, 5 encoder states", (r(1, 4), r(5, 4))),
        Case("3 decoder states, 5 encoder states", (r(3, 4), r(5, 4))),
        Case("batched [2, 3, 6] and [2, 4, 6]", (r(2, 3, 6), r(2, 4, 6))),
        Case("large scores (hundreds)", (10.0 * r(2, 4), 10.0 * r(3, 4))),
        Case("float64", (r(2, 3, dtype=torch.float64), r(4, 3, dtype=torch.float64))),
        Case("longer source", (r(4, 8), r(9, 8)), hidden=True),
        Case("batched float64", (r(3, 2, 5, dtype=torch.float64), r(3, 6, 5, dtype=torch.float64)), hidden=True),
        Case("large float64 scores", (40.0 * r(3, 4, dtype=torch.float64), 40.0 * r(5, 4, dtype=torch.float64)), hidden=True),
        Case("d = 1", (r(2, 1), r(3, 1)), hidden=True),
    ]


def _align_wrong_dim(decoder_states, encoder_states):
    scores = decoder_states @ encoder_states.transpose(-2, -1)
    weights = torch.softmax(scores, dim=-2)
    return weights @ encoder_states, weights


def _align_scores_as_weights(decoder_states, encoder_states):
    scores = decoder_states @ encoder_states.transpose(-2, -1)
    return scores @ encoder_states, torch.softmax(scores, dim=-1)


def _align_scaled(decoder_states, encoder_states):
    scores = decoder_states @ encoder_states.transpose(-2, -1) / decoder_states.shape[-1] ** 0.5
    weights = torch.softmax(scores, dim=-1)
    return weights @ encoder_states, weights


def _align_unstable_softmax(decoder_states, encoder_states):
    scores = decoder_states @ encoder_states.transpose(-2, -1)
    exp = scores.exp()  # overflows to inf once a score passes ~88 (float32) or ~709 (float64)
    weights = exp / exp.sum(dim=-1, keepdim=True)
    return weights @ encoder_states, weights


check_alignment = Checker(
    name="alignment",
    reference=alignment,
    make_cases=_alignment_cases,
    mistakes=[
        Mistake(
            "takes the softmax over the decoder positions (dim=-2) instead of over the source positions",
            "Each decoder state distributes its attention over the encoder states: softmax(scores, dim=-1), "
            "so every row of weights sums to 1.",
            _align_wrong_dim,
        ),
        Mistake(
            "computes the context from the raw scores instead of the softmax weights",
            "Mix the encoder states with the weights: context = weights @ encoder_states.",
            _align_scores_as_weights,
        ),
        Mistake(
            "divides the scores by sqrt(d) (that is the Transformer's scaled attention of chapter 02)",
            "This exercise uses the plain dot-product score: scores = decoder_states @ encoder_states^T, no scaling.",
            _align_scaled,
        ),
        Mistake(
            "computes softmax as exp(s) / sum(exp(s)) without subtracting the maximum: large scores overflow to "
            "inf and give NaN",
            "Subtract each row's maximum score before exp (it cancels in the ratio), or use torch.softmax.",
            _align_unstable_softmax,
        ),
    ],
    atol=1e-5,
)

CHECKERS = [check_cooccurrence_counts, check_ppmi, check_cosine_similarity, check_alignment]
