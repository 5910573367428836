"""Training an encoder-decoder Transformer: the loss with label smoothing, the warm-up learning
rate, teacher forcing with shifted targets, and one training loop, which also runs data-parallel
under torchrun (DistributedDataParallel, gloo on the CPU).

References: Vaswani et al., "Attention Is All You Need" (2017), section 5.3 (eq. 3, the
learning rate) and 5.4 (label smoothing, from Szegedy et al., 2016); the Annotated
Transformer (Rush et al., 2018) for the smoothed target distribution that excludes <pad>.

Run it from the command line (one process, or several with torchrun):

    python -m transformer_lib.training --task dates --steps 400 --out runs/dates
    torchrun --nproc_per_node=2 -m transformer_lib.training --task dates --steps 400 --out runs/ddp
"""

from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import torch
import torch.distributed as dist
import torch.nn as nn
from tqdm.auto import tqdm  # widgets in JupyterLab, plain text in a terminal

from .masks import causal_mask, padding_mask

# ---------------------------------------------------------------------------------------
# The loss: cross-entropy against a smoothed target distribution
# ---------------------------------------------------------------------------------------


def label_smoothed_targets(target: torch.Tensor, vocab_size: int, smoothing: float, pad_id: int,
                           dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The distribution each position is trained towards, as in the Annotated Transformer.

    target: [...] integer ids. Returns q: [..., vocab_size] of `dtype`, where for a real token
    q[gold] = 1 - smoothing, q[pad_id] = 0, and the other vocab_size - 2 classes share
    `smoothing` equally. A row whose target is <pad> is all zeros: it is not trained at all.
    """
    if not isinstance(target, torch.Tensor) or target.is_floating_point():
        raise TypeError(f"target must be a tensor of integer token ids, got "
                        f"{target.dtype if isinstance(target, torch.Tensor) else type(target).__name__}")
    if vocab_size < 3:
        raise ValueError(f"label smoothing needs vocab_size >= 3 (gold, <pad> and at least one other class), got {vocab_size}")
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing must lie in [0, 1), got {smoothing}")
    if target.numel() and (target.min() < 0 or target.max() >= vocab_size):
        raise ValueError(f"target ids must lie in [0, {vocab_size}), got min {target.min().item()}, max {target.max().item()}")
    # <pad> is never a right answer and the gold class has its own share, hence V - 2.
    q = torch.full((*target.shape, vocab_size), smoothing / (vocab_size - 2), dtype=dtype, device=target.device)  # [..., V]
    q.scatter_(-1, target.unsqueeze(-1), 1.0 - smoothing)
    q[..., pad_id] = 0.0
    return q.masked_fill((target == pad_id).unsqueeze(-1), 0.0)  # [..., V]


def label_smoothed_loss(log_probs: torch.Tensor, target: torch.Tensor, smoothing: float, pad_id: int) -> torch.Tensor:
    """The label-smoothed cross-entropy H(q, p), averaged over the real (non-<pad>) target positions.

    log_probs: [..., V] (the Generator's output); target: [...] integer ids. Returns a scalar
    tensor of log_probs' dtype: sum over positions of -sum_v q_v log p_v, divided by the number
    of positions whose target is not <pad>, with q from `label_smoothed_targets`.
    """
    q = label_smoothed_targets(target, log_probs.shape[-1], smoothing, pad_id, log_probs.dtype)  # [..., V]
    # where(q > 0, ...): a class with no target mass contributes 0 even if log p is -inf.
    per_token = -torch.where(q > 0, q * log_probs, 0.0).sum(dim=-1)  # [...]; 0 at padded positions
    n_tokens = (target != pad_id).sum()
    # Average over real tokens only, so padding changes neither the loss nor its scale.
    return per_token.sum() / n_tokens.clamp(min=1)


class LabelSmoothingLoss(nn.Module):
    """Cross-entropy H(q, p) = -sum_v q_v log p_v, averaged over the non-<pad> targets, with q
    from `label_smoothed_targets` and log p the model's log-probabilities (the Generator's output).

    Exactly which quantity: the cross-entropy, not the KL divergence the Annotated Transformer
    reports. They differ by the entropy H(q) of the target, a constant, so their gradients are
    identical; the cross-entropy has the advantage that smoothing=0 gives exactly
    F.cross_entropy(..., ignore_index=padding_idx), and that its floor, H(q), is printed by
    `min_loss()`. It is *not* torch's `label_smoothing=`, which spreads eps / V over every
    class, <pad> and the gold class included (see tests/test_training.py for the conversion).
    """

    def __init__(self, vocab_size: int, padding_idx: int, smoothing: float = 0.1):
        super().__init__()
        if not 0 <= padding_idx < vocab_size:
            raise ValueError(f"padding_idx must lie in [0, {vocab_size}), got {padding_idx}")
        label_smoothed_targets(torch.zeros(1, dtype=torch.long), vocab_size, smoothing, padding_idx)  # validates
        self.vocab_size, self.padding_idx, self.smoothing = vocab_size, padding_idx, smoothing

    def forward(self, log_probs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if log_probs.shape[:-1] != target.shape or log_probs.shape[-1] != self.vocab_size:
            raise ValueError(f"log_probs must be [..., vocab_size={self.vocab_size}] with the target's shape in front: "
                             f"got log_probs {list(log_probs.shape)}, target {list(target.shape)}")
        return label_smoothed_loss(log_probs, target, self.smoothing, self.padding_idx)

    def min_loss(self) -> float:
        """The smallest value the loss can take: the entropy H(q) of a smoothed target row."""
        eps, v = self.smoothing, self.vocab_size
        if eps == 0:
            return 0.0
        return -(1 - eps) * math.log(1 - eps) - eps * math.log(eps / (v - 2))


# ---------------------------------------------------------------------------------------
# The learning rate: linear warm-up, then decay as 1 / sqrt(step)
# ---------------------------------------------------------------------------------------


def noam_rate(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """lrate = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)  (paper, eq. 3).

    Steps count from 1. The two terms meet at step = warmup, where the rate peaks at
    factor * (d_model * warmup)^-0.5; before, it grows linearly, after, it decays as 1/sqrt(step).
    """
    if isinstance(step, bool) or int(step) != step or step < 1:
        raise ValueError(f"steps count from 1 (step 0 would divide by zero), got step={step!r}")
    if d_model < 1 or warmup < 1:
        raise ValueError(f"d_model and warmup must be positive, got d_model={d_model}, warmup={warmup}")
    return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def noam_lambda(d_model: int, warmup: int, factor: float = 1.0, total_steps: int | None = None,
                cooldown: int = 0, rate_fn: Callable[[int, int, int], float] | None = None) -> Callable[[int], float]:
    """The multiplier for torch.optim.lr_scheduler.LambdaLR. LambdaLR counts from 0 (it calls
    the function with 0 when it is built, before any step), the paper from 1: hence the + 1.

    cooldown > 0 (not in the paper) scales the rate down linearly to 0 over the last
    `cooldown` of `total_steps` steps. The paper's 1/sqrt(step) decay suits 100,000 steps;
    a run of a few hundred steps ends with a rate still high enough to keep the weights
    jumping between good solutions, and a short cool-down lets them settle (the paper
    gets a similar effect by averaging its last checkpoints).

    rate_fn(step, d_model, warmup) replaces eq. 3 (chapter 07 passes the learner's own); the
    result is multiplied by `factor`.
    """
    if cooldown:
        if total_steps is None or not 0 < cooldown <= total_steps:
            raise ValueError(f"a cool-down needs total_steps >= cooldown > 0, got total_steps={total_steps}, "
                             f"cooldown={cooldown}")

    def rate(step: int) -> float:
        if rate_fn is None:
            r = noam_rate(step + 1, d_model, warmup, factor)
        else:
            r = factor * rate_fn(step + 1, d_model, warmup)
        if cooldown:
            r *= min(1.0, max(0.0, (total_steps - step) / cooldown))
        return r

    return rate


def noam_scheduler(optimizer: torch.optim.Optimizer, d_model: int, warmup: int, factor: float = 1.0,
                   total_steps: int | None = None, cooldown: int = 0,
                   rate_fn: Callable[[int, int, int], float] | None = None) -> torch.optim.lr_scheduler.LambdaLR:
    """LambdaLR following eq. 3 (with an optional linear cool-down, see noam_lambda).
    LambdaLR multiplies the optimizer's own lr by the rate, so build the optimizer with
    lr=1.0 (then `factor` scales the whole schedule)."""
    for group in optimizer.param_groups:
        if group["lr"] != 1.0:
            raise ValueError(f"build the optimizer with lr=1.0 for noam_scheduler (LambdaLR multiplies it "
                             f"by the schedule), got lr={group['lr']}; use factor= to scale the schedule")
    return torch.optim.lr_scheduler.LambdaLR(optimizer, noam_lambda(d_model, warmup, factor, total_steps, cooldown,
                                                                    rate_fn))


# ---------------------------------------------------------------------------------------
# Teacher forcing: the decoder reads the gold prefix, shifted right by one
# ---------------------------------------------------------------------------------------


def shift_right(tgt: torch.Tensor, bos_id: int) -> torch.Tensor:
    """[y1, y2, ..., yT] -> [<bos>, y1, ..., y_{T-1}]: position t sees the tokens before t.

    tgt: [batch, T] -> [batch, T].
    """
    if tgt.dim() != 2:
        raise ValueError(f"shift_right expects target ids of shape [batch, seq], got shape {list(tgt.shape)}")
    bos = torch.full_like(tgt[:, :1], bos_id)  # [batch, 1]
    return torch.cat([bos, tgt[:, :-1]], dim=1)  # [batch, T]


def make_teacher_forcing_batch(tgt: torch.Tensor, bos_id: int, pad_id: int | None = None):
    """(decoder input, target) for training: the target is tgt itself ([y1, ..., <eos>, <pad>...]),
    the input is tgt shifted right behind <bos>, so that the output at position t is
    trained to predict y_t from <bos>, y1, ..., y_{t-1}.

    With pad_id, positions whose target is <pad> get <pad> as input too (instead of the
    <eos> that the shift moves there): harmless either way, since the loss ignores them.
    """
    decoder_input = shift_right(tgt, bos_id)  # [batch, T]
    if pad_id is not None:
        decoder_input = decoder_input.masked_fill(tgt == pad_id, pad_id)
    return decoder_input, tgt


@dataclass
class Seq2SeqBatch:
    """Everything one training step of an encoder-decoder needs."""

    src: torch.Tensor  # [batch, S]
    src_mask: torch.Tensor  # [batch, 1, 1, S]: hide source padding
    decoder_input: torch.Tensor  # [batch, T]
    target: torch.Tensor  # [batch, T]
    tgt_mask: torch.Tensor  # [batch, 1, T, T]: causal and hide target padding
    pad_id: int = 0

    @property
    def n_tokens(self) -> int:
        return int((self.target != self.pad_id).sum())


def prepare_batch(src: torch.Tensor, tgt: torch.Tensor, bos_id: int, pad_id: int,
                  teacher_forcing: Callable | None = None) -> Seq2SeqBatch:
    """Padded (src, tgt) ids -> the masks and the shifted decoder input.

    teacher_forcing(tgt, bos_id) -> (decoder_input, target) makes the shifted input (default:
    make_teacher_forcing_batch; chapter 07 passes the learner's own). Either way, positions
    whose target is <pad> then read <pad>, as make_teacher_forcing_batch(..., pad_id) does.
    """
    if teacher_forcing is None:
        decoder_input, target = make_teacher_forcing_batch(tgt, bos_id, pad_id)
    else:
        decoder_input, target = teacher_forcing(tgt, bos_id)
        decoder_input = decoder_input.masked_fill(target == pad_id, pad_id)
    src_mask = padding_mask(src, pad_id)  # [batch, 1, 1, S]
    tgt_mask = causal_mask(tgt.shape[1], device=tgt.device) & padding_mask(decoder_input, pad_id)  # [batch, 1, T, T]
    return Seq2SeqBatch(src, src_mask, decoder_input, target, tgt_mask, pad_id)


# ---------------------------------------------------------------------------------------
# The training loop
# ---------------------------------------------------------------------------------------


def train_step(model: nn.Module, batch: Seq2SeqBatch, loss_fn: Callable, optimizer: torch.optim.Optimizer,
               scheduler=None, max_grad_norm: float | None = None) -> float:
    """One update with teacher forcing; returns the batch's loss as a Python float.

    The order matters: clear the old gradients (PyTorch adds new ones to them), forward on the
    shifted decoder input, loss against the unshifted target, backward, clip the gradient's
    norm (before the step, or it protects nothing), step the optimizer, then the scheduler
    (which sets the learning rate of the *next* step).
    """
    optimizer.zero_grad(set_to_none=True)
    log_probs = model(batch.src, batch.decoder_input, batch.src_mask, batch.tgt_mask)  # [batch, T, V]
    loss = loss_fn(log_probs, batch.target)  # mean over the real target tokens
    loss.backward()  # under DDP, this is where the ranks average their gradients
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return loss.item()


def _is_main_process() -> bool:
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def train(model: nn.Module, loader: Iterable, optimizer: torch.optim.Optimizer, loss_fn: Callable,
          epochs: int | None = None, steps: int | None = None, scheduler=None, *, bos_id: int = 1,
          pad_id: int = 0, max_grad_norm: float | None = None, progress: bool = True,
          desc: str = "training", step_fn: Callable | None = None,
          teacher_forcing: Callable | None = None) -> list[float]:
    """Train an encoder-decoder with teacher forcing; returns the loss of every step.

    `loader` yields padded (src, tgt) id tensors (or ready Seq2SeqBatch objects); `loss_fn`
    takes (log_probs [batch, T, V], target [batch, T]). Give exactly one of `epochs` or
    `steps` (steps run through the loader as many times as needed). `scheduler` is stepped
    after every optimizer step. Under torch.distributed, pass the model already wrapped in
    DistributedDataParallel and a loader with a DistributedSampler: the loop then reshuffles
    each epoch with sampler.set_epoch, shows its progress bar on rank 0 only, and records
    each rank's own loss (the gradients, not the losses, are averaged by DDP).

    `step_fn(model, batch, loss_fn, optimizer, scheduler, max_grad_norm) -> loss` does one
    update (default: `train_step`), and `teacher_forcing(tgt, bos_id) -> (decoder_input,
    target)` shifts the targets (default: make_teacher_forcing_batch); chapter 07 passes the
    learner's own functions.
    """
    step_fn = train_step if step_fn is None else step_fn
    if (epochs is None) == (steps is None):
        raise ValueError(f"give exactly one of epochs= or steps=, got epochs={epochs}, steps={steps}")
    if len(loader) == 0:
        raise ValueError("the loader yields no batch (empty data set, or drop_last with too few examples)")
    total = steps if steps is not None else epochs * len(loader)
    if total < 1:
        raise ValueError(f"nothing to train: {total} steps")
    model.train()
    history: list[float] = []
    bar = tqdm(total=total, desc=desc, disable=not (progress and _is_main_process()), mininterval=1.0)
    epoch = 0
    while len(history) < total:
        for sampler in (getattr(loader, "sampler", None), getattr(loader, "batch_sampler", None)):
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        for batch in loader:
            b = batch if isinstance(batch, Seq2SeqBatch) else prepare_batch(*batch, bos_id=bos_id, pad_id=pad_id,
                                                                            teacher_forcing=teacher_forcing)
            history.append(float(step_fn(model, b, loss_fn, optimizer, scheduler, max_grad_norm)))
            bar.set_postfix(loss=f"{history[-1]:.3f}", refresh=False)
            bar.update(1)
            if len(history) == total:
                break
        epoch += 1
    bar.close()
    return history


@torch.no_grad()
def exact_match(model: nn.Module, task, max_new_tokens: int, batch_size: int = 500) -> float:
    """Fraction of the task's test pairs whose greedy output equals the target exactly."""
    from .decoding import greedy_decode

    vocab, was_training = task.vocab, model.training
    model.eval()
    correct = 0
    for start in range(0, len(task.test), batch_size):
        pairs = task.test[start : start + batch_size]
        src = vocab.encode_batch([s for s, _ in pairs])  # [batch, S]
        out = greedy_decode(model, src, padding_mask(src, vocab.pad_id), max_new_tokens, vocab.bos_id, vocab.eos_id)
        correct += sum(p == t for p, (_, t) in zip(vocab.decode_batch(out), pairs))
    model.train(was_training)
    return correct / len(task.test)


# ---------------------------------------------------------------------------------------
# Command line: python -m transformer_lib.training, or under torchrun for several processes
# ---------------------------------------------------------------------------------------


def _task(name: str, n_train: int, seed: int):
    from .datasets import dates_task, sequence_task

    if name == "dates":
        return dates_task(n_train=n_train, n_test=500, seed=seed)
    return sequence_task(name, n_train=n_train, n_test=200, seed=seed)


def main(argv: list[str] | None = None) -> list[float]:
    """Train a small Transformer on a synthetic task; save each process's final weights.

    Launched by torchrun (RANK and WORLD_SIZE in the environment) it joins the process group
    (gloo: CPU), wraps the model in DistributedDataParallel and gives each process its own
    shard of every epoch with a DistributedSampler. It writes OUT/initial.pt (rank 0, before
    training), OUT/rank{r}.pt (every rank, after training) and OUT/history_rank{r}.json.
    """
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data.distributed import DistributedSampler

    from torch.utils.data import DataLoader

    from .datasets import PairDataset
    from .layers import EncoderDecoder, TransformerConfig

    p = argparse.ArgumentParser(prog="python -m transformer_lib.training", description=main.__doc__)
    p.add_argument("--task", choices=["dates", "copy", "reverse"], default="dates")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=128, help="per process")
    p.add_argument("--n-train", type=int, default=30_000)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-ff", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--smoothing", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--lr-factor", type=float, default=0.5)
    p.add_argument("--cooldown", type=int, default=None, help="steps of linear cool-down (default: steps * 3 // 8)")
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch threads per process")
    p.add_argument("--out", type=Path, default=None, help="folder for the weights and loss history")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    distributed = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")  # reads MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE set by torchrun
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1

    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    task = _task(args.task, args.n_train, args.seed)
    vocab = task.vocab
    config = TransformerConfig(src_vocab=len(vocab), tgt_vocab=len(vocab), d_model=args.d_model, n_heads=args.heads,
                               d_ff=args.d_ff, n_layers=args.layers, dropout=args.dropout, max_len=64)
    model = EncoderDecoder(config)
    if args.out is not None and rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), args.out / "initial.pt")

    dataset = PairDataset(task.train, vocab)
    if distributed:
        # Each rank reads its own 1/world of every epoch; the shuffle depends on (seed, epoch) only.
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
        loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, collate_fn=dataset.collate)
    else:
        loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, collate_fn=dataset.collate,
                            generator=torch.Generator().manual_seed(args.seed))
    net = DistributedDataParallel(model) if distributed else model

    optimizer = torch.optim.Adam(net.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    cooldown = args.steps * 3 // 8 if args.cooldown is None else args.cooldown
    scheduler = noam_scheduler(optimizer, args.d_model, args.warmup, args.lr_factor, args.steps, cooldown)
    loss_fn = LabelSmoothingLoss(len(vocab), vocab.pad_id, args.smoothing)
    history = train(net, loader, optimizer, loss_fn, steps=args.steps, scheduler=scheduler, bos_id=vocab.bos_id,
                    pad_id=vocab.pad_id, max_grad_norm=args.max_grad_norm, progress=not args.no_progress,
                    desc=f"{args.task} x{world}")

    if args.out is not None:
        if distributed:
            dist.barrier()  # rank 0 created the folder
        torch.save(model.state_dict(), args.out / f"rank{rank}.pt")
        (args.out / f"history_rank{rank}.json").write_text(json.dumps(history))
    if rank == 0:
        print(f"{args.task}: {args.steps} steps on {world} process(es), loss {history[0]:.3f} -> {history[-1]:.3f}, "
              f"held-out exact match {exact_match(model, task, max_new_tokens=task.max_tgt_len + 2):.1%}")
    if distributed:
        dist.destroy_process_group()
    return history


if __name__ == "__main__":
    main()
