"""The library pieces chapter 10 and benchmarks/bench_gpt.py stand on: the next-token loss
over windows, whole-text evaluation (every token scored exactly once), the n-gram baselines,
the temperature, generation past the context, the character tokenizer and the training loop."""

import math

import pytest
import torch

from transformer_lib.gpt import (GPT, CharTokenizer, GPTConfig, bigram_log_probs, evaluate_lm, generate,
                                 generate_long, greedy_generate, lm_loss, next_token_loss, random_windows,
                                 temperature_probs, train_lm, unigram_log_probs, warmup_cosine)

SMALL = GPTConfig(vocab_size=11, max_len=16, d_model=16, n_heads=2, n_layers=2, dropout=0.0)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT(SMALL).eval()


def test_next_token_loss_is_lm_loss_on_shifted_windows(model):
    tokens = torch.randint(0, 11, (3, 9), generator=torch.Generator().manual_seed(0))
    logits = model(tokens)
    assert torch.allclose(next_token_loss(logits, tokens), lm_loss(logits[:, :-1], tokens[:, 1:]))
    with pytest.raises(ValueError, match="at least 2 tokens"):
        next_token_loss(logits[:, :1], tokens[:, :1])


def _brute_force_nats(model, ids, context):
    """Each token t >= 1 predicted from the (at most) `context` tokens before it, one forward each."""
    total = 0.0
    with torch.no_grad():
        for t in range(1, len(ids)):
            window = ids[max(0, t - context):t][None]
            total -= torch.log_softmax(model(window)[0, -1], dim=-1)[ids[t]].item()
    return total / (len(ids) - 1)


def test_evaluate_lm_scores_every_token_once(model):
    ids = torch.randint(0, 11, (40,), generator=torch.Generator().manual_seed(1))
    # A window as long as the text: one pass, every prediction with all of its left context.
    assert evaluate_lm(model, ids[:16], context=16) == pytest.approx(_brute_force_nats(model, ids[:16], 16), rel=1e-5)
    # Stride 1: the first window predicts targets 1..8 from 1..8 tokens, every later window one
    # target from the 8 tokens before it: exactly the brute force with a context of 8.
    slid = evaluate_lm(model, ids, context=8, stride=1)
    assert slid == pytest.approx(_brute_force_nats(model, ids, 8), rel=1e-5)
    for stride in (3, 5, 8):  # any stride: a mean over the same 39 predictions, with some context each
        value = evaluate_lm(model, ids, context=8, stride=stride)
        assert 0 < value < 2 * math.log(11)
    with pytest.raises(ValueError, match="stride"):
        evaluate_lm(model, ids, context=8, stride=9)


def test_baselines_are_distributions():
    ids = torch.tensor([0, 1, 1, 2, 0, 1])
    assert torch.allclose(unigram_log_probs(ids, 4).exp().sum(), torch.tensor(1.0))
    table = bigram_log_probs(ids, 4, alpha=1.0).exp()  # [4, 4]
    assert torch.allclose(table.sum(dim=1), torch.ones(4))
    assert torch.allclose(table[0], torch.tensor([1, 3, 1, 1]) / 6)
    assert torch.allclose(table[3], torch.full((4,), 0.25))  # never a previous token: uniform


def test_temperature_probs():
    logits = torch.tensor([1.0, 2.0, 3.0])
    assert torch.allclose(temperature_probs(logits, 1.0), logits.softmax(-1))
    assert torch.allclose(temperature_probs(logits, 0.5), torch.tensor([0.0159, 0.1173, 0.8668]), atol=1e-4)
    assert temperature_probs(logits, 0.01).argmax() == 2 and temperature_probs(logits, 100.0).max() < 0.34
    with pytest.raises(ValueError, match="temperature"):
        temperature_probs(logits, 0.0)


def test_greedy_generate_and_generation_past_the_context(model):
    prompt = torch.tensor([[1, 2, 3], [4, 5, 6]])
    assert torch.equal(greedy_generate(model, prompt, 13), generate(model, prompt, 13, greedy=True, use_cache=False))
    long = generate_long(model, prompt, 40, greedy=True)
    assert long.shape == (2, 43)
    assert torch.equal(long[:, :16], generate(model, prompt, 13, greedy=True))  # the first window is plain generate
    # After the first window, each new window restarts from the last 8 tokens (keep = max_len // 2).
    restart = generate(model, long[:, 8:16], 8, greedy=True)
    assert torch.equal(long[:, 16:24], restart[:, 8:])
    chosen = generate_long(model, prompt, 20, choose=lambda logits: logits.argmax(dim=-1))
    assert torch.equal(chosen, generate_long(model, prompt, 20, greedy=True))
    # generate_fn continues each window instead of generate(): chapter 10 passes the learner's loops.
    windows = []

    def greedy_fn(model, window, steps):
        windows.append((window.shape[1], steps))
        return greedy_generate(model, window, steps)

    assert torch.equal(generate_long(model, prompt, 40, generate_fn=greedy_fn), long)
    assert windows == [(3, 13), (8, 8), (8, 8), (8, 8), (8, 3)]
    with pytest.raises(ValueError, match="not both"):
        generate_long(model, prompt, 5, generate_fn=greedy_fn, greedy=True)


def test_char_tokenizer_round_trip():
    tok = CharTokenizer("hello", "world")
    assert len(tok) == 7 and tok.decode(tok.encode("low")) == "low"
    with pytest.raises(KeyError, match="'z'"):
        tok.encode("z")


def test_train_lm_learns_a_repeating_text():
    ids = torch.tensor([0, 1, 2, 3, 4] * 200)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=5, max_len=16, d_model=32, n_heads=2, n_layers=1, dropout=0.0))
    history = train_lm(model, ids, context=16, batch_size=8, lr=1e-2, steps=60,
                       generator=torch.Generator().manual_seed(0), progress=False)
    assert len(history) == 60 and history[-1] < 0.1 < history[0]
    assert evaluate_lm(model, ids, context=16) < 0.1
    with pytest.raises(ValueError, match="exactly one"):
        train_lm(model, ids, context=16, batch_size=8, lr=1e-2)


def test_random_windows_and_the_schedule():
    ids = torch.arange(100)
    windows = random_windows(ids, 5, 10, torch.Generator().manual_seed(0))
    assert windows.shape == (5, 10) and torch.equal(windows[:, 1:] - windows[:, :-1], torch.ones(5, 9, dtype=torch.long))
    assert warmup_cosine(0.0) < 0.1 and warmup_cosine(0.05) == pytest.approx(1.0)
    assert warmup_cosine(1.0) == pytest.approx(0.1) and warmup_cosine(0.5) > warmup_cosine(0.9)
