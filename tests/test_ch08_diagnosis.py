"""Chapter 08's checkers diagnose combined mistakes by property, and accept correct answers
written another way.

tests/test_checkers.py proves that each catalogued mistake is named when it is made alone.
Learners often make two at once (pairs counted across words *and* without the word counts,
overlapping merges *and* only the first occurrence, ties by first sight *and* unweighted
counts), and then no catalogue entry matches: the properties must still name each error
from a trait of the output."""

from collections import Counter, defaultdict

import matplotlib
import pytest
import torch
import torch.nn.functional as F

from transformer_lib.checks import ch08
from transformer_lib.tokenization import encode_word, merge_pair, pair_counts

matplotlib.use("Agg")


def _verdict(checker, fn, hidden=True):
    return checker.judge(checker.collect_outputs(fn, hidden), hidden)


# ------------------------------------------------------------------- combined mistakes


def oov_percent_of_known_words(vocab, words):
    return 100 * sum(w in vocab for w in words) / len(words)


def oov_known_share_of_distinct_words(vocab, words):
    return len({w for w in words if w in vocab}) / len(set(words))


def pairs_across_words_unweighted(word_counts):
    sequence = [symbol for word in word_counts for symbol in word]
    return Counter(zip(sequence, sequence[1:]))


def pairs_joined_and_unweighted(word_counts):
    counts = defaultdict(int)
    for word in word_counts:
        for a, b in zip(word, word[1:]):
            counts[a + b] += 1
    return dict(counts)


def merge_overlapping_and_first_only(symbols, pair):
    for i in range(len(symbols) - 1):
        if (symbols[i], symbols[i + 1]) == tuple(pair):
            return tuple(symbols[:i]) + (pair[0] + pair[1],) + tuple(symbols[i + 1:])  # keeps the second half too
    return tuple(symbols)


def merge_right_to_left_first_only(symbols, pair):
    for i in range(len(symbols) - 1, 0, -1):
        if (symbols[i - 1], symbols[i]) == tuple(pair):
            return tuple(symbols[:i - 1]) + (pair[0] + pair[1],) + tuple(symbols[i + 1:])
    return tuple(symbols)


def train_unweighted_first_seen(word_counts, n_merges):
    words = {tuple(w): 1 for w in word_counts}
    merges = []
    for _ in range(n_merges):
        pairs = pair_counts(words)
        if not pairs:
            break
        best = max(pairs, key=pairs.get)
        merges.append(best)
        words = {merge_pair(w, best): c for w, c in words.items()}
    return merges


def train_across_words_and_one_short(word_counts, n_merges):
    text = "".join(word * count for word, count in word_counts.items())
    return ch08.train_bpe_merges({text: 1}, max(n_merges - 1, 0))


def train_string_ties_and_never_stopping(word_counts, n_merges):
    """Ties by strings, and when no pair is left, the last merge repeated to fill n_merges."""
    merges = ch08._tb_alphabetical(word_counts, n_merges)
    return merges + merges[-1:] * (n_merges - len(merges)) if merges else merges


def encode_reversed_and_first_only(word, merges):
    symbols = list(word)
    for a, b in reversed(merges):
        for i in range(len(symbols) - 1):
            if symbols[i] == a and symbols[i + 1] == b:
                symbols[i:i + 2] = [a + b]
                break
    return symbols


def encode_dropping_a_character(word, merges):
    return encode_word(word, merges)[:-1] if len(word) > 1 else list(word)


def _greedy(word, vocab, unk="[UNK]", prefix="##", max_chars=100, *, shortest=False, mark=True, mark_first=False,
            step_one=False, unk_per_gap=False, limit=">"):
    """WordPiece with the mistakes switched on one by one, to combine them."""
    if (len(word) >= max_chars) if limit == ">=" else (limit == ">" and len(word) > max_chars):
        return [unk]
    tokens, start = [], 0
    while start < len(word):
        ends = range(start + 1, len(word) + 1) if shortest else range(len(word), start, -1)
        for end in ends:
            marked = mark and (start > 0 or mark_first)
            piece = (prefix if marked else "") + word[start:end]
            if piece in vocab:
                break
        else:
            if unk_per_gap:
                tokens.append(unk)
                start += 1
                continue
            return [unk]
        tokens.append(piece)
        start = start + 1 if step_one else end
    return tokens


def wordpiece_shortest_and_bare(word, vocab, unk="[UNK]", prefix="##", max_chars=100):
    return _greedy(word, vocab, unk, prefix, max_chars, shortest=True, mark=False)


def wordpiece_unk_per_gap_and_no_limit(word, vocab, unk="[UNK]", prefix="##", max_chars=100):
    return _greedy(word, vocab, unk, prefix, max_chars, unk_per_gap=True, limit=None)


def wordpiece_shortest_and_limit_off_by_one(word, vocab, unk="[UNK]", prefix="##", max_chars=100):
    return _greedy(word, vocab, unk, prefix, max_chars, shortest=True, limit=">=")


def wordpiece_one_step_and_marked_first(word, vocab, unk="[UNK]", prefix="##", max_chars=100):
    return _greedy(word, vocab, unk, prefix, max_chars, step_one=True, mark_first=True)


def wordpiece_one_step_and_no_limit(word, vocab, unk="[UNK]", prefix="##", max_chars=100):
    return _greedy(word, vocab, unk, prefix, max_chars, step_one=True, limit=None)


def wordpiece_bare_and_unknown_dropped(word, vocab, unk="[UNK]", prefix="##", max_chars=100):
    tokens = _greedy(word, vocab, unk, prefix, max_chars, mark=False)
    return [] if tokens == [unk] else tokens


def embedding_columns_and_scaled(ids, table):
    rows = F.one_hot(ids, table.shape[0]).to(table.dtype) @ table
    return (rows * table.shape[1] ** 0.5).transpose(-2, -1)


def embedding_doubled_float32(ids, table):
    return 2 * (F.one_hot(ids, table.shape[0]).float() @ table.float())


@pytest.mark.parametrize("checker,answer,trait", [
    (ch08.check_oov_rate, oov_percent_of_known_words, "a value above 1"),
    (ch08.check_oov_rate, oov_known_share_of_distinct_words, "the share of known words"),
    (ch08.check_pair_counts, pairs_across_words_unweighted, "pairs that occur inside no word"),
    (ch08.check_pair_counts, pairs_across_words_unweighted, "counts that ignore how often each word occurs"),
    (ch08.check_pair_counts, pairs_joined_and_unweighted, "keys that are not (a, b) tuples"),
    (ch08.check_merge_pair, merge_overlapping_and_first_only, "symbols duplicated or lost"),
    (ch08.check_merge_pair, merge_right_to_left_first_only, "an occurrence of the pair left unmerged"),
    (ch08.check_train_bpe, train_unweighted_first_seen, "not the most frequent pair at its turn"),
    (ch08.check_train_bpe, train_across_words_and_one_short, "a merge of a pair that no word holds"),
    (ch08.check_train_bpe, train_string_ties_and_never_stopping, "ties broken another way"),
    (ch08.check_encode_word, encode_reversed_and_first_only, "two neighbouring tokens that one of the merges joins"),
    (ch08.check_encode_word, encode_dropping_a_character, "tokens that do not spell the word"),
    (ch08.check_wordpiece_encode, wordpiece_shortest_and_bare, "a piece after the first without the ## prefix"),
    (ch08.check_wordpiece_encode, wordpiece_shortest_and_bare, "[UNK] for a word the vocabulary can cover"),
    (ch08.check_wordpiece_encode, wordpiece_unk_per_gap_and_no_limit, "[UNK] next to other pieces"),
    (ch08.check_wordpiece_encode, wordpiece_unk_per_gap_and_no_limit, "a word longer than max_chars encoded"),
    (ch08.check_wordpiece_encode, wordpiece_shortest_and_limit_off_by_one, "a shorter piece where"),
    (ch08.check_wordpiece_encode, wordpiece_shortest_and_limit_off_by_one, "a word of exactly max_chars characters"),
    (ch08.check_wordpiece_encode, wordpiece_one_step_and_marked_first, "a first piece that carries the ## prefix"),
    (ch08.check_wordpiece_encode, wordpiece_one_step_and_no_limit, "tokens that do not spell the word"),
    (ch08.check_wordpiece_encode, wordpiece_one_step_and_no_limit, "a word longer than max_chars encoded"),
    (ch08.check_wordpiece_encode, wordpiece_bare_and_unknown_dropped, "an empty list for a word the vocabulary"),
    (ch08.check_wordpiece_encode, wordpiece_bare_and_unknown_dropped, "a piece after the first without the ## prefix"),
    (ch08.check_embedding_lookup, embedding_columns_and_scaled, "a shape with the right sizes in the wrong order"),
    (ch08.check_embedding_lookup, embedding_doubled_float32, "multiplied by a constant"),
], ids=lambda x: getattr(x, "__name__", str(x))[:40])
def test_combined_mistakes_are_named_by_a_trait(checker, answer, trait):
    verdict = _verdict(checker, answer)
    assert not verdict.passed
    assert verdict.mistake is None or verdict.mistake not in [m.name for m in checker.mistakes], verdict.message
    assert trait in verdict.message, verdict.message


def test_each_trait_of_a_double_mistake_is_named():
    """Ties by strings diverge at a tie (named as such); repeating the last merge once no pair is
    left merges a pair no word holds (named too): one message, both errors."""
    verdict = _verdict(ch08.check_train_bpe, train_string_ties_and_never_stopping)
    assert "ties broken another way" in verdict.message
    assert "a merge of a pair that no word holds" in verdict.message
    assert "not the most frequent" not in verdict.message


def test_a_constant_multiple_of_the_rows_is_named():
    verdict = _verdict(ch08.check_embedding_lookup,
                       lambda ids, table: 0.5 * (F.one_hot(ids, table.shape[0]).to(table.dtype) @ table))
    assert "multiplied by a constant" in verdict.message


# ------------------------------------------------------------------- the lookup, not the product

def rows_by_indexing(ids, table):
    return table[ids]


def rows_by_index_select(ids, table):
    return table.index_select(0, ids.flatten()).reshape(*ids.shape, table.shape[1])


def rows_by_f_embedding(ids, table):
    return F.embedding(ids, table)


def rows_by_nn_embedding(ids, table):
    return torch.nn.Embedding.from_pretrained(table)(ids)


def rows_in_a_loop(ids, table):
    return torch.stack([table[int(i)] for i in ids.flatten()]).reshape(*ids.shape, table.shape[1])


def rows_of_a_copy_scaled(ids, table):
    return 2 * table.clone()[ids]  # a copy of the table, and a second mistake on top


@pytest.mark.parametrize("answer", [rows_by_indexing, rows_by_index_select, rows_by_f_embedding,
                                    rows_by_nn_embedding, rows_in_a_loop, rows_of_a_copy_scaled],
                         ids=lambda f: f.__name__)
@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
def test_picking_rows_out_of_the_table_is_refused_as_indexing(answer, hidden):
    """Indexing gives exactly the product's numbers, so without the watch every one of these
    would pass an exercise that asks for one_hot(ids) @ table."""
    checker = ch08.check_embedding_lookup
    verdict = _verdict(checker, answer, hidden)
    assert not verdict.passed
    assert verdict.mistake == checker.mistakes[0].name, verdict.message
    assert "rows picked out of the table by indexing" in verdict.message
    assert "F.one_hot(ids, table.shape[0]).to(table.dtype)" in verdict.message


def test_the_watch_sees_the_table_only():
    """An identity matrix may be indexed to build the one-hot rows; the table may not."""
    ids, table = torch.tensor([[2, 0, 1]]), torch.randn(4, 3)
    out, picked = ch08._table_rows_picked(lambda i, t: torch.eye(t.shape[0])[i] @ t, ids, table)
    assert picked == [] and torch.equal(out, table[ids])
    _, picked = ch08._table_rows_picked(lambda i, t: t[i], ids, table)
    assert picked == ["index"]


# ------------------------------------------------------------------- correct answers, other ways


def oov_with_a_loop(vocab, words):
    unknown = 0
    for word in words:
        if word not in vocab:
            unknown += 1
    return float(unknown) / len(words)


def pairs_with_defaultdict(word_counts):
    counts = defaultdict(int)
    for word, count in word_counts.items():
        for i in range(len(word) - 1):
            counts[word[i], word[i + 1]] += count
    return dict(counts)


def merge_with_a_for_loop(symbols, pair):
    out, skip = [], False
    for i, symbol in enumerate(symbols):
        if skip:
            skip = False
            continue
        if i + 1 < len(symbols) and (symbol, symbols[i + 1]) == tuple(pair):
            out.append(symbol + symbols[i + 1])
            skip = True
        else:
            out.append(symbol)
    return tuple(out)


def train_with_lists_and_sorting(word_counts, n_merges):
    """Merges returned as lists, the best pair found by sorting, ids kept in a list."""
    words = [[list(word), count] for word, count in word_counts.items()]
    order = sorted({ch for word in word_counts for ch in word})
    merges = []
    while len(merges) < n_merges:
        pairs = Counter()
        for symbols, count in words:
            for pair in zip(symbols, symbols[1:]):
                pairs[pair] += count
        if not pairs:
            break
        best = sorted(pairs, key=lambda p: (-pairs[p], order.index(p[0]), order.index(p[1])))[0]
        merges.append(list(best))
        if best[0] + best[1] not in order:
            order.append(best[0] + best[1])
        for entry in words:
            entry[0] = list(merge_pair(tuple(entry[0]), best))
    return merges


def encode_by_ranks(word, merges):
    return encode_word(word, {tuple(p): i for i, p in enumerate(merges)})


def embedding_by_comparison(ids, table):
    one_hot = (ids[..., None] == torch.arange(table.shape[0])).to(table.dtype)  # [..., vocab]
    return one_hot @ table


def embedding_by_identity_rows(ids, table):
    return torch.eye(table.shape[0], dtype=table.dtype)[ids] @ table  # the one-hot rows, then the product


def embedding_by_einsum(ids, table):
    return torch.einsum("...v,vd->...d", F.one_hot(ids, table.shape[0]).to(table.dtype), table)


def wordpiece_as_in_berts_code(word, vocab, unk="[UNK]", prefix="##", max_chars=100):
    """Two while loops and a piece that stays None when nothing fits, as Google's WordpieceTokenizer."""
    chars = list(word)
    if len(chars) > max_chars:
        return [unk]
    tokens, start = [], 0
    while start < len(chars):
        end, found = len(chars), None
        while start < end:
            piece = "".join(chars[start:end])
            if start > 0:
                piece = prefix + piece
            if piece in vocab:
                found = piece
                break
            end -= 1
        if found is None:
            return [unk]
        tokens.append(found)
        start = end
    return tokens


def wordpiece_recursive(word, vocab, unk="[UNK]", prefix="##", max_chars=100):
    """The rest of the word handled by a recursive call that knows it is not at the start."""
    if len(word) > max_chars:
        return [unk]

    def cut(rest, first):
        if not rest:
            return []
        for end in range(len(rest), 0, -1):
            piece = rest[:end] if first else prefix + rest[:end]
            if piece in vocab:
                tail = cut(rest[end:], False)
                return None if tail is None else [piece] + tail
        return None

    tokens = cut(word, True)
    return [unk] if tokens is None else tokens


def wordpiece_by_scanning_the_vocabulary(word, vocab, unk="[UNK]", prefix="##", max_chars=100):
    """The longest vocabulary entry that matches at each position, found by scanning the vocabulary;
    returned as a tuple."""
    if len(word) > max_chars:
        return (unk,)
    starts = [t for t in vocab if not t.startswith(prefix)]
    inside = [t[len(prefix):] for t in vocab if t.startswith(prefix)]
    tokens, position = [], 0
    while position < len(word):
        candidates = [p for p in (starts if position == 0 else inside) if p and word.startswith(p, position)]
        if not candidates:
            return (unk,)
        best = max(candidates, key=len)
        tokens.append(best if position == 0 else prefix + best)
        position += len(best)
    return tuple(tokens)


@pytest.mark.parametrize("checker,answer", [
    (ch08.check_oov_rate, oov_with_a_loop),
    (ch08.check_pair_counts, pairs_with_defaultdict),
    (ch08.check_merge_pair, merge_with_a_for_loop),
    (ch08.check_train_bpe, train_with_lists_and_sorting),
    (ch08.check_encode_word, encode_by_ranks),
    (ch08.check_wordpiece_encode, wordpiece_as_in_berts_code),
    (ch08.check_wordpiece_encode, wordpiece_recursive),
    (ch08.check_wordpiece_encode, wordpiece_by_scanning_the_vocabulary),
    (ch08.check_embedding_lookup, embedding_by_comparison),
    (ch08.check_embedding_lookup, embedding_by_identity_rows),
    (ch08.check_embedding_lookup, embedding_by_einsum),
], ids=lambda x: getattr(x, "__name__", None) or getattr(x, "name", None) or str(x))
def test_correct_answers_written_another_way_pass(checker, answer):
    verdict = _verdict(checker, answer)
    assert verdict.passed, verdict.message


def test_a_list_from_merge_pair_is_refused_with_a_reason():
    verdict = _verdict(ch08.check_merge_pair, lambda symbols, pair: list(merge_pair(symbols, pair)))
    assert not verdict.passed and "tuple(merged)" in verdict.message


def test_ties_to_two_characters_first_are_named():
    """The rule the chapter once stated ("a pair of two characters beats a tied pair that
    contains a merged symbol") is wrong: ("a", "bc") beats ("d", "e"), because the first
    symbols' ids are compared first, as tokenizers does."""
    verdict = _verdict(ch08.check_train_bpe, ch08._tb_characters_first, hidden=False)
    assert not verdict.passed and verdict.mistake == "ties given to pairs of two characters first, whatever their ids"
    assert ch08._tb_characters_first({"abc": 2, "bc": 1, "de": 2}, 3)[1] == ("d", "e")
    assert ch08.train_bpe_merges({"abc": 2, "bc": 1, "de": 2}, 3)[1] == ("a", "bc")


def test_the_train_bpe_reference_has_the_exercise_signature():
    assert ch08.train_bpe_merges({"low": 5, "lower": 2, "newest": 6, "widest": 3}, 4) == [
        ("e", "s"), ("es", "t"), ("l", "o"), ("lo", "w")]


# ------------------------------------------------------------------- the chapter's diagrams


def test_the_diagrams_draw():
    from transformer_lib.diagrams.ch08 import draw_bpe_merge_step, draw_text_to_vectors

    fig = draw_bpe_merge_step(step=1)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert any("merging into 'est'" in t for t in texts)  # merge 2 of the classic table is (es, t)
    fig = draw_text_to_vectors(" lowest newer", [" low", "est", " new", "er"], [7, 5, 8, 2])
    assert fig.axes
    with pytest.raises(ValueError, match="no merge number"):
        draw_bpe_merge_step({"ab": 1}, step=3)
    with pytest.raises(ValueError, match="as many ids as tokens"):
        draw_text_to_vectors("ab", ["a", "b"], [1])


# ------------------------------------------------------------------- WordPiece, more


def test_wordpiece_course_case_agrees_with_tokenizers_and_the_model_is_forbidden():
    """The hidden course case (BERT's {token: id}) is cut by the reference as tokenizers' WordPiece
    model cuts it, holds both covered and unknown words, and an answer may not call that model."""
    from tokenizers import models

    words, vocab = ch08._course_wordpiece()
    assert isinstance(vocab, dict) and "[UNK]" in vocab and len(words) > 100
    model = models.WordPiece(vocab, unk_token="[UNK]")
    outputs = [ch08.wordpiece_encode(word, vocab) for word in words]
    assert outputs == [[t.value for t in model.tokenize(word)] for word in words]
    assert any(o == ["[UNK]"] for o in outputs) and any(len(o) > 2 for o in outputs)
    assert "tokenizers.models.WordPiece" in ch08.check_wordpiece_encode.forbidden


def test_wordpiece_cases_are_the_same_in_every_process():
    """The grader builds the cases in the learner's process and again in its own: they must not depend
    on anything that changes between processes (tokenizers' trainers number symbols in hash-map order)."""
    import subprocess
    import sys

    code = ("import hashlib; from transformer_lib.checks import ch08; w, v = ch08._course_wordpiece(); "
            "print(hashlib.sha256(repr((w, sorted(v.items()))).encode()).hexdigest())")
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
            for _ in range(2)}
    assert len(runs) == 1, runs


def test_the_worked_examples_of_the_wordpiece_exercise():
    vocab = {"un", "hash", "able", "##hash", "##able", "##h", "##a", "##s", "##es"}
    assert ch08.wordpiece_encode("unhashable", vocab) == ["un", "##hash", "##able"]
    assert ch08.wordpiece_encode("hashes", vocab) == ["hash", "##es"]
    assert ch08.wordpiece_encode("unhash?able", vocab) == ["[UNK]"]
    assert ch08.wordpiece_encode("unhashable", vocab, max_chars=9) == ["[UNK]"]
