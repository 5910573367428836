"""Chapter 12's checkers name an error even when a learner makes two at once.

A catalogue entry recognises one exact wrong answer; two mistakes together match none of them.
The properties of transformer_lib/checks/ch12.py still name the error from how the values were
moved (the right patches in the wrong order, the right pixels inside a patch in the wrong order,
pixels of different squares mixed) or from the structure of a mask or an index (a token that may
not see itself, a masked window that never wrapped around, indices outside the table, two
offsets sharing a row). Each learner function below combines two catalogued mistakes; the
verdict must fail and name the property, in one line.
"""

import pytest
import torch

from transformer_lib.checks.ch12 import (check_merge_patches, check_patchify, check_relative_position_index_2d,
                                         check_shifted_window_mask, check_window_partition, check_window_reverse)

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
