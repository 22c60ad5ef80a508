"""Hook points: free when unused, faithful when patched, per-pass and per-step when recorded."""

import pytest
import torch
from helpers import tokens

from models import without_hooks
from workbench import ActivationRecorder, build_model, generate, run_with_pass_cache


def _forward(model, toks):
    return model(toks, passes=3) if model.arch == "fbt" else model(toks)


def test_unused_hooks_change_nothing_bit_for_bit(any_model):
    bare = without_hooks(any_model)
    assert not bare.hook_dict and not any(type(m).__name__ == "HookPoint" for m in bare.modules())
    toks = tokens(2, 12)
    with torch.no_grad():
        assert torch.equal(_forward(any_model, toks), _forward(bare, toks))


def test_patching_with_own_activations_changes_nothing(any_model):
    """Record every hook (per pass), then replay each recorded value into its own call."""
    toks = tokens(2, 10)
    with torch.no_grad(), ActivationRecorder(any_model) as rec:
        reference = _forward(any_model, toks)
    calls = {name: iter(rec.calls(name)) for name in rec.names}

    def replay(x, hook):
        record = next(calls[hook.name])
        assert record.pass_index == any_model.current_pass
        return record.value.clone()

    with torch.no_grad():
        hooks = [(name, replay) for name in rec.names if rec.calls(name)]
        patched = (
            any_model.run_with_hooks(toks, fwd_hooks=hooks)
            if any_model.arch != "fbt"
            else any_model.run_with_hooks(toks, passes=3, fwd_hooks=hooks)
        )
    assert torch.equal(patched, reference)
    assert all(next(it, None) is None for it in calls.values())  # every recorded call was replayed


def test_patching_a_hook_does_change_the_output():
    model = build_model("fbt", "debug")
    toks = tokens(2, 8)
    with torch.no_grad():
        plain = model(toks, passes=2)
        zeroed = model.run_with_hooks(toks, passes=2, fwd_hooks=[("fusion.hook_state", lambda x, hook: torch.zeros_like(x))])
    assert (plain - zeroed).abs().max() > 1e-3


def test_per_pass_activations_differ_exactly_where_the_recurrence_says():
    model = build_model("fbt", "debug")
    toks = tokens(2, 8)
    with torch.no_grad():
        _, cache = run_with_pass_cache(model, toks, ["blocks.0.hook_resid_pre", "fusion.hook_fused"], passes=4)
    x = torch.stack(list(cache["blocks.0.hook_resid_pre"].values()))  # [n_passes, batch, pos, d_model]
    assert x.shape == (4, 2, 8, 32)
    assert list(cache["fusion.hook_fused"]) == [1, 2, 3]  # fusion runs in passes 2..4 (keyed by 0-based pass index)
    for k in range(3):
        # inputs of pass k+1 and pass k+2 agree on positions <= k (their previous states are exact)
        same = (x[k + 1] - x[k]).abs().amax(dim=(0, 2))
        assert torch.all(same[: k + 1] == 0), (k, same)
        assert torch.all(same[k + 1 :] > 0), (k, same)


def test_attention_pattern_hook_matches_the_fused_kernel(any_model):
    toks = tokens(2, 9)
    with torch.no_grad():
        fast = _forward(any_model, toks)
        with ActivationRecorder(any_model, lambda n: n.endswith("hook_pattern")) as rec:
            slow = _forward(any_model, toks)
    torch.testing.assert_close(slow, fast, atol=1e-5, rtol=1e-5)
    pattern = rec.calls("blocks.0.attn.hook_pattern")[-1].value
    torch.testing.assert_close(pattern.sum(-1), torch.ones_like(pattern.sum(-1)))
    assert torch.all(pattern.triu(diagonal=1) == 0)  # causal


def test_recorder_tells_decoding_steps_and_passes_apart():
    model = build_model("fbt", "debug")
    prompt = tokens(2, 6)
    names = ["blocks.0.hook_resid_pre", "ln_final.hook_normalized"]
    with ActivationRecorder(model, names) as rec:
        out = generate(model, prompt, regime="fused", passes=3, max_new_tokens=5)
    assert rec.n_steps == 5  # prefill + 4 fed-back tokens (the last new token is not fed)
    assert rec.by_pass("blocks.0.hook_resid_pre", step=0).shape == (3, 2, 6, 32)
    assert [r.pass_index for r in rec.calls("ln_final.hook_normalized")] == [0, 1, 2, 0, 0, 0, 0]
    states = rec.by_step("ln_final.hook_normalized")  # last pass of each step, along pos
    assert states.shape == (2, 6 + 4, 32)
    torch.testing.assert_close(states[:, 5:], out.states)
    # the recorder removed only its own hooks
    assert not any(hp.fwd_hooks for hp in model.hook_dict.values())


def test_recorder_labels_hd_stream_embeddings_by_step():
    # hook_stream_embed fires before hook_embed: step labels must not lag behind
    model = build_model("hd", "debug", n_streams=2)
    with ActivationRecorder(model, ["hook_stream_embed", "hook_embed"]) as rec:
        generate(model, tokens(1, 5), max_new_tokens=4)
    for name in rec.names:
        assert [r.step for r in rec.calls(name)] == [0, 1, 2, 3]
    assert rec.by_step("hook_stream_embed").shape == (1, 8, 2, 32)
    assert rec.n_steps == 4


def test_user_hooks_stay_active_during_generation():
    model = build_model("baseline", "debug")
    fired = []
    with model.hooks(fwd_hooks=[("blocks.1.hook_resid_post", lambda x, hook: fired.append(x.shape[1]))]):
        generate(model, tokens(1, 4), max_new_tokens=3)
    assert fired == [4, 1, 1]


def test_unknown_hook_name_lists_close_valid_names():
    model = build_model("fbt", "debug")
    with pytest.raises(ValueError, match="fusion.hook_state"):
        ActivationRecorder(model, ["fusion.hook_stat"])


# ---- run_with_pass_cache: entry k of every hook is pass k + 1 ------------------------------------


def _hand_run(model, toks, k, past):
    """Every hook's last value and firing count in a k-pass call, whose last pass is pass k
    (TransformerLens's cache keeps a hook's last firing). ``past``: tokens run into a cache first."""
    cache = None
    if past is not None:
        cache = model.make_cache()
        model(past, cache=cache)
    counts = dict.fromkeys(model.hook_dict, 0)

    def count(x, hook):
        counts[hook.name] += 1

    for hp in model.hook_dict.values():
        hp.add_hook(count, dir="fwd")
    try:
        logits, tl = model.run_with_cache(toks, passes=k, cache=cache)
    finally:
        model.reset_hooks()
    return logits, tl, counts


@pytest.mark.parametrize("with_past", [False, True], ids=["prompt", "after-a-cached-past"])
def test_pass_cache_entry_k_is_pass_k_plus_one_for_every_hook(with_past):
    from workbench import run_with_pass_cache

    model = build_model("fbt", "debug", seed=4)
    toks, past = tokens(2, 7, seed=1), (tokens(2, 5, seed=2) if with_past else None)
    passes = 3
    with torch.no_grad():
        cache = None
        if with_past:
            cache = model.make_cache()
            model(past, cache=cache)
        logits, per_pass = run_with_pass_cache(model, toks, None, passes=passes, cache=cache)
        hand = {k: _hand_run(model, toks, k, past) for k in range(1, passes + 1)}
    torch.testing.assert_close(logits, hand[passes][0])
    assert set(per_pass) == {name for name, n in hand[passes][2].items() if n}  # every hook that fired at all
    for name, entries in per_pass.items():
        # the hook ran in pass k when a k-pass call fires it more often than a (k-1)-pass call
        fired = [k for k in range(1, passes + 1) if hand[k][2][name] > (hand[k - 1][2][name] if k > 1 else 0)]
        assert list(entries) == [k - 1 for k in fired], name  # 0-based pass index, only passes that ran it
        for k in fired:
            torch.testing.assert_close(entries[k - 1], hand[k][1][name], atol=1e-6, rtol=0, msg=f"{name}, pass {k}")
    if not with_past:  # no carried state: the fusion runs in passes 2..K only
        assert list(per_pass["fusion.hook_state"]) == [1, 2] and list(per_pass["hook_embed"]) == [0]
        with torch.no_grad():
            states = model.run_passes(toks, passes)
        for k in (1, 2):  # pass k + 1 reads pass k's states shifted right by one, zeros at position 0
            torch.testing.assert_close(per_pass["fusion.hook_state"][k][:, 1:], states[k - 1][:, :-1])
            assert not per_pass["fusion.hook_state"][k][:, 0].any()
    else:  # the first position fuses the cached state in every pass
        assert list(per_pass["fusion.hook_state"]) == [0, 1, 2]


def test_recorder_by_pass_refuses_a_hook_that_skipped_passes():
    from workbench import ActivationRecorder

    model = build_model("fbt", "debug")
    with torch.no_grad(), ActivationRecorder(model, ["blocks.0.hook_resid_pre", "fusion.hook_gate"]) as rec:
        model(tokens(1, 6), passes=3)
    assert rec.by_pass("blocks.0.hook_resid_pre").shape[0] == 3
    assert sorted(rec.per_pass("fusion.hook_gate")) == [1, 2]
    with pytest.raises(ValueError, match=r"fusion.hook_gate.*passes \[2, 3\] of 3.*per_pass"):
        rec.by_pass("fusion.hook_gate")
