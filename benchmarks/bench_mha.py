"""Time transformer_lib's MultiHeadAttention against torch.nn.MultiheadAttention.

Both modules get the same weights and the same self-attention input (query is key is
value, no mask, need_weights=False: the fused path of each). Two settings per size:

* train: training mode, forward + backward (the cost of one training step of the layer);
* eval:  eval mode under torch.no_grad(), forward only (the cost of inference).

Each setting is warmed up, then timed `--repeats` times, alternating the two modules so
that a slow moment of the machine hits both; the median is reported, with the ratio
ours / nn.MultiheadAttention (below 1 means ours is faster). Target: ratio <= 1.2.

    .venv/bin/python benchmarks/bench_mha.py              # about 20 s on the 2-core CI machine
    .venv/bin/python benchmarks/bench_mha.py --threads 2  # both cores

One thread is the default because with several threads, other processes on a small
machine make the timings of both modules jump around by factors, not percent.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing
from transformer_lib.attention import MultiHeadAttention  # noqa: E402

# (batch, seq, d_model, heads): the size, and a wider, longer one.
SIZES = [(16, 128, 256, 8), (4, 256, 512, 8)]
TARGET = 1.2


def make_pair(d_model: int, n_heads: int) -> tuple[MultiHeadAttention, nn.MultiheadAttention]:
    """Our module and nn.MultiheadAttention holding the same weights."""
    ours = MultiHeadAttention(d_model, n_heads)
    theirs = nn.MultiheadAttention(d_model, n_heads, batch_first=True)
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([ours.w_q.weight, ours.w_k.weight, ours.w_v.weight]))
        theirs.in_proj_bias.copy_(torch.cat([ours.w_q.bias, ours.w_k.bias, ours.w_v.bias]))
        theirs.out_proj.weight.copy_(ours.w_o.weight)
        theirs.out_proj.bias.copy_(ours.w_o.bias)
    return ours, theirs


def step(module: nn.Module, x: torch.Tensor, train: bool) -> torch.Tensor:
    if isinstance(module, nn.MultiheadAttention):
        out = module(x, x, x, need_weights=False)[0]
    else:
        out = module(x, x, x)
    if train:
        out.sum().backward()
    return out


def time_block(module: nn.Module, x: torch.Tensor, train: bool, iters: int) -> float:
    """Seconds per call, averaged over `iters` calls."""
    module.train(train)
    start = time.perf_counter()
    for _ in range(iters):
        if train:
            module.zero_grad(set_to_none=True)
            step(module, x, True)
        else:
            with torch.no_grad():
                step(module, x, False)
    return (time.perf_counter() - start) / iters


def bench(size, train: bool, repeats: int, iters: int, warmup: int) -> tuple[float, float]:
    batch, seq, d_model, n_heads = size
    torch.manual_seed(0)
    ours, theirs = make_pair(d_model, n_heads)
    x = torch.randn(batch, seq, d_model, requires_grad=train)
    # Same answer first: a benchmark of two different computations would mean nothing.
    ours.eval(), theirs.eval()
    with torch.no_grad():
        diff = (ours(x, x, x) - theirs(x, x, x, need_weights=False)[0]).abs().max().item()
    if diff > 1e-4:
        raise RuntimeError(f"the two modules disagree (max difference {diff:.2e}): fix that before timing")
    for module in (ours, theirs):
        time_block(module, x, train, warmup)
    t_ours, t_theirs = [], []
    for _ in range(repeats):  # alternate, so that noise from other processes hits both
        t_ours.append(time_block(ours, x, train, iters))
        t_theirs.append(time_block(theirs, x, train, iters))
    return statistics.median(t_ours), statistics.median(t_theirs)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch.set_num_threads (default 1: stable timings on a shared machine)")
    parser.add_argument("--repeats", type=int, default=7, help="timed blocks per module (median reported)")
    parser.add_argument("--iters", type=int, default=2, help="calls per timed block")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls first")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {args.repeats} blocks of {args.iters} calls")
    print(f"{'batch':>5} {'seq':>4} {'d_model':>7} {'heads':>5}  {'mode':<16} {'ours ms':>8} {'nn.MHA ms':>9} {'ratio':>6}")
    start, worst = time.perf_counter(), 0.0
    for size in SIZES:
        for train in (True, False):
            t_ours, t_theirs = bench(size, train, args.repeats, args.iters, args.warmup)
            ratio = t_ours / t_theirs
            worst = max(worst, ratio)
            mode = "train fwd+bwd" if train else "eval fwd, no_grad"
            print(f"{size[0]:>5} {size[1]:>4} {size[2]:>7} {size[3]:>5}  {mode:<16} "
                  f"{1e3 * t_ours:>8.2f} {1e3 * t_theirs:>9.2f} {ratio:>6.2f}")
    verdict = "within" if worst <= TARGET else "NOT within"
    print(f"worst ratio {worst:.2f}: {verdict} {TARGET}x of nn.MultiheadAttention "
          f"({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
