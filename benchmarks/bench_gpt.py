"""Train the course's GPT at character level on the course text for a fixed wall time, then
measure its validation loss in nats per character over the whole validation text.

The text is corpus.char_splits() (CPython's help prose: 264,147 training and 25,885 validation
characters on Python 3.11). The model is transformer_lib.gpt.GPT, trained by gpt.train_lm:
random windows, every position a training example, AdamW, warm-up then cosine decay of the
learning rate over the *time* budget (progress = seconds used / --seconds), so the run ends
on a small learning rate whatever the machine's speed. Goal: <= 1.35 nats/char at 80 s on
the course's 2-core CPU. For reference, in the same units: a unigram model (character
frequencies) scores 3.30 and a bigram model 2.42 on this split (chapter 10 computes both).

The validation loss covers every validation character but the first exactly once, with
windows of --context characters slid by --eval-stride (each prediction sees at least
context - stride characters). Evaluation time is not part of the training budget; it is
printed separately.

The default recipe was chosen by measurement, on this 2-core CPU shared with other jobs (see the
notes at the end of this file): d_model 96, 2 blocks, 4 heads, a context of 64 characters,
batches of 32 windows, peak learning rate 5e-3, float32. Small and fast wins here: in a fixed
time, more optimizer steps on a small model beat fewer steps on a wide or deep one. Neither
bfloat16 autocast (no faster at these sizes, although the CPU has AMX) nor torch.compile
(50-100 s of compilation, no faster steps afterwards) pays within 80 s.

Two threads are fast only on an idle machine: with other processes running, each OpenMP
barrier waits for the descheduled thread, and a run can lose 90% of its steps. Check `uptime`
first; the load average at the start is printed.

    .venv/bin/python benchmarks/bench_gpt.py                   # 80 s of training, 2 threads
    .venv/bin/python benchmarks/bench_gpt.py --seconds 20 --d-model 128 --layers 2

The last line printed is one JSON object: {"val_nats_per_char": ..., "steps": ..., "seconds": ...}.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing
from transformer_lib.corpus import char_splits  # noqa: E402
from transformer_lib.gpt import GPT, CharTokenizer, GPTConfig, evaluate_lm, train_lm  # noqa: E402


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=80.0, help="training wall time (default 80)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--d-model", type=int, default=96)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--context", type=int, default=64, help="training window in characters")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=5e-3, help="peak learning rate")
    p.add_argument("--warmup", type=float, default=0.05, help="fraction of the budget spent warming up")
    p.add_argument("--final-lr", type=float, default=0.1, help="final learning rate / peak")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast for the forward pass")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (compile time counts)")
    p.add_argument("--eval-stride", type=int, default=None, help="default: context // 2")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--progress", action="store_true")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    train_text, val_text = char_splits()
    tokenizer = CharTokenizer(train_text, val_text)
    train_ids, val_ids = tokenizer.encode(train_text), tokenizer.encode(val_text)
    config = GPTConfig(vocab_size=len(tokenizer), max_len=args.context, d_model=args.d_model, n_heads=args.heads,
                       n_layers=args.layers, dropout=args.dropout)
    model = GPT(config)
    n_params = sum(p.numel() for p in model.parameters())
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"torch {torch.__version__}, {args.threads} thread(s), load average {load:.2f} at start")
    print(f"GPT: d_model {args.d_model}, {args.layers} layers, {args.heads} heads, context {args.context}, "
          f"{n_params:,} parameters, vocabulary {len(tokenizer)} characters")
    print(f"recipe: batch {args.batch}, peak lr {args.lr}, warm-up {args.warmup:.0%}, cosine to {args.final_lr} x peak, "
          f"weight decay {args.weight_decay}, dropout {args.dropout}, "
          f"{'bfloat16 autocast' if args.bf16 else 'float32'}{', torch.compile' if args.compile else ''}")

    start = time.perf_counter()
    trained = torch.compile(model) if args.compile else model  # compiles lazily, inside the budget
    history = train_lm(trained, train_ids, context=args.context, batch_size=args.batch, lr=args.lr,
                       seconds=args.seconds, warmup=args.warmup, final_lr=args.final_lr,
                       weight_decay=args.weight_decay, generator=torch.Generator().manual_seed(args.seed),
                       bf16=args.bf16, progress=args.progress)
    seconds = time.perf_counter() - start
    steps = len(history)
    tail = history[-max(1, steps // 20):]
    print(f"trained {steps} steps in {seconds:.1f} s ({steps * args.batch * args.context / seconds:,.0f} "
          f"characters/s); training loss, last 5% of steps: {sum(tail) / len(tail):.3f} nats/char")

    eval_start = time.perf_counter()
    stride = args.eval_stride or args.context // 2
    val = evaluate_lm(model, val_ids, context=args.context, stride=stride)
    print(f"validation: {val:.4f} nats/char = {val / math.log(2):.3f} bits/char over all {len(val_ids) - 1:,} "
          f"predictions (stride {stride}, {time.perf_counter() - eval_start:.1f} s); goal <= 1.35 nats/char")
    result = {"val_nats_per_char": round(val, 4), "steps": steps, "seconds": round(seconds, 1)}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()

# ---------------------------------------------------------------------------------------
# Notes. The default recipe as shipped, since train_lm draws windows one token longer than the
# context (every position has a target, as nanoGPT's get_batch; December 2026), 2 threads, 80 s,
# three runs in a row: 1,898 steps -> 1.3176 (load average 0.87 at the start), 1,618 -> 1.3380
# (1.89), 1,749 -> 1.3199 (1.89) nats/char.
#
# How the default recipe was chosen (November 2026, before that change: the last position of each
# window had no target; torch 2.13 CPU, the course's 2-core Xeon shared with other jobs, load
# average 4 to 8 for most of the search).
#
# Two threads collapse under load (a run at load 3 made 110-150 steps where one at load 1.6
# made 1,423), so recipes were compared on one thread with a budget of 130 s of *CPU* time,
# which time-sharing does not distort; 130 CPU-seconds on one thread made as many steps as
# 80 s on two threads of the idle machine. Validation loss in nats/char, seed 0:
#
#   d_model layers heads context batch  peak lr  other          steps   val
#     128     4     4     128     32    3e-3                      400    1.825  (fixed 400 steps)
#     128     4     4      64     32    3e-3                      735    1.505
#     128     4     4      64     32    6e-3                      794    1.469
#     128     3     4      64     16    3e-3                    1,949    1.395
#      96     3     4      64     32    5e-3                    1,439    1.350
#      96     3     4      48     32    5e-3                    1,817    1.342
#      96     2     4      64     32    5e-3                    2,019    1.333
#      80     3     4      64     32    6e-3                    1,615    1.340
#      96     3     4      64     24    5e-3                    1,740    1.344
#      96     3     4      64     32    4e-3  weight decay 0.3  1,441    1.349
#      96     3     4      64     32    5e-3  dropout 0.05        927    1.528
#
# In 80 s, many steps of a small model win: the loss still falls with every step, and
# the training text (264k characters) is seen 5 to 15 times, so a wider or deeper model
# mostly memorises it (training loss ~1.1 against 1.34 on validation). Dropout costs more in
# speed (no fused attention) than it gains in generalisation at this budget.
# The default (2 layers) measured as then shipped, 2 threads, 80 s, at a load average of 1.0-1.1 at
# the start: 1,892 steps -> 1.3268, 1,832 -> 1.3321, 1,957 -> 1.3112 nats/char. At load 1.2-1.35:
# the 3-layer model, 1,138 and 867 steps -> 1.3748 and 1.4077; a run another job joined midway:
# 568 steps -> 1.615. The goal holds on a quiet machine only.
# Per-step CPU time, one thread, d_model 128 / 4 layers / context 128 / batch 32: float32
# 377 ms, bfloat16 autocast 439 ms; d_model 256: 941 vs 890 ms. torch.compile: 50-100 s of
# compilation (under load), then no faster steps (855 vs 827 ms). Neither pays in 80 s.
