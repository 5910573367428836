"""Chapter 09's checkers diagnose combined mistakes by property, and accept right answers
written another way.

tests/test_checkers.py proves that each catalogued mistake is named when it is made alone.
Learners often make two at once (a [SEP] lost to truncation *and* an inverted padding mask,
special tokens masked *and* the 80/10/10 rule left out, gradients never cleared *and* never
clipped): then no catalogue entry matches, and the properties must still name each error from a
trait of the output."""

import math
import random

import pytest
import torch
import torch.nn.functional as F

from transformer_lib.checks import ch09


def _verdict(checker, fn, hidden=True):
    return checker.judge(checker.collect_outputs(fn, hidden), hidden)


# ------------------------------------------------------------------- combined mistakes


def pair_cut_after_assembly_and_inverted(a, b, max_len, cls_id, sep_id, pad_id):
    ids, segments, padding = ch09._pair_cut_after_assembly(a, b, max_len, cls_id, sep_id, pad_id)
    return ids, segments, ~padding


def pair_from_front_and_pad_segment_one(a, b, max_len, cls_id, sep_id, pad_id):
    ids, segments, padding = ch09._pair_cut_from_front(a, b, max_len, cls_id, sep_id, pad_id)
    return ids, torch.where(padding, segments, torch.ones_like(segments) * (b is not None)), padding


def pair_without_padding_and_first_sep_in_b(a, b, max_len, cls_id, sep_id, pad_id):
    ids, segments, padding = ch09._pair_first_sep_in_b(a, b, max_len, cls_id, sep_id, pad_id)
    return ids[padding], segments[padding], padding[padding]


def emb_no_segments_and_scaled(ids, segment_ids, token_table, segment_table, position_table):
    return token_table[ids] * math.sqrt(token_table.shape[-1]) + position_table[:ids.shape[1]]


def emb_positions_by_id_and_scaled(ids, segment_ids, token_table, segment_table, position_table):
    return token_table[ids] * 2 + segment_table[segment_ids] + position_table[ids]


def emb_concatenated_by_id(ids, segment_ids, token_table, segment_table, position_table):
    return torch.cat([token_table[ids], segment_table[segment_ids], position_table[ids]], dim=-1)


def mt_specials_and_always_mask(ids, special_ids, mask_id, vocab_size, generator, p=0.15):
    return ch09._corrupt(ids, special_ids, mask_id, vocab_size, generator, p, exclude_special=False,
                         always_mask=True)


def mt_labels_everywhere_and_whole_vocab(ids, special_ids, mask_id, vocab_size, generator, p=0.15):
    return ch09._corrupt(ids, special_ids, mask_id, vocab_size, generator, p, labels_everywhere=True,
                         whole_vocab=True)


def mt_keep_share_and_labels_from_inputs(ids, special_ids, mask_id, vocab_size, generator, p=0.15):
    # p read as the share to keep: 85% of the tokens selected.
    return ch09._corrupt(ids, special_ids, mask_id, vocab_size, generator, 1 - p, labels_from_inputs=True)


def mt_batch_candidates_and_labels_from_inputs(ids, special_ids, mask_id, vocab_size, generator, p=0.15):
    # Random candidates from the batch's special ids only, and the labels read after the corruption.
    return ch09._corrupt(ids, special_ids, mask_id, vocab_size, generator, p, batch_specials_only=True,
                         labels_from_inputs=True)


def np_labels_swapped_any_document(documents, n_pairs, seed):
    return ch09._pairs(documents, n_pairs, seed, labels_swapped=True, any_document=True)


def np_reseeded_coin_inverted(documents, n_pairs, seed):
    return ch09._pairs(documents, n_pairs, seed, reseeded=True, coin_inverted=True)


def np_a_can_be_last(documents, n_pairs, seed):
    # A drawn among every sentence; when it is the last, its "next" sentence is itself.
    rng = random.Random(seed)
    pairs = []
    for _ in range(n_pairs):
        d = rng.randrange(len(documents))
        i = rng.randrange(len(documents[d]))
        if rng.random() < 0.5:
            pairs.append((documents[d][i], documents[d][min(i + 1, len(documents[d]) - 1)], 0))
        else:
            other = rng.choice([j for j in range(len(documents)) if j != d])
            pairs.append((documents[d][i], rng.choice(documents[other]), 1))
    return pairs


def np_biased_coin_module_random(documents, n_pairs, seed):
    pairs = []
    for _ in range(n_pairs):
        d = random.randrange(len(documents))
        i = random.randrange(len(documents[d]) - 1)
        if random.random() < 0.8:
            pairs.append((documents[d][i], documents[d][i + 1], 0))
        else:
            other = random.choice([j for j in range(len(documents)) if j != d])
            pairs.append((documents[d][i], random.choice(documents[other]), 1))
    return pairs


def ps_no_zero_grad_no_clip(*args):
    return ch09._pretrain(*args, zero_grad=False, clip=False)


def ps_step_first_no_scheduler(*args):
    return ch09._pretrain(*args, step_before_backward=True, scheduler_order="none")


def ps_nsp_left_out_no_clip(*args):
    return ch09._pretrain(*args, nsp_in_backward=False, clip=False)


def ps_no_zero_grad_no_scheduler(*args):
    return ch09._pretrain(*args, zero_grad=False, scheduler_order="none")


def ps_losses_swapped_no_scheduler(*args):
    mlm, nsp = ch09._pretrain(*args, scheduler_order="none")
    return nsp, mlm


def ps_encoder_frozen(model, batch, vocab, mask_tokens, generator, optimizer, scheduler, max_grad_norm):
    # The heads trained on features computed without gradients: the encoder never learns.
    ids, segments, padding, nsp_labels = batch
    inputs, labels = mask_tokens(ids, vocab.special_ids, vocab.mask_id, len(vocab), generator)
    with torch.no_grad():
        hidden, pooled = model.bert(inputs, segments, padding)
    mlm_logits, nsp_logits = model.mlm(hidden), model.nsp(pooled)
    mlm = F.cross_entropy(mlm_logits.reshape(-1, mlm_logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
    nsp = F.cross_entropy(nsp_logits, nsp_labels)
    optimizer.zero_grad()
    (mlm + nsp).backward()
    optimizer.step()  # and no clipping either
    scheduler.step()
    return mlm.item(), nsp.item()


def cl_mean_without_tanh(hidden, pooler, classifier):
    return classifier(pooler.dense(hidden.mean(dim=1)))


def cl_batch_axis_without_tanh(hidden, pooler, classifier):
    return classifier(pooler.dense(hidden[0]))


def cl_last_without_pooler(hidden, pooler, classifier):
    return classifier(hidden[:, -1])


def bs_start_in_passage_end_anywhere(start, end, passage, max_answer_len):
    s, _ = ch09._bs_separate_in_passage(start, end, passage, max_answer_len)
    return s, end.argmax(dim=1)


def bs_no_passage_no_length(start, end, passage, max_answer_len):
    return ch09._search(start, end, passage, lambda s, e, p: s <= e)


def bs_strict_and_one_too_long(start, end, passage, max_answer_len):
    return ch09._search(start, end, passage, lambda s, e, p: s < e <= s + max_answer_len and bool(p[s]) and bool(p[e]))


COMBINED = [
    (ch09.check_build_pair_inputs, pair_cut_after_assembly_and_inverted, ["a [SEP] missing", "True and False swapped"]),
    (ch09.check_build_pair_inputs, pair_from_front_and_pad_segment_one, ["lost its first tokens"]),
    (ch09.check_build_pair_inputs, pair_without_padding_and_first_sep_in_b, ["not exactly max_len long"]),
    (ch09.check_embedding_sum, emb_no_segments_and_scaled, ["whatever the segment ids"]),
    (ch09.check_embedding_sum, emb_positions_by_id_and_scaled, ["one token at two positions"]),
    (ch09.check_embedding_sum, emb_concatenated_by_id, ["three times too wide"]),
    (ch09.check_mask_tokens, mt_specials_and_always_mask, ["special tokens", "every selected token replaced"]),
    (ch09.check_mask_tokens, mt_labels_everywhere_and_whole_vocab,
     ["labels that are not -100 on unselected positions", "a selected fraction far from p"]),
    (ch09.check_mask_tokens, mt_keep_share_and_labels_from_inputs, ["a selected fraction far from p"]),
    (ch09.check_mask_tokens, mt_batch_candidates_and_labels_from_inputs,
     ["a random replacement that is a special token"]),
    (ch09.check_nsp_pairs, np_labels_swapped_any_document,
     ["whose B is not the sentence right after A", "whose B comes from A's own document"]),
    (ch09.check_nsp_pairs, np_reseeded_coin_inverted, ["every pair the same"]),
    (ch09.check_nsp_pairs, np_a_can_be_last, ["the last sentence of its document", "not the sentence right after A"]),
    (ch09.check_nsp_pairs, np_biased_coin_module_random, ["far from one half"]),
    (ch09.check_pretrain_step, ps_no_zero_grad_no_clip, ["longer than the clipping allows"]),
    (ch09.check_pretrain_step, ps_step_first_no_scheduler, ["never moved in two steps"]),
    (ch09.check_pretrain_step, ps_nsp_left_out_no_clip, ["NSP head", "longer than the clipping allows"]),
    (ch09.check_pretrain_step, ps_no_zero_grad_no_scheduler, ["a first step that matches"]),
    (ch09.check_pretrain_step, ps_losses_swapped_no_scheduler, ["do not match a fresh forward pass"]),
    (ch09.check_pretrain_step, ps_encoder_frozen, ["parameters that never moved"]),
    (ch09.check_classify_from_cls, cl_mean_without_tanh, ["depend on positions other than [CLS]"]),
    (ch09.check_classify_from_cls, cl_batch_axis_without_tanh, ["the batch axis was indexed"]),
    (ch09.check_classify_from_cls, cl_last_without_pooler,
     ["depend on positions other than [CLS]", "ignore the [CLS] state"]),
    (ch09.check_best_span, bs_start_in_passage_end_anywhere, ["ends before it starts", "outside the passage"]),
    (ch09.check_best_span, bs_no_passage_no_length, ["outside the passage", "longer than max_answer_len"]),
    (ch09.check_best_span, bs_strict_and_one_too_long, ["longer than max_answer_len"]),
]


@pytest.mark.parametrize("checker,answer,traits", COMBINED, ids=[a.__name__ for _, a, _ in COMBINED])
@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
def test_combined_mistakes_are_named_by_property(checker, answer, traits, hidden):
    verdict = _verdict(checker, answer, hidden)
    assert not verdict.passed
    assert "looks like" not in verdict.message, f"a single catalogue entry matched: {verdict.message}"
    assert verdict.mistake in {p.name for p in checker.properties}, verdict.message
    for trait in traits:
        assert trait in verdict.message, verdict.message
    assert "\n" not in verdict.message


def test_a_right_selection_with_a_wrong_replacement_is_not_called_a_wrong_fraction():
    def random_from_special(ids, special_ids, mask_id, vocab_size, generator, p=0.15):
        inputs, labels = ch09._corrupt(ids, special_ids, mask_id, vocab_size, generator, p)
        changed = (inputs != ids) & (inputs != mask_id)
        pad_id = special_ids[0]  # [PAD]: the first special id of every case
        return torch.where(changed, torch.full_like(ids, pad_id), inputs), labels  # random tokens: [PAD]

    verdict = _verdict(ch09.check_mask_tokens, random_from_special)
    assert not verdict.passed
    assert "a random replacement that is a special token" in verdict.message, verdict.message
    assert "fraction" not in verdict.message and "not -100" not in verdict.message, verdict.message


@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
def test_candidates_taken_from_the_batch_are_named(hidden):
    """The slip the library itself once had: leaving out only the special ids that occur in the batch,
    so that a batch without padding can receive [PAD] as a random token."""
    verdict = _verdict(ch09.check_mask_tokens, ch09._mt_batch_specials_only, hidden)
    assert not verdict.passed and "only the special ids found in the batch" in verdict.message, verdict.message
    assert "whatever ids holds" in verdict.message, verdict.message


# ------------------------------------------------------------------- right answers, other ways


def pair_with_slices(tokens_a, tokens_b, max_len, cls_id, sep_id, pad_id):
    n_a, n_b = len(tokens_a), (0 if tokens_b is None else len(tokens_b))
    room = max_len - (2 if tokens_b is None else 3)
    while n_a + n_b > room:  # longest first, B on a tie
        if n_a > n_b:
            n_a -= 1
        else:
            n_b -= 1
    ids = torch.full((max_len,), pad_id, dtype=torch.long)
    segments = torch.zeros(max_len, dtype=torch.long)
    body = [cls_id, *tokens_a[:n_a], sep_id]
    if tokens_b is not None:
        body += [*tokens_b[:n_b], sep_id]
        segments[n_a + 2:len(body)] = 1
    ids[:len(body)] = torch.tensor(body, dtype=torch.long)
    return ids, segments, torch.arange(max_len) < len(body)


def emb_with_f_embedding(ids, segment_ids, token_table, segment_table, position_table):
    positions = torch.arange(ids.shape[1]).unsqueeze(0)  # [1, seq]
    return (F.embedding(ids, token_table) + F.embedding(segment_ids, segment_table)
            + F.embedding(positions, position_table))


def mt_with_isin(ids, special_ids, mask_id, vocab_size, generator, p=0.15):
    special_mask = torch.isin(ids, torch.tensor(special_ids))
    chosen = torch.rand(ids.shape, generator=generator) < p
    chosen = chosen & ~special_mask
    u = torch.rand(ids.shape, generator=generator)
    forbidden = torch.tensor([*special_ids, mask_id])
    everything = torch.arange(vocab_size)
    candidates = everything[~torch.isin(everything, forbidden)]
    random_ids = candidates[torch.randint(candidates.numel(), ids.shape, generator=generator)]
    inputs = ids.clone()
    inputs[chosen & (u < 0.8)] = mask_id
    swap = chosen & (u >= 0.8) & (u < 0.9)
    inputs[swap] = random_ids[swap]
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    return inputs, labels


def mt_with_a_list_of_candidates(ids, special_ids, mask_id, vocab_size, generator, p=0.15):
    ordinary = torch.ones_like(ids, dtype=torch.bool)
    for special_id in special_ids:
        ordinary &= ids != special_id
    selected = (torch.rand(ids.shape, generator=generator) < p) & ordinary
    action = torch.rand(ids.shape, generator=generator)
    candidates = torch.tensor([i for i in range(vocab_size) if i not in special_ids and i != mask_id])
    random_ids = candidates[torch.randint(len(candidates), ids.shape, generator=generator)]
    inputs = torch.where(selected & (action < 0.8), mask_id, ids)
    inputs = torch.where(selected & (action >= 0.8) & (action < 0.9), random_ids, inputs)
    return inputs, torch.where(selected, ids, -100)


def np_other_document_by_randrange(documents, n_pairs, seed):
    rng = random.Random(seed)
    pairs = []
    while len(pairs) < n_pairs:
        d = rng.randrange(len(documents))
        document = documents[d]
        i = rng.randrange(len(document) - 1)
        if rng.random() < 0.5:
            pairs.append([document[i], document[i + 1], 0])
            continue
        other = rng.randrange(len(documents) - 1)  # skip A's own document
        if other >= d:
            other += 1
        sentences = documents[other]
        pairs.append([document[i], sentences[rng.randrange(len(sentences))], 1])
    return pairs


def ps_by_hand(model, batch, vocab, mask_tokens, generator, optimizer, scheduler, max_grad_norm):
    ids, segment_ids, padding_mask, is_random_next = batch
    model.zero_grad()
    corrupted, targets = mask_tokens(ids, vocab.special_ids, vocab.mask_id, len(vocab), generator=generator)
    token_scores, pair_scores = model(corrupted, segment_ids, padding_mask)
    chosen = targets != -100
    mlm = -token_scores[chosen].log_softmax(dim=-1).gather(1, targets[chosen][:, None]).mean()
    nsp = F.cross_entropy(pair_scores, is_random_next)
    mlm.backward(retain_graph=True)
    nsp.backward()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()
    scheduler.step()
    return [mlm.detach(), nsp.detach()]


def cl_with_index_select(hidden, pooler, classifier):
    cls_state = hidden.index_select(1, torch.tensor([0])).squeeze(1)
    return classifier(pooler.dense(cls_state).tanh())


def bs_by_loops(start, end, passage, max_answer_len):
    batch, seq = start.shape
    best_s, best_e = torch.zeros(batch, dtype=torch.long), torch.zeros(batch, dtype=torch.long)
    for b in range(batch):
        best = None
        for s in range(seq):
            for e in range(s, min(seq, s + max_answer_len)):
                if passage[b, s] and passage[b, e]:
                    score = start[b, s] + end[b, e]
                    if best is None or score > best:
                        best, best_s[b], best_e[b] = score, s, e
    return best_s, best_e


RIGHT = [
    (ch09.check_build_pair_inputs, pair_with_slices),
    (ch09.check_embedding_sum, emb_with_f_embedding),
    (ch09.check_mask_tokens, mt_with_isin),
    (ch09.check_mask_tokens, mt_with_a_list_of_candidates),
    (ch09.check_nsp_pairs, np_other_document_by_randrange),
    (ch09.check_pretrain_step, ps_by_hand),
    (ch09.check_classify_from_cls, cl_with_index_select),
    (ch09.check_best_span, bs_by_loops),
]


@pytest.mark.parametrize("checker,answer", RIGHT, ids=[a.__name__ for _, a in RIGHT])
def test_right_answers_written_differently_pass(checker, answer):
    verdict = _verdict(checker, answer)
    assert verdict.passed, verdict.message


def test_the_pooler_itself_is_refused():
    verdict = _verdict(ch09.check_classify_from_cls, lambda hidden, pooler, classifier: classifier(pooler(hidden)))
    assert not verdict.passed and "pooler.dense" in verdict.message, verdict.message


def test_chapter_has_seven_exercises_each_with_three_mistakes_and_properties():
    assert [c.name for c in ch09.CHECKERS] == ["build_pair_inputs", "embedding_sum", "nsp_pairs", "mask_tokens",
                                               "pretrain_step", "classify_from_cls", "best_span"]
    for checker in ch09.CHECKERS:
        assert len(checker.mistakes) >= 3, checker.name
        assert checker.properties, checker.name
