"""ViT-B/16 and Swin-T: real model objects, built on the meta device, with the published counts."""

import time

import pytest
import torch

from transformer_lib import configs
from transformer_lib.vision import Swin, ViT

# (factory, the published count, our exact count for 224 x 224 RGB images and 1,000 classes)
PUBLISHED = [
    (configs.vit_b16, 86e6, 86_567_656),  # Dosovitskiy et al., 2021, Table 1
    (configs.swin_t, 28e6, 28_288_354),  # Liu et al., 2021, Table 1
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


def test_the_models_have_the_published_shapes():
    vit, swin = configs.vit_b16(device="meta"), configs.swin_t(device="meta")
    assert isinstance(vit, ViT) and isinstance(swin, Swin)
    assert vit.pos_embed.shape == (1, 197, 768) and len(vit.encoder.layers) == 12
    assert [len(stage.blocks) for stage in swin.stages] == [2, 2, 6, 2]
    assert [b.resolution for b in swin.blocks()][::2] == [(56, 56), (28, 28)] + [(14, 14)] * 3 + [(7, 7)]
    assert [b.attn.n_heads for b in swin.blocks()] == [3, 3, 6, 6] + [12] * 6 + [24, 24]
    assert swin.blocks()[0].bias_table.shape == (13 * 13, 3) and swin.n_features == 768
    # The last stage's 7 x 7 map is a single window: its blocks are never shifted.
    assert [b.shift for b in swin.blocks()] == [0, 3] * 5 + [0, 0]


def test_small_versions_run_a_forward_pass():
    torch.manual_seed(0)
    vit = configs.vit_b16(n_classes=3, image_size=32)
    assert vit(torch.randn(1, 3, 32, 32)).shape == (1, 3)
    swin = configs.swin_t(n_classes=3)  # 224 x 224: maps of 56, 28, 14 and 7 tokens a side, all tiled by 7 x 7 windows
    with torch.no_grad():
        assert swin(torch.randn(1, 3, 224, 224)).shape == (1, 3)
