"""The bundled text: Python's help prose, the tokenizer, and the generated apple corpus."""

import pytest

from transformer_lib.corpus import (
    APPLE_COMPANY_SENTENCE,
    APPLE_FRUIT_SENTENCE,
    COMPANIES,
    FRUITS,
    apple_corpus,
    pydoc_paragraphs,
    pydoc_tokens,
    tokenize,
)


def test_tokenize_lowercases_and_keeps_only_words():
    assert tokenize("The 'if' statement (PEP 8): x = 3.14!") == ["the", "if", "statement", "pep", "x"]
    assert tokenize("Don\u2019t panic, don't") == ["don't", "panic", "don't"]  # curly apostrophe normalised
    assert tokenize("") == []


def test_tokenize_rejects_non_text():
    with pytest.raises(TypeError, match="expects a str"):
        tokenize(["a", "list"])


def test_pydoc_prose_is_present_deterministic_and_free_of_code():
    paragraphs = pydoc_paragraphs()
    assert len(paragraphs) > 500
    assert paragraphs == pydoc_paragraphs()
    assert not any("::=" in p or ">>>" in p for p in paragraphs)
    assert all("\n" not in p and len(p.split()) >= 6 for p in paragraphs)


def test_pydoc_tokens_are_a_real_english_text():
    tokens = pydoc_tokens()
    assert 30_000 < len(tokens) < 200_000
    vocabulary = set(tokens)
    for word in ["the", "exception", "class", "true", "false", "list", "loop"]:
        assert word in vocabulary
    assert all(t == t.lower() and t[0].isalpha() for t in tokens)


def test_apple_corpus_is_deterministic_and_seeded():
    assert apple_corpus() == apple_corpus()
    assert apple_corpus(seed=1) != apple_corpus(seed=0)
    assert len(apple_corpus(n_sentences=10)) == 10


def test_apple_has_both_senses_and_other_words_keep_to_one():
    sentences = [tokenize(s) for s in apple_corpus()]
    fruit_side, company_side = sentences[0::2], sentences[1::2]
    assert sum("apple" in s for s in fruit_side) > 50
    assert sum("apple" in s for s in company_side) > 50
    fruit_only = set(FRUITS) - {"apple"}
    company_only = set(COMPANIES) - {"apple"}
    assert not any(fruit_only & set(s) for s in company_side)
    assert not any(company_only & set(s) for s in fruit_side)
    assert all(fruit_only & set(s) or "apple" in s for s in fruit_side)


def test_the_two_test_sentences_use_only_corpus_words():
    vocabulary = {t for s in apple_corpus() for t in tokenize(s)}
    for sentence in [APPLE_FRUIT_SENTENCE, APPLE_COMPANY_SENTENCE]:
        assert "apple" in tokenize(sentence)
        assert set(tokenize(sentence)) <= vocabulary
        assert sentence not in apple_corpus()  # unseen sentences, made of seen words


@pytest.mark.parametrize("kwargs,message", [({"n_sentences": 1}, "at least 2"), ({"apple_share": 0.0}, "apple_share")])
def test_apple_corpus_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        apple_corpus(**kwargs)
