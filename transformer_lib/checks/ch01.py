"""Checkers for chapter 01, from static to contextual vectors: co-occurrence counts, PPMI,
cosine similarity, contextual vectors (attention over a sentence's static vectors) and
dot-product alignment (the first attention between two sentences).

Each checker is data: deterministic cases, the library's reference, and a catalogue of
the wrong answers learners tend to write, so a failure can say what went wrong.
"""

import torch

from ..static_vectors import alignment, contextual_vectors, cooccurrence_counts, cosine_similarity, ppmi
from . import properties
from .core import Case, Checker, Mistake, Property


def _tensors(expected, actual):
    """Both outputs as float64 tensors of the same shape, or (None, None)."""
    if not (isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor)):
        return None, None
    if actual.shape != expected.shape or not actual.is_floating_point():
        return None, None
    return expected.double(), actual.double()


def _not_symmetric(case, expected, actual):
    e, a = _tensors(expected, actual)
    return e is not None and not torch.allclose(a, a.T)


def _negative_entries(case, expected, actual):
    e, a = _tensors(expected, actual)
    return e is not None and bool((a < -1e-6).any())


def _outside_minus_one_one(case, expected, actual):
    e, a = _tensors(expected, actual)
    return e is not None and bool((a.abs() > 1 + 1e-4).any())

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
    properties=[
        Property(
            "a matrix that is not symmetric (counts[a, b] != counts[b, a])",
            "Every pair is seen from both sides: when b is a neighbour of a, add 1 to counts[a, b] and, "
            "from the other position, to counts[b, a].",
            _not_symmetric,
        ),
    ],
)

# ----------------------------------------------------------------------------------
# ppmi(counts) -> [V, C]
# ----------------------------------------------------------------------------------

# cooccurrence_counts([0, 1, 2, 1, 0, 2, 2], 3, window=2), written out: a case may not call another
# exercise's reference, since the grader runs the whole chapter with all of them hidden
# (tests/test_checkers.py keeps the two equal).
TINY_TEXT_COUNTS = torch.tensor([[0.0, 2.0, 4.0],
                                 [2.0, 2.0, 3.0],
                                 [4.0, 3.0, 2.0]])


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
        Case("counts of a tiny text", (TINY_TEXT_COUNTS.clone(),)),
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
    properties=[
        properties.not_finite_on_large_inputs(
            "Unseen pairs (count 0) and empty rows must give 0, not log(0) = -inf or 0/0 = NaN: replace the ratio "
            "by 1 where counts == 0 before the log."
        ),
        Property(
            "negative values (PPMI is never below 0)",
            "Clip at zero: .clamp_min(0).",
            _negative_entries,
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
    properties=[
        Property(
            "values outside [-1, 1], which no cosine can take",
            "Divide each row of a and of b by its own length, a.norm(dim=-1, keepdim=True), before the product.",
            _outside_minus_one_one,
        ),
        properties.not_finite_on_large_inputs(
            "A zero vector has length 0: clamp the norms with .clamp_min(1e-8) before dividing."
        ),
    ],
    atol=1e-5,
)

# ----------------------------------------------------------------------------------
# contextual_vectors(vectors, sharpness) -> [..., L, d]
# ----------------------------------------------------------------------------------


def _contextual_cases():
    g = torch.Generator().manual_seed(105)
    r = lambda *shape, dtype=torch.float32: torch.randn(*shape, generator=g, dtype=dtype)  # noqa: E731
    repeated = r(1, 4).repeat(3, 1)  # one word three times: every mix of it is itself
    return [
        Case("a sentence of 4 words, sharpness 2", (r(4, 3), 2.0)),
        Case("5 words, sharpness 5", (r(5, 6), 5.0)),
        Case("batch of 2 sentences [2, 3, 4]", (r(2, 3, 4), 2.0)),
        Case("the same word three times", (repeated, 3.0)),
        Case("very sharp (sharpness 120: a stable softmax is needed)", (r(4, 5), 120.0)),
        Case("one word alone", (r(1, 5), 2.0), hidden=True),
        Case("float64, sharpness 1", (r(6, 4, dtype=torch.float64), 1.0), hidden=True),
        Case("batched float64 [3, 2, 5, 3]", (r(3, 2, 5, 3, dtype=torch.float64), 4.0), hidden=True),
        Case("long vectors of different lengths", (r(7, 8) * torch.rand(7, 1, generator=g) * 20, 2.5), hidden=True),
        Case("very sharp float64", (r(3, 4, dtype=torch.float64), 800.0), hidden=True),
    ]


def _ctx_unit(vectors):
    return vectors / vectors.norm(dim=-1, keepdim=True).clamp_min(1e-8)


def _ctx_softmax_wrong_dim(vectors, sharpness=5.0):
    unit = _ctx_unit(vectors)
    weights = torch.softmax(sharpness * unit @ unit.transpose(-2, -1), dim=-2)  # columns sum to 1, not rows
    return weights @ vectors


def _ctx_dot_not_cosine(vectors, sharpness=5.0):
    weights = torch.softmax(sharpness * vectors @ vectors.transpose(-2, -1), dim=-1)
    return weights @ vectors


def _ctx_mixes_unit_vectors(vectors, sharpness=5.0):
    unit = _ctx_unit(vectors)
    weights = torch.softmax(sharpness * unit @ unit.transpose(-2, -1), dim=-1)
    return weights @ unit


def _ctx_no_sharpness(vectors, sharpness=5.0):
    unit = _ctx_unit(vectors)
    weights = torch.softmax(unit @ unit.transpose(-2, -1), dim=-1)
    return weights @ vectors


def _ctx_scores_as_weights(vectors, sharpness=5.0):
    unit = _ctx_unit(vectors)
    return (sharpness * unit @ unit.transpose(-2, -1)) @ vectors


def _ctx_unstable_softmax(vectors, sharpness=5.0):
    unit = _ctx_unit(vectors)
    exp = (sharpness * unit @ unit.transpose(-2, -1)).exp()  # overflows once a score passes ~88 in float32
    return (exp / exp.sum(dim=-1, keepdim=True)) @ vectors


def _weights_do_not_sum_to_one(case, expected, actual):
    """On a sentence of one repeated word every weighted *average* returns the word itself;
    a mix whose weights do not sum to 1 scales it instead."""
    e, a = _tensors(expected, actual)
    vectors = case.args[0]
    if e is None or vectors.shape[-2] < 2:
        return False
    if not torch.allclose(vectors, vectors[..., :1, :].expand_as(vectors)):
        return False
    return not torch.allclose(a, e, rtol=1e-4, atol=1e-5)


check_contextual_vectors = Checker(
    name="contextual_vectors",
    reference=contextual_vectors,
    make_cases=_contextual_cases,
    mistakes=[
        Mistake(
            "takes the softmax over dim=-2, so each column of the weights sums to 1 instead of each word's row",
            "Each word i spreads its attention over the sentence: softmax(scores, dim=-1), then weights @ vectors.",
            _ctx_softmax_wrong_dim,
        ),
        Mistake(
            "scores with plain dot products x_i . x_j instead of cosines (long vectors then dominate)",
            "Normalise the rows first (vectors / vectors.norm(dim=-1, keepdim=True), or use cosine_similarity_impl), "
            "then multiply the cosines by sharpness.",
            _ctx_dot_not_cosine,
        ),
        Mistake(
            "mixes the normalised (unit-length) vectors instead of the static vectors themselves",
            "The cosines only choose the weights; the average is of the original vectors: weights @ vectors.",
            _ctx_mixes_unit_vectors,
        ),
        Mistake(
            "ignores sharpness (the scores are the bare cosines)",
            "Multiply the cosines by sharpness before the softmax: larger sharpness, weights closer to the most "
            "similar words.",
            _ctx_no_sharpness,
        ),
        Mistake(
            "mixes with the scores themselves, without a softmax, so the weights are not positive and do not sum to 1",
            "Turn the scores into weights with torch.softmax(scores, dim=-1) before the weighted sum.",
            _ctx_scores_as_weights,
        ),
        Mistake(
            "computes softmax as exp(s) / sum(exp(s)) without subtracting the maximum: with a large sharpness exp "
            "overflows to inf and the result is NaN",
            "Subtract each row's maximum score before exp (it cancels in the ratio), or use torch.softmax.",
            _ctx_unstable_softmax,
        ),
    ],
    properties=[
        Property(
            "a weighted sum whose weights do not sum to 1 (a sentence of one repeated word does not come back "
            "unchanged)",
            "Make the weights a softmax over the sentence, dim=-1: positive, and each row sums to 1.",
            _weights_do_not_sum_to_one,
        ),
        properties.not_finite_on_large_inputs(
            "A large sharpness makes exp overflow: subtract each row's maximum score before exp, or use torch.softmax."
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
    properties=[
        properties.rows_do_not_sum_to_one(
            dim=-1, what="the source positions",
            fix="Take the softmax over the source positions, dim=-1: each decoder state's weights sum to 1.",
            select=lambda out: out[1] if isinstance(out, (tuple, list)) and len(out) == 2 else None,
        ),
        properties.not_finite_on_large_inputs(
            "Subtract each row's maximum score before exp, or use torch.softmax.",
            select=lambda out: out[1] if isinstance(out, (tuple, list)) and len(out) == 2 else None,
        ),
    ],
    atol=1e-5,
)

CHECKERS = [check_cooccurrence_counts, check_ppmi, check_cosine_similarity, check_contextual_vectors, check_alignment]
