"""Host-device synchronisations, counted on the CPU: the counter's known answers, and
decode steps that do not wait for the device between the host's reads every ``sync_every`` steps,
with the same tokens, states and errors as reading it at every step."""

import pytest
import torch
from helpers import tokens

from models import guard_numerics
from workbench import build_model, generate
from workbench.runtime.decoding import NonFinite
from workbench.runtime.syncs import SyncCounter, count_syncs


def test_the_counter_counts_host_reads_and_data_dependent_shapes_only():
    x = torch.arange(6.0)
    with SyncCounter() as c:
        y = (x * 2 + 1).softmax(0).argmax()  # device work: none
    assert c.total == 0
    with SyncCounter() as c:
        x.sum().item()
        int(y)
        bool(x.any())
        _ = x[x > 2]  # a boolean mask: the result's size is read from the data
        x.nonzero()
    assert c.total == 5, dict(c.counts)
    assert c.counts["aten._local_scalar_dense.default"] == 3


CASES = [("baseline", "standard", 1), ("fbt", "standard", 1), ("fbt", "soft", 1), ("fbt", "fused", 2), ("hd", "standard", 1)]


def _prompts():
    rows = tokens(3, 9, seed=7).tolist()
    return [rows[0][:9], rows[1][:3], rows[2][:6]]  # ragged: left-padded


@pytest.mark.parametrize("engine", ["eager", "static"])
@pytest.mark.parametrize("arch,regime,passes", CASES, ids=[f"{a}-{r}" for a, r, _ in CASES])
def test_decode_steps_between_the_hosts_reads_do_not_synchronise(arch, regime, passes, engine):
    """8 more steps cost no more syncs: per step, 0 (5 before: the token range's min and max, the
    guard after the step and after the readout, eos); eos and the guard read every 32 steps."""
    model = build_model(arch, "debug")
    eos = 3  # set, and perhaps emitted: finished rows decode on as pad until the next read
    totals = []
    for new in (8, 16):
        _, c = count_syncs(
            generate, model, _prompts(), regime=regime, passes=passes, max_new_tokens=new, engine=engine,
            eos_token_id=eos, sync_every=32,
        )  # fmt: skip
        totals.append(c.total)
    assert totals[0] == totals[1], totals
    _, c = count_syncs(generate, model, _prompts(), regime=regime, passes=passes, max_new_tokens=16, engine=engine, sync_every=4)
    assert c.total - totals[1] <= 4 * 2  # 4 reads: the guard's (and eos's, none without eos)


@pytest.mark.parametrize("arch,regime,passes", [CASES[0], CASES[2], CASES[4]], ids=["baseline", "fbt-soft", "hd"])
@pytest.mark.parametrize("compact", [False, True])
def test_reading_the_device_every_n_steps_decodes_what_every_step_does(arch, regime, passes, compact):
    """Rows that stop at different steps, with and without compaction: the tokens, lengths and
    states of sync_every 1 (the host reads every step), 3 and 64 are the same."""
    model = build_model(arch, "debug")
    prompts = _prompts() + [tokens(1, 5, seed=9).tolist()[0]]
    free = generate(model, prompts, regime=regime, max_new_tokens=12)
    eos = int(free.new_tokens[0, 2])  # row 0 stops at step 3
    runs = {
        n: generate(
            model, prompts, regime=regime, passes=passes, max_new_tokens=12, eos_token_id=eos, compact=compact, sync_every=n
        )
        for n in (1, 3, 64)
    }
    ref = runs[1]
    assert min(ref.lengths.tolist()) <= 3
    for n, got in runs.items():
        assert got.new_tokens.tolist() == ref.new_tokens.tolist(), n
        assert torch.equal(got.lengths, ref.lengths) and torch.equal(got.finished, ref.finished)
        # compaction at other steps runs other batch sizes, whose matmuls round differently
        tol = 1e-5 if compact else 0.0
        torch.testing.assert_close(got.states, ref.states, atol=tol, rtol=tol, equal_nan=True)


def test_a_deferred_guard_names_the_same_site_and_step():
    """An overflow at decode step 5, read 16 steps later, is named as at once: the site, the step."""

    def blow_up(step):
        def hook(act, hook):
            return act * 1e30 if model.forward_calls == step + 1 else act  # forward call step+1 is decode step `step`

        return hook

    errors = {}
    for n in (1, 16):
        model = build_model("fbt", "debug")  # a new model counts its forward calls from 0
        with model.hooks(fwd_hooks=[("blocks.1.hook_resid_mid", blow_up(5))]), pytest.raises(NonFinite) as err:
            generate(model, _prompts(), regime="soft", max_new_tokens=12, sync_every=n)
        errors[n] = (err.value.what, err.value.step, str(err.value))
    assert errors[16] == errors[1]
    assert errors[1][1] == 5 and "blocks.1.ln2" in errors[1][0]


def test_the_guard_reads_what_it_has_not_read_when_it_ends():
    model = build_model("baseline", "debug")
    with pytest.raises(Exception, match="check_every"):
        with guard_numerics(model, check_every=0):
            pass
    with SyncCounter() as c, guard_numerics(model, check_every=100):
        for _ in range(5):
            model(tokens(1, 4))
        inside = c.total
    assert c.total == inside + 1  # one read at the end, for all five calls


@pytest.mark.parametrize("arch,regime,passes", [CASES[0], CASES[3], CASES[4]], ids=["baseline", "fbt-fused", "hd"])
def test_scoring_completions_does_not_synchronise_per_token(arch, regime, passes):
    """Teacher-forced scoring (the evaluation's answer loss): 8 more completion tokens, no more syncs."""
    from workbench.runtime.decoding import score_completions

    model = build_model(arch, "debug")
    prompts = _prompts()
    totals = []
    for n in (4, 12):
        completions = [row[:n] for row in tokens(3, 12, seed=2).tolist()]
        completions[1] = completions[1][: n // 2]  # ragged: NaN past its end
        nll, c = count_syncs(score_completions, model, prompts, completions, regime=regime, passes=passes)
        totals.append(c.total)
        assert nll[1, n // 2 :].isnan().all() and not nll[0].isnan().any()
    assert totals[0] == totals[1], totals


@pytest.mark.parametrize("arch", ["baseline", "fbt", "hd"])
def test_norm_sites_are_the_order_a_step_records_its_norms(arch):
    """A compiled step's statuses are named by ``norm_sites``: the order the eager step records."""
    model = build_model(arch, "debug")
    with torch.no_grad():
        cache = model.make_cache(12, static=True)
        model.prefill(tokens(2, 4), cache=cache)
        with guard_numerics(model, check_every=None) as guard:
            model.step(tokens(2, 1), cache=cache)  # the static step, eagerly
            [(pending, _)] = guard.unread
    assert [site for site, *_ in pending] == model.norm_sites()


@pytest.mark.parametrize("arch,regime", [("baseline", "standard"), ("fbt", "soft"), ("hd", "standard")])
def test_the_static_step_reads_and_writes_the_same_storages_at_every_step(arch, regime, monkeypatch):
    """What CUDA graphs (the compiled step under ``reduce-overhead``) need to replay back to back:
    every tensor the step reads (the new ids, the cache's keys, values, mask, positions, slot and
    carried state) lives at the same address from step to step, so nothing is copied in."""
    from models import DecoderLM

    model = build_model(arch, "debug")
    seen: list[dict] = []
    core = DecoderLM._static_step_core

    def recorded(self, tokens, cache, fuse, collect):
        ptrs = {"tokens": tokens.data_ptr(), "valid": cache.valid.data_ptr(), "next_pos": cache.next_pos.data_ptr()}
        ptrs |= {"index": cache.index.data_ptr(), "state": cache.state.data_ptr() if fuse else None}
        ptrs |= {f"k{i}": layer.k.data_ptr() for i, layer in enumerate(cache.layers)}
        ptrs |= {f"v{i}": layer.v.data_ptr() for i, layer in enumerate(cache.layers)}
        seen.append(ptrs)
        return core(self, tokens, cache, fuse, collect)

    monkeypatch.setattr(DecoderLM, "_static_step_core", recorded)
    generate(model, _prompts(), regime=regime, max_new_tokens=6, engine="static")
    assert len(seen) == 5
    moved = {name for step in seen[1:] for name, ptr in step.items() if ptr != seen[0][name]}
    assert not moved, moved


@pytest.mark.parametrize("engine", ["eager", "static"])
@pytest.mark.parametrize("arch,regime", [("baseline", "standard"), ("fbt", "soft"), ("hd", "standard")])
def test_decoding_builds_no_autograd_graph(arch, regime, engine):
    """The model's weights require gradients; decoding must not record a graph through them (on
    the H200, CUDA graphs refused to replay the compiled step: "pending, uninvoked backwards")."""
    model = build_model(arch, "debug")
    assert all(p.requires_grad for p in model.parameters())
    out = generate(model, _prompts(), regime=regime, max_new_tokens=4, engine=engine)
    assert not out.states.requires_grad and out.states.grad_fn is None


@pytest.mark.parametrize("arch,regime", [("baseline", "standard"), ("fbt", "soft"), ("hd", "standard")])
def test_the_compiled_step_sees_its_cache_buffers_marked_static(arch, regime, monkeypatch):
    """CUDA graphs skip a graph whose inputs it writes in place ("mutated inputs", seen on the
    H200) unless those inputs are static addresses: every buffer the compiled step reads or
    writes (keys, values, mask, positions, slot, carried state) is marked before each call. The
    compiled function is replaced by the eager core here, so the test runs in a second."""
    from models import DecoderLM
    from models import baseline as base_module

    marked: list[bool] = []

    def recorded(self, tokens, cache, fuse, collect):
        buffers = [cache.valid, cache.next_pos, cache.index] + [t for layer in cache.layers for t in (layer.k, layer.v)]
        buffers += [cache.state] if fuse else []
        marked.append(all(getattr(t, "_dynamo_static_input_type", None) is not None for t in buffers))
        return DecoderLM._static_step_core(self, tokens, cache, fuse, collect)

    monkeypatch.setitem(base_module._COMPILED_STEPS, "default", recorded)
    model = build_model(arch, "debug")
    model.compiled_mode = "default"
    generate(model, _prompts(), regime=regime, max_new_tokens=5, engine="compiled")
    assert marked == [True] * 4


# ---- training steps ----------------------------------------------------------------------------

TRAIN_CASES = {
    "baseline": ("baseline", []),
    "fbt": ("fbt", ["fbt.feedback_start=0.25", "fbt.three_pass_fraction=0.5"]),  # 1-, 2- and 3-pass steps, the warm switch
    "hd": ("hd", ["hd.streams=1,2", "hd.expand_at=0,3"]),  # an expansion on the way
    "accumulated": ("baseline", ["train.grad_accum=2"]),
}


def _train(tmp_path, name: str, steps: int, *extra: str):
    from helpers import FAST

    from workbench.training.runconfig import make_run_config
    from workbench.training.train import train

    arch, overrides = TRAIN_CASES[name]
    cfg = make_run_config(arch, "debug", "mix", [*FAST, f"train.steps={steps}", *overrides, *extra])
    return train(cfg, tmp_path / "-".join([name, str(steps), *extra]), progress=False)


@pytest.mark.parametrize("name", list(TRAIN_CASES))
def test_training_steps_between_logging_steps_do_not_synchronise(tmp_path, name):
    """Steps 9-16 cost no host reads when none of them logs or checkpoints (26 per step before:
    the token range, the losses, the gradient norm, AdamW's step counters, the batch's target
    mass; FBT also the first pass's fuse mask and its pass draw). Host reads of the host's own
    batch go through ``host_value``, which the counter does not see."""
    totals = []
    for steps in (8, 16):
        with SyncCounter() as c:
            _train(tmp_path, name, steps, "train.log_every=1000", "train.checkpoint_every=1000")
        totals.append(c.total)
    assert totals[0] == totals[1], totals


@pytest.mark.parametrize("name", ["fbt", "accumulated"])
def test_reading_the_device_less_often_trains_the_same_weights_and_logs_the_same_numbers(tmp_path, name):
    """The host reads the step's readings at logging steps only: every 4th step's line equals
    the line that reading at every step writes, and the weights are bit for bit the same."""
    import json
    from pathlib import Path

    every = _train(tmp_path, name, 8, "train.log_every=1")
    fourth = _train(tmp_path, name, 8, "train.log_every=4")
    timing = ("tokens_per_s", "tflops_per_s", "peak_rss_mib")
    lines = []
    for out in (every, fourth):
        rows = [json.loads(line) for line in (Path(out.summary["run"]) / "metrics.jsonl").read_text().splitlines()]
        lines.append({r["step"]: {k: v for k, v in r.items() if k not in timing} for r in rows})
    a, b = lines
    assert sorted(b) == [4, 8] and all(b[s] == a[s] for s in (4, 8)), (a, b)
    for (name_a, p), (name_b, q) in zip(every.model.state_dict().items(), fourth.model.state_dict().items()):
        assert name_a == name_b and torch.equal(p, q), name_a


def test_step_readings_keep_the_first_divergence_and_the_last_step():
    """Known answers: the first non-finite step (loss NaN at step 1, not the gradient norm's inf at
    step 2) with its own values, and the last step's readings as numbers; no host read until
    ``read``."""
    import math

    from workbench.training.readings import StepReadings

    r = StepReadings("cpu")
    with SyncCounter() as c:
        r.add(0, {"loss": torch.tensor(1.5), "passes": 2}, torch.tensor(0.25))
        r.add(1, {"loss": torch.tensor(float("nan")), "passes": 2}, torch.tensor(3.0))
        r.add(2, {"loss": torch.tensor(0.5), "passes": 3}, torch.tensor(float("inf")))
    assert c.total == 0
    got = r.read()
    assert got.diverged_at == 1 and math.isnan(got.diverged_loss) and got.diverged_grad_norm == 3.0
    assert got.values == {"loss": 0.5, "passes": 3, "grad_norm": float("inf")}
    fine = StepReadings("cpu")
    fine.add(4, {"loss": torch.tensor(2.0)}, torch.tensor(1.0))
    assert fine.read().diverged_at is None
