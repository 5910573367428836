"""Time greedy decoding of 512 tokens with the key/value cache against re-decoding the whole prefix.

Without a cache, step t runs the decoder over all t tokens so far: the work of a whole
generation grows like L^2 / 2 token-passes. With a cache, each step runs the decoder on one
new token (its self-attention reads the cached keys and values, its cross-attention the
memory's keys and values computed at the first step): L token-passes. The goal in the issue
is a speed-up uncached / cached of at least 5x for 512 tokens.

The model is untrained and moderate in size (d_model 256, 4 heads, d_ff 1024, 3 encoder and
3 decoder layers, vocabulary 1000, positional table 600). So that both runs generate exactly
--tokens tokens, the generator's bias for eos is pushed to -1e4: the model can never pick it.
Both paths are warmed up once (a short generation), then timed --repeats times, alternating,
so a slow moment of the machine hits both; the median is reported. Both outputs are checked
to be identical.

One thread by default: decoding one sentence is a long chain of small operations, and on a
busy 2-core machine a second OpenMP thread spends its time waiting (we measured the cached
path 5x slower with 2 threads than with 1 under load). Pass --threads 2 on an idle machine.

    .venv/bin/python benchmarks/bench_kv_cache.py              # about 30-60 s on 2 CPU cores
    .venv/bin/python benchmarks/bench_kv_cache.py --threads 2 --tokens 256 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing
from transformer_lib.decoding import greedy_decode  # noqa: E402
from transformer_lib.layers import EncoderDecoder, TransformerConfig, count_parameters  # noqa: E402
from transformer_lib.masks import padding_mask  # noqa: E402

PAD, BOS, EOS = 0, 1, 2


def build_model(vocab: int, max_len: int) -> EncoderDecoder:
    torch.manual_seed(0)
    config = TransformerConfig(src_vocab=vocab, tgt_vocab=vocab, d_model=256, n_heads=4, d_ff=1024,
                               n_layers=3, dropout=0.0, max_len=max_len)
    model = EncoderDecoder(config).eval()
    with torch.no_grad():
        model.generator.proj.bias[EOS] = -1e4  # never chosen: every run is exactly --tokens long
    return model


def timed(fn) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=512, help="new tokens per generation (default 512)")
    parser.add_argument("--batch", type=int, default=1, help="source sentences decoded together (default 1)")
    parser.add_argument("--src-len", type=int, default=32, help="source length (default 32)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs of each path (default 1)")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    vocab = 1000
    model = build_model(vocab, max_len=max(600, args.tokens))
    g = torch.Generator().manual_seed(0)
    src = torch.randint(3, vocab, (args.batch, args.src_len), generator=g)  # [batch, src]
    src_mask = padding_mask(src, PAD)  # [batch, 1, 1, src]

    print(f"torch {torch.__version__}, {args.threads} thread(s); model: {count_parameters(model):,} parameters "
          f"(d_model 256, 4 heads, d_ff 1024, 3+3 layers, vocab {vocab})")
    print(f"greedy decoding of {args.tokens} tokens, batch {args.batch}, source length {args.src_len}")
    # Step t re-runs the decoder on t positions without a cache, on 1 with it.
    print(f"decoder positions computed: uncached {args.tokens * (args.tokens + 1) // 2:,}, cached {args.tokens:,} "
          f"(ratio {(args.tokens + 1) / 2:.0f}; fixed costs per step make the time ratio smaller)")

    def run(use_cache: bool, tokens: int):
        return greedy_decode(model, src, src_mask, tokens, BOS, EOS, use_cache=use_cache)

    for use_cache in (True, False):
        run(use_cache, 32)  # warm-up: allocator, kernels, first-call overheads

    times = {True: [], False: []}
    outputs = {}
    for _ in range(args.repeats):
        for use_cache in (False, True):
            seconds, outputs[use_cache] = timed(lambda: run(use_cache, args.tokens))
            times[use_cache].append(seconds)

    for use_cache, out in outputs.items():
        assert out.shape == (args.batch, 1 + args.tokens), f"expected {args.tokens} new tokens, got {list(out.shape)}"
    same = torch.equal(outputs[True], outputs[False])
    cached, uncached = statistics.median(times[True]), statistics.median(times[False])
    print(f"  uncached (whole prefix every step): {uncached:8.2f} s  ({1000 * uncached / args.tokens:6.1f} ms/token)")
    print(f"  cached   (one new token per step):  {cached:8.2f} s  ({1000 * cached / args.tokens:6.1f} ms/token)")
    print(f"  SPEED-UP uncached / cached: {uncached / cached:.1f}x   (goal: >= 5x)   identical tokens: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
