"""Time GPT generation with the key/value cache against re-running the whole sequence each step.

The decoder-only counterpart of bench_kv_cache.py (which times the encoder-decoder). Without
a cache, step t runs the model over all prompt + t tokens so far, so a generation of n tokens
costs about n * prompt + n^2 / 2 token-passes; with the cache, the prompt runs once and every
step feeds one token: prompt + n. Both must give the same tokens: greedy decoding is checked
token for token, and sampling too (top-k and top-p with the same seeded generator).

The model is untrained (seeded), d_model 256, 4 blocks, 4 heads, a vocabulary of 1,000 and
512 positions: 64 prompt tokens and, by default, 448 new ones fill the context. Both paths are
warmed up once and then timed --repeats times, alternating, so that a slow moment of the
machine hits both; the median is reported.

One thread by default (decoding one sequence is a long chain of small operations: on a busy
2-core machine a second thread mostly waits). Pass --threads 2 on an idle machine.

    .venv/bin/python benchmarks/bench_gpt_cache.py                # about 30-60 s on 2 CPU cores
    .venv/bin/python benchmarks/bench_gpt_cache.py --tokens 192 --repeats 3

The last line printed is one JSON object with both timings, the speed-up and the equality.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing
from transformer_lib.gpt import GPT, GPTConfig, generate  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=448, help="new tokens per generation (default 448)")
    parser.add_argument("--prompt", type=int, default=64, help="prompt length (default 64)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs of each path (default 1)")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=1000, max_len=512, d_model=256, n_heads=4, n_layers=4, dropout=0.0)
    if args.prompt + args.tokens > config.max_len:
        parser.error(f"--prompt + --tokens must fit the model's {config.max_len} positions")
    model = GPT(config).eval()
    prompt = torch.randint(0, config.vocab_size, (1, args.prompt), generator=torch.Generator().manual_seed(0))
    n_params = sum(p.numel() for p in model.parameters())
    print(f"torch {torch.__version__}, {args.threads} thread(s); GPT: {n_params:,} parameters (d_model 256, 4 blocks, "
          f"4 heads, vocabulary 1,000)")
    uncached_positions = sum(args.prompt + t for t in range(args.tokens))
    print(f"greedy generation of {args.tokens} tokens after a {args.prompt}-token prompt; positions computed: "
          f"uncached {uncached_positions:,}, cached {args.prompt + args.tokens - 1:,}")

    def run(use_cache: bool, tokens: int, **settings):
        return generate(model, prompt, tokens, use_cache=use_cache, **settings)

    for use_cache in (True, False):
        run(use_cache, 16, greedy=True)  # warm-up: allocator, kernels, first-call overheads

    times: dict[bool, list[float]] = {True: [], False: []}
    outputs = {}
    for _ in range(args.repeats):
        for use_cache in (False, True):
            start = time.perf_counter()
            outputs[use_cache] = run(use_cache, args.tokens, greedy=True)
            times[use_cache].append(time.perf_counter() - start)
    greedy_equal = torch.equal(outputs[True], outputs[False])

    # Sampling must agree too: the same generator seed draws the same numbers on both paths.
    def sampled(use_cache: bool):
        return run(use_cache, 64, temperature=0.8, top_k=50, top_p=0.9, generator=torch.Generator().manual_seed(1))

    sampled_equal = torch.equal(sampled(True), sampled(False))
    cached, uncached = statistics.median(times[True]), statistics.median(times[False])
    print(f"  uncached (whole sequence every step): {uncached:7.2f} s  ({1000 * uncached / args.tokens:6.1f} ms/token)")
    print(f"  cached   (one new token per step):   {cached:7.2f} s  ({1000 * cached / args.tokens:6.1f} ms/token)")
    print(f"  SPEED-UP uncached / cached: {uncached / cached:.1f}x; identical tokens: greedy {greedy_equal}, "
          f"sampled (T 0.8, top-k 50, top-p 0.9) {sampled_equal}")
    print(json.dumps({"tokens": args.tokens, "cached_s": round(cached, 3), "uncached_s": round(uncached, 3),
                      "speedup": round(uncached / cached, 2), "greedy_equal": greedy_equal,
                      "sampled_equal": sampled_equal}))
    return 0 if greedy_equal and sampled_equal else 1


if __name__ == "__main__":
    sys.exit(main())
