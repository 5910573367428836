"""Time and peak memory of attention over long sequences: dense attention against the ways
around its n x n matrix (transformer_lib.sparse).

Self-attention of one head, batch 1, d = 64, forward only under torch.no_grad():

  dense        transformer_lib.attention.scaled_dot_product_attention, the readable n x n path
  torch_sdpa   torch.nn.functional.scaled_dot_product_attention, PyTorch's fused kernel (given
               [batch, heads, n, d]: with 3-D inputs it falls back to an n x n math path)
  banded       transformer_lib.sparse.banded_attention, a window of --window keys on each side
  linear       transformer_lib.sparse.linear_attention (elu + 1 feature map, non-causal)
  online       transformer_lib.sparse.online_softmax_attention, keys in blocks of --block

for n = 512, 1024, ..., 16384. A method stops early when its next size is predicted (from the
last one and its fitted growth) to take more than --max-seconds per call, or to need more
than half the memory the machine has available: dense attention stops there, not the others.

Time: two clocks, each the fastest of --repeats calls after one warm-up call (the fastest: other
programs only ever add time, so the minimum is the least disturbed measurement, as `timeit`
recommends). `cpu` is the CPU time of this process (time.process_time): the work done, whatever
else runs on the machine. `wall` is the elapsed time (time.perf_counter), which on a busy machine
also counts the waits for a free core, and more of them the longer a call runs: a shared
machine bends wall-clock slopes upwards. On an idle machine with one thread the two agree. The
slopes and the goal use the CPU time; both are printed. A call that takes over 2 s is timed once,
without a warm-up: at that size the warm-up costs nothing worth removing.

Peak memory: torch's own profiler with profile_memory=True records every allocation and free
made through torch's CPU allocator (tracemalloc sees none of them: torch does not allocate
through Python). The peak is the largest value of the running sum of those records during one
call, the inputs excluded, allocations inside fused operators included. `--rss` cross-checks it the coarse way: each case runs in a fresh
subprocess, and the growth of its peak resident set size (VmHWM) during the call is reported.

Slopes: least-squares fits of log(time) and log(peak memory) against log(n), for n >= 2048.
Goals: banded attention's time slope <= 1.2 between n = 2048 and 16384, and its peak memory
at n = 16384 at least 10x below dense attention's.

    .venv/bin/python benchmarks/bench_long_attention.py          # a few minutes on one thread
    .venv/bin/python benchmarks/bench_long_attention.py --rss    # and the peak-RSS cross-check

The last line printed is one JSON object with every number.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing
from transformer_lib import sparse  # noqa: E402
from transformer_lib.attention import scaled_dot_product_attention  # noqa: E402

SIZES = [512, 1024, 2048, 4096, 8192, 16384]
FIT_FROM = 2048
TIME_SLOPE_GOAL, MEMORY_RATIO_GOAL = 1.2, 10.0
METHODS = ["dense", "torch_sdpa", "banded", "linear", "online"]
# How each method's cost grows with n, to predict the next size before running it.
GROWTH = {"dense": 2, "torch_sdpa": 2, "banded": 1, "linear": 1, "online": 2}


def attention_fn(method: str, window: int, block: int):
    """The call to time, as a function of (q, k, v)."""
    if method == "dense":
        return lambda q, k, v: scaled_dot_product_attention(q, k, v)[0]
    if method == "torch_sdpa":
        # [batch, heads, n, d]: with 3-D inputs PyTorch's CPU dispatcher takes its math fallback,
        # which builds the n x n matrix (measured: 145 MiB at n = 4096 against 1.6 MiB).
        return lambda q, k, v: F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None])[:, 0]
    if method == "banded":
        return lambda q, k, v: sparse.banded_attention(q, k, v, window)
    if method == "linear":
        return lambda q, k, v: sparse.linear_attention(q, k, v)
    if method == "online":
        return lambda q, k, v: sparse.online_softmax_attention(q, k, v, block)
    raise ValueError(f"unknown method {method!r}; known: {METHODS}")


def inputs(n: int, d: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, n, d, generator=g) for _ in range(3))  # q, k, v: [batch=1, n, d]


def check_agreement(d: int, window: int, block: int) -> None:
    """Every method computes what it claims, before anything is timed."""
    n = 1024
    q, k, v = inputs(n, d, seed=1)
    with torch.no_grad():
        dense = scaled_dot_product_attention(q, k, v)[0]
        band = scaled_dot_product_attention(q, k, v, mask=sparse.sliding_window_mask(n, window))[0]
        pairs = {
            "torch_sdpa vs dense": (F.scaled_dot_product_attention(q, k, v), dense),
            "banded vs dense under the band mask": (sparse.banded_attention(q, k, v, window), band),
            "online vs dense": (sparse.online_softmax_attention(q, k, v, block), dense),
            "linear vs its O(n^2) form": (sparse.linear_attention(q, k, v),
                                          sparse.linear_attention_quadratic(q, k, v)[0]),
        }
    for name, (a, b) in pairs.items():
        err = (a - b).abs().max().item()
        if err > 1e-4:
            raise RuntimeError(f"{name}: max difference {err:.2e}; fix that before timing")
        print(f"  agree: {name:<36} max |difference| {err:.1e}")


def time_call(fn, q, k, v, repeats: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) per call, each the fastest of `repeats`; see the module docstring."""

    def once():
        cpu, wall = time.process_time(), time.perf_counter()
        fn(q, k, v)
        return time.process_time() - cpu, time.perf_counter() - wall

    with torch.no_grad():
        first = once()
        if first[1] > 2.0:
            return first
        runs = [once() for _ in range(repeats)]
    return min(r[0] for r in runs), min(r[1] for r in runs)


def peak_bytes_rss(method: str, n: int, d: int, window: int, block: int, threads: int) -> int:
    """Growth of the peak resident set size during one call, in a fresh process."""
    cmd = [sys.executable, __file__, "--one", method, str(n), "--d", str(d), "--window", str(window),
           "--block", str(block), "--threads", str(threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return int(json.loads(out.strip().splitlines()[-1])["rss_growth_bytes"])


def _peak_rss_bytes() -> int:
    """This process's peak resident set size. VmHWM belongs to the process's own memory map, which
    exec starts afresh; ru_maxrss would not do here, since Linux carries it over from the parent
    through fork and exec, so a child of a big benchmark process would start at the parent's peak."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def one_case_rss(method: str, n: int, d: int, window: int, block: int) -> None:
    """The subprocess side of --rss: warm up small (imports, kernels), then grow to size n once."""
    fn = attention_fn(method, window, block)
    with torch.no_grad():
        fn(*inputs(256, d))
        q, k, v = inputs(n, d)
        before = _peak_rss_bytes()
        out = fn(q, k, v)
        after = _peak_rss_bytes()
    del out
    print(json.dumps({"rss_growth_bytes": after - before}))


def available_bytes() -> int:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * 2**30  # unknown: assume a small machine


def fit_slope(points: dict[int, float], lo: int = FIT_FROM, hi: int | None = None) -> float | None:
    """Least-squares slope of log(value) against log(n), over lo <= n <= hi."""
    xs = [(math.log(n), math.log(val)) for n, val in points.items() if n >= lo and (hi is None or n <= hi) and val > 0]
    if len(xs) < 2:
        return None
    mx, my = statistics.fmean(x for x, _ in xs), statistics.fmean(y for _, y in xs)
    return sum((x - mx) * (y - my) for x, y in xs) / sum((x - mx) ** 2 for x, _ in xs)


def _fmt(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    parser.add_argument("--d", type=int, default=64, help="head size d (default 64)")
    parser.add_argument("--window", type=int, default=128, help="banded attention: keys on each side (default 128)")
    parser.add_argument("--block", type=int, default=512, help="online softmax: keys per block (default 512)")
    parser.add_argument("--repeats", type=int, default=7, help="timed calls per case (the fastest is reported)")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="stop a method before a call this long")
    parser.add_argument("--sizes", type=int, nargs="*", default=SIZES, help="sequence lengths n")
    parser.add_argument("--methods", nargs="*", default=METHODS, choices=METHODS)
    parser.add_argument("--rss", action="store_true", help="also measure the growth of the peak RSS, one subprocess per case")
    parser.add_argument("--one", nargs=2, metavar=("METHOD", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.one:
        one_case_rss(args.one[0], int(args.one[1]), args.d, args.window, args.block)
        return 0

    load_start = os.getloadavg()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), d = {args.d}, window = {args.window}, "
          f"online block = {args.block}; load average {load_start[0]:.2f} on {os.cpu_count()} cores")
    check_agreement(args.d, args.window, args.block)
    times: dict[str, dict[int, float]] = {m: {} for m in args.methods}  # CPU seconds
    walls: dict[str, dict[int, float]] = {m: {} for m in args.methods}  # wall-clock seconds
    peaks: dict[str, dict[int, int]] = {m: {} for m in args.methods}
    rss: dict[str, dict[int, int]] = {m: {} for m in args.methods}
    stopped: dict[str, str] = {}
    start = time.perf_counter()
    print(f"{'method':<11} {'n':>6} {'cpu ms':>10} {'wall ms':>10} {'peak MiB':>9}" + (f" {'rss MiB':>8}" if args.rss else ""))
    for method in args.methods:
        fn = attention_fn(method, args.window, args.block)
        for n in args.sizes:
            done = sorted(times[method])
            if done:
                last = done[-1]
                grow = (n / last) ** GROWTH[method]
                if walls[method][last] * grow > args.max_seconds:
                    stopped[method] = f"n = {n}: predicted {walls[method][last] * grow:.0f} s per call > {args.max_seconds:.0f} s"
                    break
                if peaks[method][last] * grow > available_bytes() / 2:
                    stopped[method] = (f"n = {n}: predicted {peaks[method][last] * grow / 2**30:.1f} GiB > half of the "
                                       f"{available_bytes() / 2**30:.1f} GiB available")
                    break
            q, k, v = inputs(n, args.d)
            times[method][n], walls[method][n] = time_call(fn, q, k, v, args.repeats)
            peaks[method][n] = sparse.peak_memory(fn, q, k, v)
            line = (f"{method:<11} {n:>6} {1e3 * times[method][n]:>10.1f} {1e3 * walls[method][n]:>10.1f} "
                    f"{peaks[method][n] / 2**20:>9.1f}")
            if args.rss:
                del q, k, v
                rss[method][n] = peak_bytes_rss(method, n, args.d, args.window, args.block, args.threads)
                line += f" {rss[method][n] / 2**20:>8.1f}"
            print(line, flush=True)
        if method in stopped:
            print(f"{method:<11} stopped at {stopped[method]}")

    time_slope = {m: fit_slope(times[m]) for m in args.methods}
    wall_slope = {m: fit_slope(walls[m]) for m in args.methods}
    memory_slope = {m: fit_slope(peaks[m]) for m in args.methods}
    print(f"\nlog-log slopes fitted on n >= {FIT_FROM} (2 = doubling n quadruples the cost, 1 = doubles it):")
    for m in args.methods:
        ts, ms = time_slope[m], memory_slope[m]
        print(f"  {m:<11} cpu time {_fmt(ts, '5.2f'):>5}   wall time {_fmt(wall_slope[m], '5.2f'):>5}   "
              f"peak memory {_fmt(ms, '5.2f'):>5}")

    biggest = max(args.sizes)
    result = {"benchmark": "long_attention", "torch": torch.__version__, "threads": torch.get_num_threads(),
              "d": args.d, "window": args.window, "block": args.block, "sizes": args.sizes,
              "memory_method": "torch.profiler profile_memory: running sum of CPU allocator records, inputs excluded",
              "cpu_ms": {m: {str(n): round(1e3 * t, 2) for n, t in times[m].items()} for m in args.methods},
              "wall_ms": {m: {str(n): round(1e3 * t, 2) for n, t in walls[m].items()} for m in args.methods},
              "peak_mib": {m: {str(n): round(b / 2**20, 2) for n, b in peaks[m].items()} for m in args.methods},
              "cpu_time_slope": {m: None if s is None else round(s, 3) for m, s in time_slope.items()},
              "wall_time_slope": {m: None if s is None else round(s, 3) for m, s in wall_slope.items()},
              "memory_slope": {m: None if s is None else round(s, 3) for m, s in memory_slope.items()},
              "stopped": stopped}
    if args.rss:
        result["rss_growth_mib"] = {m: {str(n): round(b / 2**20, 1) for n, b in rss[m].items()} for m in args.methods}
    if "banded" in times and "dense" in times:
        slope = fit_slope(times["banded"], FIT_FROM, 16384)
        wall = fit_slope(walls["banded"], FIT_FROM, 16384)
        dense_peak = peaks["dense"].get(biggest)
        extrapolated = dense_peak is None and bool(peaks["dense"])
        if extrapolated:  # dense stopped before: its peak grows as n^2 (fitted slope shown above)
            last = max(peaks["dense"])
            dense_peak = peaks["dense"][last] * (biggest / last) ** 2
        ratio = dense_peak / peaks["banded"][biggest] if dense_peak and peaks["banded"].get(biggest) else None
        goals = {"banded_cpu_time_slope": slope, "banded_wall_time_slope": wall,
                 "banded_time_slope_goal_met": slope is not None and slope <= TIME_SLOPE_GOAL,
                 "dense_over_banded_peak_memory_at_max_n": ratio,
                 "memory_goal_met": ratio is not None and ratio >= MEMORY_RATIO_GOAL,
                 "dense_peak_at_max_n_extrapolated": extrapolated}
        result["goals"] = {k: round(v, 3) if isinstance(v, float) else v for k, v in goals.items()}
        print(f"\nbanded attention: CPU-time slope {_fmt(slope, '.2f')} (wall-clock {_fmt(wall, '.2f')}) "
              f"between n = {FIT_FROM} and {biggest} "
              f"(goal <= {TIME_SLOPE_GOAL}: {'met' if goals['banded_time_slope_goal_met'] else 'NOT met'}); "
              f"peak memory at n = {biggest} {_fmt(ratio, '.0f')}x below dense"
              f"{' (dense extrapolated)' if extrapolated else ''} "
              f"(goal >= {MEMORY_RATIO_GOAL:.0f}x: {'met' if goals['memory_goal_met'] else 'NOT met'})")
    load_end = os.getloadavg()
    result["load_average"] = [round(load_start[0], 2), round(load_end[0], 2)]
    result["seconds"] = round(time.perf_counter() - start, 1)
    print(f"load average {load_end[0]:.2f} at the end; {result['seconds']:.0f} s in all")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
