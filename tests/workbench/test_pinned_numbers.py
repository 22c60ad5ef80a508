"""Pinned numbers: each test recomputes one quantity the workbench reports *by hand* (explicit torch
ops, numpy or plain Python loops on a tiny case) and compares it with what the workbench computes.

Each test pins a quantity where a review planted a bug that the rest of the suite let pass: the
eval losses, the answer rule, the probe split, the probed pass, the FBT training fuse mask, HD
last-stream supervision, the optimizer moments across an HD expansion, HD rotary positions, the
rollout's perturbation ratio and the FBT fusion formula.

Hand computations share only the backbone with the code under test: ``backbone`` below runs the
block stack + final norm on *explicit* stack inputs (positions 0..T-1, no cache), so the fusion,
the recurrence, the pass structure, the masks, the targets and the losses are all written here.
fp64 models are used wherever the workbench keeps the dtype, so tolerances can be ~1e-10; where the
workbench itself rounds to fp32 (eval's log-softmax, stored activations), the tolerance says why.
"""

import math

import numpy as np
import pytest
import torch

from models import expand_streams
from workbench import ActivationRecorder, CharTokenizer, build_model, run_with_pass_cache, save_model
from workbench.data.answers import is_correct
from workbench.data.splits import heldout_examples
from workbench.data.tasks import Example, TaskConfig, synthetic_examples
from workbench.data.windows import step_generator
from workbench.dynamics.feedback import rollout
from workbench.probing import study
from workbench.probing.probes import split_by_sequence, train_probe
from workbench.training import train as train_mod
from workbench.training.evaluate import evaluate_examples, plain_loss
from workbench.training.runconfig import make_run_config

F64 = torch.float64


# ---- hand computations -------------------------------------------------------------------------


def randomize_fusion(model, seed=0):
    """Replace W_U and W_G by dense random matrices (entries N(0, 1/d)): far from identity and
    from each other, so a swapped gate/value or a wrong state shows by a wide margin."""
    g = torch.Generator().manual_seed(seed)
    d = model.cfg.d_model
    with torch.no_grad():
        for lin in (model.fusion.W_U, model.fusion.W_G):
            lin.weight.copy_(torch.randn(d, d, generator=g, dtype=F64).to(lin.weight.dtype) / math.sqrt(d))
    return model


@torch.no_grad()
def fuse_by_hand(model, h_prev, e):
    """The GLU fusion of docs/concepts.md, u = (W_U h_{t-1}) * sigmoid(W_G e_t), as explicit matmuls."""
    W_U, W_G = model.fusion.W_U.weight, model.fusion.W_G.weight
    return (h_prev @ W_U.T) * torch.sigmoid(e @ W_G.T)


@torch.no_grad()
def backbone(model, u, ids):
    """Blocks + final norm on explicit stack inputs u [batch, T, d] at rotary positions 0..T-1 (no
    cache, no padding): the shared backbone every hand computation below runs on."""
    return model.run_stack(u, model.context(ids, None, None))


@torch.no_grad()
def recurrence_by_hand(model, ids, plain=1, nudge=None):
    """States h_0..h_{T-1} [T, d] of the sequential FBT recurrence on one sequence ``ids``:
    u_t = e_t for t < max(plain, 1), else u_t = fuse(h_{t-1} + nudge[t], e_t); h_t is the last row
    of the stack re-run on u_0..u_t (causal, so later inputs cannot matter)."""
    ids = torch.as_tensor(ids)
    e = model.embed.W_E[ids]
    us, hs = [], []
    for t in range(len(ids)):
        if t < max(plain, 1):
            u = e[t]
        else:
            prev = hs[-1] + (nudge[t] if nudge and t in nudge else 0)
            u = fuse_by_hand(model, prev, e[t])
        us.append(u)
        hs.append(backbone(model, torch.stack(us)[None], ids[None, : t + 1])[0, -1])
    return torch.stack(hs)


@torch.no_grad()
def jacobi_by_hand(model, ids, K):
    """K Jacobi passes on one sequence (every position after the first fused): pass 1 feeds e;
    pass k feeds u_0 = e_0, u_t = fuse(h^{k-1}_{t-1}, e_t). Returns (stack inputs, states) per pass."""
    ids = torch.as_tensor(ids)
    e = model.embed.W_E[ids]
    inputs, states = [], []
    for k in range(K):
        u = e if k == 0 else torch.cat((e[:1], fuse_by_hand(model, states[-1][:-1], e[1:])))
        inputs.append(u)
        states.append(backbone(model, u[None], ids[None])[0])
    return inputs, states


@torch.no_grad()
def nll_by_hand(h, W_E, targets):
    """-log softmax(h W_E^T)[target] per row, in fp64: logsumexp minus the target's logit."""
    logits = h.to(F64) @ W_E.to(F64).T
    return torch.logsumexp(logits, -1) - logits[torch.arange(len(targets)), torch.as_tensor(targets)]


def rel(a, b):
    """Relative difference ||a - b|| / ||b||."""
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm())


# ---- 1. eval losses ----------------------------------------------------------------------------


def test_eval_plain_loss_predicts_the_next_token():
    """Pins ``plain_loss`` = sum over sequences and t < len-1 of -log p(s[t+1] | s[:t+1]) divided by
    the number of such terms. By hand: each sequence alone (no padding) through the backbone on
    its plain embeddings, the tied readout and an explicit logsumexp. Ragged lengths and
    batch_size=2 make padding and batching part of what is pinned. plain_loss rounds the fp64
    logits to fp32 before its log-softmax: |logits| < 10 here, so each term is off by ~1e-6 at
    most (fp32 epsilon 6e-8 x 10, plus the fp32 logsumexp), below the 6e-6 that rtol 1e-6 allows
    on a loss ~ 6; the planted target (the current token) moves the loss by > 0.05."""
    model = build_model("baseline", "debug", dtype=F64, init_std=0.3)
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(4, 100, (n,), generator=g).tolist() for n in (6, 9, 3, 7, 5)]
    W_E = model.embed.W_E
    next_terms, current_terms = [], []
    for s in seqs:
        h = backbone(model, W_E[torch.tensor(s)][None], torch.tensor([s]))[0]
        next_terms.append(nll_by_hand(h[:-1], W_E, s[1:]))
        current_terms.append(nll_by_hand(h[:-1], W_E, s[:-1]))  # the planted bug's target
    hand = float(torch.cat(next_terms).mean())
    assert abs(hand - float(torch.cat(current_terms).mean())) > 0.05  # the two targets are far apart
    with torch.no_grad():
        got = plain_loss(model, seqs, batch_size=2)
    assert got == pytest.approx(hand, rel=1e-6)


def test_eval_recurrent_loss_is_the_exact_recurrence():
    """Pins eval's ``loss["recurrent"]`` for FBT: feedback at every position (u_0 = e_0, u_t =
    fuse(h_{t-1}, e_t) for t >= 1, the sequential recurrence) and the mean next-token loss over the
    whole example (prompt + completion + <eos>), pooled over examples. Also pins
    ``loss["standard"]`` = the same mean with plain embeddings. The two hand losses differ by far
    more than the tolerance, so computing "recurrent" with the standard regime fails. Tolerance:
    eval's log-softmax runs in fp32 on fp64 logits (error < 1e-6 per term at |logits| < 10)."""
    model = randomize_fusion(build_model("fbt", "debug", dtype=F64, init_std=0.3))
    tok = CharTokenizer()
    examples = synthetic_examples("modsum", 3, seed=5, cfg=TaskConfig(modsum_min_len=4, modsum_max_len=7))
    W_E = model.embed.W_E
    rec_terms, plain_terms = [], []
    for ex in examples:
        w = tok.encode(ex.prompt) + tok.encode(ex.completion) + [tok.eos_id]
        ids = torch.tensor(w)
        rec_terms.append(nll_by_hand(recurrence_by_hand(model, w)[:-1], W_E, w[1:]))
        plain_terms.append(nll_by_hand(backbone(model, W_E[ids][None], ids[None])[0, :-1], W_E, w[1:]))
    recurrent, standard = float(torch.cat(rec_terms).mean()), float(torch.cat(plain_terms).mean())
    assert abs(recurrent - standard) > 0.05
    row = evaluate_examples(model, examples, tok, fused_passes=2, batch_size=2)
    assert row["loss"]["standard"] == pytest.approx(standard, rel=1e-6)
    assert row["loss"]["recurrent"] == pytest.approx(recurrent, rel=1e-6)


def test_eval_accuracy_by_difficulty_counts_each_example_under_its_difficulty():
    """Pins ``accuracy_by_difficulty``: modsum examples of 1, 2 and 3 digits, with the answers of a
    chosen few replaced by what the model answers (its argmax after the prompt, found by hand one
    example at a time), so the right ones are known: 1 of 4 one-digit, 3 of 4 two-digit, none of
    the 4 three-digit. The overall accuracy is their pooled mean."""
    model = build_model("baseline", "debug", dtype=F64, init_std=0.3)
    tok = CharTokenizer()
    examples = []
    for digits in (1, 2, 3):
        cfg = TaskConfig(modsum_min_len=digits, modsum_max_len=digits)
        examples += synthetic_examples("modsum", 4, seed=digits, cfg=cfg)
    said = []
    for ex in examples:
        with torch.no_grad():
            said.append(tok.decode([int(model(torch.tensor([tok.encode(ex.prompt)]))[0, -1].argmax())]))
    visible = [i for i, t in enumerate(said) if t.strip()]  # a blank or special answer is never right
    planted = [i for i in visible if i < 4][:1] + [i for i in visible if 4 <= i < 8][:3]
    assert len(planted) == 4, f"too few visible answers to plant: {said}"
    for i, ex in enumerate(examples):
        ex.answer = ex.completion = said[i] if i in planted else ("#" if said[i] != "#" else "%")
    row = evaluate_examples(model, examples, tok, batch_size=5)
    assert row["n_by_difficulty"] == {"1": 4, "2": 4, "3": 4}
    want = {"1": 0.25, "2": 0.75, "3": 0.0}
    assert row["accuracy_by_difficulty"]["standard"] == want
    assert row["accuracy"]["standard"] == pytest.approx(4 / 12)


# ---- 2. the answer rule ------------------------------------------------------------------------


def _ex(task, answer):
    return Example(task, "P", answer, answer, 1)


def test_is_correct_rejects_truncated_empty_and_prefix_answers():
    """Pins the answer rule (docs/training.md): chain compares the *whole* number after ``####``;
    modsum/flipflop need the generation to start with the whole answer. Cases written out by hand:
    a truncated number (12 for 123), a longer number (1234), an empty generation and a proper
    prefix of the answer are wrong; the exact answer, with trailing text, is right."""
    chain = _ex("chain", "123")
    assert is_correct(chain, " 100+23=<<100+23=123>>123\n#### 123")
    assert is_correct(chain, "#### 123 apples")  # text after the number on its line is ignored
    assert is_correct(chain, "#### 1,23")  # commas are removed: 1,23 -> 123
    for wrong in ("#### 12", "#### 1", "#### 1234", "#### -123", "123", "", "####"):
        assert not is_correct(chain, wrong), wrong
    for task in ("modsum", "flipflop"):
        one = _ex(task, "5")
        assert is_correct(one, "5") and is_correct(one, "5\n--a1")  # whether it stops is not scored
        for wrong in ("", "4", " 5", "15"):
            assert not is_correct(one, wrong), (task, wrong)
        two = _ex(task, "12")  # the rule is generic: a proper prefix of the answer is not the answer
        assert is_correct(two, "12") and not is_correct(two, "1") and not is_correct(two, "")
    assert not is_correct(_ex("modsum", ""), "")  # an empty answer never matches


# ---- 3. the probe split ------------------------------------------------------------------------


def test_probe_split_by_sequence_stays_at_chance_on_sequence_identity():
    """Activations that identify only their sequence (a one-hot per sequence, repeated on every row
    of it) with a random label per sequence. A by-row split puts rows of every test sequence in
    training, and the probe memorises sequence -> label (near 1, checked below with a by-row
    split written by hand). Split by sequence, the bound is exact, not statistical: a test
    sequence's one-hot column is zero on every training row (StandardScaler keeps a zero-variance
    column at 0), so the L2-regularised fit's gradient in that weight is identically 0 and it stays
    at its initial 0; every other column of every test row is the same constant. So the probe gives
    all test rows one score: classification accuracy <= the test majority fraction (= ``chance``),
    regression R^2 <= 0 (a constant c gives SS_res = SS_tot + n (c - mean)^2 >= SS_tot)."""
    from sklearn.linear_model import LogisticRegression

    n_seq, per_seq = 60, 8
    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(n_seq), per_seq)
    X = np.eye(n_seq)[groups]
    y = rng.integers(0, 2, n_seq)[groups]
    tokens = rng.integers(0, 50, len(X))
    train, val, test = split_by_sequence(groups, seed=0)
    for mask in (train, val, test):  # each sequence lies wholly on one side
        assert all(mask[groups == s].all() or not mask[groups == s].any() for s in range(n_seq))
    # the leak the split prevents: a by-row split (positions 0-5 train, 6-7 test) scores ~1
    pos = np.tile(np.arange(per_seq), n_seq)
    leaky = LogisticRegression(C=10.0, max_iter=300).fit(X[pos < 6], y[pos < 6]).score(X[pos >= 6], y[pos >= 6])
    assert leaky > 0.95
    result = train_probe(X, y, groups, tokens, seed=0)
    assert result.chance < 0.9  # both classes in the test split: a leak would be visible
    assert result.accuracy <= result.chance + 1e-12, (result.accuracy, result.chance)
    y_reg = rng.normal(size=n_seq)[groups]
    r2 = train_probe(X, y_reg, groups, tokens, kind="regression", seed=0).accuracy
    assert r2 <= 1e-9, r2


# ---- 4. the probed pass ------------------------------------------------------------------------


@pytest.mark.slow
def test_probe_study_probes_the_last_of_the_K_passes(tmp_path, monkeypatch):
    """Pins which activations the probe study hands to the probe for ``recurrent`` K=3: the third
    Jacobi pass of each held-out sequence, run by hand (``jacobi_by_hand``), at the layer-0 input
    (u^3 = e_0, fuse(h^2_{t-1}, e_t)) and the carried state (h^3); for ``standard``, pass 1
    (e, h^1). Rows are every position of every sequence in order, with the sequence as group.
    Stored activations are float32 and come from a right-padded batch, after three passes and the
    final norm (which divides by the rms and so amplifies rounding): reduction order alone (thread
    count, batch shape) moves them by up to ~5e-5 on O(1) values, so atol = 2e-4, rtol = 1e-4;
    pass 2 differs from pass 3 by more than 0.05 (asserted), 250 times the tolerance."""
    model = randomize_fusion(build_model("fbt", "debug", init_std=0.3))
    run = save_model(model, tmp_path / "run")
    seen = []
    real = study.train_probe

    def spy(X, y, groups, tokens, **kwargs):
        seen.append((np.array(X), np.array(y), np.array(groups), np.array(tokens)))
        return real(X, y, groups, tokens, **kwargs)

    monkeypatch.setattr(study, "train_probe", spy)
    hooks = ["blocks.0.hook_resid_pre", "ln_final.hook_normalized"]
    data = TaskConfig(modsum_min_len=4, modsum_max_len=8)
    report = study.probe_study(run, "running_sum", hooks=hooks, passes=[3], exact=False, n_sequences=9, seed=0, data=data)
    assert [(r["prefill"], r["passes"], r["hook"]) for r in report["rows"]] == [
        ("standard", 1, hooks[0]),
        ("standard", 1, hooks[1]),
        ("recurrent", 3, hooks[0]),
        ("recurrent", 3, hooks[1]),
    ]
    assert len(seen) == 4
    tok = CharTokenizer()
    examples = heldout_examples("modsum", 9, 0, data)  # the study probes held-out problems
    per_pass = [jacobi_by_hand(model, tok.encode(ex.text), 3) for ex in examples]
    expected = {  # (prefill, hook) -> rows: pass 1 for standard, pass 3 for recurrent
        ("standard", hooks[0]): torch.cat([inputs[0] for inputs, _ in per_pass]),
        ("standard", hooks[1]): torch.cat([states[0] for _, states in per_pass]),
        ("recurrent", hooks[0]): torch.cat([inputs[2] for inputs, _ in per_pass]),
        ("recurrent", hooks[1]): torch.cat([states[2] for _, states in per_pass]),
    }
    second = torch.cat([inputs[1] for inputs, _ in per_pass])
    assert (second - expected[("recurrent", hooks[0])]).abs().max() > 0.05  # pass 2 is not pass 3
    ids = np.concatenate([tok.encode(ex.text) for ex in examples])
    groups = np.concatenate([[i] * len(ex.text) for i, ex in enumerate(examples)])
    labels = np.concatenate([ex.labels["running_sum"] for ex in examples])
    for (X, y, g, t), key in zip(seen, expected):
        np.testing.assert_array_equal(t, ids)
        np.testing.assert_array_equal(g, groups)
        np.testing.assert_array_equal(y, labels)
        torch.testing.assert_close(
            torch.from_numpy(X), expected[key].float(), rtol=1e-4, atol=2e-4, msg=lambda m, key=key: f"{key}: {m}"
        )


# ---- 5. the FBT training fuse mask -------------------------------------------------------------


def test_fbt_training_fuses_after_the_plain_prefix():
    """Pins which positions FBT training fuses: row b stays plain on its first p_b positions
    (p_b uniform on 0..floor(prefix_max * T), drawn from step_generator(seed, step, purpose=2) for
    the global batch, docs/training.md) and every later position is fused (position 0 never is: it
    has no previous state). Read from the model itself: at passes 2 and 3 ``fusion.hook_fused``
    equals the embedding exactly where unfused and differs where fused (random fusion weights
    cannot reproduce e). Two micro-batches (rows 0-1, 2-3) pin the slicing to global rows. Also
    structural, whatever the draw: the fused set of a row is a suffix [max(p, 1), T) with
    p <= prefix_max * T, which an inverted mask (fused = [1, p)) never is."""
    B, T, seed, step = 4, 16, 3, 7
    cfg = make_run_config(
        "fbt",
        "debug",
        task="modsum",
        overrides=[
            f"train.seq_len={T}",
            f"train.batch_size={B}",
            f"train.seed={seed}",
            "fbt.feedback_start=0",
            "fbt.three_pass_fraction=1",
            "fbt.state_noise=0",
        ],
    )
    strategy = train_mod.make_strategy(cfg)
    assert strategy.passes(step) == 3
    model = randomize_fusion(build_model("fbt", "debug", init_std=0.3))
    x = torch.randint(4, 100, (B, T), generator=torch.Generator().manual_seed(0))
    top = int(cfg.fbt.prefix_max * T)
    drawn = torch.randint(0, top + 1, (B,), generator=step_generator(seed, step, purpose=2)).tolist()
    for rows in (slice(0, 2), slice(2, 4)):
        with ActivationRecorder(model, ["hook_embed", "fusion.hook_fused"]) as rec:
            strategy.loss(model, x[rows], x[rows], step, rows)
        e = rec.per_pass("hook_embed")[0]  # the embedding, computed once (pass index 0)
        by_index = rec.per_pass("fusion.hook_fused")
        assert sorted(by_index) == [1, 2]  # passes 2 and 3
        fused_inputs = [by_index[1], by_index[2]]
        for u in fused_inputs:
            for b, p in zip(range(e.shape[0]), drawn[rows]):
                fused = [t for t in range(T) if not torch.equal(u[b, t], e[b, t])]
                start = T - len(fused)
                assert fused == list(range(start, T)) and start <= max(top, 1), (rows, b, fused)
                assert fused == list(range(max(p, 1), T)), (rows, b, p, fused)


# ---- 6. HD last-stream supervision -------------------------------------------------------------


def test_hd_supervise_last_is_the_last_stream_loss():
    """Pins ``hd.supervise=last``: the training loss is the mean over (row, token) of
    -log softmax(logits of the *last* stream)[next token], by hand from the model's per-stream
    logits with an explicit logsumexp in fp64; ``all`` is the mean over every stream. The two
    differ by far more than the tolerance (the streams' tables differ). The strategy's loss is
    fp32: rtol 1e-6."""
    n, B, T = 3, 2, 10
    model = build_model("hd", "debug", n_streams=n, init_std=0.3)
    x = torch.randint(4, 100, (B, T), generator=torch.Generator().manual_seed(2))
    y = torch.randint(4, 100, (B, T), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits = model(x, all_streams=True).to(F64)  # [B, T, n, V]
    per_stream = torch.logsumexp(logits, -1) - logits.gather(-1, y[:, :, None, None].expand(B, T, n, 1))[..., 0]
    last, every = float(per_stream[:, :, -1].mean()), float(per_stream.mean())
    assert abs(last - every) > 0.05
    for supervise, hand in (("last", last), ("all", every)):
        cfg = make_run_config("hd", "debug", task="modsum", overrides=[f"hd.streams={n}", f"hd.supervise={supervise}"])
        loss, info = train_mod.make_strategy(cfg).loss(model, x, y, 0, slice(0, B))
        assert float(loss.detach()) == pytest.approx(hand, rel=1e-6), supervise
        assert info["n_streams"] == n


# ---- 7. optimizer moments across an HD expansion ----------------------------------------------


def _adam_steps(model, cfg, steps=2):
    """A few AdamW steps on a random loss, so every table has its own nonzero moments."""
    opt = train_mod.make_optimizer(model, cfg)
    g = torch.Generator().manual_seed(4)
    for _ in range(steps):
        x = torch.randint(4, 100, (2, 8), generator=g)
        model(x).float().logsumexp(-1).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return opt


@pytest.mark.parametrize("arch,old_n,new_n", [("baseline", 1, 3), ("hd", 2, 5)])
def test_expansion_replicates_adam_moments_cyclically(arch, old_n, new_n):
    """Pins ``carry_optimizer``: after growing old_n -> new_n streams, table s of the new model has
    exactly the moments (exp_avg, exp_avg_sq, step) of table s mod old_n of the old one (E_{n+k} <-
    E_k, docs/training.md), and every shared parameter keeps its own. Index arithmetic written
    out per stream; old tables' moments differ from each other, so a wrong source table shows."""
    cfg = make_run_config("hd", "debug", task="modsum", overrides=[f"hd.streams={new_n}"])
    old = build_model(arch, "debug", **({"n_streams": old_n} if arch == "hd" else {})).train()
    opt = _adam_steps(old, cfg)
    new = expand_streams(old, new_n).train()
    new_opt = train_mod.carry_optimizer(old, opt, new, cfg)
    old_table = opt.state[old.embed.W_E]
    new_table = new_opt.state[new.embed.W_E]
    assert {"exp_avg", "exp_avg_sq", "step"} <= set(new_table), f"the new tables' optimizer state holds only {sorted(new_table)}"
    for key in ("exp_avg", "exp_avg_sq"):
        src = old_table[key] if old_table[key].dim() == 3 else old_table[key][None]
        assert src.shape[0] == old_n and new_table[key].shape == new.embed.W_E.shape
        if old_n > 1:
            assert (src[0] - src[1]).abs().max() > 0
        for s in range(new_n):
            assert torch.equal(new_table[key][s], src[s % old_n]), f"{key} of new table {s} is not old table {s % old_n}'s"
    assert float(new_table["step"]) == float(old_table["step"]) == 2
    old_params = dict(old.named_parameters())
    for name, p in new.named_parameters():
        if name != "embed.W_E":
            for key in ("exp_avg", "exp_avg_sq"):
                assert torch.equal(new_opt.state[p][key], opt.state[old_params[name]][key]), (name, key)


def test_training_loop_steps_an_expanded_model_with_the_replicated_moments(tmp_path, monkeypatch):
    """The same pin through the training loop (streams 2 -> 3 at step 1): the moments of the
    embedding table that AdamW holds right before the first step after the expansion must be the
    step-0 moments replicated cyclically (new table 2 <- table 0), recorded by wrapping
    ``AdamW.step``, so the loop's wiring is pinned too, not only ``carry_optimizer``."""
    snapshots = []  # (when, n_streams, {key: tensor}) for the 3-d parameter (the HD tables)
    original = torch.optim.AdamW.step

    def recording_step(self, *args, **kwargs):
        table = next(p for group in self.param_groups for p in group["params"] if p.dim() == 3)
        take = lambda: {k: v.clone() for k, v in self.state.get(table, {}).items() if k in ("exp_avg", "exp_avg_sq")}
        snapshots.append(("before", table.shape[0], take()))
        out = original(self, *args, **kwargs)
        snapshots.append(("after", table.shape[0], take()))
        return out

    monkeypatch.setattr(torch.optim.AdamW, "step", recording_step)
    cfg = make_run_config(
        "hd",
        "debug",
        task="modsum",
        overrides=[
            "hd.streams=2,3",
            "hd.expand_at=0,1",
            "train.steps=2",
            "train.batch_size=2",
            "train.seq_len=16",
            "data.n_train=40",
            "train.warmup=0",
        ],
    )
    train_mod.train(cfg, tmp_path / "run", progress=False)
    assert [(w, n) for w, n, _ in snapshots] == [("before", 2), ("after", 2), ("before", 3), ("after", 3)]
    after_step0, before_step1 = snapshots[1][2], snapshots[2][2]
    for key in ("exp_avg", "exp_avg_sq"):
        assert key in before_step1, f"AdamW met the expanded tables without {key} (it holds {sorted(before_step1)})"
        assert (after_step0[key][0] - after_step0[key][1]).abs().max() > 0
        for s in range(3):
            assert torch.equal(before_step1[key][s], after_step0[key][s % 2]), f"{key} of new table {s} is not table {s % 2}'s"


# ---- 8. HD rotary positions --------------------------------------------------------------------


def _rotate_by_hand(q, positions, base):
    """Rotary (half-split pairs (j, j + d/2), the Llama convention) at the given positions:
    q'_j = q_j cos a - q_{j+h} sin a, q'_{j+h} = q_{j+h} cos a + q_j sin a, a = pos * base^(-2j/d).
    q: [batch, pos, heads, d_head]; positions: [pos]."""
    d = q.shape[-1]
    h = d // 2
    out = torch.empty_like(q)
    for j in range(h):
        a = torch.tensor([p * base ** (-2 * j / d) for p in positions], dtype=q.dtype)[None, :, None]
        c, s = torch.cos(a), torch.sin(a)
        out[..., j] = q[..., j] * c - q[..., j + h] * s
        out[..., j + h] = q[..., j + h] * c + q[..., j] * s
    return out


def test_hd_rotary_positions_default_to_token_indices():
    """Pins HD's default rotary positions: every stream of token i sits at position i (docs:
    "Rotary positions are token indices"), both in a full forward and in a cached decoding step.
    Read twice from the model: the positions handed to its rotary module, and layer 0's queries,
    recomputed by hand from ln1's output, W_Q and an explicit rotation at [0]*n + [1]*n + ... .
    The interleaved positions (i*n + s) give queries off by a wide margin (asserted), and a model
    built with ``positions='interleaved'`` matches the hand rotation at those positions."""
    n, B, T = 3, 2, 6
    toks = torch.randint(4, 100, (B, T), generator=torch.Generator().manual_seed(6))
    token_pos = [i for i in range(T) for _ in range(n)]
    interleaved_pos = [i * n + s for i in range(T) for s in range(n)]
    names = ["blocks.0.ln1.hook_normalized", "blocks.0.attn.hook_q"]
    for mode, hand_pos in ((None, token_pos), ("interleaved", interleaved_pos)):
        model = build_model("hd", "debug", n_streams=n, dtype=F64, init_std=0.3, **({"positions": mode} if mode else {}))
        seen = []
        handle = model.rotary.register_forward_hook(lambda mod, args, out, seen=seen: seen.append(args[0].clone()))
        try:
            with torch.no_grad(), ActivationRecorder(model, names) as rec:
                model(toks)
            cache = model.make_cache()
            with torch.no_grad():
                model.prefill(toks[:, :-1], cache=cache)
                model.step(toks[:, -1:], cache=cache)
        finally:
            handle.remove()
        assert seen[0].tolist() == [hand_pos] * B
        step_pos = [T - 1] * n if mode is None else [(T - 1) * n + s for s in range(n)]
        assert seen[-1].tolist() == [step_pos] * B
        x = rec.by_step(names[0])
        q_raw = (x @ model.blocks[0].attn.W_Q.weight.T).view(B, T * n, model.cfg.n_heads, model.cfg.d_head)
        q = rec.by_step(names[1])
        err = rel(q, _rotate_by_hand(q_raw, hand_pos, model.cfg.rope_base))
        assert err < 1e-12, f"positions={mode or 'default'}: hook_q vs hand rotation, relative error {err:.3g}"
        other = interleaved_pos if mode is None else token_pos
        assert rel(q, _rotate_by_hand(q_raw, other, model.cfg.rope_base)) > 0.1


# ---- 9. the rollout's perturbation ratio ------------------------------------------------------


def test_rollout_perturbation_ratio_follows_the_perturbed_soft_trajectory():
    """Pins ``rollout``'s perturbation ratio: with the carried state fed at step t0 nudged by
    eps * d/|d| (d = the seeded normal draw the rollout documents), ratio_j = ||h'_j - h_j|| / eps
    for j >= t0, where h is the ``soft`` trajectory (plain prompt, every step fused) and h' the same
    recurrence continued from the nudged state: both run by hand with ``recurrence_by_hand``
    (teacher-forced tokens). Also pins the reported states (= h, stored as fp32) and the distance
    to the ``standard`` trajectory (plain embeddings throughout). fp64 model: rtol 1e-9; measuring
    against the standard trajectory instead gives ratios over 100 times larger (asserted)."""
    model = randomize_fusion(build_model("fbt", "debug", dtype=F64, init_std=0.3))
    prompt, forced = [5, 17, 33, 8], [40, 41, 42, 43, 44, 45]
    P, H, t0, eps, seed = len(prompt), len(forced), 2, 1e-3, 3
    ids = torch.tensor(prompt + forced)
    soft = recurrence_by_hand(model, ids, plain=P)
    d = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(seed), dtype=torch.float32).to(F64)
    nudged = recurrence_by_hand(model, ids, plain=P, nudge={P + t0: eps * d / d.norm()})
    standard = backbone(model, model.embed.W_E[ids][None], ids[None])[0]
    steps = range(P, P + H)  # step j's new state sits at position P + j
    ratio = torch.tensor([float((nudged[t] - soft[t]).norm()) / eps for t in steps[t0:]], dtype=F64)
    wrong = torch.tensor([float((nudged[t] - standard[t]).norm()) / eps for t in steps[t0:]], dtype=F64)
    assert (wrong / ratio).min() > 100
    r = rollout(model, prompt, H, tokens=forced, perturb_at=t0, eps=eps, seed=seed)
    assert r.tokens == forced
    torch.testing.assert_close(r.states, soft[P:].float(), rtol=1e-6, atol=1e-6)
    standard_distance = torch.tensor([float((soft[t] - standard[t]).norm()) for t in steps], dtype=F64)
    torch.testing.assert_close(r.standard_distance, standard_distance, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(r.perturbation_ratio, ratio, rtol=1e-9, atol=1e-12)


# ---- 10. the FBT fusion formula ----------------------------------------------------------------


def test_fusion_hook_is_the_glu_of_state_and_token():
    """Pins ``fusion.hook_fused`` (docs/concepts.md): u_t = (W_U h_{t-1}) * sigmoid(W_G e_t), and
    u_0 = e_0 where there is no previous state. By hand in a 2-pass forward (h = pass 1's states,
    from the backbone on plain embeddings) and in a cached ``soft`` step (h = the prompt's last
    state). Dense random W_U, W_G (not near identity): the swapped form, the token as value and the
    state as gate, is off by a wide margin (asserted), and a gate from the state too. fp64: 1e-12."""
    model = randomize_fusion(build_model("fbt", "debug", dtype=F64, init_std=0.5))
    B, T = 2, 7
    toks = torch.randint(4, 100, (B, T), generator=torch.Generator().manual_seed(8))
    e = model.embed.W_E[toks]
    h1 = backbone(model, e, toks)
    with torch.no_grad():
        _, cache = run_with_pass_cache(model, toks, ["fusion.hook_fused"], passes=2)
    assert set(cache["fusion.hook_fused"]) == {1}  # fires in pass 2 (index 1) only
    u = cache["fusion.hook_fused"][1]
    assert u.shape == (B, T, model.cfg.d_model)
    hand = fuse_by_hand(model, h1[:, :-1], e[:, 1:])
    err = rel(u[:, 1:], hand)
    assert err < 1e-12, f"hook_fused vs (W_U h_(t-1)) * sigmoid(W_G e_t): relative error {err:.3g}"
    assert torch.equal(u[:, 0], e[:, 0]), "hook_fused at position 0 (no previous state) is not e_0"
    W_U, W_G = model.fusion.W_U.weight, model.fusion.W_G.weight
    swapped = (e[:, 1:] @ W_U.T) * torch.sigmoid(h1[:, :-1] @ W_G.T)
    state_gate = (h1[:, :-1] @ W_U.T) * torch.sigmoid(h1[:, :-1] @ W_G.T)
    assert rel(u[:, 1:], swapped) > 0.5 and rel(u[:, 1:], state_gate) > 0.2
    # a cached soft step: the new token fused with the prompt's last carried state
    kv = model.make_cache()
    nxt = torch.tensor([[50], [51]])
    with torch.no_grad():
        h = model.prefill(toks, regime="soft", cache=kv)
        with ActivationRecorder(model, ["fusion.hook_fused"]) as rec:
            model.step(nxt, regime="soft", cache=kv)
    stepped = rec.calls("fusion.hook_fused")[-1].value[:, 0]
    err = rel(stepped, fuse_by_hand(model, h[:, -1], model.embed.W_E[nxt[:, 0]]))
    assert err < 1e-12, f"cached soft step: hook_fused vs hand GLU, relative error {err:.3g}"
