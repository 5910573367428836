"""Chapter 09's library pieces: the apple data for BERT's tasks, and the functions the chapter's
exercises plug into the model (embedding_sum, mlm_loss, pretrain_step, classify_from_cls)."""

import math

import pytest
import torch
import torch.nn.functional as F

from transformer_lib.bert import (
    SENSES,
    TAGS,
    Bert,
    BertConfig,
    BertForPreTraining,
    BertForSequenceClassification,
    apple_qa,
    apple_vocab,
    build_pair_inputs,
    classify_from_cls,
    embedding_sum,
    mask_tokens,
    mlm_loss,
    nsp_pairs,
    pretrain_step,
    pretraining_loss,
    sense_documents,
    sense_sentences,
)
from transformer_lib.corpus import COMPANIES, FRUITS

SMALL = BertConfig(vocab_size=30, max_len=12, d_model=16, n_heads=2, n_layers=1, d_ff=32, dropout=0.0)


# ---------------------------------------------------------------------------------------
# The data
# ---------------------------------------------------------------------------------------

def test_vocabulary_puts_the_special_tokens_first_and_covers_every_generated_word():
    vocab = apple_vocab()
    assert vocab.itos[:4] == ["[PAD]", "[CLS]", "[SEP]", "[MASK]"]
    assert (vocab.pad_id, vocab.cls_id, vocab.sep_id, vocab.mask_id) == (0, 1, 2, 3)
    assert len(vocab) == len(set(vocab.itos)) == 124
    words = {w for s in sense_sentences(500, seed=3) for w in s.words}
    words |= {w for e in apple_qa(200, seed=4) for w in e.question + e.passage}
    assert words <= set(vocab.itos)
    assert vocab.decode(vocab.encode(["apple", "phone"])) == ["apple", "phone"]
    with pytest.raises(KeyError, match="not in the vocabulary"):
        vocab.encode(["banana", "spaceship"])


def test_sentences_are_seeded_alternate_senses_and_tag_their_slots():
    sentences = sense_sentences(40, seed=1)
    assert [s.words for s in sentences] == [s.words for s in sense_sentences(40, seed=1)]
    assert [s.words for s in sentences] != [s.words for s in sense_sentences(40, seed=2)]
    assert [s.sense for s in sentences] == [0, 1] * 20
    for s in sentences:
        assert len(s.tags) == len(s.words) and set(s.tags) <= set(TAGS)
        tagged = [w for w, t in zip(s.words, s.tags) if t != "O"]
        assert tagged, s.words
        assert all(t == ("FRUIT" if s.sense == 0 else "COMPANY") for t in s.tags if t != "O")
        assert set(tagged) <= set(FRUITS if s.sense == 0 else COMPANIES)


def test_apple_share_and_template_choice():
    every_slot = sense_sentences(60, seed=5, apple_share=1.0, templates=[0, 1, 2])
    assert all(w == "apple" for s in every_slot for w, t in zip(s.words, s.tags) if t != "O")
    assert {s.template for s in every_slot} <= {0, 1, 2}
    no_apple = sense_sentences(60, seed=5, apple_share=0.0)
    assert not any("apple" in s.words for s in no_apple)


def test_documents_keep_to_one_sense_and_nsp_pairs_follow_them():
    documents = sense_documents(50, sentences_per_document=3, seed=0)
    assert all(len({s.sense for s in d}) == 1 for d in documents)
    pairs = nsp_pairs([[s.words for s in d] for d in documents], 2000, seed=1)
    labels = torch.tensor([label for _, _, label in pairs])
    assert abs(labels.float().mean().item() - 0.5) < 0.05  # half IsNext, half NotNext
    successors = {}  # a sentence -> every sentence that follows it somewhere (a sentence can occur twice)
    for d in documents:
        for first, second in zip(d, d[1:]):
            successors.setdefault(tuple(first.words), set()).add(tuple(second.words))
    for a, b, label in pairs[:200]:
        if label == 0:
            assert tuple(b) in successors[tuple(a)]
    with pytest.raises(ValueError, match="at least two documents"):
        nsp_pairs(documents[:1], 5)


def test_qa_answers_are_spans_of_the_passage_with_the_asked_sense():
    examples = apple_qa(300, seed=2)
    assert {tuple(e.question) for e in examples} == {("which", "fruit"), ("which", "company")}
    for e in examples:
        assert 0 <= e.start <= e.end < len(e.passage) and e.end - e.start + 1 <= 2
        filler = e.answer[-1]
        assert filler in (FRUITS if e.question[1] == SENSES[0] else COMPANIES)
    both = [e for e in examples if e.passage.count("apple") == 2]
    assert both and all(e.answer[-1] == "apple" for e in both)  # only the position tells which apple
    assert len({e.start for e in both}) > 1


# ---------------------------------------------------------------------------------------
# The functions the exercises plug in
# ---------------------------------------------------------------------------------------

def test_embedding_sum_is_what_the_embedding_layer_adds_and_can_be_swapped():
    torch.manual_seed(0)
    model = Bert(SMALL).eval()
    ids = torch.randint(0, 30, (2, 7))
    segments = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1, 1]])
    emb = model.embeddings
    by_hand = emb.token.weight[ids] + emb.segment.weight[segments] + emb.positions.embedding.weight[:7]
    assert torch.allclose(embedding_sum(ids, segments, emb.token.weight, emb.segment.weight,
                                        emb.positions.embedding.weight), by_hand)
    calls = []

    def spy(*args):
        calls.append(args[0].shape)
        return embedding_sum(*args)

    with torch.no_grad():
        before = model(ids, segments)[0]
        emb.combine = spy
        after = model(ids, segments)[0]
    assert calls == [ids.shape] and torch.equal(before, after)
    with pytest.raises(ValueError, match="longer than the positional table"):
        embedding_sum(torch.zeros(1, 13, dtype=torch.long), torch.zeros(1, 13, dtype=torch.long),
                      emb.token.weight, emb.segment.weight, emb.positions.embedding.weight)


def test_mlm_loss_counts_only_the_selected_positions():
    logits = torch.randn(2, 5, 7)
    labels = torch.full((2, 5), -100)
    labels[0, 1], labels[1, 3] = 4, 6
    expected = -(logits[0, 1].log_softmax(-1)[4] + logits[1, 3].log_softmax(-1)[6]) / 2
    assert torch.allclose(mlm_loss(logits, labels), expected)
    noisy = logits.clone()
    noisy[labels == -100] = 1e4  # the unselected positions change nothing
    assert torch.allclose(mlm_loss(noisy, labels), expected)
    assert math.isclose(mlm_loss(torch.zeros(1, 3, 7), torch.tensor([[2, -100, -100]])).item(), math.log(7),
                        rel_tol=1e-6)
    nsp = torch.randn(2, 2)
    assert torch.allclose(pretraining_loss(logits, nsp, labels, torch.tensor([0, 1])),
                          expected + F.cross_entropy(nsp, torch.tensor([0, 1])))
    with pytest.raises(ValueError, match="logits \\[batch, seq, vocab\\]"):
        mlm_loss(logits.reshape(10, 7), labels)


def test_classify_from_cls_is_the_sequence_classifier_and_reads_only_cls():
    torch.manual_seed(1)
    model = BertForSequenceClassification(SMALL, n_classes=3).eval()
    ids = torch.randint(4, 30, (3, 6))
    with torch.no_grad():
        hidden, _ = model.bert(ids)
        logits = classify_from_cls(hidden, model.bert.pooler, model.classifier)
        assert torch.allclose(logits, model(ids))
        other = hidden.clone()
        other[:, 1:] = torch.randn_like(other[:, 1:])
        assert torch.equal(classify_from_cls(other, model.bert.pooler, model.classifier), logits)


def test_pretraining_with_the_generated_pairs_runs():
    vocab = apple_vocab()
    pairs = nsp_pairs([[s.words for s in d] for d in sense_documents(6, seed=0)], 8, seed=0)
    rows = [build_pair_inputs(vocab.encode(a), vocab.encode(b), 28, vocab.cls_id, vocab.sep_id, vocab.pad_id)
            for a, b, _ in pairs]
    ids, segments, padding = (torch.stack(c) for c in zip(*rows))
    inputs, labels = mask_tokens(ids, vocab.special_ids, vocab.mask_id, len(vocab), torch.Generator().manual_seed(0))
    config = BertConfig(vocab_size=len(vocab), max_len=32, d_model=16, n_heads=2, n_layers=1, d_ff=32, dropout=0.0)
    mlm, nsp = BertForPreTraining(config)(inputs, segments, padding)
    loss = pretraining_loss(mlm, nsp, labels, torch.tensor([label for _, _, label in pairs]))
    assert loss.isfinite() and mlm.shape == (8, 28, len(vocab))


def test_nsp_pairs_take_any_sentences_and_never_pick_a_last_a_or_its_own_document():
    documents = [[("doc", d, i) for i in range(n)] for d, n in enumerate([2, 3, 4, 2, 5])]
    pairs = nsp_pairs(documents, 3000, seed=4)
    assert pairs == nsp_pairs(documents, 3000, seed=4) and pairs != nsp_pairs(documents, 3000, seed=5)
    for (_, da, ia), (_, db, ib), label in pairs:
        assert ia < len(documents[da]) - 1  # A always has a next sentence
        assert (db, ib) == (da, ia + 1) if label == 0 else db != da
    assert abs(sum(label == 0 for *_, label in pairs) / len(pairs) - 0.5) < 0.03


def _pretraining_setup(seed=0):
    vocab = apple_vocab()
    pairs = nsp_pairs([[s.words for s in d] for d in sense_documents(8, seed=seed)], 16, seed=seed)
    rows = [build_pair_inputs(vocab.encode(a), vocab.encode(b), 28, vocab.cls_id, vocab.sep_id, vocab.pad_id)
            for a, b, _ in pairs]
    ids, segments, padding = (torch.stack(c) for c in zip(*rows))
    batch = (ids, segments, padding, torch.tensor([label for _, _, label in pairs]))
    config = BertConfig(vocab_size=len(vocab), max_len=32, d_model=16, n_heads=2, n_layers=1, d_ff=32, dropout=0.0)
    torch.manual_seed(seed)
    return vocab, batch, BertForPreTraining(config)


def test_pretrain_step_is_one_update_on_the_corrupted_batch():
    """Its losses are the fresh forward pass of the model before the step on the batch mask_tokens
    corrupted with the same generator; the update is zero_grad, backward of the sum, clip, step."""
    vocab, batch, model = _pretraining_setup()
    twin = BertForPreTraining(model.config)
    twin.load_state_dict(model.state_dict())
    optimiser = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda step: 0.5 ** step)
    mlm, nsp = pretrain_step(model, batch, vocab, mask_tokens, torch.Generator().manual_seed(3), optimiser,
                             scheduler, max_grad_norm=0.01)
    assert isinstance(mlm, float) and isinstance(nsp, float)
    ids, segments, padding, nsp_labels = batch
    inputs, labels = mask_tokens(ids, vocab.special_ids, vocab.mask_id, len(vocab), torch.Generator().manual_seed(3))
    mlm_logits, nsp_logits = twin(inputs, segments, padding)
    assert math.isclose(mlm, mlm_loss(mlm_logits, labels).item(), rel_tol=1e-6)
    assert math.isclose(nsp, F.cross_entropy(nsp_logits, nsp_labels).item(), rel_tol=1e-6)
    before = dict(twin.named_parameters())
    moved = torch.cat([(p.detach() - before[n].detach()).flatten() for n, p in model.named_parameters()])
    assert math.isclose(moved.norm().item(), 0.01, rel_tol=1e-3)  # SGD at lr 1: the clipped gradient, norm 0.01
    assert optimiser.param_groups[0]["lr"] == 0.5


def test_pretrain_step_learns():
    vocab, batch, model = _pretraining_setup(seed=1)
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    losses = [pretrain_step(model, batch, vocab, mask_tokens, g, optimiser, max_grad_norm=1.0) for _ in range(60)]
    first, last = sum(map(sum, losses[:10])) / 10, sum(map(sum, losses[-10:])) / 10
    assert last < 0.7 * first, (first, last)
