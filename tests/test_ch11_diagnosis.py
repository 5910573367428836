"""Chapter 11's checkers diagnose combined mistakes by property, and accept right answers
written another way.

tests/test_checkers.py proves that each catalogued mistake is named when it is made alone.
Learners often make two at once (a window off by one *and* on the wrong side, a dilation
counted from position 0 *and* a reach not scaled), and then no catalogue entry matches: the
properties must still name each error from a trait of the output."""

import math

import pytest
import torch
import torch.nn.functional as F

from transformer_lib import sparse
from transformer_lib.checks import ch11


def _verdict(checker, fn, hidden=True):
    return checker.judge(checker.collect_outputs(fn, hidden), hidden)


def _offsets(n):
    pos = torch.arange(n)
    return pos[None, :] - pos[:, None]  # j - i


# ------------------------------------------------------------------- combined mistakes


def window_strict_and_inverted(size, window, causal=False):
    offset = _offsets(size)
    inside = ((offset <= 0) & (offset > -window)) if causal else offset.abs() < window
    return ~inside


def window_wrong_side_and_strict(size, window, causal=False):
    offset = _offsets(size)
    return ((offset >= 0) & (offset < window)) if causal else offset.abs() < window


def window_one_sided_and_one_too_wide(size, window, causal=False):
    offset = _offsets(size)
    return (offset <= 0) & (offset >= -(window + 1))  # only the past, whatever causal says, and one too far


def window_float_and_causal_ignored(size, window, causal=False):
    return (_offsets(size).abs() <= window).float()


def dilated_from_zero_and_reach_not_scaled(size, window, dilation):
    key = torch.arange(size)[None, :].expand(size, size)
    return (key % dilation == 0) & (_offsets(size).abs() <= window)


def dilated_ignored_and_strict(size, window, dilation):
    return _offsets(size).abs() < window * dilation


def global_rows_only_and_not_linked(local_mask, n_global):
    n = local_mask.shape[-1]
    mask = torch.zeros(n_global + n, n_global + n, dtype=torch.bool)
    mask[n_global:, n_global:] = local_mask
    mask[:n_global, n_global:] = True  # the global tokens read the tokens ...
    mask[:n_global, :n_global] = torch.eye(n_global, dtype=torch.bool)  # ... and only themselves
    return mask


def global_columns_only_and_local_dropped(local_mask, n_global):
    n = local_mask.shape[-1]
    mask = torch.zeros(n_global + n, n_global + n, dtype=torch.bool)
    mask[:, :n_global] = True
    mask[n_global:, n_global:] = torch.eye(n, dtype=torch.bool)  # the local pattern replaced by the diagonal
    return mask


def global_float(local_mask, n_global):
    return sparse.global_token_mask(local_mask, n_global).float()


def receptive_counts_one_too_many(mask, n_layers):
    return torch.linalg.matrix_power(mask.long(), n_layers + 1)


def receptive_two_layers_too_few(mask, n_layers):
    return sparse.receptive_field(mask, max(n_layers - 2, 0))


def receptive_transposed_counts(mask, n_layers):
    return torch.linalg.matrix_power(mask.transpose(-2, -1).long(), n_layers)


def _phi(x):
    return F.elu(x) + 1


def linear_future_and_no_normaliser(q, k, v):
    return _phi(q) @ (_phi(k).transpose(-2, -1) @ v)


def linear_future_and_scaled(q, k, v):
    return sparse.linear_attention(q / math.sqrt(q.shape[-1]), k, v, causal=False)


def linear_exclusive_and_elu_only(q, k, v):
    phi_q, phi_k = F.elu(q), F.elu(k)
    kv = (phi_k.unsqueeze(-1) * v.unsqueeze(-2)).cumsum(dim=-3) - phi_k.unsqueeze(-1) * v.unsqueeze(-2)
    z = phi_k.cumsum(dim=-2) - phi_k
    return (phi_q.unsqueeze(-2) @ kv).squeeze(-2) / (phi_q * z).sum(-1, keepdim=True)


def _blocked(q, k, v, left, right, block, drop_previous=False):
    """Query i over keys i - left .. i + right, `block` queries at a time (no n x n tensor)."""
    n = q.shape[-2]
    pos = torch.arange(n)
    outs = []
    for start in range(0, n, block):
        end = min(start + block, n)
        lo, hi = (start if drop_previous else max(0, start - max(left, 0))), min(n, end + max(right, 0))
        scores = q[..., start:end, :] @ k[..., lo:hi, :].transpose(-2, -1) / math.sqrt(q.shape[-1])
        offset = pos[None, lo:hi] - pos[start:end, None]
        visible = (offset >= -left) & (offset <= right)
        outs.append(torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1) @ v[..., lo:hi, :])
    return torch.cat(outs, dim=-2)


def banded_off_by_one_and_causal_ignored(q, k, v, window, causal=False):
    return _blocked(q, k, v, window - 1, window - 1, max(window, 16))


def banded_whole_width_and_causal_ignored(q, k, v, window, causal=False):
    return _blocked(q, k, v, window // 2, window // 2, max(window, 16))


def banded_previous_block_dropped_and_padding_unmasked(q, k, v, window, causal=False):
    """Blocks whose span starts at their own first query, over keys padded with zeros at the end
    and the padding left in the softmax."""
    n, b, right = q.shape[-2], max(window, 16), 0 if causal else window
    k_pad, v_pad = F.pad(k, (0, 0, 0, right)), F.pad(v, (0, 0, 0, right))
    pos = torch.arange(n + right)
    outs = []
    for start in range(0, n, b):
        end = min(start + b, n)
        lo, hi = start, end + right
        scores = q[..., start:end, :] @ k_pad[..., lo:hi, :].transpose(-2, -1) / math.sqrt(q.shape[-1])
        offset = pos[None, lo:hi] - pos[start:end, None]
        visible = (offset >= -window) & (offset <= right)
        outs.append(torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1) @ v_pad[..., lo:hi, :])
    return torch.cat(outs, dim=-2)


def banded_dense_and_off_by_one(q, k, v, window, causal=False):
    n = q.shape[-2]
    offset = torch.arange(n)[None, :] - torch.arange(n)[:, None]
    band = (offset > -window) & (offset < (1 if causal else window))
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # [..., n, n]
    return torch.softmax(scores.masked_fill(~band, float("-inf")), dim=-1) @ v


def banded_dense_and_not_scaled(q, k, v, window, causal=False):
    mask = sparse.sliding_window_mask(q.shape[-2], window, causal)  # the whole [n, n] mask
    return torch.softmax((q @ k.transpose(-2, -1)).masked_fill(~mask, float("-inf")), dim=-1) @ v


def _recurrent(q, k, v, phi=_phi, read_first=False, normalise=True, reset=False):
    phi_q, phi_k = phi(q), phi(k)
    S = q.new_zeros(*q.shape[:-2], q.shape[-1], v.shape[-1])
    z = q.new_zeros(*q.shape[:-2], q.shape[-1])
    outs = []
    for i in range(q.shape[-2]):
        def read():
            num = (phi_q[..., i, None, :] @ S).squeeze(-2)
            return num / (phi_q[..., i, :] * z).sum(-1, keepdim=True) if normalise else num
        if read_first:
            outs.append(read())
        outer = phi_k[..., i, :, None] * v[..., i, None, :]
        S, z = (outer, phi_k[..., i, :]) if reset else (S + outer, z + phi_k[..., i, :])
        if not read_first:
            outs.append(read())
    return torch.stack(outs, dim=-2)


def recurrent_read_first_and_no_normaliser(q, k, v):
    return _recurrent(q, k, v, read_first=True, normalise=False)


def recurrent_reset_and_read_first(q, k, v):
    return _recurrent(q, k, v, read_first=True, reset=True)


def recurrent_no_feature_map_and_no_normaliser(q, k, v):
    return _recurrent(q, k, v, phi=lambda x: x, normalise=False)


def recurrent_as_exclusive_prefix_sums(q, k, v):
    phi_q, phi_k = _phi(q), _phi(k)
    outer = phi_k.unsqueeze(-1) * v.unsqueeze(-2)  # [..., n, d_k, d_v]: a state per position
    S, z = outer.cumsum(dim=-3) - outer, phi_k.cumsum(dim=-2) - phi_k
    return (phi_q.unsqueeze(-2) @ S).squeeze(-2) / (phi_q * z).sum(-1, keepdim=True)


def step_no_rescale_and_block_max(m, l, acc, scores, v_block):
    m_new = scores.amax(dim=-1, keepdim=True)
    p = torch.exp(scores - m_new)
    return m_new, l + p.sum(dim=-1, keepdim=True), acc + p @ v_block


def step_no_max_and_sum_not_rescaled(m, l, acc, scores, v_block):
    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))
    p = torch.exp(scores)  # no maximum subtracted at all
    return m_new, l + p.sum(dim=-1, keepdim=True), torch.exp(m - m_new) * acc + p @ v_block


def step_acc_not_rescaled_and_upside_down(m, l, acc, scores, v_block):
    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))
    p = torch.exp(scores - m_new)
    return m_new, torch.exp(m_new - m).nan_to_num(posinf=0.0) * l + p.sum(dim=-1, keepdim=True), acc + p @ v_block


COMBINED = [
    (ch11.check_banded_attention, banded_off_by_one_and_causal_ignored,
     ["weight on keys after the query although causal=True", "no weight on the keys exactly `window` steps away"]),
    (ch11.check_banded_attention, banded_whole_width_and_causal_ignored,
     ["weight on keys after the query although causal=True", "no weight beyond window // 2 steps"]),
    (ch11.check_banded_attention, banded_previous_block_dropped_and_padding_unmasked,
     ["a band that changes from query to query", "padding positions got a share of the softmax"]),
    (ch11.check_banded_attention, banded_dense_and_off_by_one,
     ["an n x n tensor on the long case", "no weight on the keys exactly `window` steps away"]),
    (ch11.check_banded_attention, banded_dense_and_not_scaled, ["an n x n tensor on the long case"]),
    (ch11.check_recurrent_linear_attention, recurrent_read_first_and_no_normaliser, ["not averages of the values"]),
    (ch11.check_recurrent_linear_attention, recurrent_reset_and_read_first, ["NaN or inf"]),
    (ch11.check_recurrent_linear_attention, recurrent_no_feature_map_and_no_normaliser,
     ["not averages of the values"]),
    (ch11.check_recurrent_linear_attention, recurrent_as_exclusive_prefix_sums,
     ["a state kept for every position", "NaN or inf"]),
    (ch11.check_sliding_window_mask, window_strict_and_inverted, ["True and False swapped", "cannot see itself"]),
    (ch11.check_sliding_window_mask, window_wrong_side_and_strict,
     ["sees the future", "exactly `window` steps away left out"]),
    (ch11.check_sliding_window_mask, window_one_sided_and_one_too_wide,
     ["not symmetric although causal=False", "more keys than the window allows"]),
    (ch11.check_sliding_window_mask, window_float_and_causal_ignored, ["numbers instead of booleans"]),
    (ch11.check_dilated_mask, dilated_from_zero_and_reach_not_scaled, ["cannot see itself", "not symmetric"]),
    (ch11.check_dilated_mask, dilated_ignored_and_strict, ["keys visible in the gaps"]),
    (ch11.check_global_token_mask, global_rows_only_and_not_linked,
     ["a token that cannot read a global token", "a global token that cannot read every position"]),
    (ch11.check_global_token_mask, global_columns_only_and_local_dropped,
     ["a global token that cannot read every position", "local pattern changed"]),
    (ch11.check_global_token_mask, global_float, ["numbers instead of booleans"]),
    (ch11.check_receptive_field, receptive_counts_one_too_many, ["numbers instead of booleans"]),
    (ch11.check_receptive_field, receptive_two_layers_too_few, ["fewer positions reached"]),
    (ch11.check_receptive_field, receptive_transposed_counts, ["numbers instead of booleans"]),
    (ch11.check_causal_linear_attention, linear_future_and_no_normaliser, ["not averages of the values"]),
    (ch11.check_causal_linear_attention, linear_future_and_scaled, ["the future leaked in"]),
    (ch11.check_causal_linear_attention, linear_exclusive_and_elu_only, ["NaN or inf"]),
    (ch11.check_online_softmax_step, step_no_rescale_and_block_max, ["a running maximum that went down"]),
    (ch11.check_online_softmax_step, step_no_max_and_sum_not_rescaled, ["acc / l is not the softmax average"]),
    (ch11.check_online_softmax_step, step_acc_not_rescaled_and_upside_down, ["acc / l is not the softmax average"]),
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


def test_overflow_without_the_maximum_is_named_on_large_scores():
    def step_without_maximum(m, l, acc, scores, v_block):
        p = torch.exp(scores)
        return torch.maximum(m, scores.amax(dim=-1, keepdim=True)), l + p.sum(-1, keepdim=True), acc + p @ v_block

    verdict = _verdict(ch11.check_online_softmax_step, step_without_maximum, hidden=True)
    assert not verdict.passed and "NaN or inf on large inputs" in verdict.message, verdict.message


# ------------------------------------------------------------------- right answers, other ways


def window_by_loops(size, window, causal=False):
    mask = torch.zeros(size, size, dtype=torch.bool)
    for i in range(size):
        lo, hi = max(0, i - window), i if causal else min(size - 1, i + window)
        mask[i, lo:hi + 1] = True
    return mask


def window_by_triangles(size, window, causal=False):
    ones = torch.ones(size, size, dtype=torch.bool)
    return ones.tril(0 if causal else window) & ones.triu(-window)


def dilated_by_loops(size, window, dilation):
    mask = torch.zeros(size, size, dtype=torch.bool)
    for i in range(size):
        for step in range(-window, window + 1):
            j = i + step * dilation
            if 0 <= j < size:
                mask[i, j] = True
    return mask


def global_by_cat(local_mask, n_global):
    n = local_mask.shape[-1]
    top = torch.ones(n_global, n_global + n, dtype=torch.bool)
    bottom = torch.cat([torch.ones(n, n_global, dtype=torch.bool), local_mask], dim=1)
    return torch.cat([top, bottom], dim=0)


def receptive_by_ints(mask, n_layers):
    reach = torch.eye(mask.shape[-1], dtype=torch.long).expand(mask.shape).clone()
    for _ in range(n_layers):
        reach = (mask.long() @ reach).clamp(max=1)
    return reach.bool()


def linear_by_loop(q, k, v):
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    state = torch.zeros(*q.shape[:-2], q.shape[-1], v.shape[-1], dtype=q.dtype)
    norm = torch.zeros(*q.shape[:-2], q.shape[-1], dtype=q.dtype)
    outs = []
    for i in range(q.shape[-2]):  # the RNN view: one state update per token
        state = state + phi_k[..., i, :, None] * v[..., i, None, :]
        norm = norm + phi_k[..., i, :]
        outs.append((phi_q[..., i, None, :] @ state).squeeze(-2) / (phi_q[..., i, :] * norm).sum(-1, keepdim=True))
    return torch.stack(outs, dim=-2)


def linear_by_masked_matrix(q, k, v):
    sim = (F.elu(q) + 1) @ (F.elu(k) + 1).transpose(-2, -1)
    sim = sim * torch.ones(sim.shape[-2:], dtype=torch.bool).tril()
    return (sim / sim.sum(-1, keepdim=True)) @ v


def step_with_where(m, l, acc, scores, v_block):
    block_max = scores.max(dim=-1, keepdim=True).values
    m_new = torch.where(block_max > m, block_max, m)
    factor = (m - m_new).exp()
    weights = (scores - m_new).exp()
    return m_new, l * factor + weights.sum(-1, keepdim=True), acc * factor + torch.matmul(weights, v_block)


def banded_padded_and_unfolded(q, k, v, window, causal=False):
    """The library's way: keys padded, cut into overlapping spans with unfold, the padding masked."""
    n, b = q.shape[-2], 8
    right = 0 if causal else window
    n_blocks = -(-n // b)
    span = b + window + right
    q_blocks = F.pad(q, (0, 0, 0, n_blocks * b - n)).unflatten(-2, (n_blocks, b))
    k_spans = F.pad(k, (0, 0, window, n_blocks * b - n + right)).unfold(-2, span, b).transpose(-2, -1)
    v_spans = F.pad(v, (0, 0, window, n_blocks * b - n + right)).unfold(-2, span, b).transpose(-2, -1)
    key_pos = torch.arange(n_blocks)[:, None, None] * b - window + torch.arange(span)[None, None, :]
    query_pos = torch.arange(n_blocks)[:, None, None] * b + torch.arange(b)[None, :, None]
    offset = key_pos - query_pos  # [n_blocks, b, span]
    visible = (offset >= -window) & (offset <= right) & (key_pos >= 0) & (key_pos < n)
    scores = q_blocks @ k_spans.transpose(-2, -1) / math.sqrt(q.shape[-1])
    out = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1) @ v_spans
    return out.flatten(-3, -2)[..., :n, :]


def banded_one_query_at_a_time(q, k, v, window, causal=False):
    n = q.shape[-2]
    rows = []
    for i in range(n):
        lo, hi = max(0, i - window), min(n, i + 1 + (0 if causal else window))
        rows.append(F.scaled_dot_product_attention(q[..., i:i + 1, :], k[..., lo:hi, :], v[..., lo:hi, :]))
    return torch.cat(rows, dim=-2)


def banded_blocks_of_window_with_sdpa(q, k, v, window, causal=False):
    n, b = q.shape[-2], max(window, 1)
    out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    for start in range(0, n, b):
        end = min(start + b, n)
        lo, hi = max(0, start - window), min(n, end + (0 if causal else window))
        i = torch.arange(start, end)[:, None]
        j = torch.arange(lo, hi)[None, :]
        mask = (j - i >= -window) & (j - i <= (0 if causal else window))
        out[..., start:end, :] = F.scaled_dot_product_attention(q[..., start:end, :], k[..., lo:hi, :],
                                                                v[..., lo:hi, :], attn_mask=mask)
    return out


def recurrent_in_place(q, k, v):
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    state = torch.zeros(*q.shape[:-2], q.shape[-1], v.shape[-1], dtype=q.dtype)
    norm = torch.zeros(*q.shape[:-2], q.shape[-1], dtype=q.dtype)
    out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    for i in range(q.shape[-2]):
        state += torch.einsum("...d,...e->...de", phi_k[..., i, :], v[..., i, :])
        norm += phi_k[..., i, :]
        num = torch.einsum("...d,...de->...e", phi_q[..., i, :], state)
        out[..., i, :] = num / torch.einsum("...d,...d->...", phi_q[..., i, :], norm)[..., None]
    return out


def recurrent_with_normaliser_by_cumsum(q, k, v):
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    den = (phi_q * phi_k.cumsum(dim=-2)).sum(-1, keepdim=True)  # [..., n, 1]: only [n, d_k] held
    state = torch.zeros(*q.shape[:-2], q.shape[-1], v.shape[-1], dtype=q.dtype)
    outs = []
    for q_i, k_i, v_i in zip(phi_q.unbind(-2), phi_k.unbind(-2), v.unbind(-2)):
        state = state + k_i.unsqueeze(-1) * v_i.unsqueeze(-2)
        outs.append((q_i.unsqueeze(-2) @ state).squeeze(-2))
    return torch.stack(outs, dim=-2) / den


RIGHT = [
    (ch11.check_banded_attention, banded_padded_and_unfolded),
    (ch11.check_banded_attention, banded_one_query_at_a_time),
    (ch11.check_banded_attention, banded_blocks_of_window_with_sdpa),
    (ch11.check_recurrent_linear_attention, recurrent_in_place),
    (ch11.check_recurrent_linear_attention, recurrent_with_normaliser_by_cumsum),
    (ch11.check_sliding_window_mask, window_by_loops),
    (ch11.check_sliding_window_mask, window_by_triangles),
    (ch11.check_dilated_mask, dilated_by_loops),
    (ch11.check_global_token_mask, global_by_cat),
    (ch11.check_receptive_field, receptive_by_ints),
    (ch11.check_causal_linear_attention, linear_by_loop),
    (ch11.check_causal_linear_attention, linear_by_masked_matrix),
    (ch11.check_online_softmax_step, step_with_where),
]


@pytest.mark.parametrize("checker,answer", RIGHT, ids=[a.__name__ for _, a in RIGHT])
def test_right_answers_written_differently_pass(checker, answer):
    verdict = _verdict(checker, answer)
    assert verdict.passed, verdict.message


# ------------------------------------------------------------------- cost, not only numbers


def test_banded_attention_that_builds_the_n_by_n_matrix_is_refused_with_its_message():
    def dense_but_right(q, k, v, window, causal=False):
        mask = sparse.sliding_window_mask(q.shape[-2], window, causal)
        return torch.softmax((q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~mask, float("-inf")),
                             dim=-1) @ v

    for hidden in (False, True):
        verdict = _verdict(ch11.check_banded_attention, dense_but_right, hidden)
        assert not verdict.passed and verdict.mistake.startswith("the whole n x n score matrix"), verdict.message
    # The short cases alone are right: only the long one, watched, tells the two apart.
    short = [c for c in ch11.check_banded_attention.cases(hidden=True) if c.args[0].shape[-2] < ch11.BANDED_LONG]
    for case in short:
        torch.testing.assert_close(dense_but_right(*case.args, **case.kwargs),
                                   sparse.banded_attention(*case.args, **case.kwargs), rtol=1e-5, atol=1e-6)


def test_the_watch_counts_allocations_not_views():
    n = 2048
    small = torch.ones(n)
    _, largest = ch11._largest_allocation(lambda: small[None, :].expand(n, n) * 1.0)
    assert largest == n * n  # the product allocates
    _, largest = ch11._largest_allocation(lambda: small[None, :].expand(n, n))
    assert largest == n  # the view does not
    q, k, v = (torch.randn(1, n, 4) for _ in range(3))
    _, largest = ch11._largest_allocation(sparse.banded_attention, q, k, v, 4)
    assert largest < n * n // 4


def test_recurrent_form_by_prefix_sums_is_refused_as_a_state_per_position():
    def prefix(q, k, v):
        return sparse.causal_linear_attention(q, k, v)

    verdict = _verdict(ch11.check_recurrent_linear_attention, prefix, hidden=False)
    assert not verdict.passed and verdict.mistake.startswith("prefix sums over the whole sequence"), verdict.message


def test_chapter_has_eight_exercises_each_with_three_mistakes_and_properties():
    assert len(ch11.CHECKERS) >= 8
    for checker in ch11.CHECKERS:
        assert len(checker.mistakes) >= 3, checker.name
        assert checker.properties, checker.name


def test_cases_and_catalogue_never_call_a_reference(monkeypatch):
    """The grader builds the cases where every reference of the chapter is a raising stub
    (autograder/hiding.py): neither the cases nor the catalogue may depend on one."""

    def hidden(*args, **kwargs):
        raise RuntimeError("reference hidden")

    for checker in ch11.CHECKERS:
        name = checker.reference.__name__
        monkeypatch.setattr(sparse, name, hidden)
        if hasattr(ch11, name):
            monkeypatch.setattr(ch11, name, hidden)
    for checker in ch11.CHECKERS:
        for case in checker.cases(hidden=True):
            for mistake in checker.mistakes:
                try:
                    checker._call(mistake.implementation, case)
                except RuntimeError as exc:
                    assert "reference hidden" not in str(exc), f"{checker.name}: {mistake.name}"
