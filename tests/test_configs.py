"""The published sizes: real model objects, built on the meta device, with the papers' parameter counts."""

import time

import pytest
import torch

from transformer_lib import configs

# (factory, the paper's count, our exact count with the vocabulary the docstring states)
PUBLISHED = [
    (configs.transformer_base, 65e6, 63_119_496),
    (configs.transformer_big, 213e6, 214_282_376),
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


def test_weights_are_shared_three_ways():
    model = configs.transformer_base(device="meta")
    shared = model.src_embed.embedding.weight
    assert model.tgt_embed.embedding.weight is shared and model.generator.proj.weight is shared


def test_base_runs_a_forward_pass_on_a_small_vocabulary():
    torch.manual_seed(0)
    model = configs.transformer_base(vocab_size=50).eval()
    src, tgt = torch.randint(0, 50, (1, 5)), torch.randint(0, 50, (1, 4))
    assert model(src, tgt).shape == (1, 4, 50)
