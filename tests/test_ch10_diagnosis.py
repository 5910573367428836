"""Chapter 10's checkers diagnose combined mistakes by property, and accept right answers
written another way.

tests/test_checkers.py proves that each catalogued mistake is named when it is made alone.
Learners often make two at once (targets not shifted *and* the loss in bits; the nucleus
built in the wrong order *and* left sorted), and then no catalogue entry matches: a property
must still name the error from a trait of the output."""

import math

import pytest
import torch
import torch.nn.functional as F

from transformer_lib.checks import ch10
from transformer_lib.gpt import lm_loss


def _verdict(checker, fn, hidden=True):
    return checker.judge(checker.collect_outputs(fn, hidden), hidden)


LN2 = math.log(2)

# ------------------------------------------------------------------- combined mistakes


def loss_unshifted_in_bits(logits, tokens):
    return lm_loss(logits, tokens).to(logits.dtype) / LN2


def loss_unshifted_summed(logits, tokens):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1), reduction="sum")


def loss_wrong_way_summed(logits, tokens):
    return F.cross_entropy(logits[:, 1:].reshape(-1, logits.shape[-1]), tokens[:, :-1].reshape(-1), reduction="sum")


def loss_summed_in_bits(logits, tokens):
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1),
                           reduction="sum") / LN2


def bigram_unsmoothed_and_reversed(ids, vocab_size, alpha):
    counts = torch.zeros(vocab_size, vocab_size, dtype=torch.float64)
    for prev, nxt in zip(ids[:-1].tolist(), ids[1:].tolist()):
        counts[nxt, prev] += 1
    return (counts / counts.sum(dim=1, keepdim=True)).log().float()


def bigram_over_columns_in_bits(ids, vocab_size, alpha):
    counts = torch.zeros(vocab_size, vocab_size, dtype=torch.float64)
    for prev, nxt in zip(ids[:-1].tolist(), ids[1:].tolist()):
        counts[prev, nxt] += 1
    return ((counts + alpha) / (counts.sum(dim=0, keepdim=True) + alpha * vocab_size)).log2().float()


def bits_inverted_and_times_ln2(loss, n_tokens, n_chars):
    return float(loss) * n_chars / n_tokens * LN2


def bits_per_token_in_log10(loss, n_tokens, n_chars):
    return float(loss) / math.log(10)


def temperature_after_softmax_over_batch(logits, temperature):
    return torch.softmax(logits, dim=0) / temperature


def temperature_naive_exp_over_batch(logits, temperature):
    e = (logits / temperature).exp()  # no max subtracted: inf for large logits
    return e / e.sum(dim=0, keepdim=True)


def temperature_multiplied_in_float32(logits, temperature):
    return torch.softmax(logits.float() * temperature, dim=-1)  # float64 inputs come back as float32


def top_p_crossing_dropped_zero_fill(logits, p):
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    drop = probs.cumsum(-1) > p
    drop[..., 0] = False
    return logits.masked_fill(drop.scatter(-1, order, drop), 0.0)


def top_p_ascending_left_sorted(logits, p):
    sorted_logits, _ = logits.sort(dim=-1)
    probs = torch.softmax(sorted_logits, dim=-1)
    return sorted_logits.masked_fill(probs.cumsum(-1) - probs >= p, float("-inf"))


def generate_uncached_without_prompt(model, prompt, max_new_tokens):
    tokens = prompt
    for _ in range(max_new_tokens):
        tokens = torch.cat([tokens, model(tokens)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return tokens[:, prompt.shape[1]:]


def generate_uncached_one_too_many(model, prompt, max_new_tokens):
    tokens = prompt
    for _ in range(max_new_tokens + 1):
        tokens = torch.cat([tokens, model(tokens)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return tokens


COMBINED = [
    (ch10.check_next_token_loss, loss_unshifted_in_bits, ["copy each position's own token"]),
    (ch10.check_next_token_loss, loss_unshifted_summed, ["copy each position's own token"]),
    (ch10.check_next_token_loss, loss_wrong_way_summed, ["predict every next token perfectly"]),
    (ch10.check_next_token_loss, loss_summed_in_bits, ["a loss in bits", "a sum, not a mean"]),
    (ch10.check_bigram_log_probs, bigram_unsmoothed_and_reversed, ["-inf or NaN"]),
    (ch10.check_bigram_log_probs, bigram_over_columns_in_bits, ["do not sum to 1 over the next token"]),
    (ch10.check_bits_per_char, bits_inverted_and_times_ln2, ["ratio inverted"]),
    (ch10.check_bits_per_char, bits_per_token_in_log10, ["tokens per character left out"]),
    (ch10.check_temperature_probs, temperature_after_softmax_over_batch, ["do not sum to 1"]),
    (ch10.check_temperature_probs, temperature_naive_exp_over_batch, ["NaN or inf"]),
    (ch10.check_top_p_filter, top_p_crossing_dropped_zero_fill, ["removed tokens that are not -inf"]),
    (ch10.check_top_p_filter, top_p_ascending_left_sorted, ["kept logits whose values changed"]),
    (ch10.check_greedy_generate, generate_uncached_without_prompt,
     ["positions computed more than once", "does not start with the prompt"]),
    (ch10.check_greedy_generate, generate_uncached_one_too_many,
     ["positions computed more than once", "wrong length"]),
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


def test_a_wrong_direction_in_another_dtype_is_named():
    # The float64 case is hidden; its float32 output escapes the catalogue's exact match.
    verdict = _verdict(ch10.check_temperature_probs, temperature_multiplied_in_float32, hidden=True)
    assert not verdict.passed and "looks like" not in verdict.message
    assert "moves the wrong way" in verdict.message, verdict.message


# ------------------------------------------------------------------- right answers, other ways


def loss_by_gather(logits, tokens):
    log_probs = torch.log_softmax(logits[:, :-1], dim=-1)  # [B, L-1, V]
    return -log_probs.gather(-1, tokens[:, 1:, None]).mean()


def bigram_by_loop(ids, vocab_size, alpha):
    counts = torch.zeros(vocab_size, vocab_size)
    for prev, nxt in zip(ids[:-1].tolist(), ids[1:].tolist()):
        counts[prev, nxt] += 1
    smoothed = counts + alpha
    return torch.log(smoothed / smoothed.sum(dim=1, keepdim=True))


def bits_by_log2_e(loss, n_tokens, n_chars):
    return float(loss) * math.log2(math.e) * n_tokens / n_chars


def temperature_by_hand(logits, temperature):
    z = logits / temperature
    e = (z - z.amax(dim=-1, keepdim=True)).exp()
    return e / e.sum(dim=-1, keepdim=True)


def top_p_by_shifted_cumsum(logits, p):
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    keep_sorted = torch.cat([torch.ones_like(cumulative[..., :1], dtype=torch.bool), cumulative[..., :-1] < p], dim=-1)
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return torch.where(keep, logits, torch.full_like(logits, float("-inf")))


def generate_prompt_first(model, prompt, max_new_tokens):
    """Runs the prompt before the loop and feeds the newest token at the end of every step,
    the last one included: one position more than needed, never one computed twice."""
    cache = model.new_cache()
    tokens, logits = prompt, model(prompt, cache)[:, -1]
    for _ in range(max_new_tokens):
        next_token = logits.argmax(dim=-1, keepdim=True)
        tokens = torch.cat([tokens, next_token], dim=1)
        logits = model(next_token, cache)[:, -1]
    return tokens


RIGHT = [
    (ch10.check_next_token_loss, loss_by_gather),
    (ch10.check_bigram_log_probs, bigram_by_loop),
    (ch10.check_bits_per_char, bits_by_log2_e),
    (ch10.check_temperature_probs, temperature_by_hand),
    (ch10.check_top_p_filter, top_p_by_shifted_cumsum),
    (ch10.check_greedy_generate, generate_prompt_first),
]


@pytest.mark.parametrize("checker,answer", RIGHT, ids=[a.__name__ for _, a in RIGHT])
def test_right_answers_written_differently_pass(checker, answer):
    verdict = _verdict(checker, answer)
    assert verdict.passed, verdict.message


def test_chapter_has_five_exercises_each_with_three_mistakes_and_properties():
    assert len(ch10.CHECKERS) >= 5
    for checker in ch10.CHECKERS:
        assert len(checker.mistakes) >= 3, checker.name
        assert checker.properties, checker.name
