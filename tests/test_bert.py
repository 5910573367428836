"""BERT: equal to Hugging Face's BertForPreTraining, the 80/10/10 corruption, pair inputs, best_span."""

import os

import pytest
import torch

from transformer_lib.bert import (
    Bert,
    BertConfig,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    best_span,
    bert_config_from_hf,
    build_pair_inputs,
    load_hf_bert_state_dict,
    mask_tokens,
    pretrain_step,
    pretraining_loss,
    special_tokens_mask,
)

os.environ["HF_HUB_OFFLINE"] = "1"  # never download anything: models are built from configs

PAD, CLS, SEP, MASK = 0, 1, 2, 3
SMALL = BertConfig(vocab_size=99, max_len=40, d_model=32, n_heads=2, n_layers=2, d_ff=64, dropout=0.0)


@pytest.fixture(scope="module")
def hf_pair():
    """Hugging Face BertForPreTraining with every weight random (seeded), and our copy of it."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    hf_config = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                        intermediate_size=64, max_position_embeddings=40,
                                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    hf = transformers.BertForPreTraining(hf_config).eval()
    with torch.no_grad():
        for p in hf.parameters():  # LayerNorms and biases random too, so a swapped name shows
            p.normal_(0.0, 0.2)
    ours = load_hf_bert_state_dict(BertForPreTraining(bert_config_from_hf(hf_config)), hf.state_dict()).eval()
    return hf, ours


def pair_batch():
    gen = torch.Generator().manual_seed(1)
    rows = [build_pair_inputs(torch.randint(4, 99, (n_a,), generator=gen).tolist(),
                              torch.randint(4, 99, (n_b,), generator=gen).tolist(), 40, CLS, SEP, PAD)
            for n_a, n_b in [(10, 12), (30, 25), (3, 4)]]
    return [torch.stack(t) for t in zip(*rows)]  # ids, segments, padding: [3, 40] each


# ---------------------------------------------------------------------------------------
# Equivalence with Hugging Face BERT
# ---------------------------------------------------------------------------------------

def test_mlm_and_nsp_logits_equal_hugging_face(hf_pair):
    hf, ours = hf_pair
    ids, segments, padding = pair_batch()
    assert not padding.all() and segments.any()  # the batch really has padding and two segments
    with torch.no_grad():
        expected = hf(input_ids=ids, token_type_ids=segments, attention_mask=padding.long())
        mlm, nsp = ours(ids, segments, padding)
    # Padded positions too: both models hide padded keys only, never padded queries.
    diff_mlm = (mlm - expected.prediction_logits).abs().max().item()
    assert mlm.shape == (3, 40, 99) and diff_mlm < 1e-5, diff_mlm
    assert nsp.shape == (3, 2) and torch.allclose(nsp, expected.seq_relationship_logits, atol=1e-5, rtol=0)


def test_no_mask_means_every_token_is_attended(hf_pair):
    hf, ours = hf_pair
    ids = torch.randint(0, 99, (2, 17), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = hf(input_ids=ids)
        mlm, nsp = ours(ids)
    assert torch.allclose(mlm, expected.prediction_logits, atol=1e-5, rtol=0)
    assert torch.allclose(nsp, expected.seq_relationship_logits, atol=1e-5, rtol=0)


def test_the_trunk_loads_a_bert_model_state_dict_and_ties_the_decoder(hf_pair):
    hf, ours = hf_pair
    trunk = load_hf_bert_state_dict(Bert(SMALL), hf.bert.state_dict()).eval()
    ids = torch.randint(0, 99, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        hidden, pooled = trunk(ids)
        expected = hf.bert(input_ids=ids)
    assert torch.allclose(hidden, expected.last_hidden_state, atol=1e-5, rtol=0)
    assert torch.allclose(pooled, expected.pooler_output, atol=1e-5, rtol=0)
    assert ours.mlm.decoder.weight is ours.bert.embeddings.token.weight
    with pytest.raises(KeyError, match="expected a Hugging Face BERT state dict with n_layers=3"):
        load_hf_bert_state_dict(Bert(BertConfig(vocab_size=99, max_len=40, d_model=32, n_heads=2, n_layers=3,
                                                d_ff=64)), hf.state_dict())
    with pytest.raises(TypeError, match="loads into Bert or BertForPreTraining"):
        load_hf_bert_state_dict(torch.nn.Linear(2, 2), hf.state_dict())
    with pytest.raises(ValueError, match="more layers"):
        load_hf_bert_state_dict(Bert(BertConfig(vocab_size=99, max_len=40, d_model=32, n_heads=2, n_layers=1,
                                                d_ff=64)), hf.state_dict())


def test_padding_changes_nothing_for_the_real_tokens():
    torch.manual_seed(4)
    model = Bert(SMALL).eval()
    a, b = [5, 6, 7, 8], [9, 10]
    short = build_pair_inputs(a, b, 9, CLS, SEP, PAD)
    long = build_pair_inputs(a, b, 30, CLS, SEP, PAD)
    with torch.no_grad():
        h_short, p_short = model(*(t[None] for t in short))
        h_long, p_long = model(*(t[None] for t in long))
    assert torch.allclose(h_short, h_long[:, :9], atol=1e-5) and torch.allclose(p_short, p_long, atol=1e-5)


# ---------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------

def test_build_pair_inputs_layout():
    ids, segments, padding = build_pair_inputs([11, 12, 13], [21, 22], 10, CLS, SEP, PAD)
    assert ids.tolist() == [CLS, 11, 12, 13, SEP, 21, 22, SEP, PAD, PAD]
    assert segments.tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 0, 0]
    assert padding.tolist() == [True] * 8 + [False] * 2
    assert ids.dtype == segments.dtype == torch.long and padding.dtype == torch.bool
    ids, segments, padding = build_pair_inputs([11, 12, 13], None, 6, CLS, SEP, PAD)
    assert ids.tolist() == [CLS, 11, 12, 13, SEP, PAD] and not segments.any()


@pytest.mark.parametrize("n_a,n_b,max_len", [(20, 3, 12), (3, 20, 12), (10, 10, 12), (9, 10, 13), (50, 60, 8),
                                             (0, 30, 6), (1, 1, 3)])
def test_truncation_is_longest_first_and_keeps_both_seps(n_a, n_b, max_len):
    a, b = list(range(100, 100 + n_a)), list(range(200, 200 + n_b))
    ids, segments, padding = build_pair_inputs(a, b, max_len, CLS, SEP, PAD)
    ids = ids.tolist()
    assert len(ids) == max_len and ids[0] == CLS and ids.count(SEP) == 2
    first_sep = ids.index(SEP)
    second_sep = first_sep + 1 + ids[first_sep + 1:].index(SEP)
    kept_a, kept_b = ids[1:first_sep], ids[first_sep + 1:second_sep]
    assert kept_a == a[:len(kept_a)] and kept_b == b[:len(kept_b)]  # cut from the ends only
    assert len(kept_a) + len(kept_b) == min(n_a + n_b, max_len - 3)
    if n_a + n_b > max_len - 3:
        # Longest first: the shorter one is untouched, or both end within one token of each other.
        assert len(kept_a) == n_a or len(kept_b) == n_b or abs(len(kept_a) - len(kept_b)) <= 1
        shorter_untouched = min(n_a, n_b) <= (max_len - 3) // 2
        if shorter_untouched:
            assert (len(kept_a) == n_a) if n_a <= n_b else (len(kept_b) == n_b)
    with pytest.raises(ValueError, match="max_len must be an int >= 3"):
        build_pair_inputs(a, b, 2, CLS, SEP, PAD)


def test_truncation_ties_cut_b_as_hugging_face_does():
    ids, _, _ = build_pair_inputs([1] * 5, [7] * 5, 3 + 9, 8, 9, 0)
    assert ids.tolist().count(1) == 5 and ids.tolist().count(7) == 4


# ---------------------------------------------------------------------------------------
# MLM corruption
# ---------------------------------------------------------------------------------------

def test_mask_tokens_statistics_on_a_large_sample():
    vocab = 1000
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(10, vocab, (400, 512), generator=gen)
    ids[:, 0], ids[:, 200], ids[:, 400:] = CLS, SEP, PAD  # specials: never selected
    special = special_tokens_mask(ids, [CLS, SEP, PAD])
    # ids 4..9 stand for more special tokens ([UNK]...) that this batch never holds
    inputs, labels = mask_tokens(ids, range(10), MASK, vocab, torch.Generator().manual_seed(6))
    selected = labels != -100
    share = selected.sum().item() / (~special).sum().item()
    assert abs(share - 0.15) < 0.01, share
    assert torch.equal(labels[selected], ids[selected]) and not selected[special].any()
    masked = (inputs == MASK) & selected
    unchanged = (inputs == ids) & selected
    randomised = selected & ~masked & ~unchanged
    n = selected.sum().item()
    for count, expected in ((masked, 0.8), (randomised, 0.1), (unchanged, 0.1)):
        assert abs(count.sum().item() / n - expected) < 0.02, (count.sum().item() / n, expected)
    assert torch.equal(inputs[~selected], ids[~selected])  # nothing else is touched
    # A random replacement is never a special token: not [MASK], [CLS], [SEP], [PAD], nor ids 4..9.
    assert (inputs[randomised] >= 10).all()
    # Random replacements cover the vocabulary (uniform over the allowed ids).
    assert len(set(inputs[randomised].tolist())) > 900


def test_a_batch_without_padding_never_receives_a_special_token():
    """The random candidates come from the vocabulary, not from the batch: a batch that holds no [PAD]
    (and here no [CLS] or [SEP] either) still never gets [PAD], [CLS], [SEP] or [MASK] as a random
    token, and the 80/10/10 split is unchanged."""
    vocab = 12  # 4 special ids and 8 words: a special id would be drawn often if it were allowed
    ids = torch.randint(4, vocab, (500, 200), generator=torch.Generator().manual_seed(11))
    for batch in (ids, torch.cat([torch.full((500, 1), CLS), ids, torch.full((500, 1), SEP)], dim=1)):
        inputs, labels = mask_tokens(batch, [PAD, CLS, SEP, MASK], MASK, vocab, torch.Generator().manual_seed(12))
        selected = labels != -100
        masked = (inputs == MASK) & selected
        randomised = selected & ~masked & (inputs != batch)
        ordinary = batch >= 4
        assert not torch.isin(inputs[ordinary & ~masked], torch.tensor([PAD, CLS, SEP, MASK])).any()
        assert torch.equal(inputs[~ordinary], batch[~ordinary])  # [CLS] and [SEP] stay as they are
        assert set(inputs[randomised].tolist()) == set(range(4, vocab))  # every word, and only words
        n = selected.sum().item()
        assert abs(n / ordinary.sum().item() - 0.15) < 0.01
        # Of the random draws, 1/8 land on the original word: unchanged 0.1 + 0.1/8, random 0.1 * 7/8.
        unchanged = selected & (inputs == batch)
        for count, expected in ((masked, 0.8), (randomised, 0.1 * 7 / 8), (unchanged, 0.1 + 0.1 / 8)):
            assert abs(count.sum().item() / n - expected) < 0.01, (count.sum().item() / n, expected)


def test_mask_tokens_is_reproducible_and_uses_only_the_generator():
    ids = torch.randint(4, 50, (4, 30), generator=torch.Generator().manual_seed(7))
    one = mask_tokens(ids, [PAD, CLS, SEP, MASK], MASK, 50, torch.Generator().manual_seed(8))
    torch.manual_seed(123)  # the global generator plays no part
    two = mask_tokens(ids, [PAD, CLS, SEP, MASK], MASK, 50, torch.Generator().manual_seed(8))
    assert all(torch.equal(x, y) for x, y in zip(one, two))
    with pytest.raises(ValueError, match="not a boolean mask"):
        mask_tokens(ids, ids == PAD, MASK, 50)
    with pytest.raises(ValueError, match="must be ids of the vocabulary"):
        mask_tokens(ids, [PAD, CLS, SEP, 60], MASK, 50)


def test_pretraining_runs_and_learns_on_one_batch():
    torch.manual_seed(9)
    model = BertForPreTraining(SMALL)
    ids, segments, padding = pair_batch()
    inputs, labels = mask_tokens(ids, [PAD, CLS, SEP, MASK], MASK, 99, torch.Generator().manual_seed(10), p=0.3)
    nsp_labels = torch.tensor([0, 1, 0])
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = pretraining_loss(*model(inputs, segments, padding), labels, nsp_labels)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_pretrain_step_with_dynamic_masking_learns():
    """pretrain_step corrupts the batch anew at every step (RoBERTa's dynamic masking) and still learns it."""

    class Vocab:
        special_ids, mask_id = [PAD, CLS, SEP, MASK], MASK

        def __len__(self):
            return SMALL.vocab_size

    torch.manual_seed(9)
    model = BertForPreTraining(SMALL)
    ids, segments, padding = pair_batch()
    batch = (ids, segments, padding, torch.tensor([0, 1, 0]))
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(10)
    losses = [sum(pretrain_step(model, batch, Vocab(), mask_tokens, g, optimiser, max_grad_norm=1.0))
              for _ in range(40)]
    assert sum(losses[-5:]) < 0.75 * sum(losses[:5]), losses


# ---------------------------------------------------------------------------------------
# Fine-tuning heads
# ---------------------------------------------------------------------------------------

def test_fine_tuning_heads_shapes_and_what_they_read():
    torch.manual_seed(11)
    ids, segments, padding = pair_batch()
    cls_model = BertForSequenceClassification(SMALL, n_classes=3).eval()
    tok_model = BertForTokenClassification(SMALL, n_labels=5).eval()
    qa_model = BertForQuestionAnswering(SMALL).eval()
    with torch.no_grad():
        assert cls_model(ids, segments, padding).shape == (3, 3)
        assert tok_model(ids, segments, padding).shape == (3, 40, 5)
        start, end = qa_model(ids, segments, padding)
    assert start.shape == end.shape == (3, 40)
    # The sentence classifier reads the pooled [CLS] state only.
    with torch.no_grad():
        _, pooled = cls_model.bert(ids, segments, padding)
        assert torch.allclose(cls_model(ids, segments, padding), cls_model.classifier(pooled))


def brute_force_span(start, end, passage, max_len):
    best, best_score = None, float("-inf")
    for s in range(len(start)):
        for e in range(s, min(s + max_len, len(start))):
            if passage[s] and passage[e] and start[s] + end[e] > best_score:
                best, best_score = (s, e), start[s] + end[e]
    return best


def test_best_span_obeys_the_rules_and_finds_the_maximum():
    gen = torch.Generator().manual_seed(12)
    start, end = torch.randn(64, 25, generator=gen), torch.randn(64, 25, generator=gen)
    passage = torch.zeros(64, 25, dtype=torch.bool)
    for row in range(64):  # [CLS] question [SEP] passage [SEP] pad: the passage is one stretch
        lo = 2 + row % 6
        passage[row, lo:lo + 5 + row % 13] = True
    for max_len in (1, 3, 30):
        s, e = best_span(start, end, passage, max_len)
        assert (s <= e).all() and (e - s + 1 <= max_len).all()
        assert passage[torch.arange(64), s].all() and passage[torch.arange(64), e].all()
        for row in range(64):
            assert (s[row].item(), e[row].item()) == brute_force_span(start[row], end[row], passage[row], max_len)
    # The separate argmaxes would give an end before the start; best_span does not.
    s, e = best_span(torch.tensor([[0.0, 0.0, 9.0]]), torch.tensor([[0.0, 9.0, 0.0]]), torch.ones(1, 3, dtype=torch.bool), 5)
    assert s.item() <= e.item()
    with pytest.raises(ValueError, match="at least one passage token"):
        best_span(start[:1], end[:1], torch.zeros(1, 25, dtype=torch.bool), 3)
