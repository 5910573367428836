"""transformer_lib.vision: patchify is a patch Conv2d, the Swin pieces follow Hugging Face's conventions,
and the course's ViT and Swin give Hugging Face's outputs once they hold the same (random) weights."""

import os

import pytest
import torch
import torch.nn as nn

from transformer_lib.checks import model_calls
from transformer_lib.datasets_vision import digits_split
from transformer_lib.vision import (
    PatchMerging,
    Run,
    SmallCNN,
    Swin,
    SwinBlock,
    SwinConfig,
    SwinParts,
    ViT,
    ViTConfig,
    accuracy,
    choose_learning_rates,
    conv_to_linear,
    cyclic_shift,
    load_hf_swin_state_dict,
    load_hf_vit_state_dict,
    merge_patches,
    patchify,
    swin_window_attention,
    relative_position_index_2d,
    shifted_window_mask,
    swin_config_from_hf,
    train_classifier,
    train_run,
    unpatchify,
    vit_config_from_hf,
    vit_forward,
    window_partition,
    window_reverse,
)

os.environ["HF_HUB_OFFLINE"] = "1"  # never download anything: models are built from configs


@pytest.fixture(scope="module")
def transformers():
    module = pytest.importorskip("transformers")
    module.logging.set_verbosity_error()
    return module


def _randomise(model: nn.Module, seed: int = 0) -> nn.Module:
    """Every parameter random (LayerNorms, biases and relative-position tables too), so that a
    weight copied to the wrong place, or an index in the wrong order, changes the output."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model.eval()


# ---------------------------------------------------------------------------------------
# Patches
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("batch,channels,height,width,patch", [(2, 3, 8, 8, 4), (1, 1, 8, 8, 2), (3, 2, 12, 8, 4),
                                                                (2, 3, 6, 9, 3), (1, 4, 5, 5, 5)])
def test_patchify_then_linear_is_the_patch_convolution(batch, channels, height, width, patch):
    torch.manual_seed(0)
    conv = nn.Conv2d(channels, 16, kernel_size=patch, stride=patch)
    images = torch.randn(batch, channels, height, width)
    linear = conv_to_linear(conv)  # the conv's kernel [16, C, p, p] copied into a Linear(C*p*p, 16)
    with torch.no_grad():
        expected = conv(images).flatten(2).transpose(1, 2)  # [B, N, 16], patches in reading order
        torch.testing.assert_close(linear(patchify(images, patch)), expected, rtol=1e-5, atol=1e-5)


def test_patchify_layout_and_inverse():
    image = torch.arange(16.0).reshape(1, 1, 4, 4)
    assert patchify(image, 2).tolist() == [[[0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 12, 13], [10, 11, 14, 15]]]
    images = torch.randn(2, 3, 12, 8)
    assert torch.equal(unpatchify(patchify(images, 4), 4, 3, 12, 8), images)


def test_patchify_refuses_sizes_that_do_not_tile():
    with pytest.raises(ValueError, match="not a multiple of the patch size"):
        patchify(torch.randn(1, 3, 10, 8), 4)
    with pytest.raises(ValueError, match=r"\[batch, channels, height, width\]"):
        patchify(torch.randn(3, 8, 8), 4)


# ---------------------------------------------------------------------------------------
# Swin's pieces against Hugging Face's
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("height,width,window", [(8, 8, 4), (8, 12, 4), (14, 14, 7), (6, 4, 2)])
def test_window_partition_matches_hugging_face_and_reverse_inverts_it(transformers, height, width, window):
    from transformers.models.swin import modeling_swin

    x = torch.randn(2, height, width, 5)
    ours = window_partition(x, window)
    theirs = modeling_swin.window_partition(x, window).reshape(-1, window * window, 5)
    assert torch.equal(ours, theirs)
    assert torch.equal(window_reverse(ours, window, height, width), x)
    assert torch.equal(window_reverse(ours, window, height, width),
                       modeling_swin.window_reverse(ours.reshape(-1, window, window, 5), window, height, width))


@pytest.mark.parametrize("height,width,window,shift", [(8, 8, 4, 2), (14, 14, 7, 3), (12, 8, 4, 2), (4, 4, 2, 1)])
def test_shifted_window_mask_and_roll_match_hugging_face(transformers, height, width, window, shift):
    config = transformers.SwinConfig(window_size=window, embed_dim=8, num_heads=[2], depths=[2])
    layer = transformers.models.swin.modeling_swin.SwinLayer(config, 8, (height, width), 2, shift_size=shift)
    theirs = layer.get_attn_mask(height, width, torch.float32, torch.device("cpu"))  # 0 = attend, -100 = blocked
    assert torch.equal(shifted_window_mask(height, width, window, shift), theirs == 0)
    x = torch.randn(2, height, width, 3)
    assert torch.equal(cyclic_shift(x, shift), layer.cyclic_shift(x))
    assert torch.equal(cyclic_shift(cyclic_shift(x, shift), -shift), x)


def test_shift_zero_masks_nothing():
    assert shifted_window_mask(8, 8, 4, 0).all() and shifted_window_mask(8, 8, 4, 0).shape == (4, 16, 16)


@pytest.mark.parametrize("window", [1, 2, 3, 7])
def test_relative_position_index_matches_hugging_face(transformers, window):
    bias = transformers.models.swin.modeling_swin.SwinRelativePositionBias(2, (window, window))
    assert torch.equal(relative_position_index_2d(window), bias._create_relative_position_index())


def test_relative_position_index_names_each_offset_once():
    m = 4
    index = relative_position_index_2d(m)
    assert index.dtype == torch.int64 and index.min() == 0 and index.max() == (2 * m - 1) ** 2 - 1
    assert len(index.unique()) == (2 * m - 1) ** 2
    assert index[0, 0] == index[5, 5] == (m - 1) * (2 * m - 1) + (m - 1)  # offset (0, 0): the middle row


def test_patch_merging_matches_hugging_face(transformers):
    from transformers.models.swin import modeling_swin

    theirs = _randomise(modeling_swin.SwinPatchMerging(dim=6))
    ours = PatchMerging(6)
    with torch.no_grad():
        ours.norm.gamma.copy_(theirs.norm.weight)
        ours.norm.beta.copy_(theirs.norm.bias)
        ours.reduction.weight.copy_(theirs.reduction.weight)
    x = torch.randn(2, 4, 6, 6)
    with torch.no_grad():
        expected = theirs(x.reshape(2, 24, 6), (4, 6)).reshape(2, 2, 3, 12)
        torch.testing.assert_close(ours(x), expected, rtol=1e-5, atol=1e-5)


def test_merge_patches_order_is_row_offset_first():
    x = torch.arange(16.0).reshape(1, 4, 4, 1)
    assert merge_patches(x)[0, 0, 0].tolist() == [0.0, 4.0, 1.0, 5.0]  # (0,0), (1,0), (0,1), (1,1)
    with pytest.raises(ValueError, match="even height and width"):
        merge_patches(torch.randn(1, 3, 4, 2))


def test_the_mask_keeps_wrapped_around_pieces_apart():
    """In a shifted block, token (0, 0) lands in the bottom-right window next to token (H-1, W-1),
    its wrapped-around neighbour. With the mask it cannot influence it; without, it does."""
    torch.manual_seed(0)
    no_mask = SwinParts(shifted_window_mask=lambda h, w, m, s: torch.ones((h // m) * (w // m), m * m, m * m,
                                                                          dtype=torch.bool))
    for parts, influences in [(SwinParts(), False), (no_mask, True)]:
        torch.manual_seed(0)
        block = _randomise(SwinBlock(8, 2, (8, 8), window=4, shift=2, parts=parts))
        x = torch.randn(1, 8, 8, 8)
        y = x.clone()
        y[0, 0, 0] += torch.randn(8)  # not a constant: norm1 would remove it
        with torch.no_grad():
            changed = (block(x) - block(y))[0, 7, 7].abs().max() > 1e-6
        assert bool(changed) == influences


# ---------------------------------------------------------------------------------------
# Whole models against Hugging Face's
# ---------------------------------------------------------------------------------------

def test_vit_equals_hugging_face(transformers):
    config = transformers.ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=4, intermediate_size=64, num_labels=7, layer_norm_eps=1e-6,
                                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    theirs = _randomise(transformers.ViTForImageClassification(config))
    ours = load_hf_vit_state_dict(ViT(vit_config_from_hf(config)), theirs.state_dict()).eval()
    images = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(ours(images), theirs(images).logits, rtol=1e-5, atol=1e-5)
        # The trunk alone, into a ViT without a head.
        trunk = transformers.ViTModel(config, add_pooling_layer=False)
        trunk.load_state_dict({k.removeprefix("vit."): v for k, v in theirs.state_dict().items()
                               if k.startswith("vit.")})
        headless = load_hf_vit_state_dict(ViT(vit_config_from_hf(config, n_classes=0)), trunk.state_dict()).eval()
        # Without a head, the forward pass returns [CLS]'s final state (after the final LayerNorm).
        torch.testing.assert_close(headless(images), trunk.eval()(images).last_hidden_state[:, 0], rtol=1e-5,
                                   atol=1e-5)


@pytest.mark.parametrize("image_size,window,depths", [(32, 4, [2, 2, 2]), ((32, 64), 4, [2, 2, 2]), (28, 7, [2, 2])])
def test_swin_equals_hugging_face(transformers, image_size, window, depths):
    config = transformers.SwinConfig(image_size=image_size, patch_size=2, num_channels=3, embed_dim=16, depths=depths,
                                     num_heads=[2, 4, 4][:len(depths)], window_size=window, num_labels=5,
                                     drop_path_rate=0.0, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    theirs = _randomise(transformers.SwinForImageClassification(config))
    ours = load_hf_swin_state_dict(Swin(swin_config_from_hf(config)), theirs.state_dict()).eval()
    h, w = (image_size, image_size) if isinstance(image_size, int) else image_size
    images = torch.randn(2, 3, h, w)
    with torch.no_grad():
        torch.testing.assert_close(ours(images), theirs(images).logits, rtol=1e-5, atol=1e-5)
        pooled = theirs.swin(images).pooler_output
        headless = load_hf_swin_state_dict(Swin(swin_config_from_hf(config, n_classes=0)), theirs.swin.state_dict())
        torch.testing.assert_close(headless.eval()(images), pooled, rtol=1e-5, atol=1e-5)


def test_a_shifted_block_is_really_used(transformers):
    """The equality above would hold without shifts if no stage had a map larger than its window."""
    model = Swin(SwinConfig(image_size=32, patch_size=2, in_channels=3, n_classes=5, embed_dim=16, depths=(2, 2, 2),
                            n_heads=(2, 4, 4), window=4))
    shifts = [(b.resolution, b.window, b.shift) for b in model.blocks()]
    assert shifts[:4] == [((16, 16), 4, 0), ((16, 16), 4, 2), ((8, 8), 4, 0), ((8, 8), 4, 2)]
    assert shifts[4:] == [((4, 4), 4, 0), ((4, 4), 4, 0)]  # the last map is one window: never shifted


def test_swin_runs_on_the_functions_it_is_given():
    calls = []

    def counting_partition(x, window):
        calls.append(window)
        return window_partition(x, window)

    model = Swin(SwinConfig(image_size=8, patch_size=2, in_channels=1, n_classes=10, embed_dim=8, depths=(2, 2),
                            n_heads=(2, 2), window=2), SwinParts(window_partition=counting_partition))
    model(torch.randn(2, 1, 8, 8))
    assert calls == [2, 2, 2, 2]


def test_the_models_run_the_forward_pass_and_window_attention_they_are_given():
    """ViT.forward and SwinBlock call the top-level functions (one copy of each algorithm), kept as
    module attributes so that the chapter can build them on the learner's functions."""
    torch.manual_seed(0)
    images = torch.randn(3, 1, 8, 8)
    vit = _randomise(ViT(ViTConfig(image_size=8, patch_size=2, in_channels=1, n_classes=10, d_model=16, n_heads=2,
                                   n_layers=2, d_ff=32)))
    assert vit.forward_pass is vit_forward and model_calls(vit, vit_forward, images) == 1
    with torch.no_grad():
        torch.testing.assert_close(vit(images), vit_forward(images, vit))

    def attention_by_hand(x, block, shift):  # window attention written out again, with another batching of the mask
        b, h, w, c = x.shape
        m = block.window
        rolled = torch.roll(x, (-shift, -shift), dims=(1, 2))
        windows = window_partition(rolled, m)  # [B*nW, M*M, C]
        bias = block.bias_table[relative_position_index_2d(m)].permute(2, 0, 1)  # [heads, M*M, M*M]
        mask = shifted_window_mask(h, w, m, shift)[None].expand(b, -1, -1, -1).reshape(-1, m * m, m * m)
        out = block.attn(windows, windows, windows, mask=mask, bias=bias)
        return torch.roll(window_reverse(out, m, h, w), (shift, shift), dims=(1, 2))

    config = SwinConfig(image_size=(8, 16), patch_size=2, in_channels=1, n_classes=10, embed_dim=8, depths=(2, 2),
                        n_heads=(2, 2), window=2)
    swin = _randomise(Swin(config))
    by_hand = _randomise(Swin(config, SwinParts(window_attention=attention_by_hand)))
    assert all(block.window_attention is swin_window_attention for block in swin.blocks())
    assert [block.shift for block in swin.blocks()] == [0, 1, 0, 0]  # the 2x4 map of stage 2: one window row
    assert model_calls(swin, swin_window_attention, torch.randn(2, 1, 8, 16)) == 4
    assert model_calls(by_hand, attention_by_hand, torch.randn(2, 1, 8, 16)) == 4
    with torch.no_grad():
        x = torch.randn(2, 1, 8, 16)
        torch.testing.assert_close(swin(x), by_hand(x))
        block, maps = swin.blocks()[1], torch.randn(3, 4, 8, 8)
        torch.testing.assert_close(swin_window_attention(maps, block, 1), attention_by_hand(maps, block, 1))


def test_models_refuse_images_of_the_wrong_size():
    vit = ViT(ViTConfig(image_size=8, patch_size=2, in_channels=1, n_classes=10, d_model=16, n_heads=2, n_layers=1,
                        d_ff=32))
    with pytest.raises(ValueError, match=r"takes images \[batch, 1, 8, 8\]"):
        vit(torch.randn(2, 3, 8, 8))
    swin = Swin(SwinConfig(image_size=8, patch_size=2, in_channels=1, n_classes=10, embed_dim=8, depths=(2, 2),
                           n_heads=(2, 2), window=2))
    with pytest.raises(ValueError, match=r"takes images \[batch, 1, 8, 8\]"):
        swin(torch.randn(2, 1, 16, 16))
    with pytest.raises(ValueError, match="smaller than the window"):
        shifted_window_mask(8, 8, 4, 4)
    with pytest.raises(ValueError, match="multiples of the window size"):
        window_partition(torch.randn(1, 6, 8, 2), 4)


# ---------------------------------------------------------------------------------------
# The digits and the training loop
# ---------------------------------------------------------------------------------------

def test_digits_split_is_fixed_stratified_and_disjoint():
    a, b = digits_split(), digits_split()
    assert a.train_images.shape == (1347, 1, 8, 8) and a.test_images.shape == (450, 1, 8, 8)
    assert torch.equal(a.train_images, b.train_images) and torch.equal(a.test_labels, b.test_labels)
    assert a.train_images.min() == 0 and a.train_images.max() == 1
    counts = torch.bincount(a.test_labels, minlength=10)
    assert counts.min() >= 43 and counts.max() <= 46  # stratified: 25% of each class
    train = {tuple(x.flatten().tolist()) for x in a.train_images}
    assert sum(tuple(x.flatten().tolist()) in train for x in a.test_images) < 5  # a handful of duplicate digits
    x, y = a.subset(150, seed=1)
    assert x.shape == (150, 1, 8, 8) and torch.equal(a.subset(150, seed=1)[1], y)
    levels = a.levels(a.train_images)
    assert levels.dtype == torch.int64 and levels.max() == 16


def test_training_is_deterministic_and_learns():
    data = digits_split()
    x, y = data.subset(200, seed=0)
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        model = SmallCNN()
        runs.append(train_classifier(model, x, y, steps=30, batch_size=50, lr=3e-3, seed=0))
    assert runs[0] == runs[1]
    assert sum(runs[0][-5:]) / 5 < sum(runs[0][:5]) / 5
    assert accuracy(model, data.test_images, data.test_labels) > 0.5


def test_validation_set_is_carved_from_the_training_images_and_leaves_the_test_set_alone():
    plain, split = digits_split(), digits_split(validation_size=300)
    assert plain.val_images.shape == (0, 1, 8, 8) and plain.val_labels.shape == (0,)
    assert split.train_images.shape == (1047, 1, 8, 8) and split.val_images.shape == (300, 1, 8, 8)
    assert torch.equal(plain.test_images, split.test_images) and torch.equal(plain.test_labels, split.test_labels)

    def rows(images, labels):  # the images as a multiset (some digits occur twice)
        return sorted(tuple(x.flatten().tolist()) + (int(y),) for x, y in zip(images, labels))

    assert rows(torch.cat([split.train_images, split.val_images]), torch.cat([split.train_labels, split.val_labels])) \
        == rows(plain.train_images, plain.train_labels)
    counts = torch.bincount(split.val_labels, minlength=10)
    assert counts.min() >= 29 and counts.max() <= 31  # stratified: 30 of each class, give or take one
    assert torch.equal(digits_split(validation_size=300).val_labels, split.val_labels)  # the same split every time
    with pytest.raises(ValueError, match="validation_size"):
        digits_split(validation_size=5)


def test_train_run_is_seeded_and_scored_on_the_validation_set():
    data = digits_split(validation_size=300)
    build = lambda: SmallCNN(width=4)  # noqa: E731
    a = train_run("CNN", build, data, 100, 3e-3, seed=1, steps=10)
    b = train_run("CNN", build, data, 100, 3e-3, seed=1, steps=10)
    assert a.losses == b.losses and a.val_accuracy == b.val_accuracy and len(a.losses) == 10
    assert (a.name, a.lr, a.n_train, a.seed) == ("CNN", 3e-3, 100, 1)
    assert a.val_accuracy == accuracy(a.model, data.val_images, data.val_labels)
    assert train_run("CNN", build, data, 100, 3e-3, seed=2, steps=10).losses != a.losses
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # one thread inside the run, the caller's setting back afterwards
        assert train_run("CNN", build, data, 100, 3e-3, seed=1, steps=10).losses == a.losses
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    with pytest.raises(ValueError, match="validation set"):
        train_run("CNN", build, digits_split(), 100, 3e-3, seed=0, steps=10)


def test_choose_learning_rates_takes_the_best_mean_validation_accuracy_per_model():
    def run(name, lr, n, accuracy):
        return Run(name, lr, n, 0, None, [], accuracy)

    runs = [run("A", 1e-3, 100, 0.75), run("A", 1e-3, 300, 0.25), run("A", 3e-3, 100, 0.5), run("A", 3e-3, 300, 0.5),
            run("A", 1e-2, 100, 0.875), run("A", 1e-2, 300, 0.0),
            run("B", 1e-3, 100, 0.5), run("B", 1e-2, 100, 0.625)]
    # A: means 0.5, 0.5, 0.4375 -> the tie goes to the smaller rate; B: the better one
    assert choose_learning_rates(runs) == {"A": 1e-3, "B": 1e-2}
