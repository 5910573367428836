"""BERT-base, BERT-large and GPT-2 small: real model objects, built on the meta device, with the published counts."""

import time

import pytest
import torch

from transformer_lib import configs
from transformer_lib.bert import Bert
from transformer_lib.gpt import GPT

# (factory, the published count, our exact count with the vocabulary the docstring states)
PUBLISHED = [
    (configs.bert_base, 110e6, 109_482_240),
    (configs.bert_large, 340e6, 335_141_888),
    (configs.gpt2_small, 124e6, 124_439_808),
]


@pytest.mark.parametrize("factory,paper,exact", PUBLISHED, ids=lambda v: getattr(v, "__name__", ""))
def test_parameter_count_matches_the_paper(factory, paper, exact):
    model = factory(device="meta")
    count = configs.count_parameters(model)
    assert count == exact
    assert abs(count - paper) / paper < 0.03, f"{factory.__name__}: {count:,} vs the paper's {paper:,.0f}"
    assert str(paper / 1e6).split(".")[0] in factory.__doc__ and f"{exact:,}" in factory.__doc__


@pytest.mark.parametrize("factory", [p[0] for p in PUBLISHED], ids=lambda f: f.__name__)
def test_built_cheaply_on_meta(factory):
    start = time.perf_counter()
    model = factory(device="meta")
    assert time.perf_counter() - start < 10
    assert all(p.device.type == "meta" for p in model.parameters())


def test_the_models_are_the_course_models_with_the_published_shapes():
    base, large, gpt2 = (f(device="meta") for f in (configs.bert_base, configs.bert_large, configs.gpt2_small))
    assert isinstance(base, Bert) and isinstance(large, Bert) and isinstance(gpt2, GPT)
    assert base.embeddings.token.weight.shape == (30522, 768) and len(base.encoder.layers) == 12
    assert large.embeddings.token.weight.shape == (30522, 1024) and len(large.encoder.layers) == 24
    assert base.embeddings.positions.embedding.weight.shape == (512, 768)
    assert base.embeddings.segment.weight.shape == (2, 768)
    assert gpt2.positions.embedding.weight.shape == (1024, 768) and len(gpt2.blocks) == 12
    assert gpt2.lm_head.weight is gpt2.token_embedding.weight  # tied: counted once


def test_small_vocabularies_run_a_forward_pass():
    torch.manual_seed(0)
    bert = configs.bert_base(vocab_size=50).eval()
    hidden, pooled = bert(torch.randint(0, 50, (1, 6)))
    assert hidden.shape == (1, 6, 768) and pooled.shape == (1, 768)
    gpt2 = configs.gpt2_small(vocab_size=50).eval()
    assert gpt2(torch.randint(0, 50, (1, 6))).shape == (1, 6, 50)
