"""Chapter 10's checkers diagnose combined mistakes by property, and accept right answers
written another way.

tests/test_checkers.py proves that each catalogued mistake is named when it is made alone.
Learners often make two at once (targets not shifted *and* the loss in bits; the nucleus
built in the wrong order *and* left sorted; a post-norm block without its mask; a forward
pass that neither offsets its positions nor normalises at the end; a sampler that ignores
the generator and the cache), and then no catalogue entry matches: a property must still
name the error from a trait of the output."""

import math

import pytest
import torch
import torch.nn.functional as F

from transformer_lib.checks import ch10, describe_difference
from transformer_lib.decoding import top_k_filter
from transformer_lib.gpt import lm_loss, temperature_probs, top_p_filter
from transformer_lib.masks import causal_mask


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


def block_post_norm_without_mask(x, block, cache=None):
    x = block.ln_1(x + block.dropout(block.self_attn(x, x, x, None, cache=cache)))
    return block.ln_2(x + block.dropout(block.feed_forward(x)))


def block_without_mask_or_cache(x, block, cache=None):
    h = block.ln_1(x)
    x = x + block.dropout(block.self_attn(h, h, h))
    return x + block.dropout(block.feed_forward(block.ln_2(x)))


def block_normalised_residual_mlp_first(x, block, cache=None):
    past = 0 if cache is None else cache.length
    mask = causal_mask(past + x.shape[1])[past:]
    h = block.ln_2(x)
    x = h + block.dropout(block.feed_forward(h))
    h = block.ln_1(x)
    return h + block.dropout(block.self_attn(h, h, h, mask, cache=cache))


def block_post_norm_cache_ignored(x, block, cache=None):
    mask = causal_mask(x.shape[1])
    x = block.ln_1(x + block.self_attn(x, x, x, mask))
    return block.ln_2(x + block.feed_forward(x))


def forward_no_offset_no_final_norm(tokens, model, cache=None):
    x = model.positions(model.token_embedding(tokens))
    for i, block in enumerate(model.blocks):
        x = block(x, None if cache is None else cache[i])
    return model.lm_head(x)


def forward_scaled_without_cache(tokens, model, cache=None):
    x = model.positions(model.token_embedding(tokens) * math.sqrt(model.config.d_model))
    for block in model.blocks:
        x = block(x)
    return model.lm_head(model.ln_f(x))


def forward_first_cache_and_no_offset(tokens, model, cache=None):
    x = model.positions(model.token_embedding(tokens))
    for block in model.blocks:
        x = block(x, None if cache is None else cache[0])
    return model.lm_head(model.ln_f(x))


def forward_calls_a_block_function_directly(tokens, model, cache=None):
    from transformer_lib.gpt import gpt_block  # instead of block(x, cache), which runs the model's own
    past = 0 if cache is None else cache[0].length
    x = model.positions(model.token_embedding(tokens), offset=past)
    for i, block in enumerate(model.blocks):
        x = gpt_block(x, block, None if cache is None else cache[i])
    return model.lm_head(model.ln_f(x))


def _sampler(choose, cached=True):
    def run(model, prompt, max_new_tokens, temperature=1.0, top_k=None, top_p=None, generator=None):
        cache = model.new_cache() if cached else None
        tokens = new = prompt
        for _ in range(max_new_tokens):
            logits = model(new if cached else tokens, cache)[:, -1]
            new = choose(logits, temperature, top_k, top_p, generator)
            tokens = torch.cat([tokens, new], dim=1)
        return tokens

    run.__name__ = choose.__name__ + ("" if cached else "_without_cache")
    return run


def _filters(scores, top_k, top_p):
    scores = top_k_filter(scores, top_k)
    return scores if top_p is None else top_p_filter(scores, top_p)


def global_rng(logits, temperature, top_k, top_p, generator):
    return torch.multinomial(_filters(logits / temperature, top_k, top_p).softmax(-1), 1)


def no_temperature_global_rng(logits, temperature, top_k, top_p, generator):
    return torch.multinomial(_filters(logits, top_k, top_p).softmax(-1), 1)


def filters_on_probabilities(logits, temperature, top_k, top_p, generator):
    probs = temperature_probs(logits, temperature)
    return torch.multinomial(_filters(probs, top_k, top_p).softmax(-1), 1, generator=generator)


def argmax(logits, temperature, top_k, top_p, generator):
    return logits.argmax(dim=-1, keepdim=True)


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
    (ch10.check_gpt_block, block_post_norm_without_mask, ["not causal", "post-norm"]),
    (ch10.check_gpt_block, block_without_mask_or_cache, ["not causal", "a cache that does not end up holding"]),
    (ch10.check_gpt_block, block_normalised_residual_mlp_first, ["does not carry x through"]),
    (ch10.check_gpt_block, block_post_norm_cache_ignored, ["post-norm", "a cache that does not end up holding"]),
    (ch10.check_gpt_forward, forward_no_offset_no_final_norm, ["differ from your own logits without it"]),
    (ch10.check_gpt_forward, forward_scaled_without_cache,
     ["differ from your own logits without it", "do not hold every position"]),
    (ch10.check_gpt_forward, forward_first_cache_and_no_offset, ["do not hold every position"]),
    (ch10.check_gpt_forward, forward_calls_a_block_function_directly, ["never ran as the model's blocks"]),
    (ch10.check_sample, _sampler(global_rng, cached=False), ["the generator is not used", "more than once"]),
    (ch10.check_sample, _sampler(no_temperature_global_rng), ["the generator is not used", "outside the top-k"]),
    (ch10.check_sample, _sampler(filters_on_probabilities, cached=False), ["outside the top-k", "more than once"]),
    (ch10.check_sample, _sampler(argmax, cached=False), ["no draw", "more than once"]),
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


def block_with_its_own_mask(x, block, cache=None):
    past = cache.length if cache is not None else 0
    rows = torch.arange(past, past + x.shape[1])[:, None]  # the new positions
    allowed = torch.arange(past + x.shape[1])[None, :] <= rows  # [seq, past + seq]
    a = block.ln_1(x)
    x = x + block.dropout(block.self_attn(a, a, a, mask=allowed, cache=cache))
    return x + block.dropout(block.feed_forward(block.ln_2(x)))


def forward_by_the_table(tokens, model, cache=None):
    past = cache[0].length if cache else 0
    positions = torch.arange(past, past + tokens.shape[1])
    x = model.positions.dropout(model.token_embedding(tokens) + model.positions.embedding(positions))
    for block, block_cache in zip(model.blocks, cache or [None] * len(model.blocks)):
        x = block(x, block_cache)
    return F.linear(model.ln_f(x), model.token_embedding.weight)  # the tied output layer, by hand


def sample_prompt_first(model, prompt, max_new_tokens, temperature=1.0, top_k=None, top_p=None, generator=None):
    """Runs the prompt before the loop, divides the logits by T itself and draws from unnormalised
    weights: the same distribution and the same random numbers."""
    cache = model.new_cache()
    logits, out = model(prompt, cache)[:, -1], [prompt]
    for step in range(max_new_tokens):
        scores = top_k_filter(logits / temperature, top_k)
        if top_p is not None:
            scores = top_p_filter(scores, top_p)
        new = torch.multinomial((scores - scores.amax(-1, keepdim=True)).exp(), 1, generator=generator)
        out.append(new)
        if step < max_new_tokens - 1:
            logits = model(new, cache)[:, -1]
    return torch.cat(out, dim=1)


RIGHT = [
    (ch10.check_next_token_loss, loss_by_gather),
    (ch10.check_bigram_log_probs, bigram_by_loop),
    (ch10.check_bits_per_char, bits_by_log2_e),
    (ch10.check_temperature_probs, temperature_by_hand),
    (ch10.check_top_p_filter, top_p_by_shifted_cumsum),
    (ch10.check_greedy_generate, generate_prompt_first),
    (ch10.check_gpt_block, block_with_its_own_mask),
    (ch10.check_gpt_forward, forward_by_the_table),
    (ch10.check_sample, sample_prompt_first),
]


@pytest.mark.parametrize("checker,answer", RIGHT, ids=[a.__name__ for _, a in RIGHT])
def test_right_answers_written_differently_pass(checker, answer):
    verdict = _verdict(checker, answer)
    assert verdict.passed, verdict.message


@pytest.mark.parametrize("checker,answer", RIGHT, ids=[a.__name__ for _, a in RIGHT])
def test_right_answers_written_differently_pass_the_hidden_cases_too(checker, answer):
    verdict = _verdict(checker, answer, hidden=True)
    assert verdict.passed, verdict.message


def test_chapter_has_nine_exercises_each_with_three_mistakes_and_properties():
    assert [c.name for c in ch10.CHECKERS] == ["gpt_block", "gpt_forward", "next_token_loss", "bigram_log_probs",
                                               "bits_per_char", "greedy_generate", "temperature_probs",
                                               "top_p_filter", "sample"]
    for checker in ch10.CHECKERS:
        assert len(checker.mistakes) >= 3, checker.name
        assert checker.properties, checker.name


# ------------------------------------------------------------------- the model-level checks need no other reference


HIDDEN_WHILE_GRADING = ("gpt_block", "gpt_forward", "greedy_generate", "sample", "temperature_probs", "top_p_filter")


def _hide_references(monkeypatch):
    """Make the chapter's references raise, as in the grader's copy of the library."""
    import transformer_lib.gpt as gpt

    for name in HIDDEN_WHILE_GRADING:
        def hidden(*args, _name=name, **kwargs):
            raise RuntimeError(f"{_name} is hidden")

        monkeypatch.setattr(gpt, name, hidden)
    return gpt


@pytest.mark.parametrize("checker,answer", [(ch10.check_gpt_forward, forward_by_the_table),
                                            (ch10.check_sample, sample_prompt_first),
                                            (ch10.check_greedy_generate, generate_prompt_first)],
                         ids=["gpt_forward", "sample", "greedy_generate"])
def test_a_right_answer_runs_the_same_while_the_chapters_references_are_hidden(checker, answer, monkeypatch):
    """While the grader runs a notebook, every reference of the chapter is a stub that raises. The
    checks' tiny models run GPT-1's block and forward pass (wrong answers to this chapter's
    exercises), never gpt_block or gpt_forward, so a right answer's outputs are the same there."""
    expected = checker.collect_outputs(answer, hidden=True)
    gpt = _hide_references(monkeypatch)
    with pytest.raises(RuntimeError, match="hidden"):  # the stubs are in place: a default GPT cannot run
        gpt.GPT(gpt.GPTConfig(vocab_size=5, max_len=8, d_model=8, n_heads=2, n_layers=1))(torch.zeros(1, 2).long())
    got = checker.collect_outputs(answer, hidden=True)
    monkeypatch.undo()
    assert all(describe_difference(e, g) is None for e, g in zip(expected, got)), got


def test_a_block_or_model_called_whole_is_refused_with_a_clear_message():
    def block_whole(x, block, cache=None):
        return block(x, cache)

    def forward_whole(tokens, model, cache=None):
        return model(tokens, cache)

    for checker, answer, words in [(ch10.check_gpt_block, block_whole, "compute the block from its parts"),
                                   (ch10.check_gpt_forward, forward_whole, "compute the logits from the model's parts")]:
        verdict = _verdict(checker, answer)
        assert not verdict.passed and words in verdict.message, verdict.message
