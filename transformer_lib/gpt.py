"""A decoder-only language model in the style of GPT-2 (Radford et al., 2019, "Language Models
are Unsupervised Multitask Learners"), with its loss, its evaluation measures, text generation,
and a converter from Hugging Face's GPT-2 weights.

A language model factorises the probability of a text with the chain rule,

    P(x_1, ..., x_T) = prod_t P(x_t | x_1, ..., x_{t-1}),

and the causal mask lets one forward pass compute every factor at once: position t sees only
positions <= t, so its output may predict x_{t+1}. The model is a stack of pre-norm blocks
(masked self-attention, then a GELU MLP of width 4 * d_model, each inside a residual
connection), learned absolute positions, a final LayerNorm, and an output layer that shares
its matrix with the token embedding (Press & Wolf, 2017). Every part comes from the library:
attention.MultiHeadAttention, layers.PositionwiseFeedForward / LayerNorm,
positional.LearnedPositionalEmbedding, masks.causal_mask.

The two computations are plain functions, gpt_block and gpt_forward (chapter 10's exercises);
Block and GPT keep the function they run as an attribute (block_fn, forward_fn), so a model
can be built from a learner's versions: GPT(config, block_fn=..., forward_fn=...).

Generation (greedy, temperature, top-k, top-p, beam search) runs with a key/value cache: each
step feeds only the newest token; the keys and values of the earlier ones are kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import decoding
from .attention import KVCache, MultiHeadAttention
from .decoding import sample_next_token, top_k_filter
from .layers import LayerNorm, PositionwiseFeedForward
from .masks import causal_mask
from .positional import LearnedPositionalEmbedding

IGNORE_INDEX = -100  # targets with this value add nothing to the loss (PyTorch's and Hugging Face's default)

# GPT-2 computes GELU with the tanh approximation of Hendrycks & Gimpel (2016); layers.ACTIVATIONS
# offers the exact (erf) GELU only. The two differ by up to ~1e-3, enough to matter when
# comparing with GPT-2's own outputs.
gelu_tanh = partial(F.gelu, approximate="tanh")


@dataclass
class GPTConfig:
    """Sizes of a GPT; the defaults are GPT-2 small (124M parameters with its 50,257 tokens)."""

    vocab_size: int = 50257
    max_len: int = 1024  # the longest context: the number of learned positions (GPT-2's n_positions)
    d_model: int = 768
    n_heads: int = 12
    n_layers: int = 12
    dropout: float = 0.1
    layer_norm_eps: float = 1e-5

    @property
    def d_ff(self) -> int:
        return 4 * self.d_model  # the MLP's hidden width, as in GPT-2 and the original Transformer


def gpt_block(x: torch.Tensor, block: Block, cache: KVCache | None = None) -> torch.Tensor:
    """One pre-norm decoder block, GPT-2's layout (Radford et al., 2019, section 2.3):

        x = x + Attn(LN1(x))    masked self-attention: positions exchange information
        x = x + MLP(LN2(x))     then each position is transformed on its own

    x: [batch, seq, d_model]; block: a Block (its ln_1, self_attn, ln_2, feed_forward, dropout);
    cache: None, or the block's KVCache holding the keys and values of the positions before x.
    The new positions sit at past .. past + seq - 1, past = cache.length; each may attend to every
    cached position and to the new ones up to itself. Returns [batch, seq, d_model].

    The residual stream is never normalised inside the block, so gradients reach early layers
    through an identity path; the model's final LayerNorm normalises it once, at the end.
    """
    past = 0 if cache is None else cache.length  # read before the attention appends to the cache
    seq = x.shape[1]
    mask = causal_mask(past + seq, device=x.device)[past:]  # [seq, past + seq]: the new rows only
    h = block.ln_1(x)
    x = x + block.dropout(block.self_attn(h, h, h, mask, cache=cache))  # [batch, seq, d_model]
    return x + block.dropout(block.feed_forward(block.ln_2(x)))  # [batch, seq, d_model]


def gpt_forward(tokens: torch.Tensor, model: GPT, cache: list[KVCache] | None = None) -> torch.Tensor:
    """Token ids [batch, seq] -> next-token logits [batch, seq, vocab], GPT-2's forward pass.

    Token embeddings plus learned position vectors, then every block in turn, the final
    LayerNorm, and the output layer, whose matrix is the token embedding (tied). With a cache
    (model.new_cache(), one KVCache per block), `tokens` are the tokens it has not seen: they sit
    at the positions after the cached ones, and each block appends their keys and values to its
    own cache.
    """
    past = 0 if cache is None else cache[0].length  # positions the cache already holds
    x = model.positions(model.token_embedding(tokens), offset=past)  # [batch, seq, d_model]
    for i, block in enumerate(model.blocks):
        x = block(x, None if cache is None else cache[i])  # [batch, seq, d_model]
    return model.lm_head(model.ln_f(x))  # [batch, seq, vocab]


class Block(nn.Module):
    """One pre-norm decoder block: the parts, with GPT-2's names, and the function that wires
    them (gpt_block, or block_fn(x, block, cache) when one is given).

    ln_1, ln_2: the LayerNorms in front of the attention and of the MLP; self_attn: multi-head
    self-attention; feed_forward: the MLP d_model -> 4 d_model -> d_model with GPT-2's tanh GELU;
    dropout: applied to each sub-block's output before it is added to the residual stream.
    """

    def __init__(self, config: GPTConfig, block_fn=None):
        super().__init__()
        c = config
        # The order of creation decides which random numbers each part's weights get (attention,
        # then MLP; the LayerNorms draw none): keep it, and a seeded model keeps its weights.
        self.self_attn = MultiHeadAttention(c.d_model, c.n_heads, c.dropout)
        self.feed_forward = PositionwiseFeedForward(c.d_model, c.d_ff, c.dropout, activation="gelu")
        self.feed_forward.activation = gelu_tanh
        self.ln_1 = LayerNorm(c.d_model, c.layer_norm_eps)
        self.ln_2 = LayerNorm(c.d_model, c.layer_norm_eps)
        self.dropout = nn.Dropout(c.dropout)
        self.block_fn = gpt_block if block_fn is None else block_fn

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        return self.block_fn(x, self, cache)  # [batch, seq, d_model]


class GPT(nn.Module):
    """Token ids [batch, seq] -> next-token logits [batch, seq, vocab].

    logits[:, t] scores the token that follows tokens[:, :t + 1]. With a cache (new_cache()),
    `tokens` holds only the tokens the cache has not seen: their positions continue after the
    cached ones, and their keys and values are appended to it.

    forward_fn(tokens, model, cache) computes the logits (default gpt_forward) and block_fn(x,
    block, cache) each block (default gpt_block): chapter 10 builds its models from the
    learner's functions this way. To read attention weights, make the blocks' self_attn run
    with need_weights=True (a forward pre-hook, as chapter 07 does): they land in last_weights.
    """

    def __init__(self, config: GPTConfig, block_fn=None, forward_fn=None):
        super().__init__()
        c = self.config = config
        self.token_embedding = nn.Embedding(c.vocab_size, c.d_model)
        # Adds position vectors, then embedding dropout. GPT-2 does not scale the token
        # embeddings by sqrt(d_model). Both tables start at std 0.02, as Hugging Face's GPT-2 and
        # nanoGPT start them (OpenAI's released code draws positions at 0.01, tokens at 0.02).
        self.positions = LearnedPositionalEmbedding(c.d_model, c.max_len, c.dropout)
        self.blocks = nn.ModuleList(Block(c, block_fn) for _ in range(c.n_layers))
        self.ln_f = LayerNorm(c.d_model, c.layer_norm_eps)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        # Weight tying: the output layer scores token v by the dot product of the final state with
        # v's own embedding. One matrix instead of two (38.6M parameters fewer in GPT-2 small).
        self.lm_head.weight = self.token_embedding.weight
        self.forward_fn = gpt_forward if forward_fn is None else forward_fn
        self.apply(self._init_weights)
        # GPT-2 scales the weights of the layers that write into the residual stream by
        # 1/sqrt(2 * n_layers): 2 * n_layers of them add up, and the sum should not grow with depth.
        for block in self.blocks:
            for linear in (block.self_attn.w_o, block.feed_forward.linear2):
                nn.init.normal_(linear.weight, mean=0.0, std=0.02 / math.sqrt(2 * c.n_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def new_cache(self) -> list[KVCache]:
        """An empty key/value cache: one KVCache per block."""
        return [KVCache() for _ in self.blocks]

    def _check_inputs(self, tokens: torch.Tensor, cache: list[KVCache] | None) -> None:
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
            shape = list(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
            raise ValueError(f"GPT expects token ids of shape [batch, seq], got {shape}")
        if tokens.is_floating_point() or tokens.dtype == torch.bool:
            raise TypeError(f"GPT expects integer token ids, got dtype {tokens.dtype}")
        if tokens.shape[1] == 0:
            raise ValueError("GPT needs at least one token per sequence, got seq = 0")
        vocab = self.config.vocab_size
        if tokens.device.type != "meta" and (tokens.min() < 0 or tokens.max() >= vocab):
            raise ValueError(f"token ids must lie in [0, {vocab}), got min {tokens.min().item()}, "
                             f"max {tokens.max().item()}")
        if cache is not None and (not isinstance(cache, (list, tuple)) or len(cache) != len(self.blocks)):
            raise ValueError(f"the cache must be model.new_cache(): a list of one KVCache per block "
                             f"({len(self.blocks)}), got {type(cache).__name__}")
        past = 0 if cache is None else cache[0].length
        if past + tokens.shape[1] > self.config.max_len:
            raise ValueError(f"sequence of length {tokens.shape[1]} (starting at position {past}) is longer than "
                             f"the positional table (max_len={self.config.max_len}); build the model with a "
                             f"larger max_len")

    def forward(self, tokens: torch.Tensor, cache: list[KVCache] | None = None) -> torch.Tensor:
        """Logits [batch, seq, vocab], computed by forward_fn (gpt_forward unless given)."""
        self._check_inputs(tokens, cache)
        return self.forward_fn(tokens, self, cache)  # [batch, seq, vocab]


# ---------------------------------------------------------------------------------------
# Loss and evaluation
# ---------------------------------------------------------------------------------------

def lm_loss(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Causal language-modelling loss: mean cross-entropy of each position's next token, in nats.

    logits: [batch, seq, vocab] from model(tokens[:, :-1]); targets: [batch, seq], the same
    tokens shifted left by one, targets = tokens[:, 1:] (position t is scored on token t + 1).
    Targets equal to ignore_index (padding, a prompt one does not train on) are left out of
    the mean. This is -1/N log P(text) by the chain rule, N the number of scored tokens.
    """
    if logits.dim() != 3 or targets.shape != logits.shape[:2]:
        raise ValueError(f"lm_loss needs logits [batch, seq, vocab] and targets [batch, seq] with the same "
                         f"batch and seq, got logits {list(logits.shape)} and targets {list(targets.shape)}; "
                         f"for tokens [batch, L] use logits = model(tokens[:, :-1]), targets = tokens[:, 1:]")
    # cross_entropy wants the classes in dim 1: flatten the positions into one long batch.
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                           ignore_index=ignore_index)


def unigram_log_probs(ids: torch.Tensor, vocab_size: int, alpha: float = 1.0) -> torch.Tensor:
    """The simplest baseline: log P(token) from its frequency in ids [N], ignoring all context.

    Add-alpha smoothing (Laplace's rule for alpha = 1): P(v) = (count(v) + alpha) / (N + alpha * V),
    so a token never seen still gets a small probability. Returns float32 [vocab_size].
    """
    counts = torch.bincount(ids, minlength=vocab_size).double()  # [V]
    return ((counts + alpha) / (counts.sum() + alpha * vocab_size)).log().float()  # [V]


def bigram_log_probs(ids: torch.Tensor, vocab_size: int, alpha: float = 1.0) -> torch.Tensor:
    """A context of one token: log P(next = j | previous = i) from the pairs of ids [N].

    counts[i, j] = how often j follows i (every adjacent pair, overlapping); each row is then
    smoothed and normalised over the next token: (counts[i, j] + alpha) / (sum_j counts[i, j]
    + alpha * V). Row i is the distribution after token i. Returns float32 [vocab_size, vocab_size].
    """
    pairs = ids[:-1] * vocab_size + ids[1:]  # one number per (previous, next) pair: [N - 1]
    counts = torch.bincount(pairs, minlength=vocab_size * vocab_size).view(vocab_size, vocab_size).double()
    probs = (counts + alpha) / (counts.sum(dim=1, keepdim=True) + alpha * vocab_size)  # rows sum to 1
    return probs.log().float()  # [V, V]


def perplexity(loss) -> float:
    """exp(mean cross-entropy in nats): the number of equally likely tokens the model is, on
    average, as uncertain as. A uniform guess over V tokens has perplexity V."""
    return math.exp(float(loss))


def bits_per_char(loss, n_tokens: int | None = None, n_chars: int | None = None) -> float:
    """Mean cross-entropy in bits per character, a measure that does not depend on the tokenizer.

    loss: mean nats per token. For a character-level model tokens are characters:
    bpc = loss / ln 2. For a subword model pass the token and character counts of the text:
    bpc = loss * n_tokens / (n_chars * ln 2) (the total information over the number of characters).
    """
    if (n_tokens is None) != (n_chars is None):
        raise ValueError("bits_per_char needs both n_tokens and n_chars, or neither (a character-level model)")
    tokens_per_char = 1.0 if n_tokens is None else n_tokens / n_chars
    return float(loss) * tokens_per_char / math.log(2)


def next_token_loss(logits: torch.Tensor, tokens: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """The loss of whole windows of text: every position is one training example.

    logits = model(tokens): [batch, L, vocab]; tokens: [batch, L]. Position t, which has seen
    tokens 0..t, is scored on token t + 1, for t = 0 .. L - 2: the last position's prediction
    is left out, since the token it predicts lies past the end of the window. Returns the mean
    cross-entropy in nats over the batch * (L - 1) predictions (targets equal to ignore_index
    left out), i.e. lm_loss(logits[:, :-1], tokens[:, 1:]).
    """
    if logits.dim() != 3 or tokens.shape != logits.shape[:2]:
        raise ValueError(f"next_token_loss needs logits [batch, L, vocab] = model(tokens) and tokens [batch, L], "
                         f"got logits {list(logits.shape)} and tokens {list(tokens.shape)}")
    if tokens.shape[1] < 2:
        raise ValueError("next_token_loss needs windows of at least 2 tokens: one to read, one to predict")
    return lm_loss(logits[:, :-1], tokens[:, 1:], ignore_index)  # position t against token t + 1


# ---------------------------------------------------------------------------------------
# Training and evaluating on one long stream of token ids (a text)
# ---------------------------------------------------------------------------------------

class CharTokenizer:
    """The simplest tokenizer: one token per character, ids in code-point order.

    Built from the texts it must cover (characters it never saw have no id: a clear KeyError).
    """

    def __init__(self, *texts: str):
        self.chars = sorted(set().union(*map(set, texts)))
        self.ids = {ch: i for i, ch in enumerate(self.chars)}

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        try:
            return torch.tensor([self.ids[ch] for ch in text], dtype=torch.long)  # [len(text)]
        except KeyError as err:
            raise KeyError(f"character {err.args[0]!r} is not in the tokenizer's {len(self)} characters") from None

    def decode(self, ids) -> str:
        return "".join(self.chars[i] for i in torch.as_tensor(ids).tolist())


def random_windows(ids: torch.Tensor, batch_size: int, length: int,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """batch_size windows of `length` consecutive ids, each starting at a random place: [batch, length]."""
    if ids.dim() != 1 or len(ids) < length:
        raise ValueError(f"random_windows needs a 1-d stream of at least length={length} ids, got {list(ids.shape)}")
    starts = torch.randint(0, len(ids) - length + 1, (batch_size,), generator=generator)  # [batch]
    return ids[starts[:, None] + torch.arange(length)]  # [batch, length]


@torch.no_grad()
def evaluate_lm(model: GPT, ids: torch.Tensor, context: int | None = None, stride: int | None = None,
                batch_size: int = 32) -> float:
    """Mean nats per token over a whole stream ids [N]: every token but the first is predicted
    exactly once, so this is -log P(ids[1:] | ids[0]) / (N - 1) under a window of `context`.

    The first window predicts its context tokens with 1..context tokens of left context. Each
    later window is slid `stride` tokens on (default: context, windows side by side) and scores
    only its last `stride` predictions, the ones not scored yet: they see at least
    context - stride tokens. A smaller stride gives each prediction more context, at more cost.
    """
    context = model.config.max_len if context is None else context
    stride = context if stride is None else stride
    if not 1 <= stride <= context <= model.config.max_len:
        raise ValueError(f"need 1 <= stride <= context <= max_len={model.config.max_len}, "
                         f"got stride={stride}, context={context}")
    if ids.dim() != 1 or len(ids) < 2:
        raise ValueError(f"evaluate_lm needs a 1-d stream of at least 2 ids, got {list(ids.shape)}")
    n_targets = len(ids) - 1
    context = min(context, n_targets)
    # (window end, how many of its last predictions to score). Window e reads ids[e - context : e]
    # and predicts ids[e - context + 1 : e + 1].
    windows, done = [], 0
    while done < n_targets:
        end = min(max(done + stride, context), n_targets)
        windows.append((end, end - done))
        done = end
    was_training = model.training
    model.eval()
    total = 0.0
    for i in range(0, len(windows), batch_size):
        chunk = windows[i:i + batch_size]
        starts = torch.tensor([end - context for end, _ in chunk])  # [b]
        x = ids[starts[:, None] + torch.arange(context + 1)]  # [b, context + 1]
        log_probs = torch.log_softmax(model(x[:, :-1]).float(), dim=-1)  # [b, context, vocab]
        picked = log_probs.gather(-1, x[:, 1:, None]).squeeze(-1)  # [b, context]: log P(next | before)
        for row, (_, n_new) in enumerate(chunk):
            total -= picked[row, context - n_new:].sum().item()  # only the predictions not scored yet
    model.train(was_training)
    return total / n_targets


def warmup_cosine(progress: float, warmup: float = 0.05, final: float = 0.1) -> float:
    """The learning-rate multiplier at `progress` in [0, 1] of a run: a linear warm-up over the
    first `warmup` fraction, then a cosine down to `final` at the end (as nanoGPT trains)."""
    if progress < warmup:
        return (progress + 1e-3) / (warmup + 1e-3)
    t = min(1.0, (progress - warmup) / max(1e-9, 1.0 - warmup))
    return final + (1.0 - final) * 0.5 * (1.0 + math.cos(math.pi * t))


def train_lm(model: GPT, ids: torch.Tensor, *, context: int, batch_size: int, lr: float, steps: int | None = None,
             seconds: float | None = None, warmup: float = 0.05, final_lr: float = 0.1, weight_decay: float = 0.1,
             max_grad_norm: float | None = 1.0, loss_fn=None, generator: torch.Generator | None = None,
             bf16: bool = False, progress: bool = True, desc: str = "training") -> list[float]:
    """Train a GPT on random windows of the stream `ids` [N]; returns the loss of every step.

    Each step draws batch_size windows of context + 1 tokens, as nanoGPT's get_batch does: the
    model reads the first context tokens and every one of its context positions is scored on the
    token that follows it, loss_fn(model(window[:, :-1]), window[:, 1:]) (default lm_loss). A
    window of only context tokens would leave its last position without a target, and that
    position is one evaluate_lm scores.
    AdamW (betas 0.9, 0.95; weight decay on the matrices only), gradient clipping, and the
    learning rate lr * warmup_cosine(progress, warmup, final_lr). Give `steps` (the notebooks:
    reproducible) or `seconds` (the benchmark: progress is the time used, and training stops when
    it is up). bf16=True runs the forward pass under bfloat16 autocast (fast on CPUs with AMX).
    """
    import time

    from tqdm.auto import tqdm

    if (steps is None) == (seconds is None):
        raise ValueError(f"give exactly one of steps= or seconds=, got steps={steps}, seconds={seconds}")
    loss_fn = lm_loss if loss_fn is None else loss_fn
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    others = [p for p in model.parameters() if p.dim() < 2]  # LayerNorm gains and biases: no decay
    optimizer = torch.optim.AdamW([{"params": matrices, "weight_decay": weight_decay},
                                   {"params": others, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))
    model.train()
    history: list[float] = []
    bar = tqdm(total=steps if steps is not None else round(seconds), desc=desc, disable=not progress,
               mininterval=1.0, unit="step" if steps is not None else "s")
    start = time.perf_counter()
    while True:
        elapsed = time.perf_counter() - start
        done = len(history) / steps if steps is not None else elapsed / seconds
        if done >= 1.0:
            break
        for group in optimizer.param_groups:
            group["lr"] = lr * warmup_cosine(done, warmup, final_lr)
        window = random_windows(ids, batch_size, context + 1, generator)  # [batch, context + 1]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(window[:, :-1])  # [batch, context, vocab]
        loss = loss_fn(logits.float(), window[:, 1:])  # position t scored on token t + 1, for every t
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        history.append(loss.item())
        bar.set_postfix(loss=f"{history[-1]:.3f}", refresh=False)
        bar.update(1 if steps is not None else round(time.perf_counter() - start) - bar.n)
    bar.close()
    return history


# ---------------------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------------------

def top_p_filter(logits: torch.Tensor, p: float | None) -> torch.Tensor:
    """Nucleus filtering (Holtzman et al., 2020, "The Curious Case of Neural Text Degeneration").

    Keep the smallest set of most probable tokens whose probabilities sum to at least p, and set
    every other logit to -inf. logits: [..., vocab]. Unlike top-k, the number kept adapts to the
    distribution: few tokens when the model is sure, many when it is not. The most probable
    token is always kept; p=None or p >= 1 returns the logits unchanged.
    """
    if p is None:
        return logits
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p:
        raise ValueError(f"top_p must be a number in (0, 1], got {p!r}")
    if p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # [..., vocab]
    probs = torch.softmax(sorted_logits.float(), dim=-1)  # [..., vocab]
    # A token is in the nucleus if the tokens ranked above it do not yet reach p.
    mass_before = probs.cumsum(dim=-1) - probs  # [..., vocab]
    drop_sorted = mass_before >= p
    drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
    return logits.masked_fill(drop, float("-inf"))


def temperature_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """The next-token distribution at a temperature: softmax(logits / temperature) over the last dim.

    logits: [..., vocab] -> probabilities [..., vocab]. Dividing the logits by T < 1 stretches
    their gaps, so the distribution gets sharper (T -> 0 is the argmax); T > 1 flattens it
    (T -> infinity is uniform). The temperature acts on the logits, before the softmax.
    """
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(f"temperature must be a number > 0, got {temperature!r}")
    return torch.softmax(logits / temperature, dim=-1)  # [..., vocab]


def choose_next_token(logits: torch.Tensor, greedy: bool = False, temperature: float = 1.0,
                      top_k: int | None = None, top_p: float | None = None,
                      generator: torch.Generator | None = None) -> torch.Tensor:
    """One next token per row of logits [batch, vocab] -> [batch].

    greedy: the argmax. Otherwise a draw from softmax(logits / temperature), restricted first
    to the top_k most probable tokens, then to the nucleus of mass top_p (the order Hugging Face
    applies them in).
    """
    if greedy:
        return logits.argmax(dim=-1)  # [batch]
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(f"temperature must be a number > 0, got {temperature!r}; "
                         f"its limit 0 is greedy decoding: pass greedy=True")
    filtered = top_p_filter(top_k_filter(logits.float() / temperature, top_k), top_p)  # [batch, vocab]
    return sample_next_token(filtered, temperature=1.0, generator=generator)  # [batch]


def _check_room(model: GPT, prompt: torch.Tensor, max_new_tokens: int) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative int, got {max_new_tokens!r}")
    if not isinstance(prompt, torch.Tensor) or prompt.dim() != 2 or prompt.shape[1] < 1:
        raise ValueError("the prompt must be token ids [batch, seq] with at least one token: "
                         "start unconditional generation from a begin/end-of-text token")
    total = prompt.shape[1] + max_new_tokens
    if total > model.config.max_len:
        raise ValueError(f"prompt ({prompt.shape[1]} tokens) + max_new_tokens ({max_new_tokens}) = {total} "
                         f"positions, but the model has only max_len={model.config.max_len} positions")


@torch.no_grad()
def generate(model: GPT, prompt: torch.Tensor, max_new_tokens: int, *, greedy: bool = False,
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
             eos_id: int | None = None, generator: torch.Generator | None = None,
             use_cache: bool = True, choose=None) -> torch.Tensor:
    """Continue each prompt [batch, seq] by up to max_new_tokens tokens: [batch, seq + steps].

    Each step turns the last position's logits into a token with choose_next_token (greedy,
    or sampling with temperature / top_k / top_p) and appends it; choose(logits [batch, vocab])
    -> [batch], if given, replaces that rule (chapter 10 passes one built from the learner's
    functions). A row that has produced eos_id keeps producing eos_id; generation stops when
    every row has. With use_cache the prompt is run once and every later step feeds one token;
    without, every step re-runs the whole sequence. Both give the same tokens. Call
    model.eval() first (dropout off).
    """
    _check_room(model, prompt, max_new_tokens)
    cache = model.new_cache() if use_cache else None
    tokens = prompt
    new = prompt  # what the model has not seen yet: the whole prompt at first
    finished = torch.zeros(prompt.shape[0], dtype=torch.bool, device=prompt.device)  # [batch]
    for _ in range(max_new_tokens):
        logits = model(new if use_cache else tokens, cache)[:, -1]  # [batch, vocab]: only the last position predicts
        if choose is None:
            next_token = choose_next_token(logits, greedy, temperature, top_k, top_p, generator)  # [batch]
        else:
            next_token = choose(logits)  # [batch]
        if eos_id is not None:
            next_token = next_token.masked_fill(finished, eos_id)
            finished |= next_token == eos_id
        new = next_token[:, None]  # [batch, 1]
        tokens = torch.cat([tokens, new], dim=1)  # [batch, seq + 1]
        if eos_id is not None and finished.all():
            break
    return tokens


@torch.no_grad()
def generate_long(model: GPT, prompt: torch.Tensor, max_new_tokens: int, keep: int | None = None,
                  generate_fn=None, **settings) -> torch.Tensor:
    """generate() past the model's context of max_len positions.

    The course's own scheme (nanoGPT's generate keeps no cache: it crops to the last block_size
    tokens and recomputes them every step). Generates with the cache until the window is full,
    then starts a new window from the last `keep` tokens (default: half the context) with a
    fresh cache, and so on: every prediction
    sees between keep and max_len tokens, at positions 0, 1, ... as in training. Each window is
    continued by generate_fn(model, window, steps) -> [batch, window + steps] when given (chapter
    10 passes the learner's greedy_generate or sample), else by generate() with `settings`
    (greedy, temperature, top_k, top_p, generator, choose).
    """
    context = model.config.max_len
    keep = context // 2 if keep is None else keep
    if not 1 <= keep < context:
        raise ValueError(f"keep must lie in [1, max_len={context}), got {keep}")
    if generate_fn is not None and settings:
        raise ValueError(f"give generate_fn or generate()'s settings, not both: got {sorted(settings)}")
    if generate_fn is None:
        generate_fn = partial(generate, **settings)
    tokens, remaining = prompt[:, -context:], max_new_tokens
    out = prompt
    while remaining > 0:
        window = tokens[:, -keep:] if tokens.shape[1] >= context else tokens  # [batch, <= keep or prompt]
        steps = min(remaining, context - window.shape[1])
        tokens = generate_fn(model, window, steps)  # [batch, window + steps]
        out = torch.cat([out, tokens[:, window.shape[1]:]], dim=1)
        remaining -= steps
    return out


@torch.no_grad()
def greedy_generate(model: GPT, prompt: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """Greedy decoding with the key/value cache: prompt [batch, seq] -> [batch, seq + max_new_tokens].

    The prompt runs through the model once (filling the cache); then every step feeds only
    the newest token. Each step appends the argmax of the last position's logits.
    """
    return generate(model, prompt, max_new_tokens, greedy=True)


@torch.no_grad()
def sample(model: GPT, prompt: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
           top_k: int | None = None, top_p: float | None = None,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """Sampling with the key/value cache: prompt [batch, seq] -> [batch, seq + max_new_tokens].

    Each step takes the last position's logits, divides them by the temperature, keeps the
    top_k most probable tokens (None: all), then the nucleus of mass top_p (None: all), and
    draws one token per row from what is left with torch.multinomial and `generator`. The
    prompt runs through the model once; every later step feeds only the newest token.
    """
    return generate(model, prompt, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                    generator=generator)


class _PromptedLM:
    """A GPT seen through decoding's encoder-decoder interface, so that decoding.beam_search
    (one copy of beam search for the whole course) runs on it. The prompt plays the source:
    "encoding" keeps it; decoding's start token is a placeholder standing for the prompt's last
    position, whose output predicts the first new token. What decode returns as the decoder's
    states are the model's logits already (its forward_fn ran), so generator is a log-softmax."""

    def __init__(self, model: GPT):
        self.model = model

    def encode(self, prompt, src_mask=None):
        return prompt  # [batch, prompt_len]

    def new_cache(self):
        return self.model.new_cache()

    def generator(self, logits):
        return torch.log_softmax(logits.float(), dim=-1)  # [batch, vocab]

    def decode(self, prompt, src_mask, tgt, tgt_mask=None, cache=None):
        # Without an eos, beam search is given the id -1, which no step can choose; clamp it anyway,
        # since the embedding needs a valid id for anything that reaches it.
        tgt = tgt.clamp(min=0)
        if cache is None:  # the whole sequence: prompt, then the new tokens after the placeholder
            logits = self.model(torch.cat([prompt, tgt[:, 1:]], dim=1))
            return logits[:, prompt.shape[1] - 1:]  # [batch, tgt_len, vocab]
        if cache[0].length == 0:  # first step: the placeholder means "run the prompt"
            return self.model(prompt, cache)[:, -1:]  # [batch, 1, vocab]
        return self.model(tgt, cache)  # [batch, tgt_len, vocab]


def beam_search(model: GPT, prompt: torch.Tensor, max_new_tokens: int, beam_size: int = 4,
                length_penalty: float = 0.6, eos_id: int | None = None) -> torch.Tensor:
    """Continue each prompt with the beam_size best partial continuations kept at every step.

    Runs decoding.beam_search (finished hypotheses stay in the beam with their score, a key/value
    cache reordered with the beams, the GNMT length penalty when the best one is chosen) on the prompt. Returns [batch, seq + steps]: the prompt and
    the best continuation, padded with eos_id after an early eos. beam_size=1 is greedy decoding.
    """
    _check_room(model, prompt, max_new_tokens)
    if max_new_tokens == 0:
        return prompt
    # No eos: -1 can never be produced, so every hypothesis runs for max_new_tokens steps.
    out = decoding.beam_search(_PromptedLM(model), prompt, None, max_new_tokens, bos_id=0,
                               eos_id=-1 if eos_id is None else eos_id, beam_size=beam_size,
                               length_penalty=length_penalty)  # [batch, 1 + steps], placeholder first
    return torch.cat([prompt, out[:, 1:]], dim=1)


@torch.no_grad()
def sequence_log_prob(model: GPT, tokens: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """log P(tokens[:, prompt_len:] | tokens[:, :prompt_len]) for each row: [batch]."""
    log_probs = torch.log_softmax(model(tokens[:, :-1]).float(), dim=-1)  # [batch, L - 1, vocab]
    picked = log_probs.gather(-1, tokens[:, 1:, None]).squeeze(-1)  # [batch, L - 1]: log P(token t+1 | ...)
    return picked[:, prompt_len - 1:].sum(dim=1)  # [batch]


# ---------------------------------------------------------------------------------------
# Loading GPT-2's weights from Hugging Face
# ---------------------------------------------------------------------------------------

class _StateDict(dict):
    """A state dict whose missing keys say what was expected, not only which key."""

    def __init__(self, entries: dict, expected: str):
        super().__init__(entries)
        self.expected = expected

    def __missing__(self, key):
        raise KeyError(f"the state dict has no {key!r}: expected {self.expected}")


def load_hf_gpt2_state_dict(model: GPT, hf_state_dict: dict) -> GPT:
    """Copy the weights of a Hugging Face GPT2LMHeadModel (or GPT2Model) into `model`, in place.

    Two differences of layout. GPT-2's linear layers are `Conv1D` modules that store their
    weight as [in, out] and compute x @ W, where nn.Linear stores [out, in]: every matrix is
    transposed. And its attention packs the query, key and value projections into one c_attn
    of width 3 * d_model, in that order: it is cut into three. Unused buffers (old versions'
    causal-mask "attn.bias") are skipped; a missing or misshapen weight is an error.
    """
    sd = _StateDict({k.removeprefix("transformer."): v for k, v in hf_state_dict.items()},
                    f"a GPT-2 state dict with n_layers={model.config.n_layers}")
    d = model.config.d_model

    def linear(prefix: str):  # a Conv1D weight [in, out] and bias -> nn.Linear's weight [out, in] and bias
        return sd[f"{prefix}.weight"].t(), sd[f"{prefix}.bias"]

    ours = {
        "token_embedding.weight": sd["wte.weight"],
        "lm_head.weight": sd["wte.weight"],  # tied: the same matrix
        "positions.embedding.weight": sd["wpe.weight"],
        "ln_f.gamma": sd["ln_f.weight"],
        "ln_f.beta": sd["ln_f.bias"],
    }
    for i in range(model.config.n_layers):
        h, b = f"h.{i}", f"blocks.{i}"
        qkv_weight, qkv_bias = linear(f"{h}.attn.c_attn")  # [3d, d], [3d]
        for j, name in enumerate(("w_q", "w_k", "w_v")):
            ours[f"{b}.self_attn.{name}.weight"] = qkv_weight[j * d:(j + 1) * d]  # [d, d]
            ours[f"{b}.self_attn.{name}.bias"] = qkv_bias[j * d:(j + 1) * d]
        for theirs_name, our_name in (("attn.c_proj", "self_attn.w_o"), ("mlp.c_fc", "feed_forward.linear1"),
                                      ("mlp.c_proj", "feed_forward.linear2")):
            ours[f"{b}.{our_name}.weight"], ours[f"{b}.{our_name}.bias"] = linear(f"{h}.{theirs_name}")
        for n in (1, 2):
            ours[f"{b}.ln_{n}.gamma"] = sd[f"{h}.ln_{n}.weight"]
            ours[f"{b}.ln_{n}.beta"] = sd[f"{h}.ln_{n}.bias"]
    if "lm_head.weight" in sd and not torch.equal(sd["lm_head.weight"], sd["wte.weight"]):
        raise ValueError("the state dict's output layer differs from its token embedding; the course's GPT ties them")
    if f"h.{model.config.n_layers}.ln_1.weight" in sd:
        raise ValueError(f"the state dict has more layers than the model's n_layers={model.config.n_layers}")
    model.load_state_dict({k: v.contiguous() for k, v in ours.items()}, strict=True)
    return model


def gpt_config_from_hf(hf_config) -> GPTConfig:
    """The GPTConfig of a Hugging Face GPT2Config (dropout: its residual dropout)."""
    if getattr(hf_config, "activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ValueError(f"the course's GPT uses GPT-2's tanh GELU, got {hf_config.activation_function!r}")
    return GPTConfig(vocab_size=hf_config.vocab_size, max_len=hf_config.n_positions, d_model=hf_config.n_embd,
                     n_heads=hf_config.n_head, n_layers=hf_config.n_layer, dropout=hf_config.resid_pdrop,
                     layer_norm_eps=hf_config.layer_norm_epsilon)


__all__ = [
    "GPTConfig", "Block", "GPT", "IGNORE_INDEX", "gelu_tanh", "lm_loss", "next_token_loss", "perplexity",
    "bits_per_char", "random_windows", "evaluate_lm", "warmup_cosine", "train_lm",
    "CharTokenizer", "unigram_log_probs", "bigram_log_probs", "temperature_probs", "top_p_filter",
    "choose_next_token", "generate", "generate_long", "greedy_generate", "sample", "beam_search",
    "sequence_log_prob", "gpt_block", "gpt_forward",
    "load_hf_gpt2_state_dict", "gpt_config_from_hf",
]
