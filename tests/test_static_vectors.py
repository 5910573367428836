"""Static word vectors (vocabulary, counts, PPMI, SVD, cosine), the attention that makes them
contextual, and the chapter-01 checkers' acceptance of other correct answers."""

import math

import pytest
import torch
import torch.nn.functional as F

from transformer_lib.attention import scaled_dot_product_attention
from transformer_lib.corpus import APPLE_COMPANY_SENTENCE, APPLE_FRUIT_SENTENCE, apple_corpus, tokenize
from transformer_lib.static_vectors import (
    StaticVectors,
    Vocabulary,
    alignment,
    build_vocabulary,
    contextual_vectors,
    cooccurrence_counts,
    cosine_similarity,
    fit_static_vectors,
    nearest_neighbours,
    ppmi,
    svd_vectors,
)


def brute_force_counts(ids, vocab_size, window):
    counts = torch.zeros(vocab_size, vocab_size)
    for i in range(len(ids)):
        for j in range(len(ids)):
            if 1 <= abs(i - j) <= window:
                counts[ids[i], ids[j]] += 1
    return counts


# -- vocabulary ------------------------------------------------------------------------


def test_vocabulary_orders_by_frequency_then_alphabet():
    vocab = build_vocabulary("b a c b a b d".split())
    assert vocab.words == ["b", "a", "c", "d"] and vocab.counts == [3, 2, 1, 1]
    assert build_vocabulary("b a c b a b d".split(), max_size=2).words == ["b", "a"]
    assert build_vocabulary("b a c b a b d".split(), min_count=2).words == ["b", "a"]


def test_encode_drops_unknown_words_and_id_names_them():
    vocab = Vocabulary(["x", "y"], [2, 1])
    assert vocab.encode(["y", "unknown", "x"]).tolist() == [1, 0]
    assert vocab.encode([]).dtype == torch.long
    assert "x" in vocab and "z" not in vocab and len(vocab) == 2
    with pytest.raises(KeyError, match="'z' is not in the vocabulary"):
        vocab.id("z")


@pytest.mark.parametrize("kwargs", [{"min_count": 0}, {"max_size": 0}])
def test_vocabulary_rejects_bad_limits(kwargs):
    with pytest.raises(ValueError):
        build_vocabulary(["a"], **kwargs)


# -- co-occurrence counts ------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_counts_match_the_definition(seed):
    g = torch.Generator().manual_seed(seed)
    n, vocab_size, window = int(torch.randint(1, 25, (1,), generator=g)), 6, seed % 4 + 1
    ids = torch.randint(0, vocab_size, (n,), generator=g)
    counts = cooccurrence_counts(ids, vocab_size, window)
    assert counts.dtype == torch.float32
    assert torch.equal(counts, brute_force_counts(ids, vocab_size, window))
    assert torch.equal(counts, counts.T)
    expected_total = 2 * sum(max(n - d, 0) for d in range(1, window + 1))
    assert counts.sum().item() == expected_total


def test_a_position_is_not_its_own_neighbour_but_a_repeated_word_is():
    assert cooccurrence_counts(torch.tensor([0, 1, 2]), 3, 2).diagonal().sum() == 0
    assert cooccurrence_counts(torch.tensor([0, 0]), 1, 1).item() == 2  # "very very"


@pytest.mark.parametrize(
    "args,error,message",
    [
        ((torch.tensor([[0, 1]]), 2, 1), ValueError, "1-D"),
        ((torch.tensor([0.0, 1.0]), 2, 1), TypeError, "integer ids"),
        ((torch.tensor([0, 1]), 2, 0), ValueError, "window"),
        ((torch.tensor([0, 5]), 2, 1), ValueError, r"\[0, vocab_size=2\)"),
        ((torch.tensor([-1, 0]), 2, 1), ValueError, "vocab_size"),
    ],
)
def test_counts_reject_bad_input(args, error, message):
    with pytest.raises(error, match=message):
        cooccurrence_counts(*args)


# -- PPMI ---------------------------------------------------------------------------------


def test_ppmi_hand_computed_value():
    counts = torch.tensor([[2.0, 1.0], [1.0, 0.0]])  # N = 4, row sums [3, 1], column sums [3, 1]
    expected = torch.tensor([[max(math.log(2 * 4 / 9), 0), math.log(1 * 4 / 3)], [math.log(4 / 3), 0.0]])
    torch.testing.assert_close(ppmi(counts), expected)


def test_ppmi_is_zero_for_independent_words():
    counts = torch.outer(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4.0, 5.0, 6.0]))  # P(a,b) = P(a) P(b)
    torch.testing.assert_close(ppmi(counts), torch.zeros(3, 3), atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ppmi_properties(dtype):
    g = torch.Generator().manual_seed(0)
    counts = torch.randint(0, 5, (8, 8), generator=g).to(dtype)
    counts[2] = 0  # a word that never occurs
    result = ppmi(counts)
    assert result.dtype == dtype and result.shape == counts.shape
    assert torch.isfinite(result).all() and (result >= 0).all()
    assert (result[counts == 0] == 0).all()
    torch.testing.assert_close(ppmi(10 * counts), result)  # probabilities do not depend on the scale


def test_ppmi_of_nothing_is_zero():
    assert torch.equal(ppmi(torch.zeros(3, 3)), torch.zeros(3, 3))


@pytest.mark.parametrize(
    "counts,error", [(torch.ones(3), ValueError), (torch.ones(2, 2, dtype=torch.long), TypeError), (-torch.ones(2, 2), ValueError)]
)
def test_ppmi_rejects_bad_input(counts, error):
    with pytest.raises(error):
        ppmi(counts)


# -- SVD vectors and cosine ---------------------------------------------------------------


def test_svd_vectors_keep_the_geometry_and_a_fixed_sign():
    g = torch.Generator().manual_seed(1)
    m = torch.randn(6, 6, generator=g, dtype=torch.float64)
    m = m + m.T
    x = svd_vectors(m, 6, power=1.0)  # x x^T = U S^2 U^T = m m^T
    torch.testing.assert_close(x @ x.T, m @ m.T)
    biggest = x.gather(0, x.abs().argmax(dim=0, keepdim=True))
    assert (biggest > 0).all()
    assert svd_vectors(m, 3).shape == (6, 3)
    with pytest.raises(ValueError, match="dim"):
        svd_vectors(m, 7)


def test_cosine_matches_torch_and_ignores_length():
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(2, 4, 5, generator=g), torch.randn(2, 3, 5, generator=g)
    expected = F.cosine_similarity(a.unsqueeze(-2), b.unsqueeze(-3), dim=-1)
    torch.testing.assert_close(cosine_similarity(a, b), expected)
    torch.testing.assert_close(cosine_similarity(3 * a, 0.5 * b), expected)
    assert (cosine_similarity(a, b).abs() <= 1 + 1e-6).all()


def test_cosine_of_a_zero_vector_is_zero_not_nan():
    sims = cosine_similarity(torch.zeros(1, 3), torch.randn(4, 3))
    assert torch.equal(sims, torch.zeros(1, 4))


def test_cosine_rejects_mismatched_sizes():
    with pytest.raises(ValueError, match="same vector size"):
        cosine_similarity(torch.ones(2, 3), torch.ones(2, 4))
    with pytest.raises(ValueError, match=r"\[\.\.\., rows, d\]"):
        cosine_similarity(torch.ones(3), torch.ones(2, 3))


def test_nearest_neighbours_exclude_the_word_and_are_sorted():
    vocab = Vocabulary(["a", "b", "c", "d"], [1, 1, 1, 1])
    vectors = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [-1.0, 0.0]])
    result = nearest_neighbours(vectors, vocab, "a", k=3)
    assert [w for w, _ in result] == ["b", "c", "d"]
    sims = [s for _, s in result]
    assert sims == sorted(sims, reverse=True)


# -- the chapter's claims on the apple corpus ----------------------------------------------


@pytest.fixture(scope="module")
def apple_table() -> StaticVectors:
    return fit_static_vectors([tokenize(s) for s in apple_corpus()], dim=16, window=3)


def test_static_apple_mixes_both_senses(apple_table):
    fruit, company = ["banana", "peach", "cherry", "plum"], ["google", "samsung", "intel", "nokia"]
    fruit_sim = sum(apple_table.similarity("apple", w) for w in fruit) / 4
    company_sim = sum(apple_table.similarity("apple", w) for w in company) / 4
    assert 0.4 < fruit_sim < 0.8 and 0.4 < company_sim < 0.8
    assert apple_table.similarity("pear", "banana") > 0.8 > abs(apple_table.similarity("pear", "google")) + 0.6
    neighbours = {w for w, _ in apple_table.nearest("apple", 8)}
    assert neighbours & {"pear", "banana", "peach", "cherry", "plum", "grape", "mango"}
    assert neighbours & {"microsoft", "google", "samsung", "amazon", "intel", "nokia", "ibm"}


def test_contextual_apple_moves_toward_the_sense_of_its_sentence(apple_table):
    fruit = torch.stack([apple_table[w] for w in ["banana", "peach", "cherry", "plum"]]).mean(0)
    company = torch.stack([apple_table[w] for w in ["google", "samsung", "intel", "nokia"]]).mean(0)
    centres = torch.stack([fruit, company])
    static = cosine_similarity(apple_table["apple"][None], centres)[0]
    for sentence, sense in [(APPLE_FRUIT_SENTENCE, 0), (APPLE_COMPANY_SENTENCE, 1)]:
        words = tokenize(sentence)
        x = torch.stack([apple_table[w] for w in words])
        moved = cosine_similarity(contextual_vectors(x, sharpness=2.0)[words.index("apple")][None], centres)[0]
        assert moved[sense] > static[sense] and moved[1 - sense] < static[1 - sense]


# -- contextual vectors and alignment ------------------------------------------------------


def test_contextual_vectors_are_permutation_equivariant_and_context_dependent():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 4, generator=g)
    perm = torch.tensor([3, 0, 4, 1, 2])
    torch.testing.assert_close(contextual_vectors(x)[perm], contextual_vectors(x[perm]))
    other = torch.cat([x[:1], torch.randn(3, 4, generator=g)])  # the same first word, other neighbours
    assert not torch.allclose(contextual_vectors(x)[0], contextual_vectors(other)[0])
    torch.testing.assert_close(contextual_vectors(x[:1]), x[:1])  # alone, a word keeps its vector


def test_alignment_is_dot_product_attention():
    g = torch.Generator().manual_seed(4)
    dec, enc = torch.randn(2, 3, 4, generator=g), torch.randn(2, 5, 4, generator=g)
    context, weights = alignment(dec, enc)
    expected_weights = torch.softmax(dec @ enc.transpose(-2, -1), dim=-1)
    torch.testing.assert_close(weights, expected_weights)
    torch.testing.assert_close(context, expected_weights @ enc)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3))
    reference, _ = scaled_dot_product_attention(dec, enc, enc, scale=1.0)
    torch.testing.assert_close(context, reference)


def test_alignment_becomes_hard_when_one_source_matches_strongly():
    enc = torch.eye(4)
    _, weights = alignment(50.0 * enc[[2, 0]], enc)  # huge scores: a stable softmax must not overflow
    assert torch.isfinite(weights).all()
    torch.testing.assert_close(weights, enc[[2, 0]])


# -- the chapter-01 checkers accept other correct answers -------------------------------


def test_checkers_accept_other_correct_answers():
    from transformer_lib.checks.ch01 import (
        check_alignment,
        check_cooccurrence_counts,
        check_cosine_similarity,
        check_ppmi,
    )

    def loop_counts(ids, vocab_size, window):  # the double loop a newcomer writes
        counts = torch.zeros(vocab_size, vocab_size)
        for i in range(len(ids)):
            for j in range(max(0, i - window), min(len(ids), i + window + 1)):
                if j != i:
                    counts[ids[i], ids[j]] += 1
        return counts

    def log_sum_ppmi(counts):  # log differences instead of a ratio
        pmi = counts.log() + counts.sum().log() - counts.sum(1, keepdim=True).log() - counts.sum(0, keepdim=True).log()
        return torch.where(counts > 0, pmi, 0.0).clamp(min=0)

    def torch_cosine(a, b):
        return F.cosine_similarity(a.unsqueeze(-2), b.unsqueeze(-3), dim=-1)

    def softmax_alignment(dec, enc):
        weights = torch.softmax(dec @ enc.transpose(-2, -1), dim=-1)
        return weights @ enc, weights

    for checker, answer in [
        (check_cooccurrence_counts, loop_counts),
        (check_ppmi, log_sum_ppmi),
        (check_cosine_similarity, torch_cosine),
        (check_alignment, softmax_alignment),
    ]:
        verdict = checker.judge(checker.collect_outputs(answer, hidden=True), hidden=True)
        assert verdict.passed, verdict.message
