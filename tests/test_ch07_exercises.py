"""The library functions behind chapter 07's new exercises, and the checkers' own machinery.

`label_smoothed_loss` against the loss module and against padding; `train_step` against a
step written out by hand (and the clipping it promises); the training loop running the
learner's step and shift; greedy decoding with the cache against decoding without it, with
the encoder run once; the tiny models the checkers build, and their counts; beam search written
another way, and two of its mistakes made at once.
"""

import pytest
import torch

from transformer_lib import training
from transformer_lib.checks.ch07 import (TinyModel, TrainingRun, _invoke_decode, _invoke_train_step, _training_setup,
                                         check_greedy_decode, check_train_step)
from transformer_lib.decoding import greedy_decode
from transformer_lib.layers import EncoderDecoder, TransformerConfig
from transformer_lib.masks import causal_mask, padding_mask
from transformer_lib.training import (LabelSmoothingLoss, label_smoothed_loss, make_teacher_forcing_batch, noam_lambda,
                                      noam_rate, noam_scheduler, prepare_batch, train, train_step)

VOCAB, PAD, BOS, EOS = 11, 0, 1, 2


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _model(seed=0, layers=2) -> EncoderDecoder:
    torch.manual_seed(seed)
    config = TransformerConfig(src_vocab=VOCAB, tgt_vocab=VOCAB, d_model=16, n_heads=2, d_ff=32, n_layers=layers,
                               dropout=0.0, max_len=32)
    return EncoderDecoder(config).double()


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, VOCAB, (3, 7), generator=g)  # [3, 7]
    src[1, 5:] = PAD
    tgt = torch.randint(3, VOCAB, (3, 5), generator=g)  # [3, 5]
    tgt[0, 4], tgt[1, 2], tgt[2, 3] = EOS, EOS, EOS
    tgt[1, 3:], tgt[2, 4:] = PAD, PAD
    return src, tgt


# ---------------------------------------------------------------- the loss over real tokens


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_label_smoothed_loss_is_the_loss_module(eps):
    g = torch.Generator().manual_seed(1)
    log_probs = torch.log_softmax(torch.randn(3, 5, VOCAB, generator=g, dtype=torch.float64), -1)
    _, target = _batch()
    module = LabelSmoothingLoss(VOCAB, PAD, eps)(log_probs, target)
    assert torch.allclose(label_smoothed_loss(log_probs, target, eps, PAD), module)
    assert label_smoothed_loss(log_probs, target, eps, PAD).dim() == 0


def test_label_smoothed_loss_does_not_change_with_more_padding():
    g = torch.Generator().manual_seed(2)
    log_probs = torch.log_softmax(torch.randn(3, 5, VOCAB, generator=g), -1)  # [3, 5, V]
    _, target = _batch()
    longer_log_probs = torch.cat([log_probs, torch.log_softmax(torch.randn(3, 4, VOCAB, generator=g), -1)], dim=1)
    longer_target = torch.cat([target, torch.full((3, 4), PAD)], dim=1)  # four more padded positions
    assert torch.allclose(label_smoothed_loss(log_probs, target, 0.1, PAD),
                          label_smoothed_loss(longer_log_probs, longer_target, 0.1, PAD))


# ---------------------------------------------------------------- one training step


def test_train_step_matches_a_step_written_out_by_hand():
    ours, theirs = _model(), _model()
    loss_fn = LabelSmoothingLoss(VOCAB, PAD, 0.1)
    setups = []
    for m in (ours, theirs):
        opt = torch.optim.Adam(m.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
        setups.append((opt, noam_scheduler(opt, 16, warmup=3, factor=1.0)))
    for seed in range(3):
        b = prepare_batch(*_batch(seed), BOS, PAD)
        loss = train_step(ours, b, loss_fn, *setups[0], max_grad_norm=0.5)

        opt, sched = setups[1]
        opt.zero_grad()
        expected = loss_fn(theirs(b.src, b.decoder_input, b.src_mask, b.tgt_mask), b.target)
        expected.backward()
        torch.nn.utils.clip_grad_norm_(theirs.parameters(), 0.5)
        opt.step()
        sched.step()
        assert isinstance(loss, float) and loss == pytest.approx(expected.item(), rel=1e-12)
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
        assert torch.equal(p, q), name
    assert setups[0][0].param_groups[0]["lr"] == setups[1][0].param_groups[0]["lr"]


def test_train_step_clips_the_gradient_before_the_update():
    # Plain SGD with lr 1: the update is minus the (clipped) gradient, so its norm is max_norm.
    model = _model()
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    train_step(model, prepare_batch(*_batch(), BOS, PAD), LabelSmoothingLoss(VOCAB, PAD, 0.1), opt, sched, 1e-3)
    update = torch.cat([(p.detach() - b).flatten() for p, b in zip(model.parameters(), before)])
    assert update.norm().item() == pytest.approx(1e-3, rel=1e-4)


def test_train_runs_the_given_step_and_teacher_forcing_functions():
    src, tgt = _batch()
    loader = [(src, tgt)] * 3
    calls = {"step": 0, "shift": 0}

    def step(*args):
        calls["step"] += 1
        return train_step(*args)

    def shift(t, bos_id):
        calls["shift"] += 1
        return make_teacher_forcing_batch(t, bos_id)  # without the <pad> fill: prepare_batch adds it

    runs = []
    for kwargs in [{}, {"step_fn": step, "teacher_forcing": shift}]:
        model = _model()
        opt = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
        sched = noam_scheduler(opt, 16, warmup=2, factor=1.0)
        history = train(model, loader, opt, LabelSmoothingLoss(VOCAB, PAD, 0.1), steps=5, scheduler=sched,
                        bos_id=BOS, pad_id=PAD, max_grad_norm=1.0, progress=False, **kwargs)
        runs.append((history, model.state_dict()))
    assert calls == {"step": 5, "shift": 5}
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(runs[0][1][k], runs[1][1][k]) for k in runs[0][1])


def test_prepare_batch_with_a_teacher_forcing_function_equals_the_default():
    src, tgt = _batch()
    default = prepare_batch(src, tgt, BOS, PAD)
    given = prepare_batch(src, tgt, BOS, PAD, teacher_forcing=lambda t, b: make_teacher_forcing_batch(t, b))
    for field in ["src", "src_mask", "decoder_input", "target", "tgt_mask"]:
        assert torch.equal(getattr(default, field), getattr(given, field)), field


def test_noam_lambda_takes_the_learners_rate_function():
    def eq3(step, d_model, warmup):
        return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)

    ours = noam_lambda(64, 10, factor=0.5, total_steps=50, cooldown=20, rate_fn=eq3)
    library = noam_lambda(64, 10, factor=0.5, total_steps=50, cooldown=20)
    assert all(ours(s) == pytest.approx(library(s), rel=1e-12) for s in range(50))
    assert ours(9) == pytest.approx(0.5 * noam_rate(10, 64, 10))


def test_training_loop_uses_tqdm_auto():
    import tqdm.auto

    assert training.tqdm is tqdm.auto.tqdm


# ---------------------------------------------------------------- greedy decoding with the cache


class _Counts:
    def __init__(self, model):
        self.encoder = self.decoder = self.positions = 0
        self.hooks = [model.encoder.register_forward_hook(self._enc),
                      model.decoder.register_forward_pre_hook(self._dec)]

    def _enc(self, *_):
        self.encoder += 1

    def _dec(self, module, args):
        self.decoder += 1
        self.positions += args[0].shape[1]


@pytest.mark.parametrize("eos", [3, 5, 8])
def test_greedy_with_cache_equals_without_and_runs_the_encoder_once(eos):
    model = _model(seed=3).eval()
    src, _ = _batch(4)
    mask = padding_mask(src, PAD)
    counts = _Counts(model)
    cached = greedy_decode(model, src, mask, 9, BOS, eos, use_cache=True)
    steps = cached.shape[1] - 1
    assert (counts.encoder, counts.decoder, counts.positions) == (1, steps, steps)
    uncached = greedy_decode(model, src, mask, 9, BOS, eos, use_cache=False)
    assert torch.equal(cached, uncached)
    assert counts.positions - steps == steps * (steps + 1) // 2  # without the cache: the whole prefix each step


def test_greedy_equals_a_loop_that_calls_the_full_model():
    model = _model(seed=5).eval()
    src, _ = _batch(6)
    mask = padding_mask(src, PAD)
    tokens = torch.full((3, 1), BOS)
    with torch.no_grad():
        for _ in range(6):
            log_probs = model(src, tokens, mask, causal_mask(tokens.shape[1]))  # [3, t, V]
            tokens = torch.cat([tokens, log_probs[:, -1].argmax(-1, keepdim=True)], dim=1)
    out = greedy_decode(model, src, mask, 6, BOS, eos_id=-1)  # an id never produced: all 6 steps
    assert torch.equal(out, tokens)


# ---------------------------------------------------------------- the checkers' tiny models


def test_tiny_models_are_seeded_and_leave_the_global_rng_alone():
    torch.manual_seed(0)
    first = torch.rand(3)
    torch.manual_seed(0)
    a, b = TinyModel(7).build(), TinyModel(7).build()
    assert torch.equal(torch.rand(3), first)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert next(a.parameters()).dtype == torch.float64


def test_decode_checker_counts_the_work_of_the_reference():
    for case in check_greedy_decode.cases(hidden=True):
        tokens, counts = _invoke_decode(greedy_decode, case)
        steps = tokens.shape[1] - 1
        assert counts == {"encoder runs": 1, "decoder runs": steps, "positions fed to the decoder": steps}


def test_train_step_checker_runs_two_real_steps():
    run = TrainingRun(TinyModel(1))
    out = _invoke_train_step(train_step, check_train_step.cases()[0])
    initial = dict(run.model.build().named_parameters())
    assert set(out["parameters after step 1"]) == set(initial)  # every parameter is compared, by name
    for name, value in out["parameters after step 1"].items():
        if name.endswith("w_k.bias"):
            # A key bias adds the same q . b to every score of a query's row, and softmax ignores a
            # constant shift: its gradient is zero, and the reference leaves it where it started.
            assert torch.equal(value, initial[name].detach()), name
        else:
            assert not torch.equal(value, initial[name].detach()), f"{name} did not move"
    assert out["loss of step 1"] != out["loss of step 2"]
    # The step's learning rate after two scheduler steps: LambdaLR at step 2 of the schedule.
    _, _, scheduler, _ = _training_setup(run)
    assert out["learning rate after step 2"] == pytest.approx(scheduler.lr_lambdas[0](2))


def _step_without_the_encoders_update(model, batch, loss_fn, optimizer, scheduler, max_norm):
    """Right loss, right clipping, right order, but the encoder's gradients are dropped before the update."""
    optimizer.zero_grad()
    loss = loss_fn(model(batch.src, batch.decoder_input, batch.src_mask, batch.tgt_mask), batch.target)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    for p in model.encoder.parameters():
        p.grad = None  # optimizer.step() skips a parameter without a gradient
    optimizer.step()
    scheduler.step()
    return loss.item()


@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
def test_train_step_checker_rejects_a_step_that_updates_only_some_parameters(hidden):
    outputs = check_train_step.collect_outputs(_step_without_the_encoders_update, hidden)
    expected = check_train_step.collect_outputs(train_step, hidden)
    # After the first step only the encoder's tensors differ from the reference's: the decoder and the
    # generator got exactly the reference's update, so only a comparison of every tensor sees the fault.
    ours, reference = outputs[0]["parameters after step 1"], expected[0]["parameters after step 1"]
    differ = {name for name in reference if not torch.equal(ours[name], reference[name])}
    assert differ and all(name.startswith("encoder.") for name in differ), differ
    verdict = check_train_step.judge(outputs, hidden)
    assert not verdict.passed
    assert verdict.mistake == "some parameters that never changed, where the reference's step changes them"
    assert "Every weight of the model must take part in the update" in verdict.message


def test_train_step_checker_names_an_encoder_run_without_gradients():
    from transformer_lib.checks.ch07 import _step_encoder_without_gradients

    verdict = check_train_step.judge(check_train_step.collect_outputs(_step_encoder_without_gradients))
    assert not verdict.passed
    assert verdict.mistake.startswith("the encoder never learns"), verdict.message


# ---------------------------------------------------------------- sampling with the learner's top-k filter


def test_sample_next_token_uses_the_given_filter_only_where_the_exercise_defines_it():
    from transformer_lib.decoding import sample_next_token, top_k_filter

    calls = []

    def learners_filter(logits, k):
        calls.append(k)
        return top_k_filter(logits, k)

    logits = torch.tensor([[2.0, 1.5, 0.5, -0.5, -1.0]]).repeat(200, 1)  # [200, 5]
    for top_k in [None, 2, 5, 7]:
        ours = sample_next_token(logits, 0.7, top_k, torch.Generator().manual_seed(4), filter_fn=learners_filter)
        library = sample_next_token(logits, 0.7, top_k, torch.Generator().manual_seed(4))
        assert torch.equal(ours, library)
    assert calls == [2]  # k = None, and k >= vocab, need no filter: 1 <= k < vocab is the exercise's range

    def keeps_everything(logits, k):
        return logits

    draws = sample_next_token(logits, 1.0, 2, torch.Generator().manual_seed(0), filter_fn=keeps_everything)
    assert (draws >= 2).any()  # the given filter, not the library's, decided which tokens could come up


# ---------------------------------------------------------------- beam search: the learner's exercise


def _beam_by_hand(model, src, src_mask, max_len, bos_id, eos_id, beam_size=4, length_penalty=0.6):
    """A right answer written another way: torch.div and torch.remainder for the parents, index_put for the finished rows,
    Python loops for the final choice, and the whole token tensor returned (padding after eos)."""
    from transformer_lib.decoding import reorder_cache

    batch, k = src.shape[0], beam_size
    memory = model.encode(src, src_mask).repeat_interleave(k, 0)  # [batch * k, S, d_model]
    mask = src_mask.repeat_interleave(k, 0)
    cache = model.new_cache()
    seqs = torch.full((batch * k, 1), bos_id)
    score = torch.tensor([[0.0] + [float("-inf")] * (k - 1)] * batch, dtype=torch.float64)  # [batch, k]
    done = torch.zeros(batch * k, dtype=torch.bool)
    for _ in range(max_len):
        lp = model.generator(model.decode(memory, mask, seqs[:, -1:], cache=cache))[:, -1].clone()  # [batch*k, V]
        lp[done] = float("-inf")
        lp[done, eos_id] = 0.0
        vocab = lp.shape[-1]
        flat = (score.unsqueeze(-1) + lp.view(batch, k, vocab)).flatten(1)  # [batch, k * V]
        score, idx = flat.topk(k, dim=1)
        parent, tok = torch.div(idx, vocab, rounding_mode="floor"), torch.remainder(idx, vocab)
        rows = (parent + k * torch.arange(batch).unsqueeze(1)).flatten()
        seqs = torch.cat([seqs.index_select(0, rows), tok.reshape(-1, 1)], 1)
        reorder_cache(cache, rows)
        done = done[rows] | (tok.flatten() == eos_id)
        if done.all():
            break
    best = []
    for b in range(batch):
        ranked = []
        for j in range(k):
            row = seqs[b * k + j]
            ends = (row[1:] == eos_id).nonzero()
            length = int(ends[0]) + 1 if len(ends) else len(row) - 1
            ranked.append((score[b, j].item() / ((5 + length) / 6) ** length_penalty, b * k + j))
        best.append(max(ranked)[1])
    return seqs[best]


def _beam_cache_not_reordered_and_no_penalty(model, src, src_mask, max_len, bos_id, eos_id, beam_size=4,
                                             length_penalty=0.6):
    from transformer_lib.checks.ch07 import _beam_variant
    return _beam_variant(model, src, src_mask, max_len, bos_id, eos_id, beam_size, length_penalty,
                         reorder_kv=False, normalise=False)


def _beam_per_beam_and_probabilities(model, src, src_mask, max_len, bos_id, eos_id, beam_size=4,
                                     length_penalty=0.6):
    from transformer_lib.checks.ch07 import _beam_variant
    return _beam_variant(model, src, src_mask, max_len, bos_id, eos_id, beam_size, length_penalty,
                         per_beam=True, step_score=torch.exp)


def _beam_tokens_not_reordered_and_finished_extended(model, src, src_mask, max_len, bos_id, eos_id, beam_size=4,
                                                     length_penalty=0.6):
    from transformer_lib.checks.ch07 import _beam_variant
    return _beam_variant(model, src, src_mask, max_len, bos_id, eos_id, beam_size, length_penalty,
                         reorder_tokens=False, freeze_finished=False)


def _beam_without_cache(model, src, src_mask, max_len, bos_id, eos_id, beam_size=4, length_penalty=0.6):
    """Right tokens, but the whole prefix re-decoded at every step (no cache to reorder)."""
    from transformer_lib.checks.ch07 import _beam_variant

    class NoCache:
        def __init__(self, m):
            self.m = m

        def encode(self, *a):
            return self.m.encode(*a)

        def generator(self, h):
            return self.m.generator(h)

        def new_cache(self):
            return None

        def decode(self, memory, src_mask, tgt, cache=None):
            self.prefix = tgt if not hasattr(self, "prefix") else torch.cat([self.prefix[self.rows], tgt], 1)
            return self.m.decode(memory, src_mask, self.prefix, causal_mask(self.prefix.shape[1]))

    wrapped = NoCache(model)
    import transformer_lib.checks.ch07 as ch07
    original = ch07.reorder_cache
    ch07.reorder_cache = lambda cache, rows: setattr(wrapped, "rows", rows)
    try:
        return _beam_variant(wrapped, src, src_mask, max_len, bos_id, eos_id, beam_size, length_penalty)
    finally:
        ch07.reorder_cache = original


@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
def test_beam_search_written_another_way_passes(hidden):
    from transformer_lib.checks.ch07 import check_beam_search
    verdict = check_beam_search.judge(check_beam_search.collect_outputs(_beam_by_hand, hidden), hidden)
    assert verdict.passed, verdict.message


@pytest.mark.parametrize("answer,trait", [
    (_beam_cache_not_reordered_and_no_penalty, "a best output less probable than the reference's"),
    (_beam_per_beam_and_probabilities, "a best output less probable than the reference's"),
    (_beam_tokens_not_reordered_and_finished_extended, "a best output less probable than the reference's"),
    (_beam_without_cache, "more than one position fed to the decoder in one step"),
])
@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
def test_beam_search_combined_mistakes_are_named_by_property(answer, trait, hidden):
    from transformer_lib.checks.ch07 import check_beam_search
    verdict = check_beam_search.judge(check_beam_search.collect_outputs(answer, hidden), hidden)
    assert not verdict.passed
    assert "looks like" not in verdict.message, verdict.message
    assert trait in verdict.message, verdict.message


def test_beam_checker_counts_the_work_of_the_reference():
    from transformer_lib.checks.ch07 import _invoke_beam, check_beam_search
    from transformer_lib.decoding import beam_search
    for case in check_beam_search.cases(hidden=True):
        out = _invoke_beam(beam_search, case)
        assert out["encoder runs"] == 1 and out["most positions fed to the decoder at once"] == 1
        assert 1 <= out["decoder runs"] <= case.args[3]


def test_beam_checker_cases_are_ones_where_beam_search_beats_greedy():
    # With no length penalty beam search ranks by log P: on the visible cases it finds a more
    # probable output than greedy decoding for at least one sentence, so a search that never
    # leaves greedy's path cannot pass.
    from transformer_lib.checks.ch07 import _best_outputs, _sentence_log_probs, check_beam_search
    from transformer_lib.decoding import beam_search
    better = 0
    for case in check_beam_search.cases():
        tiny, src, src_mask, max_len, bos, eos = case.args
        model = tiny.build().eval()
        beam = _best_outputs(beam_search(model, src, src_mask, max_len, bos, eos, **case.kwargs), eos)
        greedy = _best_outputs(greedy_decode(model, src, src_mask, max_len, bos, eos), eos)
        better += int((_sentence_log_probs(case, beam) > _sentence_log_probs(case, greedy) + 1e-6).sum())
    assert better >= 1
