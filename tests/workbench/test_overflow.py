"""Finite overflow: an activation that overflows (RMSNorm turns an input whose square
is inf into a *finite* zero, the logits become constant and argmax emits the pad id) stops every
inference tool with one line naming the step and the site; ids that decode to nothing are counted.

``COUNTS`` is this fault class's tally, printed at the end of the session (``tests/faultkit.py``)."""

import json
import re
import shutil

import pytest
import torch
from helpers import assert_usage_error, cli, tally, tokens

from models import NonFiniteActivation, guard_numerics
from workbench import CharTokenizer, build_model, generate, load_model, save_model
from workbench.data.tasks import load_task
from workbench.dynamics.feedback import RolloutDiverged, rollout
from workbench.runtime.checkpoint import load_weights, save_weights
from workbench.runtime.decoding import score_completions
from workbench.studies.traces import problems, run_traces, summarise
from workbench.training.evaluate import evaluate_examples
from workbench.training.runconfig import make_run_config
from workbench.training.train import train

COUNTS = tally("finite overflow")
ARCHS = {"baseline": {}, "fbt": {}, "hd": {"n_streams": 2}}
SILENT = {0, 1, 2, 3, *range(100, 128)}  # the specials and the ids past the character vocabulary (d_vocab 128)


def overflowing(model, name="blocks.0.mlp.W_out.weight", value=1e30):
    """``model`` with one entry of the weight ``name`` set to ``value``."""
    with torch.no_grad():
        model.get_parameter(name).view(-1)[0] = value
    return model


# ---- the guard, on the models ------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_the_guard_changes_no_output_bit_for_bit(arch):
    model = build_model(arch, "debug", **ARCHS[arch])
    toks, mask = tokens(2, 12), torch.ones(2, 12, dtype=torch.bool)
    mask[1, :3] = False  # a left-padded row: masked attention, shifted rotary positions
    extra = {"passes": 3} if arch == "fbt" else {}

    def outputs():
        with torch.no_grad():
            cache = model.make_cache()
            cached = [model(toks[:, :8], cache=cache), *(model(toks[:, t : t + 1], cache=cache) for t in range(8, 12))]
            return [model(toks, **extra), model(toks, attention_mask=mask), *cached]

    plain = outputs()
    with guard_numerics(model) as guard:
        guarded = outputs()
    assert guard is not None and model.numerics_guard is None and model.ln_final.guard is None  # off again after
    assert all(torch.equal(a, b) for a, b in zip(plain, guarded))
    regimes = ["standard", "soft", "fused"] if arch == "fbt" else ["standard"]
    for regime in regimes:
        a, b = (
            generate(model, [[5, 6, 7, 8], [9, 10]], regime=regime, passes=2, max_new_tokens=6, check_numerics=c)
            for c in (False, True)
        )
        assert torch.equal(a.new_tokens, b.new_tokens) and torch.equal(a.states, b.states)


def test_large_but_finite_activations_are_not_reported():
    """Embeddings of 3e18: every norm's mean square is 9e36 (its sum over d_model=32, 2.9e38, still
    finite in fp32), but the sum over 5 norms x 12 positions, 5.4e38, is not. The guard confirms
    such a sum site by site, so nothing is reported and nothing changes."""
    model = build_model("baseline", "debug")
    with torch.no_grad():
        model.embed.W_E.fill_(3e18)
        plain = model(tokens(2, 6))
        with guard_numerics(model):
            guarded = model(tokens(2, 6))
    assert torch.isfinite(plain).all() and torch.equal(plain, guarded)


@pytest.mark.parametrize("arch", ARCHS)
def test_an_input_that_overflows_in_the_square_is_named_by_site_and_step(arch):
    """Token 50's embedding holds 1e30: finite, but its square is inf in fp32. Fed at the third
    cached step, the first norm it reaches is blocks.0.ln1, at step 3 (step 0 = the prefill). (FBT
    steps are plain here: a fused step reads the embedding only through the sigmoid gate.)"""
    model = build_model(arch, "debug", **ARCHS[arch])
    with torch.no_grad():
        model.embed.W_E[..., 50, 0] = 1e30
    COUNTS["faults_injected"] += 1
    pass_text, plain = (", FBT pass 1", {"fuse_mask": torch.zeros(1, 1, dtype=torch.bool)}) if arch == "fbt" else ("", {})
    with torch.no_grad(), guard_numerics(model):
        cache = model.make_cache()
        model(tokens(1, 5), cache=cache)
        model(torch.tensor([[7]]), cache=cache, **plain)
        model(torch.tensor([[8]]), cache=cache, **plain)
        with pytest.raises(
            NonFiniteActivation, match=rf"^non-finite activation: blocks\.0\.ln1 input overflowed at step 3{pass_text} "
        ) as info:
            model(torch.tensor([[50]]), cache=cache, **plain)
    assert (info.value.what, info.value.step) == ("blocks.0.ln1 input overflowed", 3) and "\n" not in str(info.value)
    with torch.no_grad():  # unguarded it is the reported symptom: a finite output with every logit equal
        logits = model(torch.tensor([[50]]))
    assert torch.isfinite(logits).all() and bool((logits == logits[..., :1]).all())


@pytest.mark.parametrize("arch", ARCHS)
def test_an_infinite_logit_is_named_as_the_readout(arch):
    model = build_model(arch, "debug", **ARCHS[arch])

    def inf_state(h, hook):  # after ln_final's check: only the readout sees it
        h = h.clone()
        h[..., 0] = float("inf")
        return h

    COUNTS["faults_injected"] += 1
    with model.hooks(fwd_hooks=[("ln_final.hook_normalized", inf_state)]):
        with pytest.raises(NonFiniteActivation, match=r"^non-finite activation: readout logits overflowed at step 0 "):
            generate(model, tokens(2, 4), max_new_tokens=3)
        with (
            pytest.raises(NonFiniteActivation, match="readout logits overflowed at step 0 "),
            torch.no_grad(),
            guard_numerics(model),
        ):
            model(tokens(2, 4))


@pytest.mark.parametrize(
    "hook,site", [("blocks.1.hook_resid_post", "ln_final input"), ("fusion.hook_state", "blocks.0.ln1 input")]
)
def test_a_nan_carried_state_in_fbt_pass_2_names_the_pass(hook, site):
    """NaN in pass 2's last residual (the stream ln_final turns into the carried state), or in the
    carried state pass 2 is fed: named with pass 2, not pass 1 or the readout."""
    model = build_model("fbt", "debug")
    nan_in_pass = lambda x, hook: x * float("nan") if model.current_pass == 1 else x  # noqa: E731
    COUNTS["faults_injected"] += 1
    with model.hooks(fwd_hooks=[(hook, nan_in_pass)]):
        with torch.no_grad():
            assert torch.isfinite(model(tokens(2, 6), passes=1)).all()  # pass 1 alone is untouched
        with pytest.raises(NonFiniteActivation, match=rf"^non-finite activation: {site} is NaN at step 0, FBT pass 2 "):
            generate(model, tokens(2, 6), regime="fused", passes=3, max_new_tokens=2)


def test_score_completions_names_the_step_that_fed_the_overflowing_token():
    model = build_model("baseline", "debug")
    with torch.no_grad():
        model.embed.W_E[50, 0] = 1e30
    COUNTS["faults_injected"] += 1
    # prompt (step 0), then the completion's tokens are fed one per step: 50 is the third
    with pytest.raises(NonFiniteActivation, match="blocks.0.ln1 input overflowed at step 3 "):
        score_completions(model, [[5, 6, 7]], [[8, 9, 50, 11]])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_rollout_names_the_step_and_the_site(dtype):
    model = overflowing(build_model("fbt", "debug", dtype=dtype), "fusion.W_U.weight", 1e30 if dtype == torch.float32 else 1e300)
    COUNTS["faults_injected"] += 1
    with pytest.raises(
        RolloutDiverged, match=r"^blocks\.0\.ln1 input overflowed at step 0 \(token \d+\): the carried state diverged$"
    ):
        rollout(model, tokens(1, 4)[0].tolist(), 10)
    model = overflowing(build_model("fbt", "debug", dtype=dtype), value=1e30 if dtype == torch.float32 else 1e300)
    COUNTS["faults_injected"] += 1
    with pytest.raises(RolloutDiverged, match=r"^blocks\.1\.ln1 input overflowed in the prompt's prefill \(before step 0\)$"):
        rollout(model, tokens(1, 4)[0].tolist(), 10)


# ---- the tools, from the command line ----------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A one-step FBT run (config.json with every section, as eval needs)."""
    run = tmp_path_factory.mktemp("trained") / "fbt"
    cfg = make_run_config(
        "fbt",
        "debug",
        "modsum",
        ["train.steps=2", "train.batch_size=4", "train.seq_len=32", "train.warmup=1", "data.n_train=50", "train.eval_examples=4"],
    )
    train(cfg, run, progress=False)
    return run


def poison(run, name="blocks.0.mlp.W_out.weight", value=1e30):
    path = run / "model.safetensors"
    tensors, meta = load_weights(path)
    tensors[name].view(-1)[0] = value
    save_weights(path, tensors, meta)  # a new file: the old one may be a hard link into train_state/
    COUNTS["faults_injected"] += 1
    return run


def test_eval_stops_naming_the_computation_step_and_site(trained, tmp_path):
    run = poison(shutil.copytree(trained, tmp_path / "run"))
    shutil.rmtree(run / "results", ignore_errors=True)
    assert_usage_error(
        ["eval", str(run), "--n", "4"],
        match=r"error: loss\[standard\]: non-finite activation: blocks\.1\.ln1 input overflowed at step 0, FBT pass 1 ",
    )
    assert not list((run / "results").glob("eval*.json"))


@pytest.mark.parametrize("arch", ARCHS)
def test_generate_stops_naming_the_regime_step_and_site(arch, tmp_path):
    run = poison(save_model(build_model(arch, "debug", **ARCHS[arch]), tmp_path / arch))
    regime = "soft" if arch == "fbt" else "standard"
    assert_usage_error(
        ["generate", str(run), "--prompt", "Q: 3+4", "--regimes", regime, "--json", str(tmp_path / "out.json")],
        match=rf"error: regime {regime}: non-finite activation: blocks\.1\.ln1 input overflowed at step 0[ ,]",
    )
    assert not (tmp_path / "out.json").exists()


def test_traces_stop_naming_the_step_and_site_and_write_no_summary(tmp_path):
    run = poison(save_model(build_model("fbt", "debug"), tmp_path / "fbt"))
    good = save_model(build_model("baseline", "debug"), tmp_path / "baseline")
    out = tmp_path / "out"
    assert_usage_error(
        [
            "traces",
            str(good),
            str(run),
            "--task",
            "chain",
            "--n",
            "2",
            "--difficulty",
            "1..1",
            "--max-new-tokens",
            "4",
            "--out",
            str(out),
            "--no-progress",
        ],
        match=r"error: regime standard: non-finite activation: blocks\.1\.ln1 input overflowed at step 0, "
        "FBT pass 1 ",
    )
    assert [p.name for p in out.iterdir()] == [".workbench.lock"]  # no summary.json, traces.csv or figure, no staging


DYNAMICS = [
    "--prompt",
    "Q: Start with 12.",
    "--horizon",
    "30",
    "--perturb-at",
    "5",
    "--spectra",
    "1",
    "--fixed-points",
    "1",
    "--starts",
    "2",
    "--fp-steps",
    "4",
    "--max-passes",
    "2",
]


def test_dynamics_checks_the_checkpoints_own_dtype_before_analysing_in_fp64(tmp_path):
    """W_U with a 1e30 entry: the first soft step overflows in fp32, while in fp64 (where the
    analyses run) the square is 1e60, finite, and the rollout would run to the end."""
    run = poison(save_model(build_model("fbt", "debug"), tmp_path / "fbt"), "fusion.W_U.weight")
    ids = CharTokenizer().encode("Q: Start with 12.")
    assert len(rollout(load_model(run).double(), ids, 30).tokens) == 30  # what fp64 alone would report
    out = tmp_path / "out"
    assert_usage_error(
        ["dynamics", str(run), *DYNAMICS, "--out", str(out)],
        match=re.escape(str(run)) + r": in the checkpoint's own dtype \(float32\): blocks\.0\.ln1 input overflowed at "
        r"step 0 \(token \d+\): the carried state diverged$",
    )
    assert not (out / "dynamics.json").exists()


def test_dynamics_names_an_overflow_in_the_prompts_prefill(tmp_path):
    run = poison(save_model(build_model("fbt", "debug"), tmp_path / "fbt"))
    out = tmp_path / "out"
    assert_usage_error(
        ["dynamics", str(run), *DYNAMICS, "--out", str(out)],
        match=r"own dtype \(float32\): blocks\.1\.ln1 input overflowed in the prompt's prefill \(before step 0\)$",
    )
    assert not (out / "dynamics.json").exists()


# ---- silent tokens: ids that decode to nothing are counted -------------------------------


def pad_emitter(arch="fbt"):
    """ln_final's weight zeroed: every state is 0, every logit 0, and greedy argmax picks id 0 (pad)
    at every step, the overflow's symptom without an overflow (so the guard has nothing to say)."""
    model = build_model(arch, "debug", **ARCHS[arch])
    with torch.no_grad():
        model.ln_final.w.zero_()
    return model


def test_the_tokenizer_names_the_ids_that_decode_to_nothing():
    assert CharTokenizer().silent_ids(128) == SILENT


def test_silent_tokens_are_counted_up_to_eos():
    model = pad_emitter("baseline")
    out = generate(model, [[5, 6, 7], [8]], max_new_tokens=7, eos_token_id=2)
    assert out.new_tokens.eq(0).all() and out.silent_counts(SILENT) == [7, 7]
    # uniform logits, sampled: count by hand the silent ids before the first eos of each row
    free = generate(model, [[5, 6, 7]], max_new_tokens=40, temperature=1.0, seed=1).new_tokens[0].tolist()
    eos = next(t for t in free[5:] if t not in SILENT)  # an id the row emits, at least 5 tokens in
    stop = free.index(eos)
    expected = len([t for t in free[:stop] if t in SILENT])
    assert expected > 0
    out = generate(model, [[5, 6, 7]], max_new_tokens=40, temperature=1.0, seed=1, eos_token_id=eos)
    assert out.completions()[0] == free[: stop + 1] and out.silent_counts(SILENT) == [expected]


def test_traces_and_eval_report_silent_tokens():
    model, tok = pad_emitter(), CharTokenizer()
    examples = problems("chain", 3, [1])
    rows = [{"model": "m", "regime": "soft", **r} for r in run_traces(model, examples, "soft", 1, tok, max_new_tokens=6)]
    assert [(r["silent_tokens"], r["total_tokens"], r["text"], r["trace_tokens"]) for r in rows] == [(6, 6, "", 0)] * 3
    group = summarise(rows, ("m", "soft"))["groups"]["m/soft"]
    assert group["silent_tokens"] == 18 and group["silent_rate"] == 1.0
    examples = load_task("modsum", 4, 0)[:4]
    row = evaluate_examples(model, examples, tok)
    prompts = [tok.encode(ex.prompt) for ex in examples]
    budget = min(max(len(tok.encode(ex.completion)) + 1 for ex in examples) + 8, model.cfg.n_ctx - max(map(len, prompts)))
    assert row["silent_tokens"] == {"standard": 4 * budget, "soft": 4 * budget, "fused": 4 * budget}
    assert row["accuracy"] == {"standard": 0.0, "soft": 0.0, "fused": 0.0}


def test_generate_warns_and_reports_silent_tokens(tmp_path):
    run = save_model(pad_emitter("hd"), tmp_path / "hd")
    code, out, err = cli(
        ["generate", str(run), "--prompt", "ab", "--prompt", "c", "--max-new-tokens", "5", "--json", str(tmp_path / "g.json")]
    )
    assert code is None and "[standard] 'ab' -> ''" in out
    assert err.strip().splitlines() == [
        "warning: [standard] 10 generated tokens decode to nothing (pad, other special tokens or "
        "ids past the vocabulary) and are missing from the text; per prompt: [5, 5]"
    ]
    result = json.loads((tmp_path / "g.json").read_text())
    assert result["silent_tokens"] == {"standard": [5, 5]} and result["generations"] == {"standard": ["", ""]}
