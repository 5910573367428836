"""Chapter 04's checkers name errors no single catalogue entry reproduces (two mistakes at once),
from a trait of the output: the properties in transformer_lib/checks/ch04.py. And the library's
relative_position_bias, the reference of exercise 5, against the module built on it."""

import pytest
import torch

from transformer_lib.checks.ch04 import (check_add_positions, check_relative_position_bias,
                                         check_relative_position_index, check_rotation_for_offset,
                                         check_sinusoidal_table)
from transformer_lib.positional import (RelativePositionBias, offset_rotation, relative_offsets, relative_position_bias,
                                        sinusoidal_encoding)


def verdict_of(checker, fn, hidden=True):
    return checker.judge(checker.collect_outputs(fn, hidden), hidden)


def _table(max_len, d_model, exponent_scale=1.0, sin_first=True):
    omega = 10000.0 ** (-exponent_scale * torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    angle = torch.arange(max_len, dtype=torch.float64)[:, None] * omega  # [max_len, d/2]
    first, second = (angle.sin(), angle.cos()) if sin_first else (angle.cos(), angle.sin())
    return torch.stack([first, second], dim=-1).reshape(max_len, d_model).float()


# -- exercise 1: the sinusoidal table ----------------------------------------------------------


def test_swapped_with_a_wrong_exponent_is_named_by_position_zero():
    verdict = verdict_of(check_sinusoidal_table, lambda n, d: _table(n, d, exponent_scale=0.5, sin_first=False))
    assert not verdict.passed and "even dims start at 1" in verdict.message


def test_transposed_table_is_named():
    verdict = verdict_of(check_sinusoidal_table, lambda n, d: sinusoidal_encoding(n, d).T)
    assert "[d_model, max_len]" in verdict.message


def test_transposed_and_swapped_are_both_named():
    verdict = verdict_of(check_sinusoidal_table, lambda n, d: _table(n, d, sin_first=False).T)
    assert "[d_model, max_len]" in verdict.message and "even dims start at 1" in verdict.message


def test_raw_angles_are_named():
    def angles(n, d):
        omega = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        a = torch.arange(n, dtype=torch.float64)[:, None] * omega
        return torch.stack([a, a], dim=-1).reshape(n, d).float()

    assert "outside [-1, 1]" in verdict_of(check_sinusoidal_table, angles).message


def test_halves_with_base_1000_are_named_by_the_pairs():
    def halves_base_1000(n, d):
        omega = 1000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        a = torch.arange(n, dtype=torch.float64)[:, None] * omega
        return torch.cat([a.sin(), a.cos()], dim=-1).float()

    assert "squares do not add up to 1" in verdict_of(check_sinusoidal_table, halves_base_1000).message


# -- exercise 2: adding the rows -----------------------------------------------------------------


def test_rows_two_positions_late_are_named():
    def two_late(x, pe, offset=0):
        seq = x.shape[-2]
        start = min(offset + 2, pe.shape[0] - seq)
        return x + pe[start : start + seq].to(x.dtype)

    assert "starts at the wrong position" in verdict_of(check_add_positions, two_late).message


def test_one_row_for_every_token_is_named():
    verdict = verdict_of(check_add_positions, lambda x, pe, offset=0: x + pe[offset].to(x.dtype))
    assert "the same position vector added to every token" in verdict.message


# -- exercise 3: the rotation ----------------------------------------------------------------------


def test_broadcast_slices_with_mirrored_signs_are_named():
    def wrong(k, d):
        angle = k * 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        m = torch.zeros(d, d, dtype=torch.float64)
        m[0::2, 0::2], m[0::2, 1::2] = angle.cos(), -angle.sin()
        m[1::2, 0::2], m[1::2, 1::2] = angle.sin(), angle.cos()
        return m.float()

    assert "outside the 2x2 blocks" in verdict_of(check_rotation_for_offset, wrong).message


def test_a_scaled_rotation_is_named():
    verdict = verdict_of(check_rotation_for_offset, lambda k, d: 2 * offset_rotation(k, d))
    assert "not a rotation" in verdict.message


# -- exercise 4: the index -------------------------------------------------------------------------


def test_mirrored_and_unclipped_is_named():
    def wrong(q, k, d):
        return torch.arange(q)[:, None] - torch.arange(k)[None, :] + d

    assert "outside 0 .. 2 * max_distance" in verdict_of(check_relative_position_index, wrong).message


# -- exercise 5: the bias ----------------------------------------------------------------------------


def test_heads_last_and_mirrored_is_named_by_the_shape():
    def wrong(table, q, k):
        d = (table.shape[1] - 1) // 2
        index = (torch.arange(q)[:, None] - torch.arange(k)[None, :]).clamp(-d, d) + d
        return table.T[index]  # [L_q, L_k, heads]

    assert "right sizes in the wrong order" in verdict_of(check_relative_position_bias, wrong).message


def test_queries_and_keys_swapped_is_named_as_a_transpose():
    def wrong(table, q, k):
        return relative_position_bias(table, q, k).transpose(-2, -1)

    assert "swapped" in verdict_of(check_relative_position_bias, wrong).message


def test_one_head_for_all_is_named():
    def wrong(table, q, k):
        return relative_position_bias(table, q, k)[:1].expand(table.shape[0], q, k).clone()

    assert "every head given the same bias" in verdict_of(check_relative_position_bias, wrong).message


def test_a_bias_of_the_absolute_position_is_named():
    def wrong(table, q, k):  # entry (i, j) from column min(j, 2D): absolute, not relative
        columns = torch.arange(k).clamp(max=table.shape[1] - 1)
        return table[:, columns][:, None, :].expand(table.shape[0], q, k).clone()

    assert "changes along a diagonal" in verdict_of(check_relative_position_bias, wrong).message


@pytest.mark.parametrize("q_len,k_len,q_offset", [(5, 5, 0), (3, 7, 0), (1, 6, 5), (2, 6, 4)])
def test_library_bias_equals_the_module_and_the_index(q_len, k_len, q_offset):
    torch.manual_seed(0)
    module = RelativePositionBias(3, max_distance=2)
    with torch.no_grad():
        module.table.normal_()
    bias = relative_position_bias(module.table, q_len, k_len, q_offset)
    assert torch.equal(bias, module(q_len, k_len, q_offset))
    index = relative_offsets(q_len, k_len, 2, q_offset=q_offset)
    for h in range(3):
        assert torch.equal(bias[h], module.table[h][index])


def test_library_bias_is_differentiable_and_rejects_an_even_table():
    table = torch.zeros(2, 5, requires_grad=True)
    relative_position_bias(table, 4, 4)[:, 1, 0].sum().backward()  # offset -1 of both heads
    assert table.grad[:, 1].tolist() == [1.0, 1.0] and table.grad.abs().sum() == 2.0
    with pytest.raises(ValueError, match="odd number of columns"):
        relative_position_bias(torch.zeros(2, 4), 3, 3)
