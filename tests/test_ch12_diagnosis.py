"""Chapter 12's checkers name an error even when a learner makes two at once.

A catalogue entry recognises one exact wrong answer; two mistakes together match none of them.
The properties of transformer_lib/checks/ch12.py still name the error from how the values were
moved (the right patches in the wrong order, the right pixels inside a patch in the wrong order,
pixels of different squares mixed) or from the structure of a mask or an index (a token that may
not see itself, a masked window that never wrapped around, indices outside the table, two
offsets sharing a row); for vit_forward and swin_window_attention, from which of their options is
wrong (positions, patch order, final norm, head; roll, mask, bias, reverse). Each learner function
below combines two catalogued mistakes; the verdict must fail and name the property, in one line.
And right answers written another way pass.
"""

import pytest
import torch

from transformer_lib.checks.ch12 import (check_merge_patches, check_patchify, check_relative_position_index_2d,
                                         check_shifted_window_mask, check_swin_window_attention, check_vit_forward,
                                         check_window_partition, check_window_reverse)
from transformer_lib.vision import (cyclic_shift, patchify, relative_position_index_2d, shifted_window_mask,
                                    window_partition, window_reverse)

PATCH_ORDER = "the right patches in the wrong order"
PIXEL_ORDER = "the right pixels inside each of the patches, in the wrong order"
WINDOW_ORDER = "the right windows in the wrong order"
TOKEN_ORDER = "the right tokens inside each of the windows, in the wrong order"
MIXED_WINDOWS = "windows that mix tokens from different squares"
MERGED_ORDER = "the right values inside each of the merged tokens, in the wrong order"
MERGED_PLACE = "the right merged tokens in the wrong order"
SELF = "a token that may not attend to itself"
INTERIOR = "a window masked although it holds no wrapped-around piece"
WRAPPED = "tokens from different pieces of the rolled map allowed to attend"
OUTSIDE = "indices outside the table"
SHARED = "two different offsets (dy, dx) sharing one row"


def _verdict(checker, learner, hidden):
    verdict = checker.judge(checker.collect_outputs(learner, hidden), hidden)
    assert not verdict.passed
    assert verdict.mistake not in {m.name for m in checker.mistakes}, f"no single mistake should match: " \
                                                                     f"{verdict.message}"
    assert "\n" not in verdict.message  # CheckFailed shows it as one line
    return verdict


# -- patchify --------------------------------------------------------------------------------------


def patchify_column_major_and_channels_last(images, patch):
    b, c, h, w = images.shape
    x = images.reshape(b, c, h // patch, patch, w // patch, patch)
    return x.permute(0, 4, 2, 3, 5, 1).reshape(b, -1, c * patch * patch)


def patchify_column_major_and_inside_transposed(images, patch):
    b, c, h, w = images.shape
    x = images.reshape(b, c, h // patch, patch, w // patch, patch)
    return x.permute(0, 4, 2, 1, 5, 3).reshape(b, -1, c * patch * patch)


@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
@pytest.mark.parametrize("learner", [patchify_column_major_and_channels_last,
                                     patchify_column_major_and_inside_transposed], ids=lambda f: f.__name__)
def test_patchify_two_mistakes_name_both_traits(learner, hidden):
    verdict = _verdict(check_patchify, learner, hidden)
    assert PATCH_ORDER in verdict.message and PIXEL_ORDER in verdict.message, verdict.message


# -- window_partition / window_reverse -------------------------------------------------------------


def partition_column_major_windows_and_tokens(x, window):
    b, h, w, c = x.shape
    t = x.reshape(b, h // window, window, w // window, window, c)
    return t.permute(0, 3, 1, 4, 2, 5).reshape(-1, window * window, c)


def partition_strips_and_batch_inside(x, window):
    b, h, w, c = x.shape
    return x.reshape(b, -1, window * window, c).transpose(0, 1).reshape(-1, window * window, c)


@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
def test_window_partition_column_major_twice(hidden):
    verdict = _verdict(check_window_partition, partition_column_major_windows_and_tokens, hidden)
    assert WINDOW_ORDER in verdict.message and TOKEN_ORDER in verdict.message, verdict.message


@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
def test_window_partition_strips_are_named_as_mixing(hidden):
    verdict = _verdict(check_window_partition, partition_strips_and_batch_inside, hidden)
    assert MIXED_WINDOWS in verdict.message, verdict.message


def reverse_column_major_and_transposed_tokens(windows, window, height, width):
    c = windows.shape[-1]
    t = windows.reshape(-1, width // window, height // window, window, window, c)
    return t.permute(0, 2, 4, 1, 3, 5).reshape(-1, height, width, c)


@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
def test_window_reverse_two_mistakes(hidden):
    verdict = _verdict(check_window_reverse, reverse_column_major_and_transposed_tokens, hidden)
    assert WINDOW_ORDER in verdict.message and TOKEN_ORDER in verdict.message, verdict.message


# -- shifted_window_mask ---------------------------------------------------------------------------


def _labels(height, width, window, shift, first):
    def bands(n):
        idx = torch.arange(n)
        return (idx >= n - window).long() + (idx >= n - shift).long()
    label = bands(height)[:, None] * 3 + bands(width)[None, :]
    t = label.reshape(height // window, window, width // window, window).permute(*first, 1, 3)
    return t.reshape(-1, window * window)


def mask_inverted_and_column_major(height, width, window, shift):
    windows = _labels(height, width, window, shift, (2, 0))
    return windows[:, :, None] != windows[:, None, :]


def mask_column_major_and_unshifted_labels(height, width, window, shift):
    """Windows cut column by column AND labels taken before the roll (the wrong map)."""
    windows = _labels(height, width, window, shift, (2, 0))
    windows = windows.roll(1, dims=0)
    return windows[:, :, None] == windows[:, None, :]


@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
def test_inverted_column_major_mask_is_named(hidden):
    verdict = _verdict(check_shifted_window_mask, mask_inverted_and_column_major, hidden)
    assert SELF in verdict.message and INTERIOR in verdict.message, verdict.message


@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
def test_masks_on_the_wrong_windows_are_named(hidden):
    verdict = _verdict(check_shifted_window_mask, mask_column_major_and_unshifted_labels, hidden)
    assert INTERIOR in verdict.message or WRAPPED in verdict.message, verdict.message


def float_mask_with_sum_labels(height, width, window, shift):
    """The additive 0 / -100 mask of Hugging Face's code AND labels that collide."""
    def bands(n):
        idx = torch.arange(n)
        return (idx >= n - window).long() + (idx >= n - shift).long()
    label = bands(height)[:, None] + bands(width)[None, :]
    t = label.reshape(height // window, window, width // window, window).permute(0, 2, 1, 3)
    windows = t.reshape(-1, window * window)
    return torch.where(windows[:, :, None] == windows[:, None, :], 0.0, -100.0)


@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
def test_a_float_mask_is_named(hidden):
    verdict = _verdict(check_shifted_window_mask, float_mask_with_sum_labels, hidden)
    assert "a mask of numbers instead of booleans" in verdict.message, verdict.message


# -- relative_position_index_2d --------------------------------------------------------------------


def _offsets(m):
    rows, cols = torch.meshgrid(torch.arange(m), torch.arange(m), indexing="ij")
    coords = torch.stack([rows.flatten(), cols.flatten()])
    return coords[:, :, None] - coords[:, None, :]


def index_not_shifted_and_stride_m(window):
    dy, dx = _offsets(window)
    return dy * window + dx


def index_transposed_and_no_stride(window):
    dy, dx = -_offsets(window) + (window - 1)
    return dy + dx


@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
def test_index_two_mistakes_name_both_traits(hidden):
    verdict = _verdict(check_relative_position_index_2d, index_not_shifted_and_stride_m, hidden)
    assert OUTSIDE in verdict.message and SHARED in verdict.message, verdict.message


@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
def test_transposed_index_without_stride_is_named(hidden):
    verdict = _verdict(check_relative_position_index_2d, index_transposed_and_no_stride, hidden)
    assert SHARED in verdict.message, verdict.message


# -- merge_patches ---------------------------------------------------------------------------------


def merge_reading_order_and_transposed(x):
    parts = [x[:, r::2, c::2] for r in range(2) for c in range(2)]
    return torch.cat(parts, dim=-1).transpose(1, 2)


def merge_interleaved_and_transposed(x):
    parts = [x[:, r::2, c::2] for c in range(2) for r in range(2)]  # Swin's order, but stacked
    b, h, w, c = parts[0].shape
    return torch.stack(parts, dim=-1).reshape(b, h, w, 4 * c).transpose(1, 2)


@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
def test_merge_reading_order_and_transposed_map(hidden):
    verdict = _verdict(check_merge_patches, merge_reading_order_and_transposed, hidden)
    assert MERGED_ORDER in verdict.message, verdict.message


@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
def test_merge_interleaved_and_transposed_names_both_traits(hidden):
    verdict = _verdict(check_merge_patches, merge_interleaved_and_transposed, hidden)
    assert MERGED_ORDER in verdict.message and MERGED_PLACE in verdict.message, verdict.message


# -- vit_forward -----------------------------------------------------------------------------------

POSITIONS = "position vectors added to the wrong tokens, or not at all"
PATCH_READING_ORDER = "patches not in patchify's reading order"
NO_FINAL_NORM = "no final LayerNorm"
NOT_CLS = "a head that does not read [CLS] alone"


def _vit_tokens(images, model):
    return model.patch_embed(model.patchify(images, model.config.patch_size))  # [B, N, D]


def vit_positions_before_cls_and_no_final_norm(images, model):
    tokens = _vit_tokens(images, model)
    x = tokens + model.pos_embed[:, :tokens.shape[1]]
    x = torch.cat([model.cls_token.expand(images.shape[0], -1, -1), x], dim=1)
    for layer in model.encoder.layers:
        x = layer(x)
    return model.head(x[:, 0])


def vit_mean_of_patches_in_column_order(images, model):
    tokens = _vit_tokens(images, model)
    b, n, d = tokens.shape
    side = int(n ** 0.5)
    tokens = tokens.reshape(b, side, side, d).transpose(1, 2).reshape(b, n, d)
    x = torch.cat([model.cls_token.expand(b, -1, -1), tokens], dim=1) + model.pos_embed
    return model.head(model.encoder(x)[:, 1:].mean(dim=1))


def vit_no_positions_and_mean_of_everything(images, model):
    x = torch.cat([model.cls_token.expand(images.shape[0], -1, -1), _vit_tokens(images, model)], dim=1)
    return model.head(model.encoder(x).mean(dim=1))


@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
@pytest.mark.parametrize("learner,traits", [
    (vit_positions_before_cls_and_no_final_norm, [POSITIONS, NO_FINAL_NORM]),
    (vit_mean_of_patches_in_column_order, [PATCH_READING_ORDER, NOT_CLS]),
    (vit_no_positions_and_mean_of_everything, [POSITIONS, NOT_CLS]),
], ids=lambda x: getattr(x, "__name__", ""))
def test_vit_forward_two_mistakes_name_both_traits(learner, traits, hidden):
    verdict = _verdict(check_vit_forward, learner, hidden)
    for trait in traits:
        assert trait in verdict.message, verdict.message
    others = {POSITIONS, PATCH_READING_ORDER, NO_FINAL_NORM, NOT_CLS} - set(traits)
    assert not any(other in verdict.message for other in others), verdict.message


def vit_positions_added_in_two_parts(images, model):
    """Right, written another way: [CLS] and the patches each get their own rows before the concatenation,
    the stack written out, the library's patchify instead of the model's."""
    pos = model.pos_embed
    tokens = model.patch_embed(patchify(images, model.config.patch_size)) + pos[:, 1:]
    cls = model.cls_token + pos[:, :1]
    x = torch.cat([cls.expand(images.shape[0], -1, -1), tokens], dim=1)
    for layer in model.encoder.layers:
        x = layer(x)
    return model.head(model.encoder.norm(x)[:, 0, :])


def vit_through_the_encoder_module(images, model):
    """Right, written another way: model.encoder runs the layers and the final norm."""
    tokens = _vit_tokens(images, model)
    x = torch.cat([model.cls_token.repeat(images.shape[0], 1, 1), tokens], dim=1) + model.pos_embed
    return model.head(model.encoder(model.dropout(x))[:, 0])


@pytest.mark.parametrize("learner", [vit_positions_added_in_two_parts, vit_through_the_encoder_module],
                         ids=lambda f: f.__name__)
def test_vit_forward_written_another_way_passes(learner):
    verdict = check_vit_forward.judge(check_vit_forward.collect_outputs(learner, True), True)
    assert verdict.passed, verdict.message


def vit_calling_the_model(images, model):
    return model(images)


def test_vit_forward_cannot_call_the_model_it_is_given():
    verdict = check_vit_forward.judge(check_vit_forward.collect_outputs(vit_calling_the_model))
    assert not verdict.passed and "calling model(images) inside it" in verdict.message, verdict.message


def test_the_checks_leave_the_global_random_state_alone():
    state = torch.random.get_rng_state()
    check_vit_forward.cases(hidden=True)
    check_swin_window_attention.cases(hidden=True)
    assert torch.equal(state, torch.random.get_rng_state())


# -- swin_window_attention -------------------------------------------------------------------------

ROLL = "a roll that is not -shift before the windows and +shift after them"
MASK = "a shifted-window mask that is missing or tiled in the wrong order"
BIAS = "a relative position bias that is missing, transposed or mixed across heads"
REVERSE = "height and width swapped when the windows are put back"


def _swin(x, block, shift, before, after, bias_of, mask_of, reverse_hw=False):
    b, h, w, c = x.shape
    m = block.window
    x = torch.roll(x, (before, before), dims=(1, 2))
    windows = window_partition(x, m)
    mask = mask_of(shifted_window_mask(h, w, m, shift), b) if shift else None
    bias = bias_of(block.bias_table[relative_position_index_2d(m)])
    out = block.attn(windows, windows, windows, mask=mask, bias=bias)
    out = window_reverse(out, m, w, h) if reverse_hw else window_reverse(out, m, h, w)
    return torch.roll(out, (after, after), dims=(1, 2))


def _per_head(table):
    return table.permute(2, 0, 1)


def _tiled(mask, b):
    return mask.repeat(b, 1, 1)


def swin_not_rolled_back_and_bias_transposed(x, block, shift):
    return _swin(x, block, shift, -shift, 0, lambda t: t.permute(2, 1, 0), _tiled)


def swin_no_mask_and_height_width_swapped(x, block, shift):
    return _swin(x, block, shift, -shift, shift, _per_head, lambda mask, b: None, reverse_hw=True)


def swin_wrong_direction_and_masks_window_major(x, block, shift):
    return _swin(x, block, shift, shift, -shift, _per_head, lambda mask, b: mask.repeat_interleave(b, dim=0))


def swin_rolled_twice_the_same_way_without_bias(x, block, shift):
    return _swin(x, block, shift, -shift, -shift, lambda t: None, _tiled)


@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
@pytest.mark.parametrize("learner,traits", [
    (swin_not_rolled_back_and_bias_transposed, [ROLL, BIAS]),
    (swin_no_mask_and_height_width_swapped, [MASK, REVERSE]),
    (swin_wrong_direction_and_masks_window_major, [ROLL, MASK]),
    (swin_rolled_twice_the_same_way_without_bias, [ROLL, BIAS]),
], ids=lambda x: getattr(x, "__name__", ""))
def test_swin_window_attention_two_mistakes_name_both_traits(learner, traits, hidden):
    verdict = _verdict(check_swin_window_attention, learner, hidden)
    for trait in traits:
        assert trait in verdict.message, verdict.message
    others = {ROLL, MASK, BIAS, REVERSE} - set(traits)
    assert not any(other in verdict.message for other in others), verdict.message


def swin_attention_by_hand(x, block, shift):
    """Right, written another way: the library's cyclic_shift, the mask broadcast over the images with
    expand, and attention computed from block.attn's weights instead of calling it."""
    b, h, w, c = x.shape
    m, attn = block.window, block.attn
    windows = window_partition(cyclic_shift(x, shift), m)  # [B*nW, M*M, C]

    def heads(t):
        return t.reshape(t.shape[0], m * m, attn.n_heads, -1).transpose(1, 2)  # [B*nW, heads, M*M, d_k]

    q, k, v = heads(attn.w_q(windows)), heads(attn.w_k(windows)), heads(attn.w_v(windows))
    scores = q @ k.transpose(-2, -1) / attn.d_k ** 0.5
    scores = scores + block.bias_table[relative_position_index_2d(m)].permute(2, 0, 1)
    if shift:
        mask = shifted_window_mask(h, w, m, shift)[None].expand(b, -1, -1, -1).reshape(-1, 1, m * m, m * m)
        scores = scores.masked_fill(~mask, float("-inf"))
    out = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(-1, m * m, c)
    return cyclic_shift(window_reverse(attn.w_o(out), m, h, w), -shift)


def test_swin_window_attention_written_another_way_passes():
    verdict = check_swin_window_attention.judge(check_swin_window_attention.collect_outputs(swin_attention_by_hand,
                                                                                            True), True)
    assert verdict.passed, verdict.message


def swin_calling_the_block(x, block, shift):
    return block(x)


def test_swin_window_attention_cannot_call_the_block_it_is_given():
    verdict = check_swin_window_attention.judge(check_swin_window_attention.collect_outputs(swin_calling_the_block))
    assert not verdict.passed and "calling block(x) inside it" in verdict.message, verdict.message
