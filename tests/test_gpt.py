"""The decoder-only model: equal to Hugging Face's GPT-2, causal, cached generation == uncached, and
built from two plain functions (gpt_block, gpt_forward) that a model can take from elsewhere."""

import itertools
import math
import os

import pytest
import torch

from transformer_lib.checks import model_calls
from transformer_lib.gpt import (
    GPT,
    Block,
    GPTConfig,
    beam_search,
    bits_per_char,
    choose_next_token,
    generate,
    gpt_block,
    gpt_config_from_hf,
    gpt_forward,
    lm_loss,
    load_hf_gpt2_state_dict,
    perplexity,
    sample,
    sequence_log_prob,
    top_p_filter,
)

os.environ["HF_HUB_OFFLINE"] = "1"  # never download anything: models are built from configs

SMALL = GPTConfig(vocab_size=101, max_len=64, d_model=32, n_heads=2, n_layers=2, dropout=0.0)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT(SMALL).eval()


@pytest.fixture(scope="module")
def hf_pair():
    """A GPT-2 from the brief's small config with every weight random (seeded), and our copy."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    hf_config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=101, n_positions=64,
                                        resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
    hf = transformers.GPT2LMHeadModel(hf_config).eval()
    with torch.no_grad():
        for p in hf.parameters():  # not only the default init: LayerNorms and biases too
            p.normal_(0.0, 0.2)
    ours = load_hf_gpt2_state_dict(GPT(gpt_config_from_hf(hf_config)), hf.state_dict()).eval()
    return hf, ours


# ---------------------------------------------------------------------------------------
# Equivalence with Hugging Face GPT-2
# ---------------------------------------------------------------------------------------

def test_logits_equal_hugging_face_gpt2(hf_pair):
    hf, ours = hf_pair
    tokens = torch.randint(0, 101, (3, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(tokens).logits
        got = ours(tokens)
    assert got.shape == expected.shape == (3, 64, 101)
    assert torch.allclose(got, expected, atol=1e-5, rtol=0), (got - expected).abs().max().item()


def test_the_loss_equals_hugging_face_with_shifted_targets(hf_pair):
    hf, ours = hf_pair
    tokens = torch.randint(0, 101, (2, 20), generator=torch.Generator().manual_seed(2))
    labels = tokens.clone()
    labels[0, :5] = -100  # a prompt we do not train on
    with torch.no_grad():
        expected = hf(tokens, labels=labels).loss  # Hugging Face shifts inside
        got = lm_loss(ours(tokens[:, :-1]), labels[:, 1:])  # we shift outside
    assert torch.allclose(got, expected, atol=1e-5)


def test_tied_embeddings_and_a_clear_error_for_a_wrong_state_dict(hf_pair):
    hf, ours = hf_pair
    assert ours.lm_head.weight is ours.token_embedding.weight
    deeper = GPT(GPTConfig(vocab_size=101, max_len=64, d_model=32, n_heads=2, n_layers=3))
    with pytest.raises(KeyError, match="no 'h.2.attn.c_attn.weight': expected a GPT-2 state dict with n_layers=3"):
        load_hf_gpt2_state_dict(deeper, hf.state_dict())
    untied = dict(hf.state_dict(), **{"lm_head.weight": torch.zeros(101, 32)})
    with pytest.raises(ValueError, match="ties them"):
        load_hf_gpt2_state_dict(GPT(SMALL), untied)
    shallower = GPT(GPTConfig(vocab_size=101, max_len=64, d_model=32, n_heads=2, n_layers=1))
    with pytest.raises(ValueError, match="more layers"):
        load_hf_gpt2_state_dict(shallower, hf.state_dict())


# ---------------------------------------------------------------------------------------
# One copy of each computation: the modules call gpt_block and gpt_forward
# ---------------------------------------------------------------------------------------

def test_the_modules_run_the_top_level_functions(model):
    tokens = torch.randint(0, 101, (2, 9), generator=torch.Generator().manual_seed(11))
    assert all(block.block_fn is gpt_block for block in model.blocks) and model.forward_fn is gpt_forward
    assert model_calls(model, gpt_block, tokens) == SMALL.n_layers
    assert model_calls(model, gpt_forward, tokens) == 1
    with torch.no_grad():
        assert torch.equal(model(tokens), gpt_forward(tokens, model))
        x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(12))
        assert torch.equal(model.blocks[0](x), gpt_block(x, model.blocks[0]))


def test_a_model_built_from_other_functions_runs_them(model):
    calls = []

    def block_fn(x, block, cache=None):
        calls.append("block")
        return gpt_block(x, block, cache)

    def forward_fn(tokens, model, cache=None):
        calls.append("forward")
        return gpt_forward(tokens, model, cache)

    torch.manual_seed(0)
    theirs = GPT(SMALL, block_fn=block_fn, forward_fn=forward_fn).eval()
    tokens = torch.tensor([[5, 17, 42, 7]])
    with torch.no_grad():
        assert torch.equal(theirs(tokens), model(tokens))  # same seed, same weights, same computation
    assert calls == ["forward", "block", "block"]
    assert model_calls(theirs, block_fn, tokens) == 2 and model_calls(theirs, gpt_block, tokens) == 0
    assert torch.equal(generate(theirs, tokens, 5, greedy=True), generate(model, tokens, 5, greedy=True))


def test_gpt2_names_and_a_clear_error_for_a_wrong_cache(model):
    block = model.blocks[0]
    assert isinstance(block, Block) and {"ln_1", "ln_2", "self_attn", "feed_forward", "dropout"} <= set(
        dict(block.named_children()))
    assert "blocks.0.ln_1.gamma" in model.state_dict()
    with pytest.raises(ValueError, match="one KVCache per block"):
        model(torch.tensor([[1, 2]]), model.new_cache()[:1])
    cache = model.new_cache()
    model(torch.zeros(1, 60, dtype=torch.long), cache)
    with pytest.raises(ValueError, match=r"starting at position 60\) is longer than the positional table"):
        model(torch.zeros(1, 5, dtype=torch.long), cache)


# ---------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------

def test_causality_a_future_token_changes_no_earlier_output(model):
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 101, (2, 30), generator=gen)
    with torch.no_grad():
        base = model(tokens)
        for t in (0, 7, 29):
            changed = tokens.clone()
            changed[:, t] = (changed[:, t] + 1 + torch.randint(0, 99, (2,), generator=gen)) % 101
            out = model(changed)
            assert torch.allclose(out[:, :t], base[:, :t], atol=1e-6, rtol=0), f"changing token {t} changed an earlier output"
            assert not torch.allclose(out[:, t], base[:, t]), f"token {t} does not affect its own output"


def test_incremental_forward_with_a_cache_equals_the_full_forward(model):
    tokens = torch.randint(0, 101, (2, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache()
        pieces = [model(tokens[:, :5], cache), model(tokens[:, 5:6], cache), model(tokens[:, 6:], cache)]
    assert cache[0].length == 12
    assert torch.allclose(torch.cat(pieces, dim=1), full, atol=1e-5)


def test_parameter_count_and_shapes(model):
    n = sum(p.numel() for p in model.parameters())
    per_layer = 4 * (32 * 32 + 32) + (32 * 128 + 128) + (128 * 32 + 32) + 4 * 32
    assert n == 101 * 32 + 64 * 32 + 2 * per_layer + 2 * 32  # the output layer adds nothing: it is tied


def test_clear_errors(model):
    with pytest.raises(ValueError, match="longer than the positional table"):
        model(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 101\)"):
        model(torch.tensor([[0, 101]]))
    with pytest.raises(ValueError, match=r"\[batch, seq\]"):
        model(torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="divisible by n_heads"):
        GPT(GPTConfig(vocab_size=10, d_model=30, n_heads=4, n_layers=1))
    with pytest.raises(ValueError, match="max_len=64 positions"):
        generate(model, torch.zeros(1, 60, dtype=torch.long), 5)


# ---------------------------------------------------------------------------------------
# Loss and measures
# ---------------------------------------------------------------------------------------

def test_loss_perplexity_and_bits_per_char():
    vocab = 7
    logits = torch.zeros(2, 5, vocab)  # a uniform model
    targets = torch.randint(0, vocab, (2, 5))
    loss = lm_loss(logits, targets)
    assert math.isclose(loss.item(), math.log(vocab), rel_tol=1e-6)
    assert math.isclose(perplexity(loss), vocab, rel_tol=1e-5)  # uniform over V: perplexity V
    assert math.isclose(bits_per_char(loss), math.log2(vocab), rel_tol=1e-6)
    # A subword model: 100 tokens for 400 characters at 2 nats per token.
    assert math.isclose(bits_per_char(2.0, n_tokens=100, n_chars=400), 2.0 * 100 / (400 * math.log(2)))
    targets[1] = -100  # ignored rows change nothing for a uniform model, and never count
    assert math.isclose(lm_loss(logits, targets).item(), math.log(vocab), rel_tol=1e-6)
    with pytest.raises(ValueError, match=r"targets = tokens\[:, 1:\]"):
        lm_loss(logits, targets[:, :4])
    with pytest.raises(ValueError, match="both n_tokens and n_chars"):
        bits_per_char(1.0, n_tokens=3)


# ---------------------------------------------------------------------------------------
# Choosing tokens
# ---------------------------------------------------------------------------------------

def test_top_p_keeps_the_smallest_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = lambda p: torch.isfinite(top_p_filter(logits, p))[0].tolist()  # noqa: E731
    assert kept(0.5) == [True, False, False, False]  # 0.5 already reaches p
    assert kept(0.6) == [True, True, False, False]
    assert kept(0.9) == [True, True, True, False]
    assert kept(0.01) == [True, False, False, False]  # the top token always stays
    assert top_p_filter(logits, 1.0) is logits and top_p_filter(logits, None) is logits
    shuffled = logits[:, [2, 0, 3, 1]]  # order in the vocabulary does not matter
    assert torch.isfinite(top_p_filter(shuffled, 0.6))[0].tolist() == [False, True, False, True]
    with pytest.raises(ValueError, match=r"top_p must be a number in \(0, 1\]"):
        top_p_filter(logits, 0.0)


def test_top_p_equals_hugging_faces_warper():
    transformers = pytest.importorskip("transformers")
    from transformers.generation.logits_process import TopPLogitsWarper

    logits = torch.randn(50, 40, generator=torch.Generator().manual_seed(5)) * 3
    for p in (0.1, 0.5, 0.9, 0.99):
        theirs = TopPLogitsWarper(top_p=p)(None, logits.clone())
        assert torch.equal(torch.isfinite(top_p_filter(logits, p)), torch.isfinite(theirs)), p


def test_sampling_stays_inside_top_k_and_the_nucleus():
    logits = torch.randn(1, 20, generator=torch.Generator().manual_seed(6)).repeat(2000, 1)
    gen = torch.Generator().manual_seed(7)
    top3 = set(logits[0].topk(3).indices.tolist())
    assert set(choose_next_token(logits, top_k=3, generator=gen).tolist()) <= top3
    nucleus = set(torch.isfinite(top_p_filter(logits[:1], 0.7))[0].nonzero().flatten().tolist())
    drawn = set(choose_next_token(logits, top_p=0.7, generator=gen).tolist())
    assert drawn == nucleus  # 2000 draws reach every token of the nucleus and nothing else
    cold = choose_next_token(logits, temperature=1e-3, generator=gen)
    assert (cold == logits.argmax(-1)).all()  # temperature -> 0 is greedy
    with pytest.raises(ValueError, match="greedy=True"):
        choose_next_token(logits, temperature=0)


# ---------------------------------------------------------------------------------------
# Generation: cached == uncached, token for token
# ---------------------------------------------------------------------------------------

PROMPT = torch.tensor([[5, 17, 42], [99, 0, 3]])


@pytest.mark.parametrize("settings", [
    dict(greedy=True),
    dict(temperature=0.8),
    dict(top_k=5),
    dict(top_p=0.9, temperature=1.3),
], ids=["greedy", "temperature", "top_k", "top_p"])
def test_cached_generation_equals_uncached(model, settings):
    runs = [generate(model, PROMPT, 20, generator=torch.Generator().manual_seed(8), use_cache=use, **settings)
            for use in (True, False)]
    assert runs[0].shape == (2, 23) and torch.equal(runs[0][:, :3], PROMPT)
    assert torch.equal(runs[0], runs[1])


def test_sample_is_generate_with_its_settings_and_reproducible(model):
    settings = dict(temperature=0.7, top_k=20, top_p=0.8)
    drawn = sample(model, PROMPT, 15, generator=torch.Generator().manual_seed(3), **settings)
    again = sample(model, PROMPT, 15, generator=torch.Generator().manual_seed(3), **settings)
    assert drawn.shape == (2, 18) and torch.equal(drawn, again)
    assert torch.equal(drawn, generate(model, PROMPT, 15, generator=torch.Generator().manual_seed(3), **settings))
    assert torch.equal(drawn, generate(model, PROMPT, 15, generator=torch.Generator().manual_seed(3),
                                       use_cache=False, **settings))


def test_eos_ends_a_row_and_pads_it(model):
    first = generate(model, PROMPT, 1, greedy=True)[:, -1]  # make the first greedy token the eos of row 0
    out = generate(model, PROMPT, 10, greedy=True, eos_id=first[0].item())
    assert (out[0, 3:] == first[0]).all()


def test_beam_size_one_is_greedy_and_cached_beams_find_the_true_best(model):
    greedy = generate(model, PROMPT, 6, greedy=True)
    assert torch.equal(beam_search(model, PROMPT, 6, beam_size=1), greedy)
    # With beam_size = vocab ** (steps - 1) nothing is ever pruned that could still win:
    # beam search (cached, beams reordered) must return the exact best continuation, which we
    # find by scoring all continuations with plain uncached forward passes.
    tiny = GPT(GPTConfig(vocab_size=5, max_len=16, d_model=16, n_heads=2, n_layers=2, dropout=0.0)).eval()
    prompt = torch.tensor([[1, 4], [3, 3]])
    steps = 3
    best = beam_search(tiny, prompt, steps, beam_size=5 ** (steps - 1), length_penalty=0.0)
    for row in range(2):
        candidates = torch.tensor([list(prompt[row]) + list(c) for c in itertools.product(range(5), repeat=steps)])
        scores = sequence_log_prob(tiny, candidates, prompt_len=2)
        assert torch.equal(best[row], candidates[scores.argmax()])
    # and beams beat greedy on the sequence's probability (or tie)
    beams = beam_search(model, PROMPT, 6, beam_size=4, length_penalty=0.0)
    assert (sequence_log_prob(model, beams, 3) >= sequence_log_prob(model, greedy, 3) - 1e-5).all()
