"""Chapter 01's newer exercise and checker behaviour: `contextual_vectors` (attention over a
sentence's static vectors), the properties that name combined mistakes, and the library
hooks that let the learner's own functions build the chapter's vectors."""

import pytest
import torch
import torch.nn.functional as F

from transformer_lib.attention import scaled_dot_product_attention
from transformer_lib.checks.ch01 import (
    check_alignment,
    check_contextual_vectors,
    check_cooccurrence_counts,
    check_cosine_similarity,
    check_ppmi,
)
from transformer_lib.corpus import apple_corpus, tokenize
from transformer_lib.static_vectors import (
    contextual_vectors,
    cooccurrence_counts,
    cosine_similarity,
    fit_static_vectors,
    nearest_neighbours,
    ppmi,
)


def judge(checker, fn):
    return checker.judge(checker.collect_outputs(fn, hidden=True), hidden=True)


# -- contextual_vectors: the reference and other correct answers -------------------------------


def test_contextual_vectors_worked_example():
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    e = torch.tensor(1.0).exp()
    near, far = e / (2 * e + 1), 1 / (2 * e + 1)  # softmax of [1, 0, 1]
    middle, side = e / (e + 2), 1 / (e + 2)  # softmax of [0, 1, 0]
    expected = torch.stack([torch.stack([2 * near, far]), torch.stack([2 * side, middle]), torch.stack([2 * near, far])])
    torch.testing.assert_close(contextual_vectors(x, sharpness=1.0), expected)


def test_contextual_vectors_is_a_weighted_average_of_the_static_vectors():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 3, generator=g)
    unit = x / x.norm(dim=-1, keepdim=True)
    weights = torch.softmax(2.0 * unit @ unit.transpose(-2, -1), dim=-1)
    torch.testing.assert_close(contextual_vectors(x, 2.0), weights @ x)
    repeated = x[0, :1].repeat(4, 1)
    torch.testing.assert_close(contextual_vectors(repeated, 3.0), repeated)  # the average of one word is itself
    with pytest.raises(ValueError, match=r"\[\.\.\., L, d\]"):
        contextual_vectors(torch.ones(3))


@pytest.mark.parametrize(
    "answer",
    [
        lambda x, s: torch.softmax(s * cosine_similarity(x, x), dim=-1) @ x,
        lambda x, s: torch.softmax(s * F.cosine_similarity(x.unsqueeze(-2), x.unsqueeze(-3), dim=-1), dim=-1) @ x,
        lambda x, s: scaled_dot_product_attention(F.normalize(x, dim=-1), F.normalize(x, dim=-1), x, scale=s)[0],
        lambda x, s: F.softmax(s * F.normalize(x, dim=-1) @ F.normalize(x, dim=-1).mT, dim=-1) @ x,
    ],
    ids=["with cosine_similarity", "F.cosine_similarity", "scaled_dot_product_attention", "F.normalize"],
)
def test_the_checker_accepts_other_correct_answers(answer):
    verdict = judge(check_contextual_vectors, answer)
    assert verdict.passed, verdict.message


def test_a_manual_stable_softmax_passes_and_an_unstable_one_is_named():
    def stable(x, s):
        unit = x / x.norm(dim=-1, keepdim=True)
        scores = s * unit @ unit.transpose(-2, -1)
        exp = (scores - scores.amax(dim=-1, keepdim=True)).exp()
        return exp / exp.sum(dim=-1, keepdim=True) @ x

    assert judge(check_contextual_vectors, stable).passed
    verdict = check_contextual_vectors.judge(
        check_contextual_vectors.collect_outputs(lambda x, s: _unstable(x, s)))
    assert not verdict.passed and "without subtracting the maximum" in verdict.message


def _unstable(x, s):
    unit = x / x.norm(dim=-1, keepdim=True)
    exp = (s * unit @ unit.transpose(-2, -1)).exp()
    return exp / exp.sum(dim=-1, keepdim=True) @ x


# -- properties name combined mistakes that no single catalogue entry matches -------------------


def test_contextual_weights_that_do_not_sum_to_one_are_named():
    def exp_without_normalising_and_unit(x, s):  # two mistakes at once
        unit = x / x.norm(dim=-1, keepdim=True)
        return (s * unit @ unit.transpose(-2, -1)).exp() @ unit

    verdict = judge(check_contextual_vectors, exp_without_normalising_and_unit)
    assert not verdict.passed and "weights do not sum to 1" in verdict.message


def test_alignment_rows_not_summing_to_one_are_named():
    def wrong_dim_and_scaled(dec, enc):  # softmax over the decoder positions and a 1/sqrt(d) scale
        weights = torch.softmax(dec @ enc.transpose(-2, -1) / dec.shape[-1] ** 0.5, dim=-2)
        return weights @ enc, weights

    verdict = judge(check_alignment, wrong_dim_and_scaled)
    assert not verdict.passed and "do not sum to 1 along the source positions" in verdict.message


def test_one_sided_counts_with_a_window_slip_are_named_not_symmetric():
    def one_side_short(ids, vocab_size, window):  # one side only, and window - 1
        counts = torch.zeros(vocab_size, vocab_size)
        for i in range(len(ids)):
            for j in range(i + 1, min(i + window, len(ids))):
                counts[ids[i], ids[j]] += 1
        return counts

    verdict = judge(check_cooccurrence_counts, one_side_short)
    assert not verdict.passed and "not symmetric" in verdict.message


def test_ppmi_negative_values_and_cosines_above_one_are_named():
    def pmi_with_a_zero_fill_in_log2(counts):  # no clipping, and log base 2
        ratio = counts * counts.sum() / (counts.sum(1, keepdim=True) * counts.sum(0, keepdim=True)).clamp_min(1e-30)
        return torch.where(counts > 0, torch.where(counts > 0, ratio, 1.0).log2(), 0.0)

    verdict = judge(check_ppmi, pmi_with_a_zero_fill_in_log2)
    assert not verdict.passed and "negative values" in verdict.message

    def half_normalised_transposed(a, b):  # b normalised along the wrong dim
        return (a / a.norm(dim=-1, keepdim=True).clamp_min(1e-8)) @ (b / b.norm(dim=-2, keepdim=True)).transpose(-2, -1)

    verdict = judge(check_cosine_similarity, half_normalised_transposed)
    assert not verdict.passed and "outside [-1, 1]" in verdict.message


# -- the learner's functions can build the chapter's vectors -------------------------------------


def test_fit_static_vectors_uses_the_functions_it_is_given():
    sentences = [tokenize(s) for s in apple_corpus(40)]
    calls = {"counts": 0, "ppmi": 0}

    def counting(*args):
        calls["counts"] += 1
        return cooccurrence_counts(*args)

    def association(counts):
        calls["ppmi"] += 1
        return ppmi(counts)

    table = fit_static_vectors(sentences, dim=8, window=2, counts_fn=counting, ppmi_fn=association)
    assert calls["counts"] == len(sentences) and calls["ppmi"] == 1
    torch.testing.assert_close(table.vectors, fit_static_vectors(sentences, dim=8, window=2).vectors)


def test_nearest_neighbours_accepts_a_similarity_and_leaves_its_output_alone():
    table = fit_static_vectors([tokenize(s) for s in apple_corpus(60)], dim=8, window=2)
    seen = []

    def similarity(a, b):
        out = cosine_similarity(a, b)
        seen.append(out)
        return out

    assert nearest_neighbours(table.vectors, table.vocab, "pear", 3, similarity=similarity) == table.nearest("pear", 3)
    assert torch.isfinite(seen[0]).all(), "the word's own entry must be excluded on a copy"
