"""transformer_lib.training: the label-smoothed loss held against torch's cross_entropy, the
warm-up schedule against eq. 3, teacher forcing's shift and causality, the training loop, and
the same loop data-parallel under torchrun (two CPU processes, gloo) ending with equal weights."""

import math
import os
import socket
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from transformer_lib.datasets import make_loader, sequence_task
from transformer_lib.layers import EncoderDecoder, TransformerConfig
from transformer_lib.training import (LabelSmoothingLoss, label_smoothed_targets, make_teacher_forcing_batch,
                                      noam_lambda, noam_rate, noam_scheduler, prepare_batch, shift_right, train)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _logits_and_targets(batch=4, seq=6, vocab=9, pad=0, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, seq, vocab, generator=g, dtype=torch.float64) * 2
    target = torch.randint(0, vocab, (batch, seq), generator=g)
    target[0, -2:] = pad  # some padding, and at least one real token per row
    target[:, 0] = torch.where(target[:, 0] == pad, (pad + 1) % vocab, target[:, 0])
    return logits, target


# ---------------------------------------------------------------- the smoothed targets


@pytest.mark.parametrize("pad", [0, 3])
@pytest.mark.parametrize("eps", [0.0, 0.1, 0.4])
def test_smoothed_targets_are_distributions(pad, eps):
    _, target = _logits_and_targets(pad=pad)
    vocab = 9
    q = label_smoothed_targets(target, vocab, eps, pad)  # [batch, seq, V]
    real = target != pad
    assert q.shape == (*target.shape, vocab)
    torch.testing.assert_close(q.sum(-1)[real], torch.ones(int(real.sum())))
    assert (q[~real] == 0).all(), "pad rows carry no target"
    assert (q[..., pad] == 0).all(), "<pad> is never a target"
    gold = q.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(gold[real], torch.full((int(real.sum()),), 1 - eps))
    others = real.unsqueeze(-1) & (q > 0) & (q < 1 - eps - 1e-6)
    assert torch.allclose(q[others], torch.tensor(eps / (vocab - 2)))


def test_smoothed_targets_refuse_bad_input():
    with pytest.raises(TypeError, match="integer"):
        label_smoothed_targets(torch.zeros(3), 5, 0.1, 0)
    with pytest.raises(ValueError, match="smoothing"):
        label_smoothed_targets(torch.zeros(3, dtype=torch.long), 5, 1.0, 0)
    with pytest.raises(ValueError, match="vocab_size >= 3"):
        label_smoothed_targets(torch.zeros(3, dtype=torch.long), 2, 0.1, 0)
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        label_smoothed_targets(torch.tensor([1, 5]), 5, 0.1, 0)


# ---------------------------------------------------------------- the loss against torch


@pytest.mark.parametrize("pad", [0, 4])
def test_without_smoothing_the_loss_is_torch_cross_entropy_ignoring_pad(pad):
    logits, target = _logits_and_targets(pad=pad)
    loss = LabelSmoothingLoss(9, pad, 0.0)(logits.log_softmax(-1), target)
    expected = F.cross_entropy(logits.reshape(-1, 9), target.reshape(-1), ignore_index=pad)
    torch.testing.assert_close(loss, expected)


@pytest.mark.parametrize("eps", [0.1, 0.3])
@pytest.mark.parametrize("pad", [0, 4])
def test_with_smoothing_it_is_torch_label_smoothing_over_the_non_pad_classes(eps, pad):
    """torch's label_smoothing=e spreads e / V over all V classes; ours spreads eps over the
    V - 2 classes that are neither gold nor <pad>. Over the V - 1 non-pad classes the two
    agree when e = eps * (V - 1) / (V - 2), and when the model gives <pad> no probability."""
    vocab = 9
    logits, target = _logits_and_targets(pad=pad)
    logits[..., pad] = -1e4  # probability exp(-1e4) = 0: <pad> is out of the picture
    loss = LabelSmoothingLoss(vocab, pad, eps)(logits.log_softmax(-1), target)

    keep = [v for v in range(vocab) if v != pad]
    remapped = torch.where(target == pad, -100, target - (target > pad).long())  # ids over the V - 1 classes
    expected = F.cross_entropy(logits[..., keep].reshape(-1, vocab - 1), remapped.reshape(-1), ignore_index=-100,
                               label_smoothing=eps * (vocab - 1) / (vocab - 2))
    torch.testing.assert_close(loss, expected)


def test_loss_is_kl_divergence_plus_the_targets_entropy():
    vocab, pad, eps = 9, 0, 0.2
    logits, target = _logits_and_targets(pad=pad)
    log_probs = logits.log_softmax(-1)
    criterion = LabelSmoothingLoss(vocab, pad, eps)
    q = label_smoothed_targets(target, vocab, eps, pad, dtype=torch.float64)
    n_tokens = (target != pad).sum()
    kl = F.kl_div(log_probs, q, reduction="sum") / n_tokens  # the Annotated Transformer's quantity, per token
    torch.testing.assert_close(criterion(log_probs, target), kl + criterion.min_loss())


def test_min_loss_is_reached_when_the_model_predicts_the_smoothed_target():
    vocab, pad, eps = 7, 0, 0.1
    target = torch.tensor([[1, 2, 3, 0]])
    q = label_smoothed_targets(target, vocab, eps, pad, dtype=torch.float64)
    log_probs = torch.where(q > 0, q.log(), torch.tensor(-math.inf, dtype=torch.float64))  # log 0 = -inf for <pad>
    criterion = LabelSmoothingLoss(vocab, pad, eps)
    assert math.isfinite(criterion(log_probs[:, :3], target[:, :3]).item())
    assert abs(criterion(log_probs[:, :3], target[:, :3]).item() - criterion.min_loss()) < 1e-12
    assert LabelSmoothingLoss(vocab, pad, 0.0).min_loss() == 0.0


def test_pad_targets_contribute_nothing():
    vocab, pad = 9, 0
    logits, target = _logits_and_targets(pad=pad)
    criterion = LabelSmoothingLoss(vocab, pad, 0.1)
    base = criterion(logits.log_softmax(-1), target)
    # Any prediction at a padded position: the loss does not move.
    scrambled = logits.clone()
    scrambled[target == pad] = torch.randn_like(scrambled[target == pad]) * 10
    torch.testing.assert_close(criterion(scrambled.log_softmax(-1), target), base)
    # More padding columns: the mean over real tokens does not move either.
    longer_logits = torch.cat([logits, torch.randn(4, 3, vocab, dtype=torch.float64)], dim=1)
    longer_target = torch.cat([target, torch.full((4, 3), pad)], dim=1)
    torch.testing.assert_close(criterion(longer_logits.log_softmax(-1), longer_target), base)
    # And their gradient is exactly zero.
    lp = logits.log_softmax(-1).requires_grad_(True)
    criterion(lp, target).backward()
    assert (lp.grad[target == pad] == 0).all()


def test_loss_refuses_mismatched_shapes():
    criterion = LabelSmoothingLoss(9, 0, 0.1)
    with pytest.raises(ValueError, match="vocab_size=9"):
        criterion(torch.zeros(2, 3, 8), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="target"):
        criterion(torch.zeros(2, 3, 9), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="padding_idx"):
        LabelSmoothingLoss(9, 9, 0.1)


# ---------------------------------------------------------------- the warm-up schedule


def test_noam_rate_is_equation_3():
    for step in [1, 7, 100, 3999, 4000, 4001, 50_000]:
        expected = 512 ** -0.5 * min(step ** -0.5, step * 4000 ** -1.5)
        assert noam_rate(step, 512, 4000) == pytest.approx(expected, rel=1e-12)
    assert noam_rate(10, 512, 4000, factor=2.0) == pytest.approx(2 * noam_rate(10, 512, 4000))


def test_noam_rate_rises_linearly_peaks_at_warmup_then_decays_as_inverse_sqrt():
    d, w = 64, 100
    rates = [noam_rate(s, d, w) for s in range(1, 1001)]
    assert max(range(1000), key=rates.__getitem__) + 1 == w
    assert rates[w - 1] == pytest.approx((d * w) ** -0.5)
    assert noam_rate(40, d, w) == pytest.approx(2 * noam_rate(20, d, w))  # linear
    assert noam_rate(800, d, w) == pytest.approx(noam_rate(200, d, w) / 2)  # 1 / sqrt(step)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_noam_rate_counts_steps_from_one(bad):
    with pytest.raises(ValueError, match="from 1"):
        noam_rate(bad, 512, 4000)


def test_scheduler_sets_the_optimizer_to_the_schedule():
    p = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([p], lr=1.0)
    scheduler = noam_scheduler(optimizer, 64, 10, factor=0.5)
    for step in range(1, 30):
        # The rate used by the step-th optimizer step is eq. 3 at that step.
        assert optimizer.param_groups[0]["lr"] == pytest.approx(0.5 * noam_rate(step, 64, 10))
        optimizer.step()
        scheduler.step()
    with pytest.raises(ValueError, match="lr=1.0"):
        noam_scheduler(torch.optim.SGD([p], lr=0.1), 64, 10)


def test_cooldown_goes_linearly_to_zero_at_the_last_step():
    rate = noam_lambda(64, 10, total_steps=100, cooldown=20)
    assert [rate(s) for s in (0, 50, 79)] == [noam_rate(s + 1, 64, 10) for s in (0, 50, 79)]
    assert rate(90) == pytest.approx(noam_rate(91, 64, 10) * 0.5)
    assert rate(99) == pytest.approx(noam_rate(100, 64, 10) / 20) and rate(100) == 0.0
    with pytest.raises(ValueError, match="total_steps"):
        noam_lambda(64, 10, cooldown=20)


# ---------------------------------------------------------------- teacher forcing


def test_shift_right_puts_bos_first_and_drops_the_last_token():
    tgt = torch.tensor([[5, 6, 7, 2], [8, 2, 0, 0]])
    assert shift_right(tgt, 1).tolist() == [[1, 5, 6, 7], [1, 8, 2, 0]]
    decoder_input, target = make_teacher_forcing_batch(tgt, bos_id=1)
    assert decoder_input.tolist() == [[1, 5, 6, 7], [1, 8, 2, 0]] and target is tgt
    # With pad_id, positions whose target is <pad> read <pad>, not the <eos> the shift moved there.
    decoder_input, _ = make_teacher_forcing_batch(tgt, bos_id=1, pad_id=0)
    assert decoder_input.tolist() == [[1, 5, 6, 7], [1, 8, 0, 0]]
    with pytest.raises(ValueError, match=r"\[batch, seq\]"):
        shift_right(torch.tensor([5, 6]), 1)


def test_prepared_batch_masks():
    src = torch.tensor([[4, 5, 6], [7, 0, 0]])
    tgt = torch.tensor([[5, 6, 2], [8, 2, 0]])
    b = prepare_batch(src, tgt, bos_id=1, pad_id=0)
    assert b.src_mask.shape == (2, 1, 1, 3) and b.src_mask[1, 0, 0].tolist() == [True, False, False]
    assert b.tgt_mask.shape == (2, 1, 3, 3)
    assert b.tgt_mask[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert b.n_tokens == 5


def test_teacher_forcing_output_at_t_ignores_targets_from_t_on():
    """Causality: the log-probabilities predicting y_t may depend on y_1..y_{t-1} only."""
    torch.manual_seed(0)
    model = EncoderDecoder(TransformerConfig(12, 12, d_model=16, n_heads=2, d_ff=32, n_layers=2, dropout=0.0)).eval()
    g = torch.Generator().manual_seed(1)
    src = torch.randint(3, 12, (2, 5), generator=g)
    tgt = torch.randint(3, 12, (2, 6), generator=g)
    b = prepare_batch(src, tgt, 1, 0)
    out = model(b.src, b.decoder_input, b.src_mask, b.tgt_mask)  # [2, 6, 12]
    for t in range(6):
        changed = tgt.clone()
        changed[:, t:] = torch.randint(3, 12, changed[:, t:].shape, generator=g)
        c = prepare_batch(src, changed, 1, 0)
        out2 = model(c.src, c.decoder_input, c.src_mask, c.tgt_mask)
        torch.testing.assert_close(out2[:, : t + 1], out[:, : t + 1])


# ---------------------------------------------------------------- the training loop


def _reverse_setup(n_train=512, batch_size=32):
    torch.manual_seed(0)
    task = sequence_task("reverse", n_train=n_train, n_test=20, min_len=2, max_len=5, seed=0)
    v = task.vocab
    model = EncoderDecoder(TransformerConfig(len(v), len(v), d_model=32, n_heads=2, d_ff=64, n_layers=1, dropout=0.0))
    loader = make_loader(task.train, v, batch_size, seed=0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    return model, loader, optimizer, LabelSmoothingLoss(len(v), v.pad_id, 0.1), v


def test_train_records_one_loss_per_step_and_learns():
    model, loader, optimizer, loss_fn, v = _reverse_setup()
    scheduler = noam_scheduler(optimizer, 32, warmup=10, factor=0.2)
    history = train(model, loader, optimizer, loss_fn, steps=40, scheduler=scheduler, bos_id=v.bos_id,
                    pad_id=v.pad_id, progress=False)
    assert len(history) == 40 and len(loader) == 16  # 40 steps: the loader ran 2.5 times
    assert sum(history[-5:]) / 5 < sum(history[:5]) / 5 - 1.0
    assert scheduler.last_epoch == 40


def test_train_by_epochs_and_argument_errors():
    model, loader, optimizer, loss_fn, v = _reverse_setup(n_train=96)
    history = train(model, loader, optimizer, loss_fn, epochs=2, progress=False)
    assert len(history) == 2 * len(loader) == 6
    with pytest.raises(ValueError, match="exactly one"):
        train(model, loader, optimizer, loss_fn, epochs=1, steps=3)
    with pytest.raises(ValueError, match="exactly one"):
        train(model, loader, optimizer, loss_fn)


def test_train_is_reproducible():
    runs = []
    for _ in range(2):
        model, loader, optimizer, loss_fn, v = _reverse_setup(n_train=128)
        runs.append((train(model, loader, optimizer, loss_fn, steps=6, progress=False), model.state_dict()))
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(runs[0][1][k], runs[1][1][k]) for k in runs[0][1])


# ---------------------------------------------------------------- data-parallel under torchrun


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_torchrun_two_processes_end_with_the_same_weights(tmp_path):
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={_free_port()}", "-m", "transformer_lib.training", "--task", "dates", "--steps", "4",
           "--n-train", "512", "--batch-size", "16", "--threads", "1", "--no-progress", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "on 2 process(es)" in result.stdout
    initial = torch.load(out / "initial.pt", weights_only=True)
    rank0 = torch.load(out / "rank0.pt", weights_only=True)
    rank1 = torch.load(out / "rank1.pt", weights_only=True)
    assert rank0.keys() == rank1.keys() == initial.keys()
    for name in rank0:
        # DDP averages the gradients, so every rank takes the same steps: bit-identical weights.
        assert torch.equal(rank0[name], rank1[name]), name
    assert any(not torch.equal(rank0[n], initial[n]) for n in rank0), "training did not move the weights"
    # Each rank saw its own half of the data, so their losses differ.
    h0 = (out / "history_rank0.json").read_text()
    h1 = (out / "history_rank1.json").read_text()
    assert h0 != h1
