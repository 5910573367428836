"""The Transformer's layers and the encoder-decoder model ("Attention Is All You Need", section 3).

Read top to bottom: LayerNorm (and BatchNorm, for comparison), the position-wise
feed-forward network, the residual sub-layer (post-norm as in the paper, pre-norm as most
later models; Xiong et al., 2020, "On Layer Normalization in the Transformer Architecture"),
the encoder and decoder layers, their stacks, the scaled token embedding, the generator,
and the full model with its config. The exercises of chapter 05 (layer_norm, batch_norm,
feed_forward, add_and_norm, encoder_layer_forward, encoder_forward) and chapter 06
(decoder_layer_forward) are plain functions here that the modules call, so there is one copy
of each formula. Masks follow the course convention: bool, True = may attend.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from .attention import KVCache, MultiHeadAttention
from .positional import SinusoidalPositionalEncoding


def layer_norm(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm(x) = gamma * (x - mean) / sqrt(var + eps) + beta, over the last dimension.

    x: [..., d]; gamma, beta: [d]. Returns [..., d]. The same as torch.nn.functional.layer_norm:
    the biased variance (divide by d, not d - 1) and eps inside the square root. Each vector is
    normalised with its own statistics, never with its neighbours' in the batch or the sentence.
    """
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"layer_norm expects a floating point tensor x, got {got}")
    if x.dim() < 1 or x.shape[-1] < 1:
        raise ValueError(f"layer_norm needs x of shape [..., d] with d >= 1, got {list(x.shape)}")
    d = x.shape[-1]
    if gamma.shape != (d,) or beta.shape != (d,):
        raise ValueError(f"gamma and beta must have shape [d] = [{d}] to match x {list(x.shape)}, "
                         f"got gamma {list(gamma.shape)} and beta {list(beta.shape)}")
    mean = x.mean(dim=-1, keepdim=True)  # [..., 1]
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)  # [..., 1], biased: divide by d
    return gamma * (x - mean) / torch.sqrt(var + eps) + beta  # [..., d]


def batch_norm(x: torch.Tensor, mask: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    """BatchNorm over a batch of sequences, without gain and bias (nn.BatchNorm1d in training mode).

    x: [batch, seq, d]; mask: None or bool [batch, seq], True = a real token (False = padding).
    One mean and one biased variance per feature, over every (real) token of every sequence:
    the opposite axes to layer_norm. Padding positions are normalised with the same
    statistics; their values never enter them when a mask is given. Returns [batch, seq, d].
    """
    if x.dim() != 3:
        raise ValueError(f"batch_norm expects x of shape [batch, seq, d], got {list(x.shape)}")
    if mask is None:
        mask = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
    if mask.shape != x.shape[:2] or mask.dtype != torch.bool:
        raise ValueError(f"batch_norm's mask must be bool [batch, seq] = {list(x.shape[:2])}, "
                         f"got {mask.dtype} {list(mask.shape)}")
    weight = mask[..., None].to(x.dtype)  # [batch, seq, 1]: 1 for a real token, 0 for padding
    count = weight.sum(dim=(0, 1), keepdim=True)  # [1, 1, 1]: real tokens in the batch
    mean = (x * weight).sum(dim=(0, 1), keepdim=True) / count  # [1, 1, d]
    var = (((x - mean) ** 2) * weight).sum(dim=(0, 1), keepdim=True) / count  # [1, 1, d], biased
    return (x - mean) / torch.sqrt(var + eps)  # [batch, seq, d]


class LayerNorm(nn.Module):
    """Normalise each position's features to mean 0, variance 1, then scale and shift.

    Same as torch.nn.LayerNorm (see layer_norm). Statistics are per position, never across
    the batch, so padding and batch composition change nothing (unlike BatchNorm).
    """

    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(d_model))  # start as the identity map
        self.beta = nn.Parameter(torch.zeros(d_model))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.gamma, self.beta, self.eps)

    def extra_repr(self) -> str:
        return f"{self.gamma.shape[0]}, eps={self.eps}"


def feed_forward(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor | None, w2: torch.Tensor,
                 b2: torch.Tensor | None, activation=torch.relu, dropout=None) -> torch.Tensor:
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (eq. 2 of the paper), for every position at once.

    x: [..., d_model]; w1: [d_model, d_ff], b1: [d_ff]; w2: [d_ff, d_model], b2: [d_model].
    Returns [..., d_model]. Matrices multiply from the right, as x @ W^Q in chapter 02. Only
    the last dimension is touched, so each position is transformed on its own (the same
    weights everywhere: a 1x1 convolution over the sequence).
    """
    if w1.dim() != 2 or w2.dim() != 2 or x.shape[-1] != w1.shape[0] or w1.shape[1] != w2.shape[0]:
        raise ValueError(f"feed_forward needs x [..., d_model], w1 [d_model, d_ff], w2 [d_ff, d_model]; "
                         f"got x {list(x.shape)}, w1 {list(w1.shape)}, w2 {list(w2.shape)}")
    hidden = x @ w1  # [..., d_ff]: expand
    if b1 is not None:
        hidden = hidden + b1
    hidden = activation(hidden)  # without it, the two products would collapse into one linear map
    if dropout is not None:
        hidden = dropout(hidden)
    out = hidden @ w2  # [..., d_model]: project back
    return out + b2 if b2 is not None else out


ACTIVATIONS = {"relu": torch.relu, "gelu": nn.functional.gelu}


class PositionwiseFeedForward(nn.Module):
    """Two linear layers with a ReLU between, d_model -> d_ff -> d_model, applied to every
    position separately (eq. 2; the paper's d_ff = 2048 = 4 * d_model)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, activation: str = "relu"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.activation = ACTIVATIONS[activation]
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # nn.Linear stores its weight as [out, in]; feed_forward wants [in, out].
        return feed_forward(x, self.linear1.weight.t(), self.linear1.bias, self.linear2.weight.t(),
                            self.linear2.bias, self.activation, self.dropout)  # [..., d_model]


def add_and_norm(x: torch.Tensor, sublayer, gamma: torch.Tensor, beta: torch.Tensor,
                 norm_first: bool = False, eps: float = 1e-5) -> torch.Tensor:
    """A sub-layer wrapped in a residual connection and a LayerNorm.

    post-norm (norm_first=False, the paper): LayerNorm(x + sublayer(x))
    pre-norm  (norm_first=True, GPT-2 and most later models): x + sublayer(LayerNorm(x))

    x: [..., d_model]; sublayer: a function [..., d_model] -> [..., d_model]; gamma, beta: [d_model].
    In pre-norm the sum with x is never normalised inside the layer, so the residual path
    through it is an exact identity; in a stack, only the final LayerNorm scales it.
    """
    if norm_first:
        return x + sublayer(layer_norm(x, gamma, beta, eps))  # [..., d_model]
    return layer_norm(x + sublayer(x), gamma, beta, eps)  # [..., d_model]


class ResidualConnection(nn.Module):
    """add_and_norm with a learned LayerNorm and dropout on the sub-layer's output (the
    paper drops out each sub-layer's output before it is added to the input). eps is the
    LayerNorm's (PyTorch's 1e-5 by default; BERT uses 1e-12)."""

    def __init__(self, d_model: int, dropout: float = 0.0, norm_first: bool = False, eps: float = 1e-5):
        super().__init__()
        self.norm = LayerNorm(d_model, eps)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: torch.Tensor, sublayer) -> torch.Tensor:
        return add_and_norm(x, lambda y: self.dropout(sublayer(y)), self.norm.gamma, self.norm.beta,
                            self.norm_first, self.norm.eps)


def encoder_layer_forward(x: torch.Tensor, mask: torch.Tensor | None, layer: EncoderLayer) -> torch.Tensor:
    """One encoder layer: self-attention, then the FFN, each inside a residual connection.

    post-norm: x = LN1(x + drop(SelfAttn(x))); out = LN2(x + drop(FFN(x)))
    pre-norm:  x = x + drop(SelfAttn(LN1(x))); out = x + drop(FFN(LN2(x)))
    x: [batch, seq, d_model]; mask: None or bool, broadcastable to the scores (True = may
    attend), e.g. padding_mask's [batch, 1, 1, seq]. `layer` supplies the parts: self_attn,
    feed_forward, norm1, norm2, dropout1, dropout2 and norm_first. Returns [batch, seq, d_model].
    """
    def attention(y):  # the only place where positions exchange information
        return layer.dropout1(layer.self_attn(y, y, y, mask))  # [batch, seq, d_model]

    def ffn(y):  # then each position on its own
        return layer.dropout2(layer.feed_forward(y))  # [batch, seq, d_model]

    x = add_and_norm(x, attention, layer.norm1.gamma, layer.norm1.beta, layer.norm_first, layer.norm1.eps)
    return add_and_norm(x, ffn, layer.norm2.gamma, layer.norm2.beta, layer.norm_first, layer.norm2.eps)


class EncoderLayer(nn.Module):
    """Self-attention, then the feed-forward network, each inside a residual connection.

    post-norm: x = LN1(x + SelfAttn(x)); out = LN2(x + FFN(x))
    pre-norm:  x = x + SelfAttn(LN1(x)); out = x + FFN(LN2(x))
    Attention is the only place where positions exchange information; the FFN then
    transforms each position on its own. The LayerNorms and dropouts live in residual1 and
    residual2; norm1/norm2, dropout1/dropout2 and norm_first name them as the equations do.
    eps is the LayerNorms' (BERT's layers use 1e-12, see bert.BertLayer).
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0,
                 norm_first: bool = False, activation: str = "relu", eps: float = 1e-5):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff, dropout, activation)
        self.residual1 = ResidualConnection(d_model, dropout, norm_first, eps)
        self.residual2 = ResidualConnection(d_model, dropout, norm_first, eps)

    @property
    def norm1(self) -> LayerNorm:  # around the attention
        return self.residual1.norm

    @property
    def norm2(self) -> LayerNorm:  # around the FFN
        return self.residual2.norm

    @property
    def dropout1(self) -> nn.Dropout:
        return self.residual1.dropout

    @property
    def dropout2(self) -> nn.Dropout:
        return self.residual2.dropout

    @property
    def norm_first(self) -> bool:
        return self.residual1.norm_first

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return encoder_layer_forward(x, mask, self)  # [batch, src, d_model]


@dataclass
class LayerCache:
    """What one decoder layer keeps between decoding steps."""

    self_attn: KVCache = field(default_factory=KVCache)
    cross_attn: KVCache = field(default_factory=lambda: KVCache(static=True))


def decoder_layer_forward(x: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor | None,
                          tgt_mask: torch.Tensor | None, layer: DecoderLayer,
                          cache: LayerCache | None = None) -> torch.Tensor:
    """One decoder layer: masked self-attention, cross-attention over the memory, then the FFN,
    each inside a residual connection (the same wiring as encoder_layer_forward).

    post-norm: x = LN1(x + drop(SelfAttn(x, tgt_mask))); x = LN2(x + drop(CrossAttn(x, memory, src_mask)));
               out = LN3(x + drop(FFN(x)))
    pre-norm:  the same three sub-layers as x = x + drop(Sublayer(LN(x))).
    x: [batch, tgt, d_model]; memory: the encoder's output [batch, src, d_model]; src_mask: the
    source padding mask ([batch, 1, 1, src]) or None; tgt_mask: causal AND target padding
    ([batch, 1, tgt, tgt] or [tgt, tgt]) or None. `layer` supplies self_attn, cross_attn,
    feed_forward, norm1-3, dropout1-3 and norm_first. Returns [batch, tgt, d_model].

    cache: while decoding one token at a time (chapter 07), a LayerCache whose self_attn part
    grows by the new positions' keys and values and whose cross_attn part keeps the memory's.
    """
    self_cache = cache.self_attn if cache is not None else None
    cross_cache = cache.cross_attn if cache is not None else None

    def self_attention(y):  # the target reads itself, up to the current position
        return layer.dropout1(layer.self_attn(y, y, y, tgt_mask, cache=self_cache))  # [batch, tgt, d_model]

    def cross_attention(y):  # queries from the decoder, keys and values from the encoder's memory
        return layer.dropout2(layer.cross_attn(y, memory, memory, src_mask, cache=cross_cache))

    def ffn(y):
        return layer.dropout3(layer.feed_forward(y))  # [batch, tgt, d_model]

    x = add_and_norm(x, self_attention, layer.norm1.gamma, layer.norm1.beta, layer.norm_first, layer.norm1.eps)
    x = add_and_norm(x, cross_attention, layer.norm2.gamma, layer.norm2.beta, layer.norm_first, layer.norm2.eps)
    return add_and_norm(x, ffn, layer.norm3.gamma, layer.norm3.beta, layer.norm_first, layer.norm3.eps)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the encoder memory, then the FFN, each inside a
    residual connection (see decoder_layer_forward). As in EncoderLayer, the LayerNorms and dropouts
    live in residual1-3; norm1-3, dropout1-3 and norm_first name them as the equations do."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0,
                 norm_first: bool = False, activation: str = "relu", eps: float = 1e-5):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff, dropout, activation)
        self.residual1 = ResidualConnection(d_model, dropout, norm_first, eps)
        self.residual2 = ResidualConnection(d_model, dropout, norm_first, eps)
        self.residual3 = ResidualConnection(d_model, dropout, norm_first, eps)

    @property
    def norm1(self) -> LayerNorm:  # around the masked self-attention
        return self.residual1.norm

    @property
    def norm2(self) -> LayerNorm:  # around the cross-attention
        return self.residual2.norm

    @property
    def norm3(self) -> LayerNorm:  # around the FFN
        return self.residual3.norm

    @property
    def dropout1(self) -> nn.Dropout:
        return self.residual1.dropout

    @property
    def dropout2(self) -> nn.Dropout:
        return self.residual2.dropout

    @property
    def dropout3(self) -> nn.Dropout:
        return self.residual3.dropout

    @property
    def norm_first(self) -> bool:
        return self.residual1.norm_first

    def forward(self, x, memory, src_mask=None, tgt_mask=None, cache: LayerCache | None = None):
        return decoder_layer_forward(x, memory, src_mask, tgt_mask, self, cache)  # [batch, tgt, d_model]


def _check_n_layers(n_layers) -> None:
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
        raise ValueError(f"a stack needs a positive integer number of layers, got n_layers={n_layers!r}")


def encoder_forward(x: torch.Tensor, mask: torch.Tensor | None, encoder: Encoder,
                    layer_forward=None) -> torch.Tensor:
    """The encoder stack: each layer's output is the next layer's input, then the final norm.

    x: [batch, seq, d_model]; mask: as for one layer, the same for every layer. `layer_forward(x,
    mask, layer)` runs one layer (default: the layer's own forward). `encoder.norm` is a
    LayerNorm in pre-norm stacks, whose residual stream is otherwise never normalised, and
    the identity in post-norm ones. Returns [batch, seq, d_model].
    """
    for layer in encoder.layers:
        x = layer(x, mask) if layer_forward is None else layer_forward(x, mask, layer)  # [batch, seq, d_model]
    return encoder.norm(x)


class Encoder(nn.Module):
    """N encoder layers, each a deep copy of `layer` with its own parameters (like
    torch.nn.TransformerEncoder, the copies start from equal values; EncoderDecoder
    re-initialises them). A final LayerNorm only in pre-norm, where the stack's output is
    otherwise never normalised."""

    def __init__(self, layer: EncoderLayer, n_layers: int, norm_first: bool = False):
        super().__init__()
        _check_n_layers(n_layers)
        self.layers = nn.ModuleList(copy.deepcopy(layer) for _ in range(n_layers))
        self.norm = LayerNorm(layer.self_attn.d_model) if norm_first else nn.Identity()

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return encoder_forward(x, mask, self)


def decoder_forward(x, memory, src_mask, tgt_mask, decoder: Decoder, layer_forward=None,
                    cache: list[LayerCache] | None = None) -> torch.Tensor:
    """The decoder stack: each layer reads the layer below, all read the same memory; then the final norm.

    x: [batch, tgt, d_model]; memory: [batch, src, d_model]. `layer_forward(x, memory, src_mask,
    tgt_mask, layer)` runs one layer (default: the layer's own forward, which also takes the
    cache). `cache` holds one LayerCache per layer while decoding token by token.
    """
    for i, layer in enumerate(decoder.layers):
        layer_cache = cache[i] if cache is not None else None
        if layer_forward is None:
            x = layer(x, memory, src_mask, tgt_mask, layer_cache)  # [batch, tgt, d_model]
        elif layer_cache is None:
            x = layer_forward(x, memory, src_mask, tgt_mask, layer)
        else:
            x = layer_forward(x, memory, src_mask, tgt_mask, layer, layer_cache)
    return decoder.norm(x)


class Decoder(nn.Module):
    """N decoder layers (deep copies of `layer`, as in Encoder); a final LayerNorm in pre-norm.

    layer_forward: a function (x, memory, src_mask, tgt_mask, layer) that runs one layer in place
    of the layers' own forward (chapter 06 runs a decoder on the learner's decoder_layer_forward).
    """

    def __init__(self, layer: DecoderLayer, n_layers: int, norm_first: bool = False, layer_forward=None):
        super().__init__()
        _check_n_layers(n_layers)
        self.layers = nn.ModuleList(copy.deepcopy(layer) for _ in range(n_layers))
        self.norm = LayerNorm(layer.self_attn.d_model) if norm_first else nn.Identity()
        self.layer_forward = layer_forward

    def forward(self, x, memory, src_mask=None, tgt_mask=None, cache: list[LayerCache] | None = None):
        return decoder_forward(x, memory, src_mask, tgt_mask, self, self.layer_forward, cache)


class TokenEmbedding(nn.Module):
    """Token ids -> vectors, multiplied by sqrt(d_model) (section 3.4) so that they are not
    drowned by the positional encoding, whose entries are of size 1."""

    def __init__(self, vocab_size: int, d_model: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.d_model = d_model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if not isinstance(tokens, torch.Tensor):
            raise TypeError(f"TokenEmbedding expects a tensor of integer token ids, got {type(tokens).__name__}")
        if tokens.is_floating_point() or tokens.dtype == torch.bool:
            raise TypeError(f"TokenEmbedding expects integer token ids, got dtype {tokens.dtype}")
        if tokens.numel() and (tokens.min() < 0 or tokens.max() >= self.embedding.num_embeddings):
            raise ValueError(f"token ids must lie in [0, {self.embedding.num_embeddings}), got "
                             f"min {tokens.min().item()}, max {tokens.max().item()}")
        return self.embedding(tokens) * math.sqrt(self.d_model)  # [batch, seq, d_model]


class Generator(nn.Module):
    """The decoder's output -> log-probabilities over the target vocabulary (linear + log-softmax)."""

    def __init__(self, d_model: int, vocab_size: int):
        super().__init__()
        self.proj = nn.Linear(d_model, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.proj(x), dim=-1)  # [batch, seq, vocab]


@dataclass
class TransformerConfig:
    """Sizes of an encoder-decoder Transformer; the defaults are the paper's base model."""

    src_vocab: int
    tgt_vocab: int
    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    n_layers: int = 6
    dropout: float = 0.1
    max_len: int = 5000
    norm_first: bool = False
    activation: str = "relu"
    # The paper shares one matrix between the two embeddings and the pre-softmax linear
    # layer (section 3.4); that needs one vocabulary for source and target.
    share_embeddings: bool = False


class EncoderDecoder(nn.Module):
    """The full model: embed + encode the source once, then decode the target against it."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        c = self.config = config
        self.src_embed = TokenEmbedding(c.src_vocab, c.d_model)
        self.tgt_embed = TokenEmbedding(c.tgt_vocab, c.d_model)
        self.positions = SinusoidalPositionalEncoding(c.d_model, c.max_len, c.dropout)
        self.encoder = Encoder(EncoderLayer(c.d_model, c.n_heads, c.d_ff, c.dropout, c.norm_first, c.activation),
                               c.n_layers, c.norm_first)
        self.decoder = Decoder(DecoderLayer(c.d_model, c.n_heads, c.d_ff, c.dropout, c.norm_first, c.activation),
                               c.n_layers, c.norm_first)
        self.generator = Generator(c.d_model, c.tgt_vocab)
        if c.share_embeddings:
            if c.src_vocab != c.tgt_vocab:
                raise ValueError(f"share_embeddings needs one vocabulary, got src_vocab={c.src_vocab}, tgt_vocab={c.tgt_vocab}")
            self.tgt_embed.embedding.weight = self.src_embed.embedding.weight
            self.generator.proj.weight = self.src_embed.embedding.weight
        self._init_weights()

    def _init_weights(self):
        # Glorot / fan_avg uniform for matrices, as in the reference implementations.
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.encoder(self.positions(self.src_embed(src)), src_mask)  # [batch, src, d_model]

    def decode(self, memory, src_mask, tgt, tgt_mask=None, cache: list[LayerCache] | None = None):
        # With a cache, `tgt` holds only the new tokens: their positions start after the cached ones.
        offset = cache[0].self_attn.length if cache is not None else 0
        x = self.positions(self.tgt_embed(tgt), offset)
        return self.decoder(x, memory, src_mask, tgt_mask, cache)  # [batch, tgt, d_model]

    def forward(self, src, tgt, src_mask=None, tgt_mask=None) -> torch.Tensor:
        """Log-probabilities of the next target token at every position: [batch, tgt, tgt_vocab]."""
        return self.generator(self.decode(self.encode(src, src_mask), src_mask, tgt, tgt_mask))

    def new_cache(self) -> list[LayerCache]:
        return [LayerCache() for _ in self.decoder.layers]


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters, each shared tensor counted once (works on the meta device too)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
