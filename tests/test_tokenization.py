"""The readable BPE trainer makes exactly the merges Hugging Face tokenizers makes, and round-trips text;
the WordPiece encoder cuts words exactly as tokenizers' WordPiece model does."""

import json

import pytest

from transformer_lib import corpus
from transformer_lib.tokenization import (
    PRE_TOKENIZE_PATTERN,
    decode,
    embedding_lookup,
    encode,
    encode_word,
    merge_pair,
    oov_rate,
    pair_counts,
    pre_tokenize,
    tokens_to_ids,
    train_bpe,
    train_bpe_with_tokenizers,
    train_byte_level_bpe,
    vocabulary_from_merges,
    word_counts,
    word_vocabulary,
    wordpiece_encode,
)

tokenizers = pytest.importorskip("tokenizers")

N_MERGES = 400


def hf_bpe(texts, n_merges, alphabet, pre_tokenizer=None):
    """tokenizers' BpeTrainer, set up like train_bpe (the library's helper), checked here
    against a setup written out by hand."""
    return train_bpe_with_tokenizers(texts, n_merges, alphabet, pre_tokenizer)


def test_the_library_helper_sets_up_bpe_trainer_like_a_hand_written_one():
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    text = corpus.char_splits()[0][:20_000]
    alphabet = sorted(set(text))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(PRE_TOKENIZE_PATTERN), behavior="isolated")
    trainer = trainers.BpeTrainer(vocab_size=len(alphabet) + 60, min_frequency=0, show_progress=False,
                                  initial_alphabet=alphabet, special_tokens=[])
    tok.train_from_iterator([text], trainer)
    model = json.loads(tok.to_str())["model"]
    _, merges, vocab = train_bpe_with_tokenizers([text], 60, alphabet)
    assert merges == [tuple(m) for m in model["merges"]]
    assert vocab == sorted(model["vocab"], key=model["vocab"].get)


@pytest.fixture(scope="module")
def trained():
    train, val = corpus.char_splits()
    alphabet = set(train) | set(val)
    ours = train_bpe(train, N_MERGES, alphabet=alphabet)
    theirs = hf_bpe([train], N_MERGES, alphabet)
    return train, val, ours, theirs


# ---------------------------------------------------------------------------------------
# The pieces
# ---------------------------------------------------------------------------------------

def test_pre_tokenize_keeps_every_character_exactly_once():
    text = 'The "if" statement:\n  x = 3.14  # a comment\u2019s end \u82f9\u679c!'
    words = pre_tokenize(text)
    assert "".join(words) == text
    assert words[:4] == ["The", ' "', "if", '"']
    assert " statement" in words and "\n  " in words


def test_pair_counts_weights_each_word_by_its_count_and_overlaps():
    counts = pair_counts({("l", "o", "w"): 5, ("l", "o", "t"): 2, ("a", "a", "a"): 1})
    assert counts == {("l", "o"): 7, ("o", "w"): 5, ("o", "t"): 2, ("a", "a"): 2}
    assert pair_counts({"low": 3}) == pair_counts({("l", "o", "w"): 3})  # a str is read per character


def test_merge_pair_is_left_to_right_and_non_overlapping():
    assert merge_pair(("a", "a", "a"), ("a", "a")) == ("aa", "a")
    assert merge_pair(("a", "a", "a", "a"), ("a", "a")) == ("aa", "aa")
    assert merge_pair(("l", "o", "w", "l", "o"), ("l", "o")) == ("lo", "w", "lo")
    assert merge_pair(("l", "o"), ("o", "x")) == ("l", "o")
    assert merge_pair((), ("a", "b")) == ()


def test_the_classic_example():
    # Sennrich et al.'s toy vocabulary: "low" x5, "lower" x2, "newest" x6, "widest" x3.
    merges, vocab = train_bpe({"low": 5, "lower": 2, "newest": 6, "widest": 3}, 4)
    assert merges == [("e", "s"), ("es", "t"), ("l", "o"), ("lo", "w")]
    assert vocab[-4:] == ["es", "est", "lo", "low"]
    assert encode_word("lowest", {pair: i for i, pair in enumerate(merges)}) == ["low", "est"]
    from tokenizers import pre_tokenizers

    text = "low " * 5 + "lower " * 2 + "newest " * 6 + "widest " * 3
    all_merges, _ = train_bpe({"low": 5, "lower": 2, "newest": 6, "widest": 3}, 100)
    assert hf_bpe([text], 100, set(text) - {" "}, pre_tokenizers.WhitespaceSplit())[1] == all_merges
    assert len(all_merges) == 12  # until every word is one token


@pytest.mark.parametrize("counts, expected", [
    # After ("a","b") (count 3), ("ab","c") and ("b","d") tie at 2. By strings "ab" < "b";
    # by ids "b" (a character) < "ab" (a merge): tokenizers compares ids, and so do we.
    ({"abc": 2, "ab": 1, "bd": 2}, [("a", "b"), ("b", "d"), ("ab", "c")]),
    # After ("b","c") (count 3), ("a","bc") and ("d","e") tie at 2. A rule "two characters
    # first" would take ("d","e"); the ids compare the first symbols first, and a (0) < d (3).
    ({"abc": 2, "bc": 1, "de": 2}, [("b", "c"), ("a", "bc"), ("d", "e")]),
], ids=["smaller ids, not smaller strings", "the first symbol decides, even against two characters"])
def test_ties_go_to_the_smaller_ids_as_in_tokenizers(counts, expected):
    merges, vocab = train_bpe(counts, 3)
    assert merges == expected
    from tokenizers import pre_tokenizers

    text = " ".join(word for word, n in counts.items() for _ in range(n))
    alphabet = set("".join(counts))
    _, hf_merges, hf_vocab = hf_bpe([text], 3, alphabet, pre_tokenizers.WhitespaceSplit())
    assert hf_merges == merges and hf_vocab == vocab


def test_ties_between_characters_follow_code_points():
    merges, _ = train_bpe({"zy": 1, "ba": 1, "Ab": 1}, 3)
    assert merges == [("A", "b"), ("b", "a"), ("z", "y")]  # "A" < "b" < "z" as code points


def test_stopping_rules():
    counts = {"low": 5, "lower": 2, "newest": 6, "widest": 3}
    merges, vocab = train_bpe(counts, vocab_size=15)
    assert len(vocab) == 15 and len(merges) == 15 - len(set("lowernstid"))
    merges, _ = train_bpe(counts, 100, min_frequency=5)  # only pairs seen at least 5 times
    # ("e","w"), ("n","e") and ("w","est") tie at 6: ("e","w") has the smallest ids (e=1, w=9).
    assert merges == [("e", "s"), ("es", "t"), ("l", "o"), ("lo", "w"), ("e", "w"), ("n", "ew"), ("new", "est")]
    merges, vocab = train_bpe({"ab": 1}, 100)  # runs out of pairs
    assert merges == [("a", "b")] and vocab == ["a", "b", "ab"]
    merges, vocab = train_bpe({"ab": 1}, 0, special_tokens=["<pad>"], alphabet="z")
    assert merges == [] and vocab == ["<pad>", "a", "b", "z"]
    with pytest.raises(ValueError, match="exactly one of n_merges and vocab_size"):
        train_bpe(counts)
    with pytest.raises(ValueError, match="exactly one"):
        train_bpe(counts, 3, vocab_size=10)
    with pytest.raises(ValueError, match="non-negative int"):
        train_bpe(counts, -1)


def naive_train_bpe(counts, n_merges):
    """The algorithm as stated, with every count recomputed after every merge."""
    words = {tuple(word): n for word, n in counts.items()}
    vocab = sorted({ch for word in counts for ch in word})
    merges = []
    for _ in range(n_merges):
        pairs = pair_counts(words)
        if not pairs:
            break
        token_id = {t: i for i, t in enumerate(vocab)}
        best = max(pairs, key=lambda p: (pairs[p], -token_id[p[0]], -token_id[p[1]]))
        merges.append(best)
        if best[0] + best[1] not in token_id:
            vocab.append(best[0] + best[1])
        words = {merge_pair(word, best): n for word, n in words.items()}
    return merges, vocab


def test_incremental_counting_equals_recounting_everything():
    text = corpus.char_splits()[0][:30_000]
    counts = word_counts(text)
    assert train_bpe(counts, 150) == naive_train_bpe(counts, 150)


# ---------------------------------------------------------------------------------------
# Against tokenizers' BpeTrainer on the course text
# ---------------------------------------------------------------------------------------

def test_the_first_400_merges_equal_tokenizers(trained):
    _, _, (merges, vocab), (_, hf_merges, hf_vocab) = trained
    assert len(merges) == len(hf_merges) == N_MERGES
    first_difference = next((i for i, (a, b) in enumerate(zip(merges, hf_merges)) if a != b), None)
    assert first_difference is None, (first_difference, merges[first_difference], hf_merges[first_difference])
    assert vocab == hf_vocab  # the same tokens with the same ids


def test_encoding_held_out_text_equals_tokenizers(trained):
    _, val, (merges, vocab), (hf_tokenizer, _, _) = trained
    ours = encode(val, merges)
    theirs = hf_tokenizer.encode(val)
    assert ours == theirs.tokens
    assert tokens_to_ids(ours, vocab) == theirs.ids
    assert len(ours) < len(val) / 2  # 400 merges already halve the number of symbols


def test_round_trips(trained):
    _, val, (merges, vocab), _ = trained
    tokens = encode(val, merges)
    assert decode(tokens) == val
    assert decode(tokens_to_ids(tokens, vocab), vocab) == val
    odd = "  Leading spaces,\ttabs\n\nand unseen characters: \u82f9\u679c \U0001f34e  "
    assert decode(encode(odd, merges)) == odd
    with pytest.raises(KeyError, match="not in the vocabulary"):
        tokens_to_ids(encode("\U0001f34e", merges), vocab)
    with pytest.raises(ValueError, match="needs the vocabulary"):
        decode([1, 2])


# ---------------------------------------------------------------------------------------
# Byte-level BPE with tokenizers, the path used in practice
# ---------------------------------------------------------------------------------------

def test_byte_level_bpe_encodes_anything_and_round_trips():
    train, val = corpus.char_splits()
    tokenizer = train_byte_level_bpe([train], vocab_size=600)
    assert tokenizer.get_vocab_size() == 600
    assert tokenizer.token_to_id("<|endoftext|>") == 0 and tokenizer.token_to_id("<pad>") == 1
    for text in [val[:5000], "Unseen scripts: \u82f9\u679c, \u00e9t\u00e9, \U0001f34e!\n\ttab  double"]:
        ids = tokenizer.encode(text).ids
        assert tokenizer.decode(ids) == text
    # Special tokens are never split; ordinary text is compressed well below one token per byte.
    assert tokenizer.encode("a<|endoftext|>b").ids[1] == 0
    ids = tokenizer.encode(val).ids
    assert len(ids) < 0.5 * len(val.encode("utf-8"))


# ---------------------------------------------------------------------------------------
# Around BPE: whole words, encoding with a merge list, ids to vectors
# ---------------------------------------------------------------------------------------

def test_word_vocabulary_and_oov_rate():
    words = "b a c a b a d".split()
    assert word_vocabulary(words, 2) == ["a", "b"]
    assert word_vocabulary(words, 10) == ["a", "b", "c", "d"]  # fewer words than asked
    assert word_vocabulary(words, 3) == ["a", "b", "c"]  # c and d tie at 1: c occurs first
    assert oov_rate({"the", "cat"}, ["the", "cat", "sat", "the"]) == 0.25
    assert oov_rate(["a"], ["z", "z", "z", "a"]) == 0.75  # tokens, not distinct words
    assert oov_rate(word_vocabulary(words, 4), words) == 0.0
    with pytest.raises(ValueError, match="at least one word"):
        oov_rate({"a"}, [])
    with pytest.raises(ValueError, match="non-negative int"):
        word_vocabulary(words, -1)


def test_encode_word_takes_the_merge_list_or_the_ranks():
    merges = [("e", "s"), ("es", "t"), ("l", "o"), ("lo", "w")]
    assert encode_word("lowest", merges) == encode_word("lowest", {p: i for i, p in enumerate(merges)}) == ["low", "est"]
    # Order matters: the earlier merge wins where two overlap.
    assert encode_word("abc", [("b", "c"), ("a", "b")]) == ["a", "bc"]
    assert encode_word("abc", [("a", "b"), ("b", "c")]) == ["ab", "c"]


def test_replaying_every_merge_in_order_encodes_like_the_ranks(trained):
    """The simple encoder (apply merge 1 everywhere, then merge 2, ...) gives the same tokens
    as the rank-based one on real text."""
    _, val, (merges, _), _ = trained
    for word in set(pre_tokenize(val)):
        symbols = tuple(word)
        for pair in merges:
            symbols = merge_pair(symbols, pair)
        assert list(symbols) == encode_word(word, merges), word


def test_vocabulary_from_merges_rebuilds_train_bpes_vocabulary(trained):
    train, val, (merges, vocab), _ = trained
    assert vocabulary_from_merges(merges, set(train) | set(val)) == vocab
    assert vocabulary_from_merges([("a", "b"), ("ab", "c"), ("a", "bc")], "abc", ["<pad>"]) == [
        "<pad>", "a", "b", "c", "ab", "abc"]  # "a"+"bc" makes no new token


def test_embedding_lookup_is_a_row_copy():
    import torch

    g = torch.Generator().manual_seed(0)
    table = torch.randn(11, 5, generator=g)
    ids = torch.randint(11, (3, 4), generator=g)
    out = embedding_lookup(ids, table)
    assert out.shape == (3, 4, 5)
    assert torch.equal(out, table[ids])
    emb = torch.nn.Embedding(11, 5)
    emb.weight.data.copy_(table)
    assert torch.equal(out, emb(ids).detach())
    assert embedding_lookup(ids, table.double()).dtype == torch.float64
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 11\)"):
        embedding_lookup(torch.tensor([11]), table)
    with pytest.raises(TypeError, match="integer token ids"):
        embedding_lookup(torch.tensor([1.0]), table)


# ------------------------------------------------------------------- WordPiece


def hf_wordpiece(vocab, unk="[UNK]", prefix="##", max_chars=100):
    """tokenizers' WordPiece model on a vocabulary (it needs the unknown token in it, with an id)."""
    from tokenizers import models

    ids = {token: i for i, token in enumerate(sorted(set(vocab) | {unk}))}
    model = models.WordPiece(ids, unk_token=unk, continuing_subword_prefix=prefix, max_input_chars_per_word=max_chars)
    return lambda word: [t.value for t in model.tokenize(word)]


def test_wordpiece_docstring_examples():
    vocab = {"un", "##hash", "##able", "hash", "##h"}
    assert wordpiece_encode("unhashable", vocab) == ["un", "##hash", "##able"]
    assert wordpiece_encode("unhashable!", vocab) == ["[UNK]"]
    assert wordpiece_encode("", vocab) == []
    assert wordpiece_encode("hash", vocab) == ["hash"]
    assert wordpiece_encode("unhash", vocab, max_chars=5) == ["[UNK]"]
    assert wordpiece_encode("unhash", vocab, max_chars=6) == ["un", "##hash"]
    assert wordpiece_encode("unhashable", {"un": 0, "##hash": 1, "##able": 2}) == ["un", "##hash", "##able"]


def test_wordpiece_equals_tokenizers_on_every_held_out_word_of_the_course():
    """A 500-token vocabulary trained by tokenizers' WordPieceTrainer on a tenth of the training text (so
    that some held-out words cannot be covered), and every distinct word of the held-out text (BERT's split
    at spaces and punctuation): the same tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    train, val = corpus.char_splits()
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.train_from_iterator([train[:len(train) // 10]],
                                  trainers.WordPieceTrainer(vocab_size=500, special_tokens=["[UNK]"], show_progress=False))
    vocab = tokenizer.get_vocab()
    theirs = hf_wordpiece(vocab)
    words = sorted({w for w, _ in pre_tokenizers.BertPreTokenizer().pre_tokenize_str(val)})
    assert len(words) > 800
    unknown = 0
    for word in words:
        ours = wordpiece_encode(word, vocab)
        assert ours == theirs(word), word
        unknown += ours == ["[UNK]"]
    assert 0 < unknown < len(words) / 10  # both kinds of word are in the comparison
    # a vocabulary trained on the held-out text covers every one of its words
    tokenizer.train_from_iterator([val], trainers.WordPieceTrainer(vocab_size=1000, special_tokens=["[UNK]"],
                                                                   show_progress=False))
    assert all(wordpiece_encode(word, tokenizer.get_vocab()) != ["[UNK]"] for word in words)


@pytest.mark.parametrize("seed", range(6))
def test_wordpiece_equals_tokenizers_on_random_vocabularies(seed):
    """Random pieces over a small alphabet (so that words are often, but not always, covered), random
    words, and the options: another prefix and unknown token, and a small max_chars."""
    import random

    rng = random.Random(seed)
    alphabet = "abcdé"
    prefix, unk = [("##", "[UNK]"), ("@@", "<unk>"), ("_", "?")][seed % 3]
    max_chars = [100, 6, 9][seed % 3]
    pieces = {"".join(rng.choices(alphabet, k=rng.randint(1, 4))) for _ in range(40)}
    vocab = {p if rng.random() < 0.5 else prefix + p for p in pieces}
    theirs = hf_wordpiece(vocab, unk, prefix, max_chars)
    covered = 0
    for _ in range(400):
        word = "".join(rng.choices(alphabet, k=rng.randint(1, 12)))
        ours = wordpiece_encode(word, vocab, unk=unk, prefix=prefix, max_chars=max_chars)
        assert ours == theirs(word), (word, sorted(vocab))
        covered += ours != [unk]
    assert covered > 0


def test_wordpiece_pieces_spell_the_word_and_are_the_longest():
    import random

    rng = random.Random(0)
    vocab = {"a", "b", "ab", "##a", "##b", "##ab", "##ba", "##bab"}
    for _ in range(200):
        word = "".join(rng.choices("ab", k=rng.randint(1, 10)))
        tokens = wordpiece_encode(word, vocab)
        assert tokens[0] + "".join(t.removeprefix("##") for t in tokens[1:]) == word
        assert all(t.startswith("##") for t in tokens[1:]) and not tokens[0].startswith("##")
        start = len(tokens[0])
        assert not any(word[:end] in vocab for end in range(start + 1, len(word) + 1))  # the longest first piece
