"""Checkers for chapter 09, BERT: the pair input [CLS] A [SEP] B [SEP] with segment ids and
padding, the sum of token, segment and position embeddings, next-sentence pairs drawn half
IsNext and half NotNext, the masked-language-model corruption (15% of the non-special tokens;
80% [MASK], 10% random, 10% unchanged), one pre-training step (corrupt, forward, MLM + NSP
loss, backward, clip, step), the sentence classifier on [CLS], and the best answer span for
extractive question answering.

References are the library's (transformer_lib.bert). Each checker knows the wrong answers
learners often write (a [SEP] lost to truncation, positions looked up by token id, a NotNext
sentence from A's own document, special tokens masked, gradients that pile up across steps, an
answer that ends before it starts...), and properties name an error from a trait of the output
("labels that are not -100 on unselected positions", "an NSP head that never moved", "a span
outside the passage"), so two mistakes made at once are still diagnosed in the learner's terms.

The pre-training step runs on a tiny float64 BERT that the checker builds (in `invoke`), with
the checker's own copies of the embedding sum and of the corruption: while grading, the
library's embedding_sum and mask_tokens are hidden like every reference of the chapter.
"""

import math
import random
import re
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from transformer_lib.bert import (IGNORE_INDEX, BertConfig, BertForPreTraining, BertPooler, best_span,
                                  build_pair_inputs, classify_from_cls, embedding_sum, mask_tokens, nsp_pairs,
                                  pretrain_step)

from . import properties
from .core import Case, Checker, Mistake, Property, describe_difference, randn, seeded


def _tensor(x):
    return isinstance(x, torch.Tensor)


# ---------------------------------------------------------------------------------------
# Exercise 1: build_pair_inputs(tokens_a, tokens_b, max_len, cls_id, sep_id, pad_id)
#             -> (ids, segment_ids, padding_mask), each [max_len]
# ---------------------------------------------------------------------------------------


def _pair_cases() -> list[Case]:
    return [
        Case("both sentences fit, then padding", ([11, 12, 13], [21, 22], 10, 1, 2, 0)),
        Case("sentence A too long", (list(range(30, 40)), [50, 51], 10, 1, 2, 0)),
        Case("one sentence (tokens_b=None)", ([7, 8, 9], None, 7, 1, 2, 0)),
        Case("BERT's own ids ([CLS] 101, [SEP] 102, [PAD] 0), both too long",
             (list(range(2000, 2008)), list(range(3000, 3007)), 12, 101, 102, 0)),
        Case("sentence B too long", ([5, 6], list(range(20, 32)), 11, 1, 2, 0), hidden=True),
        Case("both too long, equal lengths (B loses the tie)", (list(range(40, 46)), list(range(60, 66)), 10, 1, 2, 0),
             hidden=True),
        Case("an exact fit, no padding", ([4, 5, 6], [7, 8, 9, 10], 10, 1, 2, 0), hidden=True),
        Case("one sentence, truncated", (list(range(10, 22)), None, 8, 1, 2, 0), hidden=True),
        Case("pad id 3, empty sentence A", ([], [44, 45, 46], 9, 1, 2, 3), hidden=True),
    ]


def _assemble(a, b, max_len, cls_id, sep_id, pad_id, seg_of_first_sep=0, pad_segment=0, pad_true=False):
    """[CLS] a [SEP] (b [SEP]), padded to max_len; the knobs reproduce common slips."""
    ids = [cls_id, *a, sep_id]
    segments = [0] * (len(a) + 1) + [seg_of_first_sep]
    if b is not None:
        ids += [*b, sep_id]
        segments += [1] * (len(b) + 1)
    n = len(ids)
    ids += [pad_id] * (max_len - n)
    segments += [pad_segment] * (max_len - n)
    padding = [not pad_true] * n + [pad_true] * (max_len - n)
    return torch.tensor(ids), torch.tensor(segments), torch.tensor(padding)


def _longest_first(a, b, budget, from_front=False):
    a, b = list(a), list(b)
    while len(a) + len(b) > budget:
        longer = a if len(a) > len(b) else b
        longer.pop(0 if from_front else -1)
    return a, b


def _fit(a, b, max_len, from_front=False):
    if b is None:
        return (list(a)[len(a) - (max_len - 2):] if from_front and len(a) > max_len - 2 else list(a)[:max_len - 2]), None
    return _longest_first(a, b, max_len - 3, from_front)


def _pair_cut_after_assembly(a, b, max_len, cls_id, sep_id, pad_id):
    n = len(a) + 2 + (0 if b is None else len(b) + 1)
    ids, segments, padding = _assemble(a, b, max(n, max_len), cls_id, sep_id, pad_id)
    return ids[:max_len], segments[:max_len], padding[:max_len]


def _pair_first_sep_in_b(a, b, max_len, cls_id, sep_id, pad_id):
    a, b = _fit(a, b, max_len)
    return _assemble(a, b, max_len, cls_id, sep_id, pad_id, seg_of_first_sep=0 if b is None else 1)


def _pair_mask_inverted(a, b, max_len, cls_id, sep_id, pad_id):
    a, b = _fit(a, b, max_len)
    return _assemble(a, b, max_len, cls_id, sep_id, pad_id, pad_true=True)


def _pair_only_b_cut(a, b, max_len, cls_id, sep_id, pad_id):
    if b is None:
        return _assemble(list(a)[:max_len - 2], None, max_len, cls_id, sep_id, pad_id)
    a, b = list(a), list(b)
    while len(a) + len(b) > max_len - 3:
        (b if b else a).pop()
    return _assemble(a, b, max_len, cls_id, sep_id, pad_id)


def _pair_cut_from_front(a, b, max_len, cls_id, sep_id, pad_id):
    a, b = _fit(a, b, max_len, from_front=True)
    return _assemble(a, b, max_len, cls_id, sep_id, pad_id)


def _pair_pad_segment_one(a, b, max_len, cls_id, sep_id, pad_id):
    a, b = _fit(a, b, max_len)
    return _assemble(a, b, max_len, cls_id, sep_id, pad_id, pad_segment=0 if b is None else 1)


def _seps(case, actual):
    ids = actual[0] if isinstance(actual, (tuple, list)) and actual and _tensor(actual[0]) else None
    if ids is None:
        return None
    return int((ids == case.args[4]).sum())


def _sep_missing(case, expected, actual):
    n = _seps(case, actual)
    return n is not None and n < int((expected[0] == case.args[4]).sum())


def _wrong_length(case, expected, actual):
    if not (isinstance(actual, (tuple, list)) and actual):
        return False
    return any(_tensor(t) and t.dim() == 1 and t.shape[0] != case.args[2] for t in actual)


def _kept(ids, cls_id, sep_id):
    """The tokens kept of each sentence, read from an ids tensor: (a, b or None)."""
    ids = ids.tolist()
    if not ids or ids[0] != cls_id or sep_id not in ids:
        return None
    first = ids.index(sep_id)
    a = ids[1:first]
    rest = ids[first + 1:]
    b = rest[:rest.index(sep_id)] if sep_id in rest else None
    return a, b


def _cut_at_the_front(case, expected, actual):
    if not (isinstance(actual, (tuple, list)) and actual and _tensor(actual[0])):
        return False
    tokens_a, tokens_b, _, cls_id, sep_id, _ = case.args
    kept = _kept(actual[0], cls_id, sep_id)
    if kept is None:
        return False
    for original, got in ((tokens_a, kept[0]), (tokens_b, kept[1])):
        if original is not None and got is not None and 0 < len(got) < len(original):
            if got != list(original)[:len(got)] and got == list(original)[len(original) - len(got):]:
                return True
    return False


SEP_MISSING = Property(
    "an input with a [SEP] missing: truncation cut a separator",
    "Truncate the sentences *before* adding the special tokens, to max_len - 3 tokens for a pair (max_len - 2 "
    "for one sentence), so that [CLS] and every [SEP] always stay.",
    _sep_missing,
)
WRONG_LENGTH = Property(
    "an output that is not exactly max_len long",
    "Every output has max_len entries: truncate the sentences to fit, then pad ids with pad_id, segments with 0 "
    "and the mask with False up to max_len.",
    _wrong_length,
)
CUT_AT_THE_FRONT = Property(
    "a truncated sentence that lost its first tokens instead of its last",
    "Remove tokens from the end of the longer sentence (list.pop()), one at a time.",
    _cut_at_the_front,
)

check_build_pair_inputs = Checker(
    name="build_pair_inputs",
    reference=build_pair_inputs,
    make_cases=_pair_cases,
    mistakes=[
        Mistake(
            "truncation after assembling: the whole input cut at max_len, which drops the final [SEP] "
            "(and the sentence B it closes)",
            "Truncate the sentences first (longest first, to max_len - 3 tokens together), then add [CLS] and "
            "the two [SEP]s: the separators must survive.",
            _pair_cut_after_assembly,
        ),
        Mistake(
            "the [SEP] after sentence A given segment 1",
            "A's [SEP] belongs to A: segment 0 for [CLS], A and its [SEP]; segment 1 for B and the final [SEP].",
            _pair_first_sep_in_b,
        ),
        Mistake(
            "padding mask inverted: True on the padding",
            "The mask says which positions are real tokens: True for [CLS], the sentences and the [SEP]s, "
            "False for padding.",
            _pair_mask_inverted,
        ),
        Mistake(
            "only sentence B truncated (A kept whole while B still has tokens)",
            "Truncate longest first: while the pair is too long, remove the last token of the longer sentence "
            "(of B on a tie).",
            _pair_only_b_cut,
        ),
        Mistake(
            "tokens removed from the start of the longer sentence",
            "Remove tokens from the end: the start of a sentence usually matters most (list.pop(), not pop(0)).",
            _pair_cut_from_front,
        ),
        Mistake(
            "segment 1 continued over the padding",
            "Padding positions get segment 0 (their value never matters, but it is fixed): pad segment_ids "
            "with zeros.",
            _pair_pad_segment_one,
        ),
    ],
    properties=[
        SEP_MISSING,
        WRONG_LENGTH,
        properties.mask_inverted(
            "The padding mask is True on real tokens ([CLS], words, [SEP]) and False on padding.",
            select=lambda out: out[2]),
        CUT_AT_THE_FRONT,
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 2: embedding_sum(ids, segment_ids, token_table, segment_table, position_table)
#             -> [batch, seq, d_model]
# ---------------------------------------------------------------------------------------


def _embedding_case(name, seed, batch, seq, vocab, d, max_len, dtype=torch.float32, hidden=False,
                    single=False):
    g = seeded(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    segments = torch.zeros(batch, seq, dtype=torch.long)
    if not single:
        for b in range(batch):  # sentence B from a random point on: [0 ... 0 1 ... 1]
            segments[b, int(torch.randint(1, seq, (1,), generator=g)) if seq > 1 else 0:] = 1
    if batch >= 3 and seq >= 4:
        ids[1] = ids[0]  # the same tokens in another segment layout: only the segments differ
        segments[1] = 1 - segments[0]
        segments[1, 0] = 0
        ids[2, seq - 1] = ids[2, seq - 2]  # one token twice, side by side, in one segment
        segments[2, seq - 2] = segments[2, seq - 1]
    tables = (randn(g, vocab, d, dtype=dtype), randn(g, 2, d, dtype=dtype), randn(g, max_len, d, dtype=dtype))
    return Case(name, (ids, segments, *tables), hidden=hidden)


def _embedding_cases() -> list[Case]:
    return [
        _embedding_case("4 pairs, 7 positions, d_model 8", 901, 4, 7, 20, 8, 24),
        _embedding_case("2 single sentences (all segment 0)", 902, 2, 5, 9, 6, 10, single=True),
        _embedding_case("float64 tables", 903, 3, 6, 11, 4, 12, dtype=torch.float64, hidden=True),
        _embedding_case("sequence as long as the position table", 904, 3, 9, 9, 5, 9, hidden=True),
        _embedding_case("one token", 905, 1, 1, 5, 3, 6, hidden=True),
        _embedding_case("3 pairs, 16 positions, d_model 32", 906, 3, 16, 16, 32, 20, hidden=True),
    ]


def _emb_no_segments(ids, segment_ids, token_table, segment_table, position_table):
    return token_table[ids] + position_table[:ids.shape[1]]


def _emb_positions_by_id(ids, segment_ids, token_table, segment_table, position_table):
    return token_table[ids] + segment_table[segment_ids] + position_table[ids]


def _emb_scaled(ids, segment_ids, token_table, segment_table, position_table):
    d = token_table.shape[-1]
    return token_table[ids] * math.sqrt(d) + segment_table[segment_ids] + position_table[:ids.shape[1]]


def _emb_positions_per_sentence(ids, segment_ids, token_table, segment_table, position_table):
    seq = ids.shape[1]
    positions = torch.arange(seq).expand_as(ids).clone()  # [batch, seq]
    for b in range(ids.shape[0]):
        in_b = (segment_ids[b] == 1).nonzero()
        if len(in_b):
            start = int(in_b[0])
            positions[b, start:] -= start  # sentence B numbered from 0 again
    return token_table[ids] + segment_table[segment_ids] + position_table[positions]


def _emb_concatenated(ids, segment_ids, token_table, segment_table, position_table):
    positions = position_table[:ids.shape[1]].expand(ids.shape[0], -1, -1)
    return torch.cat([token_table[ids], segment_table[segment_ids], positions], dim=-1)


def _rows_equal(a, i, j):
    return torch.allclose(a[i].double(), a[j].double(), rtol=1e-5, atol=1e-6)


def _segments_ignored(case, expected, actual):
    ids, segments = case.args[0], case.args[1]
    if not (_tensor(actual) and actual.shape == expected.shape):
        return False
    for i in range(ids.shape[0]):
        for j in range(i + 1, ids.shape[0]):
            if torch.equal(ids[i], ids[j]) and not torch.equal(segments[i], segments[j]):
                if not _rows_equal(expected, i, j) and _rows_equal(actual, i, j):
                    return True
    return False


def _same_vector_at_two_positions(case, expected, actual):
    ids, segments = case.args[0], case.args[1]
    if not (_tensor(actual) and actual.shape == expected.shape):
        return False
    for b in range(ids.shape[0]):
        for t in range(ids.shape[1] - 1):
            for u in range(t + 1, ids.shape[1]):
                if ids[b, t] == ids[b, u] and segments[b, t] == segments[b, u]:
                    e_same = torch.allclose(expected[b, t].double(), expected[b, u].double())
                    a_same = torch.allclose(actual[b, t].double(), actual[b, u].double(), rtol=1e-5, atol=1e-6)
                    if a_same and not e_same:
                        return True
    return False


def _three_times_wider(case, expected, actual):
    return _tensor(actual) and actual.dim() == 3 and actual.shape[-1] == 3 * expected.shape[-1]


SEGMENTS_IGNORED = Property(
    "the same vectors whatever the segment ids (two inputs that differ only in their segments come out equal)",
    "Add segment_table[segment_ids]: it is how the model tells sentence A (0) from sentence B (1).",
    _segments_ignored,
)
SAME_VECTOR_AT_TWO_POSITIONS = Property(
    "one token at two positions getting the same vector: no position was added, or it was looked up by the "
    "token id",
    "Add position_table[t] at position t = 0, 1, ..., seq - 1 (the first seq rows), the same for every sentence "
    "of the batch.",
    _same_vector_at_two_positions,
)
THREE_TIMES_WIDER = Property(
    "vectors three times too wide: the three embeddings were concatenated",
    "Add the three [batch, seq, d_model] tensors; BERT sums its embeddings (concatenating would change d_model).",
    _three_times_wider,
)

check_embedding_sum = Checker(
    name="embedding_sum",
    reference=embedding_sum,
    make_cases=_embedding_cases,
    mistakes=[
        Mistake(
            "the segment embedding left out",
            "Add segment_table[segment_ids] too: token + segment + position.",
            _emb_no_segments,
        ),
        Mistake(
            "positions looked up by the token ids (position_table[ids])",
            "The position is where the token stands, not what it is: add position_table[:seq], one row per "
            "position 0..seq-1 (broadcast over the batch).",
            _emb_positions_by_id,
        ),
        Mistake(
            "token embeddings multiplied by sqrt(d_model), as in the original Transformer",
            "BERT does not scale its embeddings: add the three lookups as they are (a LayerNorm follows the sum).",
            _emb_scaled,
        ),
        Mistake(
            "positions restarting at 0 in sentence B",
            "Positions run through the whole input: [CLS] is 0 and sentence B carries on where A ends; the "
            "segment embedding is what tells the sentences apart.",
            _emb_positions_per_sentence,
        ),
        Mistake(
            "the three embeddings concatenated instead of summed",
            "Sum them: token_table[ids] + segment_table[segment_ids] + position_table[:seq] keeps d_model.",
            _emb_concatenated,
        ),
    ],
    properties=[SEGMENTS_IGNORED, SAME_VECTOR_AT_TWO_POSITIONS, THREE_TIMES_WIDER],
)


# ---------------------------------------------------------------------------------------
# Exercise 3: nsp_pairs(documents, n_pairs, seed) -> [(a, b, label), ...]
# ---------------------------------------------------------------------------------------


def _documents(sizes) -> list[list[list[str]]]:
    """Documents of sentences that name where they stand ("d2", "s1"): every sentence is unique, so an
    output pair can be traced back to its documents."""
    return [[[f"d{d}", f"s{i}"] for i in range(n)] for d, n in enumerate(sizes)]


def _nsp_cases() -> list[Case]:
    return [
        Case("6 documents of 3 sentences, 200 pairs", (_documents([3] * 6), 200, 1)),
        Case("documents of 2 to 5 sentences, 300 pairs", (_documents([2, 5, 3, 4, 2, 5, 3]), 300, 7)),
        Case("2 documents of 2 sentences, 40 pairs", (_documents([2, 2]), 40, 3)),
        Case("40 documents of 3 sentences, 500 pairs", (_documents([3] * 40), 500, 11), hidden=True),
        Case("one pair", (_documents([4, 3, 2]), 1, 5), hidden=True),
        Case("3 long documents (8 sentences), 250 pairs", (_documents([8, 8, 8]), 250, 13), hidden=True),
        Case("no pairs", (_documents([3, 3]), 0, 2), hidden=True),
    ]


def _invoke_nsp(fn, case: Case):
    # A slip that uses the random module's own functions must give the same pairs on every run, so
    # that it can be recognised: seed the module, and leave its state as it was found.
    state = random.getstate()
    try:
        random.seed(case.args[2] + 1000)
        return fn(*case.args)
    finally:
        random.setstate(state)


def _pairs(documents, n_pairs, seed, *, labels_swapped=False, coin_inverted=False, any_document=False,
           module_random=False, reseeded=False):
    """nsp_pairs with knobs that reproduce common slips, drawing in the reference's order."""
    rng = random if module_random else random.Random(seed)
    pairs = []
    for _ in range(n_pairs):
        if reseeded:  # a new generator for every pair: the same pair every time
            rng = random.Random(seed)
        d = rng.randrange(len(documents))
        i = rng.randrange(len(documents[d]) - 1)
        is_next = rng.random() < 0.5
        if coin_inverted:
            is_next = not is_next
        if is_next:
            b, label = documents[d][i + 1], 0
        else:
            if any_document:
                other = rng.choice(documents)
            else:
                other = documents[rng.choice([j for j in range(len(documents)) if j != d])]
            b, label = rng.choice(other), 1
        pairs.append((documents[d][i], b, 1 - label if labels_swapped else label))
    return pairs


def _np_labels_swapped(documents, n_pairs, seed):
    return _pairs(documents, n_pairs, seed, labels_swapped=True)


def _np_coin_inverted(documents, n_pairs, seed):
    return _pairs(documents, n_pairs, seed, coin_inverted=True)


def _np_any_document(documents, n_pairs, seed):
    return _pairs(documents, n_pairs, seed, any_document=True)


def _np_module_random(documents, n_pairs, seed):
    return _pairs(documents, n_pairs, seed, module_random=True)


def _np_reseeded(documents, n_pairs, seed):
    return _pairs(documents, n_pairs, seed, reseeded=True)


def _where(documents):
    """Sentence (as a tuple) -> (document, index)."""
    return {tuple(s): (d, i) for d, document in enumerate(documents) for i, s in enumerate(document)}


def _traced(case, actual):
    """[(doc of a, index of a, doc of b, index of b, label)], or None when the output cannot be read so."""
    documents = case.args[0]
    if not isinstance(actual, (list, tuple)):
        return None
    where, out = _where(documents), []
    for pair in actual:
        if not (isinstance(pair, (list, tuple)) and len(pair) == 3 and isinstance(pair[0], (list, tuple))
                and isinstance(pair[1], (list, tuple))):
            return None
        a, b = where.get(tuple(pair[0])), where.get(tuple(pair[1]))
        if a is None or b is None:
            return None
        out.append((*a, *b, pair[2]))
    return out


def _np_isnext_not_next(case, expected, actual):
    traced = _traced(case, actual)
    return traced is not None and any(label == 0 and (db, ib) != (da, ia + 1) for da, ia, db, ib, label in traced)


def _np_notnext_same_document(case, expected, actual):
    traced = _traced(case, actual)
    return traced is not None and any(label == 1 and db == da for da, ia, db, ib, label in traced)


def _np_a_last(case, expected, actual):
    traced = _traced(case, actual)
    documents = case.args[0]
    return traced is not None and any(ia == len(documents[da]) - 1 for da, ia, _, _, _ in traced)


def _np_share_far(case, expected, actual):
    traced = _traced(case, actual)
    if traced is None or len(traced) < 100:
        return False
    return abs(sum(label == 0 for *_, label in traced) / len(traced) - 0.5) > 0.15


def _np_all_the_same(case, expected, actual):
    traced = _traced(case, actual)
    return traced is not None and len(traced) >= 10 and len(set(traced)) == 1


def _np_wrong_count(case, expected, actual):
    return isinstance(actual, (list, tuple)) and len(actual) != case.args[1]


NP_ISNEXT_NOT_NEXT = Property(
    "an IsNext pair (label 0) whose B is not the sentence right after A in A's document",
    "For label 0, B is documents[d][i + 1]: the next sentence of the same document.",
    _np_isnext_not_next,
)
NP_NOTNEXT_SAME_DOCUMENT = Property(
    "a NotNext pair (label 1) whose B comes from A's own document",
    "Draw the other document among the documents other than A's (a list of the indices j != d), then a "
    "sentence of it.",
    _np_notnext_same_document,
)
NP_A_LAST = Property(
    "an A that is the last sentence of its document (it has no next sentence)",
    "Draw A's index among all but the last sentence: randrange(len(document) - 1).",
    _np_a_last,
)
NP_SHARE_FAR = Property(
    "a share of IsNext pairs far from one half",
    "Flip a fair coin for every pair: rng.random() < 0.5 gives IsNext (label 0), the rest NotNext (label 1).",
    _np_share_far,
)
NP_ALL_THE_SAME = Property(
    "every pair the same: the generator was created (and seeded) anew for each pair",
    "Create random.Random(seed) once, before the loop, and draw every number from it.",
    _np_all_the_same,
)
NP_WRONG_COUNT = Property(
    "a number of pairs other than n_pairs",
    "Return a list of exactly n_pairs tuples (a, b, label).",
    _np_wrong_count,
)

check_nsp_pairs = Checker(
    name="nsp_pairs",
    reference=nsp_pairs,
    make_cases=_nsp_cases,
    invoke=_invoke_nsp,
    mistakes=[
        Mistake(
            "the labels swapped: 1 for IsNext and 0 for NotNext",
            "BERT's convention here: label 0 is IsNext (B follows A), label 1 is NotNext (B is a random sentence).",
            _np_labels_swapped,
        ),
        Mistake(
            "the coin read the other way round: random() < 0.5 makes a NotNext pair",
            "Below 0.5 is IsNext (B = the next sentence, label 0), from 0.5 on NotNext: the draws then match the "
            "reference's.",
            _np_coin_inverted,
        ),
        Mistake(
            "the NotNext document drawn among all the documents, A's own included (B can then be A's real next "
            "sentence, labelled NotNext)",
            "Draw it among the other documents only: rng.choice of the indices j != d.",
            _np_any_document,
        ),
        Mistake(
            "the random module's functions instead of random.Random(seed): the pairs do not depend on the seed",
            "Make one generator, rng = random.Random(seed), and call rng.randrange, rng.random and rng.choice.",
            _np_module_random,
        ),
        Mistake(
            "a new random.Random(seed) for every pair: every pair is the same",
            "Create the generator once, before the loop.",
            _np_reseeded,
        ),
    ],
    properties=[NP_WRONG_COUNT, NP_ISNEXT_NOT_NEXT, NP_NOTNEXT_SAME_DOCUMENT, NP_A_LAST, NP_SHARE_FAR, NP_ALL_THE_SAME],
)


# ---------------------------------------------------------------------------------------
# Exercise 4: mask_tokens(ids, special_ids, mask_id, vocab_size, generator, p=0.15)
#             -> (inputs, labels)
# ---------------------------------------------------------------------------------------


def _bert_batch(seed, batch, seq, vocab, cls_id, sep_id, pad_id, mask_id, first_word, full=False):
    """[CLS] A [SEP] B [SEP] [PAD]... rows of random words (ids first_word..vocab-1 that are not special).
    full=True: every row fills the whole length, so the batch holds no [PAD]."""
    g = seeded(seed)
    words = [i for i in range(first_word, vocab) if i not in (cls_id, sep_id, pad_id, mask_id)]
    ids = torch.full((batch, seq), pad_id, dtype=torch.long)
    for b in range(batch):
        n = seq if full else int(torch.randint(seq // 2, seq + 1, (1,), generator=g))
        row = [words[int(i)] for i in torch.randint(len(words), (n,), generator=g)]
        row[0], row[-1] = cls_id, sep_id
        if n > 4:
            row[int(torch.randint(2, n - 2, (1,), generator=g))] = sep_id
        ids[b, :n] = torch.tensor(row)
    return ids


def _mask_case(name, seed, batch, seq, vocab, mask_id=3, specials=(1, 2, 0), first_word=4, p=0.15, full=False,
               hidden=False):
    cls_id, sep_id, pad_id = specials
    ids = _bert_batch(seed, batch, seq, vocab, cls_id, sep_id, pad_id, mask_id, first_word, full)
    return Case(name, (ids, [pad_id, cls_id, sep_id, mask_id], mask_id, vocab), {"seed": seed + 1, "p": p},
                hidden=hidden)


def _mask_cases() -> list[Case]:
    plain = torch.randint(4, 12, (16, 50), generator=seeded(930))  # 8 words: a special id would often be drawn
    return [
        _mask_case("8 BERT inputs ([PAD] 0, [CLS] 1, [SEP] 2, [MASK] 3), vocabulary 60", 910, 8, 40, 60),
        _mask_case("p = 0.3", 912, 6, 32, 50, p=0.3),
        Case("a batch with no special token in it (the vocabulary's special ids 0 to 3 still exist)",
             (plain, [0, 1, 2, 3], 3, 12), {"seed": 931, "p": 0.15}),
        _mask_case("16 inputs of 64 tokens, vocabulary 100", 914, 16, 64, 100, hidden=True),
        _mask_case("special ids at the top of the vocabulary ([MASK] 96, [CLS] 97, [SEP] 98, [PAD] 99)", 916, 10, 30,
                   100, mask_id=96, specials=(97, 98, 99), first_word=0, hidden=True),
        _mask_case("every input full length: no [PAD] in the batch", 922, 12, 24, 40, full=True, hidden=True),
        _mask_case("one input of 12 tokens", 918, 1, 12, 40, hidden=True),
        _mask_case("p = 0.5", 920, 12, 48, 80, p=0.5, hidden=True),
    ]


def _invoke_mask(fn, case: Case):
    generator = torch.Generator().manual_seed(case.kwargs["seed"])
    return fn(*case.args, generator, p=case.kwargs["p"])


def _special_positions(ids, special_ids):
    return torch.isin(ids, torch.as_tensor(list(special_ids), dtype=ids.dtype))


def _corrupt(ids, special_ids, mask_id, vocab_size, generator, p, *, exclude_special=True, always_mask=False,
             whole_vocab=False, batch_specials_only=False, mask_id_only=False, labels_everywhere=False,
             labels_from_inputs=False, labels_inverted=False):
    """mask_tokens with knobs that reproduce common slips, drawing the same random numbers in the same order."""
    special = _special_positions(ids, special_ids)
    selected = torch.rand(ids.shape, generator=generator) < p
    if exclude_special:
        selected &= ~special
    action = torch.rand(ids.shape, generator=generator)
    to_mask = selected & ((action < 0.8) | always_mask)
    to_random = selected & (action >= 0.8) & (action < 0.9) & (not always_mask)
    allowed = torch.ones(vocab_size, dtype=torch.bool)
    if batch_specials_only:  # the special ids that happen to occur in this batch
        allowed[ids[special]] = False
    elif not mask_id_only:
        allowed[list(special_ids)] = False
    allowed[mask_id] = False
    candidates = allowed.nonzero().squeeze(-1)
    if whole_vocab:
        random_ids = torch.randint(vocab_size, ids.shape, generator=generator)
    else:
        random_ids = candidates[torch.randint(len(candidates), ids.shape, generator=generator)]
    inputs = torch.where(to_mask, torch.full_like(ids, mask_id), ids)
    inputs = torch.where(to_random, random_ids, inputs)
    if labels_everywhere:
        labels = ids.clone()
    elif labels_from_inputs:
        labels = inputs.masked_fill(~selected, IGNORE_INDEX)
    elif labels_inverted:
        labels = ids.masked_fill(selected, IGNORE_INDEX)
    else:
        labels = ids.masked_fill(~selected, IGNORE_INDEX)
    return inputs, labels


def _mt_specials_selected(ids, special_ids, mask_id, vocab_size, generator, p=0.15):
    return _corrupt(ids, special_ids, mask_id, vocab_size, generator, p, exclude_special=False)


def _mt_always_mask(ids, special_ids, mask_id, vocab_size, generator, p=0.15):
    return _corrupt(ids, special_ids, mask_id, vocab_size, generator, p, always_mask=True)


def _mt_labels_everywhere(ids, special_ids, mask_id, vocab_size, generator, p=0.15):
    return _corrupt(ids, special_ids, mask_id, vocab_size, generator, p, labels_everywhere=True)


def _mt_whole_vocab(ids, special_ids, mask_id, vocab_size, generator, p=0.15):
    return _corrupt(ids, special_ids, mask_id, vocab_size, generator, p, whole_vocab=True)


def _mt_batch_specials_only(ids, special_ids, mask_id, vocab_size, generator, p=0.15):
    return _corrupt(ids, special_ids, mask_id, vocab_size, generator, p, batch_specials_only=True)


def _mt_mask_id_only(ids, special_ids, mask_id, vocab_size, generator, p=0.15):
    return _corrupt(ids, special_ids, mask_id, vocab_size, generator, p, mask_id_only=True)


def _mt_labels_from_inputs(ids, special_ids, mask_id, vocab_size, generator, p=0.15):
    return _corrupt(ids, special_ids, mask_id, vocab_size, generator, p, labels_from_inputs=True)


def _mt_labels_inverted(ids, special_ids, mask_id, vocab_size, generator, p=0.15):
    return _corrupt(ids, special_ids, mask_id, vocab_size, generator, p, labels_inverted=True)


def _pair_out(actual):
    """(inputs, labels) of a learner's output, or None when it is not two integer tensors of one shape."""
    if not (isinstance(actual, (tuple, list)) and len(actual) == 2 and all(_tensor(t) for t in actual)):
        return None
    inputs, labels = actual
    if inputs.shape != labels.shape or inputs.is_floating_point() or labels.is_floating_point():
        return None
    return inputs, labels


def _case_out(case, actual):
    """(ids, special positions, inputs, labels), or None when the output is not two tensors of the shape of ids."""
    out = _pair_out(actual)
    ids = case.args[0]
    if out is None or out[0].shape != ids.shape:
        return None
    return ids, _special_positions(ids, case.args[1]), *out


def _mt_special_touched(case, expected, actual):
    found = _case_out(case, actual)
    if found is None:
        return False
    ids, special, inputs, labels = found
    return bool(((labels != IGNORE_INDEX) & special).any() or (inputs != ids)[special].any())


def _mt_labels_on_unselected(case, expected, actual):
    found = _case_out(case, actual)
    if found is None:
        return False
    _, special, _, labels = found
    unselected = (expected[1] == IGNORE_INDEX) & ~special  # the reference's -100 on ordinary tokens
    if not unselected.any():
        return False
    return bool((labels[unselected] != IGNORE_INDEX).float().mean() > 0.5)


def _mt_fraction_far(case, expected, actual):
    found = _case_out(case, actual)
    if found is None:
        return False
    _, special, _, labels = found
    n = int((~special).sum())
    if n < 200:  # too few tokens to judge a share
        return False
    share = float(((labels != IGNORE_INDEX) & ~special).sum()) / n
    return abs(share - case.kwargs["p"]) > 0.1


def _mt_all_mask(case, expected, actual):
    found = _case_out(case, actual)
    if found is None:
        return False
    _, special, inputs, labels = found
    chosen = (labels != IGNORE_INDEX) & ~special
    if int(chosen.sum()) < 30:
        return False
    return float((inputs[chosen] == case.args[2]).float().mean()) > 0.97


def _mt_unlabelled_changed(case, expected, actual):
    found = _case_out(case, actual)
    if found is None:
        return False
    ids, special, inputs, labels = found
    return bool(((inputs != ids) & (labels == IGNORE_INDEX) & ~special).any())


def _mt_random_special(case, expected, actual):
    found = _case_out(case, actual)
    if found is None:
        return False
    _, special, inputs, _ = found
    mask_id = case.args[2]
    others = torch.tensor([i for i in case.args[1] if i != mask_id], dtype=inputs.dtype)  # [MASK] itself is no slip
    if not len(others):
        return False
    return bool((torch.isin(inputs, others) & ~special).any())


MT_SPECIAL_TOUCHED = Property(
    "special tokens ([CLS], [SEP], [PAD]) selected or changed",
    "Select only ordinary tokens: special = torch.isin(ids, torch.tensor(special_ids)), then "
    "selected = (torch.rand(...) < p) & ~special.",
    _mt_special_touched,
)
MT_LABELS_ON_UNSELECTED = Property(
    "labels that are not -100 on unselected positions",
    "labels holds the original id only where a token was selected and -100 everywhere else "
    "(ids.masked_fill(~selected, -100)), so that the loss skips the other positions.",
    _mt_labels_on_unselected,
)
MT_FRACTION_FAR = Property(
    "a selected fraction far from p (the share of ordinary tokens with a label is not about 15%)",
    "Each ordinary token is selected with probability p: torch.rand(ids.shape, generator=generator) < p.",
    _mt_fraction_far,
)
MT_ALL_MASK = Property(
    "every selected token replaced by [MASK]: the 10% random and 10% unchanged are missing",
    "Draw a second uniform number per token: below 0.8 -> [MASK], from 0.8 to 0.9 -> a random token, "
    "from 0.9 on -> unchanged.",
    _mt_all_mask,
)
MT_UNLABELLED_CHANGED = Property(
    "inputs changed at positions that carry no label",
    "Only selected tokens may change, and every selected token has its original id as label.",
    _mt_unlabelled_changed,
)
MT_RANDOM_SPECIAL = Property(
    "a random replacement that is a special token",
    "Draw random tokens among the ordinary ids only: candidates leaves out mask_id and every id of special_ids, "
    "whether or not it occurs in the batch.",
    _mt_random_special,
)

check_mask_tokens = Checker(
    name="mask_tokens",
    reference=mask_tokens,
    make_cases=_mask_cases,
    invoke=_invoke_mask,
    mistakes=[
        Mistake(
            "special tokens can be selected: [CLS], [SEP] and [PAD] get masked and predicted",
            "Exclude them: special = torch.isin(ids, torch.tensor(special_ids)), then "
            "selected = (torch.rand(ids.shape, generator=generator) < p) & ~special.",
            _mt_specials_selected,
        ),
        Mistake(
            "every selected token replaced by [MASK] (the 80/10/10 rule left out)",
            "Of the selected tokens, 80% become [MASK], 10% a random token and 10% stay as they are: "
            "use the second uniform draw, action < 0.8 and 0.8 <= action < 0.9.",
            _mt_always_mask,
        ),
        Mistake(
            "labels kept at every position (no -100 on the unselected ones): the loss would count every token",
            "labels = ids.masked_fill(~selected, -100): only the selected positions are predicted.",
            _mt_labels_everywhere,
        ),
        Mistake(
            "random replacements drawn from the whole vocabulary, special ids included",
            "Draw among the allowed ids only: candidates[torch.randint(len(candidates), ids.shape, "
            "generator=generator)], where candidates leaves out mask_id and every id of special_ids.",
            _mt_whole_vocab,
        ),
        Mistake(
            "random candidates that leave out only the special ids found in the batch (ids[special]): a batch "
            "without padding can receive [PAD] as a random token",
            "The candidates are a property of the vocabulary, not of the batch: allowed[special_ids] = False and "
            "allowed[mask_id] = False, whatever ids holds.",
            _mt_batch_specials_only,
        ),
        Mistake(
            "random candidates that leave out mask_id but not the other special ids ([PAD], [CLS], [SEP])",
            "Leave out every id of special_ids as well: allowed[special_ids] = False.",
            _mt_mask_id_only,
        ),
        Mistake(
            "labels taken from the corrupted inputs instead of the original ids",
            "The model must recover the original token: labels come from ids, not from the inputs after "
            "[MASK] and random replacement.",
            _mt_labels_from_inputs,
        ),
        Mistake(
            "labels inverted: -100 on the selected positions and the ids everywhere else",
            "labels = ids.masked_fill(~selected, -100): keep the id where selected is True.",
            _mt_labels_inverted,
        ),
    ],
    properties=[MT_SPECIAL_TOUCHED, MT_LABELS_ON_UNSELECTED, MT_FRACTION_FAR, MT_ALL_MASK, MT_UNLABELLED_CHANGED,
                MT_RANDOM_SPECIAL],
)


# ---------------------------------------------------------------------------------------
# Exercise 5: pretrain_step(model, batch, vocab, mask_tokens, generator, optimizer, scheduler,
#             max_grad_norm) -> (mlm_loss, nsp_loss)
# ---------------------------------------------------------------------------------------


class _Vocab:
    """What pretrain_step reads of a vocabulary: its special ids, [MASK]'s id and its size."""

    def __init__(self, size, pad_id, cls_id, sep_id, mask_id):
        self.size, self.pad_id, self.cls_id, self.sep_id, self.mask_id = size, pad_id, cls_id, sep_id, mask_id

    @property
    def special_ids(self) -> list[int]:
        return [self.pad_id, self.cls_id, self.sep_id, self.mask_id]

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return (f"a vocabulary of {self.size} ([PAD] {self.pad_id}, [CLS] {self.cls_id}, [SEP] {self.sep_id}, "
                f"[MASK] {self.mask_id})")


@dataclass(frozen=True)
class PretrainingRun:
    """Two pre-training steps of a tiny BertForPreTraining (float64, so every CPU computes alike)."""

    seed: int
    optimizer: str = "sgd"  # "sgd" (with momentum) or "adamw"
    max_norm: float = 0.05
    vocab_size: int = 24
    specials: tuple = (0, 1, 2, 3)  # [PAD], [CLS], [SEP], [MASK]
    batch: int = 8
    seq: int = 16

    def vocab(self) -> _Vocab:
        return _Vocab(self.vocab_size, *self.specials)

    def __repr__(self) -> str:
        return (f"two {self.optimizer} steps of a 1-layer BERT (d_model 16), batches [{self.batch}, {self.seq}], "
                f"{self.vocab()!r}, max_grad_norm={self.max_norm}")


def _sum_of_embeddings(ids, segment_ids, token_table, segment_table, position_table):
    # The checker's own copy of the sum: while grading, the library's embedding_sum is hidden.
    return token_table[ids] + segment_table[segment_ids] + position_table[:ids.shape[1]]


def _tiny_bert(run: PretrainingRun) -> BertForPreTraining:
    config = BertConfig(vocab_size=run.vocab_size, max_len=run.seq, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                        dropout=0.0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(run.seed)
        model = BertForPreTraining(config)
    model.bert.embeddings.combine = _sum_of_embeddings
    return model.double()


def _pretraining_batches(run: PretrainingRun) -> list[tuple]:
    """Two batches (ids, segment_ids, padding_mask, nsp_labels) of [CLS] A [SEP] B [SEP] [PAD]... rows."""
    pad_id, cls_id, sep_id, mask_id = run.specials
    batches = []
    for k in range(2):
        ids = _bert_batch(run.seed + 10 * k + 1, run.batch, run.seq, run.vocab_size, cls_id, sep_id, pad_id, mask_id,
                          first_word=0)
        first_sep = (ids == sep_id).long().cumsum(dim=1)  # [batch, seq]: 0 before A's [SEP], 1 up to it, 2 after
        segments = ((first_sep >= 1) & ~((first_sep == 1) & (ids == sep_id)) & (ids != pad_id)).long()
        nsp = torch.randint(0, 2, (run.batch,), generator=seeded(run.seed + 10 * k + 2))
        batches.append((ids, segments, ids != pad_id, nsp))
    return batches


def _masking(ids, special_ids, mask_id, vocab_size, generator=None, p=0.15):
    """The checker's own copy of mask_tokens (the same draws in the same order), handed to pretrain_step:
    while grading, the library's mask_tokens is hidden."""
    if isinstance(special_ids, torch.Tensor) and special_ids.dtype == torch.bool:
        raise ValueError("special_ids is the list of the special tokens' ids (vocab.special_ids), not a boolean mask")
    return _corrupt(ids, [int(i) for i in special_ids], mask_id, vocab_size, generator, p)


def _training_objects(run: PretrainingRun):
    model = _tiny_bert(run)
    if run.optimizer == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.9)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
    # The rate changes at every step, so a scheduler stepped too early or not at all shows.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (1 + step))
    return model, optimizer, scheduler


def _digest(model) -> dict:
    # Every parameter by name, so that a step that leaves some of them behind names them.
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _invoke_pretrain_step(fn, case: Case):
    run = case.args[0]
    model, optimizer, scheduler = _training_objects(run)
    generator = torch.Generator().manual_seed(run.seed + 200)
    out = {}
    # Checkers run under no_grad; a training step needs gradients. The global generator is seeded (and
    # restored after) so that a step that forgets to pass `generator` is reproducible, and recognised.
    with torch.enable_grad(), torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        torch.manual_seed(run.seed + 300)
        warnings.filterwarnings("ignore", message=re.escape("Detected call of `lr_scheduler.step()` before"))
        for step, batch in enumerate(_pretraining_batches(run), start=1):
            losses = fn(model, batch, run.vocab(), _masking, generator, optimizer, scheduler, run.max_norm)
            if isinstance(losses, (tuple, list)):
                losses = tuple(x.detach() if isinstance(x, torch.Tensor) else x for x in losses)
            out[f"losses of step {step} (MLM, NSP)"] = losses
            out[f"parameters after step {step}"] = _digest(model)
    out["learning rate after step 2"] = optimizer.param_groups[0]["lr"]
    return out


def _pretrain_cases() -> list[Case]:
    return [
        Case("two SGD steps", (PretrainingRun(1),)),
        Case("two SGD steps, another model and data, clipping at 0.02", (PretrainingRun(2, max_norm=0.02),)),
        Case("two AdamW steps", (PretrainingRun(3, "adamw", max_norm=0.05),), hidden=True),
        Case("special ids at the top of the vocabulary", (PretrainingRun(4, specials=(23, 20, 21, 22)),), hidden=True),
        Case("two SGD steps, longer inputs", (PretrainingRun(5, batch=6, seq=24, max_norm=0.03),), hidden=True),
    ]


def _pretrain(model, batch, vocab, mask_tokens, generator, optimizer, scheduler, max_norm, *, zero_grad=True,
              every_position=False, nsp_in_backward=True, clip=True, step_before_backward=False, specials=True,
              feed_original=False, pass_generator=True, pass_padding=True, scheduler_order="after"):
    """pretrain_step with knobs that reproduce common slips."""
    ids, segments, padding, nsp_labels = batch
    inputs, labels = mask_tokens(ids, vocab.special_ids if specials else [], vocab.mask_id, len(vocab),
                                 generator if pass_generator else None)
    mlm_logits, nsp_logits = model(ids if feed_original else inputs, segments, padding if pass_padding else None)
    targets = ids if every_position else labels
    mlm = F.cross_entropy(mlm_logits.reshape(-1, mlm_logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX)
    nsp = F.cross_entropy(nsp_logits, nsp_labels)
    if zero_grad:
        optimizer.zero_grad()
    if step_before_backward:
        optimizer.step()
    (mlm + nsp if nsp_in_backward else mlm).backward()
    if clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if scheduler_order == "before":
        scheduler.step()
    if not step_before_backward:
        optimizer.step()
    if scheduler_order == "after":
        scheduler.step()
    return mlm.item(), nsp.item()


def _ps_no_zero_grad(*args):
    return _pretrain(*args, zero_grad=False)


def _ps_every_position(*args):
    return _pretrain(*args, every_position=True)


def _ps_nsp_left_out(*args):
    return _pretrain(*args, nsp_in_backward=False)


def _ps_no_clip(*args):
    return _pretrain(*args, clip=False)


def _ps_step_before_backward(*args):
    return _pretrain(*args, step_before_backward=True)


def _ps_specials(*args):
    return _pretrain(*args, specials=False)


def _ps_original_ids(*args):
    return _pretrain(*args, feed_original=True)


def _ps_no_generator(*args):
    return _pretrain(*args, pass_generator=False)


def _ps_no_padding(*args):
    return _pretrain(*args, pass_padding=False)


def _ps_no_scheduler(*args):
    return _pretrain(*args, scheduler_order="none")


def _ps_scheduler_first(*args):
    return _pretrain(*args, scheduler_order="before")


def _ps_unchanged(case, actual) -> set[str]:
    """Names of the parameters that are, after two steps, exactly what the model started with."""
    initial = _digest(_tiny_bert(case.args[0]))
    after = actual["parameters after step 2"]
    return {name for name in initial if torch.equal(initial[name], after[name])}


def _ps_never_moved(case, expected, actual):
    return _ps_unchanged(case, actual) == set(_digest(_tiny_bert(case.args[0])))


def _ps_nsp_head_still(case, expected, actual):
    left_behind = _ps_unchanged(case, actual) - _ps_unchanged(case, expected)  # the reference moves them all
    return "nsp.weight" in left_behind and not _ps_never_moved(case, expected, actual)


def _ps_others_still(case, expected, actual):
    left_behind = _ps_unchanged(case, actual) - _ps_unchanged(case, expected)
    heads = {"nsp.weight", "nsp.bias", "bert.pooler.dense.weight", "bert.pooler.dense.bias"}
    return bool(left_behind - heads) and not _ps_never_moved(case, expected, actual)


def _ps_update_too_long(case, expected, actual):
    run = case.args[0]
    if run.optimizer != "sgd":  # with SGD, the first update is lr (1.0) times the clipped gradient
        return False
    initial = _digest(_tiny_bert(run))
    after = actual["parameters after step 1"]
    length = math.sqrt(sum(float(((after[name] - initial[name]).double() ** 2).sum()) for name in initial))
    return length > run.max_norm * (1 + 1e-6)


def _ps_same(expected, actual, key) -> bool:
    return describe_difference(expected[key], actual[key]) is None


def _ps_losses_right_update_wrong(case, expected, actual):
    return (_ps_same(expected, actual, "losses of step 1 (MLM, NSP)")
            and not _ps_same(expected, actual, "parameters after step 1"))


def _ps_losses_not_fresh(case, expected, actual):
    # The reference's step-1 losses are a fresh forward pass of the initial model on the batch the step
    # corrupted; with the update right, the returned numbers should be those.
    return (_ps_same(expected, actual, "parameters after step 1")
            and not _ps_same(expected, actual, "losses of step 1 (MLM, NSP)"))


def _ps_first_right_second_wrong(case, expected, actual):
    first = all(_ps_same(expected, actual, key) for key in ("losses of step 1 (MLM, NSP)", "parameters after step 1"))
    return first and not _ps_same(expected, actual, "parameters after step 2")


PS_NEVER_MOVED = Property(
    "weights that never moved in two steps: the optimizer stepped before any gradient existed",
    "Back-propagate first, then step: loss.backward() makes the gradients that optimizer.step() uses (and "
    "zero_grad() clears them, so it must come before backward()).",
    _ps_never_moved,
)
PS_NSP_HEAD_STILL = Property(
    "an NSP head (nsp.weight, nsp.bias) that never moved while the rest of the model did: the NSP loss is not in "
    "the backward pass",
    "Back-propagate the sum of the two losses, MLM + NSP.",
    _ps_nsp_head_still,
)
PS_OTHERS_STILL = Property(
    "parameters that never moved while the reference moves them all",
    "Back-propagate the loss of a forward pass through the whole model, with gradients on (no torch.no_grad(), "
    "no .detach() on the way).",
    _ps_others_still,
)
PS_UPDATE_TOO_LONG = Property(
    "a first update longer than the clipping allows (with SGD at lr 1.0 it should be at most max_grad_norm)",
    "Clip after backward() and before optimizer.step(): torch.nn.utils.clip_grad_norm_(model.parameters(), "
    "max_grad_norm).",
    _ps_update_too_long,
)
PS_LOSSES_RIGHT_UPDATE_WRONG = Property(
    "the right losses but the wrong update: the corruption, the forward pass and the losses are right, what "
    "follows them is not",
    "After the losses: zero_grad, backward on MLM + NSP, clip the gradient norm, optimizer.step(), "
    "scheduler.step(), in that order.",
    _ps_losses_right_update_wrong,
)
PS_LOSSES_NOT_FRESH = Property(
    "returned losses that do not match a fresh forward pass (the update is right, the numbers returned are not "
    "this batch's MLM and NSP losses before the step)",
    "Return (mlm_loss.item(), nsp_loss.item()), MLM first, from the forward pass you back-propagated.",
    _ps_losses_not_fresh,
)
PS_FIRST_RIGHT_SECOND_WRONG = Property(
    "a first step that matches and a second that does not: something carries over from one step to the next",
    "Clear the gradients at every step (optimizer.zero_grad()), and step the scheduler once per step, after "
    "optimizer.step().",
    _ps_first_right_second_wrong,
)

check_pretrain_step = Checker(
    name="pretrain_step",
    reference=pretrain_step,
    make_cases=_pretrain_cases,
    invoke=_invoke_pretrain_step,
    mistakes=[
        Mistake(
            "no optimizer.zero_grad(): the second step's gradients are added to the first step's",
            "PyTorch accumulates gradients in .grad: call optimizer.zero_grad() in every step, before backward().",
            _ps_no_zero_grad,
        ),
        Mistake(
            "the gradient not clipped, or clipped after optimizer.step() (too late: the step has used it)",
            "Clip between backward() and optimizer.step(): torch.nn.utils.clip_grad_norm_(model.parameters(), "
            "max_grad_norm).",
            _ps_no_clip,
        ),
        Mistake(
            "optimizer.step() before loss.backward(): the step finds no gradient, and the weights never move",
            "zero_grad, backward, clip, then step.",
            _ps_step_before_backward,
        ),
        Mistake(
            "the NSP loss left out of the backward pass (only the MLM loss back-propagated)",
            "BERT's pre-training loss is the sum of both: back-propagate mlm_loss + nsp_loss.",
            _ps_nsp_left_out,
        ),
        Mistake(
            "the MLM loss taken at every position against the original ids, instead of at the selected positions",
            "Use the labels mask_tokens returns (-100 where nothing was selected) with "
            "F.cross_entropy(..., ignore_index=-100): only the selected positions count.",
            _ps_every_position,
        ),
        Mistake(
            "the model run on the original ids instead of the corrupted ones: it sees every answer",
            "Feed the inputs mask_tokens returns to the model; the original ids only appear in the labels.",
            _ps_original_ids,
        ),
        Mistake(
            "mask_tokens given no special ids: [CLS], [SEP] and [PAD] can be selected, masked and predicted",
            "Pass vocab.special_ids (and vocab.mask_id, len(vocab)) to mask_tokens.",
            _ps_specials,
        ),
        Mistake(
            "mask_tokens called without the generator: the corruption comes from the global random state",
            "Pass the step's generator to mask_tokens, so that a seeded run gives the same masks.",
            _ps_no_generator,
        ),
        Mistake(
            "the padding mask not passed to the model: every position attends to the [PAD]s",
            "Call model(inputs, segment_ids, padding_mask).",
            _ps_no_padding,
        ),
        Mistake(
            "the scheduler never stepped: the learning rate stays at its first value",
            "Call scheduler.step() once per step, after optimizer.step().",
            _ps_no_scheduler,
        ),
        Mistake(
            "scheduler.step() called before optimizer.step(): every step uses the next step's learning rate",
            "Step the optimizer first, then the scheduler.",
            _ps_scheduler_first,
        ),
    ],
    properties=[PS_NEVER_MOVED, PS_NSP_HEAD_STILL, PS_OTHERS_STILL, PS_UPDATE_TOO_LONG, PS_LOSSES_RIGHT_UPDATE_WRONG,
                PS_LOSSES_NOT_FRESH, PS_FIRST_RIGHT_SECOND_WRONG],
)



# ---------------------------------------------------------------------------------------
# Exercise 6: classify_from_cls(hidden, pooler, classifier) -> logits [batch, n_classes]
# ---------------------------------------------------------------------------------------

_CALL_THE_DENSE = ("calling pooler(hidden) runs the library's own pooler: read the [CLS] state yourself, then use "
                   "pooler.dense and torch.tanh")
ERROR_MESSAGES = (_CALL_THE_DENSE,)  # raised in the learner's process: translated at judging


class _ExercisePooler(BertPooler):
    """The library's pooler with its forward sealed, so that an answer must use pooler.dense."""

    def forward(self, hidden):
        raise RuntimeError(_CALL_THE_DENSE)


def _cls_case(name, seed, batch, seq, d, n_classes, dtype=torch.float32, hidden=False):
    g = seeded(seed)
    states = randn(g, batch, seq, d, dtype=dtype)
    if batch >= 4 and seq >= 2:
        states[1, 0] = states[0, 0]  # rows 0 and 1: the same [CLS] state, different words
        states[3, 1:] = states[2, 1:]  # rows 2 and 3: the same words, different [CLS] states
    return Case(name, (states,), {"seed": seed + 1, "n_classes": n_classes}, hidden=hidden)


def _cls_cases() -> list[Case]:
    return [
        _cls_case("4 inputs of 6 positions, d_model 16, 3 classes", 950, 4, 6, 16, 3),
        _cls_case("2 inputs of 3 positions, 2 classes", 951, 2, 3, 8, 2),
        _cls_case("float64, 5 inputs of 9 positions", 952, 5, 9, 8, 2, dtype=torch.float64, hidden=True),
        _cls_case("as many inputs as positions (6 and 6)", 953, 6, 6, 12, 4, hidden=True),
        _cls_case("one input of one position ([CLS] alone)", 954, 1, 1, 4, 3, hidden=True),
    ]


def _invoke_cls(fn, case: Case):
    hidden = case.args[0]
    d, dtype = hidden.shape[-1], hidden.dtype
    with torch.random.fork_rng(devices=[]):  # the modules' own initialisation must not move the caller's RNG
        pooler = _ExercisePooler(d)
        classifier = torch.nn.Linear(d, case.kwargs["n_classes"])
    g = seeded(case.kwargs["seed"])
    for module in (pooler, classifier):
        for p in module.parameters():
            p.data.copy_(randn(g, *p.shape, dtype=torch.float64) / math.sqrt(d))
    return fn(hidden, pooler.to(dtype), classifier.to(dtype))


def _cl_mean(hidden, pooler, classifier):
    return classifier(torch.tanh(pooler.dense(hidden.mean(dim=1))))


def _cl_last(hidden, pooler, classifier):
    return classifier(torch.tanh(pooler.dense(hidden[:, -1])))


def _cl_batch_axis(hidden, pooler, classifier):
    return classifier(torch.tanh(pooler.dense(hidden[0])))


def _cl_no_tanh(hidden, pooler, classifier):
    return classifier(pooler.dense(hidden[:, 0]))


def _cl_no_pooler(hidden, pooler, classifier):
    return classifier(hidden[:, 0])


def _cl_reads_other_positions(case, expected, actual):
    hidden = case.args[0]
    if not (_tensor(actual) and actual.shape == expected.shape):
        return False
    for i in range(hidden.shape[0]):
        for j in range(i + 1, hidden.shape[0]):
            if torch.equal(hidden[i, 0], hidden[j, 0]) and not torch.equal(hidden[i], hidden[j]):
                if not _rows_equal(actual, i, j):
                    return True
    return False


def _cl_ignores_cls(case, expected, actual):
    hidden = case.args[0]
    if not (_tensor(actual) and actual.shape == expected.shape):
        return False
    for i in range(hidden.shape[0]):
        for j in range(i + 1, hidden.shape[0]):
            if torch.equal(hidden[i, 1:], hidden[j, 1:]) and not torch.equal(hidden[i, 0], hidden[j, 0]):
                if _rows_equal(actual, i, j) and not _rows_equal(expected, i, j):
                    return True
    return False


def _cl_batch_axis_shape(case, expected, actual):
    batch, seq = case.args[0].shape[:2]
    return _tensor(actual) and actual.dim() == 2 and batch != seq and actual.shape[0] == seq


CL_READS_OTHER_POSITIONS = Property(
    "logits that depend on positions other than [CLS] (two inputs with the same [CLS] state get different logits)",
    "Read only position 0 of every input: hidden[:, 0] is [batch, d_model].",
    _cl_reads_other_positions,
)
CL_IGNORES_CLS = Property(
    "logits that ignore the [CLS] state (two inputs that differ only at [CLS] get the same logits)",
    "The sentence vector is the final state of [CLS], at position 0: hidden[:, 0].",
    _cl_ignores_cls,
)
CL_BATCH_AXIS = Property(
    "one row of logits per position instead of one per input: the batch axis was indexed",
    "hidden is [batch, seq, d_model]: position 0 of every input is hidden[:, 0], not hidden[0].",
    _cl_batch_axis_shape,
)

check_classify_from_cls = Checker(
    name="classify_from_cls",
    reference=classify_from_cls,
    make_cases=_cls_cases,
    invoke=_invoke_cls,
    rtol=1e-4,
    atol=1e-5,
    mistakes=[
        Mistake(
            "the mean over all positions instead of the [CLS] state",
            "BERT's sentence vector is the state of [CLS] alone: hidden[:, 0].",
            _cl_mean,
        ),
        Mistake(
            "the last position instead of [CLS] (in a padded batch often a [PAD])",
            "[CLS] is the first token: hidden[:, 0], not hidden[:, -1].",
            _cl_last,
        ),
        Mistake(
            "hidden[0]: the first input's states (one row per position) instead of position 0 of every input",
            "Index the position axis: hidden[:, 0] is [batch, d_model].",
            _cl_batch_axis,
        ),
        Mistake(
            "the tanh of the pooler left out",
            "The pooler is a dense layer followed by tanh: torch.tanh(pooler.dense(cls_state)).",
            _cl_no_tanh,
        ),
        Mistake(
            "the pooler skipped: the classifier applied to the raw [CLS] state",
            "Pass the [CLS] state through pooler.dense and tanh first, then the classifier.",
            _cl_no_pooler,
        ),
    ],
    properties=[CL_READS_OTHER_POSITIONS, CL_IGNORES_CLS, CL_BATCH_AXIS],
)


# ---------------------------------------------------------------------------------------
# Exercise 7: best_span(start_logits, end_logits, passage_mask, max_answer_len) -> (start, end)
# ---------------------------------------------------------------------------------------


def _passage(batch, seq, g, min_start=2):
    """[CLS] question [SEP] passage [SEP] [PAD]...: one stretch of True per row."""
    mask = torch.zeros(batch, seq, dtype=torch.bool)
    for b in range(batch):
        lo = int(torch.randint(min_start, max(min_start + 1, seq // 3), (1,), generator=g))
        hi = int(torch.randint(lo + 2, seq, (1,), generator=g))
        mask[b, lo:hi] = True
    return mask


def _span_case(name, seed, batch, seq, max_len, dtype=torch.float32, hidden=False):
    g = seeded(seed)
    start, end = randn(g, batch, seq, dtype=dtype, scale=2.0), randn(g, batch, seq, dtype=dtype, scale=2.0)
    return Case(name, (start, end, _passage(batch, seq, g), max_len), hidden=hidden)


def _constructed_cases():
    """Rows built so that each rule decides the answer somewhere."""
    seq = 10
    passage = torch.zeros(4, seq, dtype=torch.bool)
    passage[:, 3:9] = True  # [CLS] q q [SEP] p p p p p p [SEP]
    start = torch.zeros(4, seq)
    end = torch.zeros(4, seq)
    start[0, 7], end[0, 4] = 5.0, 5.0  # the best start comes after the best end
    start[0, 5], end[0, 6] = 3.0, 3.0
    start[1, 1], end[1, 2] = 9.0, 9.0  # the highest scores sit in the question
    start[1, 4], end[1, 5] = 2.0, 2.0
    start[2, 3], end[2, 8] = 6.0, 6.0  # a long span (6 tokens) beats a short one
    start[2, 6], end[2, 6] = 4.0, 4.0
    start[3, 5], end[3, 5] = 4.0, 4.0  # a one-token answer is the best
    start[3, 4], end[3, 7] = 1.0, 1.0
    return start, end, passage


def _span_cases() -> list[Case]:
    start, end, passage = _constructed_cases()
    return [
        _span_case("6 questions, 14 positions, answers up to 3 tokens", 960, 6, 14, 3),
        Case("4 constructed rows, answers up to 4 tokens", (start, end, passage, 4)),
        Case("the same rows, answers up to 5 tokens", (start, end, passage, 5)),
        _span_case("32 questions, one-token answers", 961, 32, 25, 1, hidden=True),
        _span_case("16 questions, no effective length limit", 962, 16, 20, 30, hidden=True),
        _span_case("float64, 8 questions, answers up to 4 tokens", 963, 8, 12, 4, dtype=torch.float64, hidden=True),
        Case("4 constructed rows, answers up to 6 tokens", (start, end, passage, 6), hidden=True),
        _span_case("40 questions, answers up to 2 tokens", 964, 40, 16, 2, hidden=True),
    ]


def _search(start, end, passage, allowed_fn):
    """argmax of start[s] + end[e] over the (s, e) with allowed_fn(s, e, passage_row) True, row by row."""
    batch, seq = start.shape
    s_out, e_out = torch.zeros(batch, dtype=torch.long), torch.zeros(batch, dtype=torch.long)
    for b in range(batch):
        best = None
        for s in range(seq):
            for e in range(seq):
                if allowed_fn(s, e, passage[b]):
                    score = float(start[b, s] + end[b, e])
                    if best is None or score > best[0]:
                        best = (score, s, e)
        if best is not None:  # no allowed pair: (0, 0), what an argmax over all -inf gives
            s_out[b], e_out[b] = best[1], best[2]
    return s_out, e_out


def _bs_separate(start, end, passage, max_answer_len):
    return start.argmax(dim=1), end.argmax(dim=1)


def _bs_separate_in_passage(start, end, passage, max_answer_len):
    low = torch.finfo(start.dtype).min
    return start.masked_fill(~passage, low).argmax(dim=1), end.masked_fill(~passage, low).argmax(dim=1)


def _bs_outside_passage(start, end, passage, max_answer_len):
    return _search(start, end, passage, lambda s, e, p: s <= e < s + max_answer_len)


def _bs_no_length_limit(start, end, passage, max_answer_len):
    return _search(start, end, passage, lambda s, e, p: s <= e and bool(p[s]) and bool(p[e]))


def _bs_one_too_long(start, end, passage, max_answer_len):
    return _search(start, end, passage, lambda s, e, p: s <= e <= s + max_answer_len and bool(p[s]) and bool(p[e]))


def _bs_strict(start, end, passage, max_answer_len):
    return _search(start, end, passage, lambda s, e, p: s < e < s + max_answer_len and bool(p[s]) and bool(p[e]))


def _span_out(actual, batch):
    if not (isinstance(actual, (tuple, list)) and len(actual) == 2 and all(_tensor(t) for t in actual)):
        return None
    s, e = actual
    if s.shape != (batch,) or e.shape != (batch,) or s.is_floating_point() or e.is_floating_point():
        return None
    return s.long(), e.long()


def _bs_start_after_end(case, expected, actual):
    out = _span_out(actual, case.args[0].shape[0])
    return out is not None and bool((out[0] > out[1]).any())


def _bs_outside(case, expected, actual):
    passage = case.args[2]
    out = _span_out(actual, passage.shape[0])
    if out is None:
        return False
    s, e = out
    seq = passage.shape[1]
    if ((s < 0) | (s >= seq) | (e < 0) | (e >= seq)).any():
        return True
    rows = torch.arange(passage.shape[0])
    return bool((~passage[rows, s] | ~passage[rows, e]).any())


def _bs_too_long(case, expected, actual):
    out = _span_out(actual, case.args[0].shape[0])
    return out is not None and bool((out[1] - out[0] + 1 > case.args[3]).any())


def _bs_not_the_best(case, expected, actual):
    start, end, passage, max_len = case.args
    out = _span_out(actual, start.shape[0])
    if out is None:
        return False
    s, e = out
    seq, rows = start.shape[1], torch.arange(start.shape[0])
    if ((s < 0) | (s >= seq) | (e < 0) | (e >= seq)).any():
        return False
    valid = (s <= e) & (e - s + 1 <= max_len) & passage[rows, s] & passage[rows, e]
    score = start[rows, s] + end[rows, e]
    best = start[rows, expected[0]] + end[rows, expected[1]]
    return bool((valid & (score < best - 1e-6)).any())


BS_START_AFTER_END = Property(
    "a span that ends before it starts",
    "Score pairs, not positions: only (s, e) with s <= e are allowed, so take the best sum start[s] + end[e] "
    "over those pairs instead of two separate argmaxes.",
    _bs_start_after_end,
)
BS_OUTSIDE = Property(
    "a span outside the passage (in the question, on [CLS], [SEP] or padding)",
    "Allow only pairs whose start and end are both passage tokens: passage_mask[s] and passage_mask[e].",
    _bs_outside,
)
BS_TOO_LONG = Property(
    "a span longer than max_answer_len",
    "Allow only e - s + 1 <= max_answer_len, i.e. e < s + max_answer_len.",
    _bs_too_long,
)
BS_NOT_THE_BEST = Property(
    "an allowed span, but not the highest-scoring one",
    "Among all allowed pairs (s <= e, length limit, both in the passage) return the one with the largest "
    "start_logits[s] + end_logits[e].",
    _bs_not_the_best,
)

check_best_span = Checker(
    name="best_span",
    reference=best_span,
    make_cases=_span_cases,
    mistakes=[
        Mistake(
            "start and end chosen separately (two argmaxes), anywhere in the input",
            "Score every pair: scores[s, e] = start[s] + end[e]; keep s <= e, the length limit and the passage; "
            "take the best pair.",
            _bs_separate,
        ),
        Mistake(
            "start and end chosen separately within the passage: the end can come before the start",
            "Choose the pair, not each end alone: the best start[s] + end[e] with s <= e.",
            _bs_separate_in_passage,
        ),
        Mistake(
            "spans allowed outside the passage (the question, [CLS] or [SEP] can be the answer)",
            "Keep only pairs with passage_mask[s] and passage_mask[e] both True.",
            _bs_outside_passage,
        ),
        Mistake(
            "no maximum answer length",
            "Keep only spans of at most max_answer_len tokens: e - s + 1 <= max_answer_len.",
            _bs_no_length_limit,
        ),
        Mistake(
            "one token too long allowed (e - s <= max_answer_len)",
            "A span from s to e (inclusive) has e - s + 1 tokens: allow e - s + 1 <= max_answer_len.",
            _bs_one_too_long,
        ),
        Mistake(
            "one-token answers excluded (s < e instead of s <= e)",
            "An answer may be a single token: allow e == s.",
            _bs_strict,
        ),
    ],
    properties=[BS_START_AFTER_END, BS_OUTSIDE, BS_TOO_LONG, BS_NOT_THE_BEST],
)


CHECKERS = [check_build_pair_inputs, check_embedding_sum, check_nsp_pairs, check_mask_tokens, check_pretrain_step,
            check_classify_from_cls, check_best_span]
