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
