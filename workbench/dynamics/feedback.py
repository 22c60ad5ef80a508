"""Feedback-map dynamics of a Full-Bandwidth model.

- ``feedback_map``: F(h) = h_t given h_{t-1} = h, with the token x_t and the context (the KV cache
  of everything before t) frozen. A plain batched function, so every analysis in
  ``workbench.dynamics.maps`` applies to it.
- ``rollout``: ``soft`` decoding (free, or teacher-forced on a fixed token stream) for a long
  horizon, tracking per step ||h_t||, ||u_t||, the gate's mean and entropy, the logit entropy and
  the distance to the ``standard`` rollout on the same tokens; optionally with a perturbation of
  the carried state at step t0, tracked as ||dh_t|| / ||dh_t0||.
- ``kpass_convergence``: relative residual between successive passes and KL between their
  next-token distributions, against the exact recurrence.

Beyond the context length a rollout follows the documented rule ``context_rule``: ``"slide"``
drops the oldest half of the window when it is full (keys keep their absolute rotary phases, so
every relative distance the model sees stays below n_ctx), ``"stop"`` stops with a message.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import cast

import torch
from torch import Tensor
from torch.autograd import forward_ad
from torch.nn.attention import SDPBackend, sdpa_kernel

from models import DecoderLM, FullBandwidthLM, NonFiniteActivation, guard_numerics
from workbench.dynamics.maps import tangent_basis, tangent_qr, tangent_qr_map
from workbench.runtime.activations import ActivationRecorder
from workbench.runtime.decoding import check_passes, guarded, model_check
from workbench.storage.errors import BadInput, WorkbenchError

CONTEXT_RULES = ("slide", "stop")


class RolloutDiverged(WorkbenchError, RuntimeError):
    """A rollout met a non-finite activation; the message names the rollout step and the site."""


def feedback_model(model: DecoderLM) -> FullBandwidthLM:
    """``model``, which must carry a state (FBT): the feedback dynamics need one."""
    if not model.carries_state:
        raise BadInput(f"feedback dynamics need a Full-Bandwidth model, got arch {model.arch!r}")
    return cast(FullBandwidthLM, model)  # the architecture that carries a state


@torch.no_grad()
def prefill_context(model: FullBandwidthLM, prefix: list[int], capacity: int | None = None, plain: int = 0):
    """``prefix`` in a fresh cache, its first ``plain`` tokens plain (a prompt, as in ``soft``
    decoding) and the rest by the exact recurrence; returns (cache, carried state [D]). Non-finite
    activations raise ``NonFinite`` (steps are its forward calls: the plain part, then one per
    position)."""
    feedback_model(model)
    cache = model.make_cache(capacity)
    ids = torch.tensor([prefix], device=model.embed.W_E.device)
    model_check(model.check_tokens, ids, cache)
    first = max(plain, 1)  # the first token has no state to fuse with: plain either way
    with guarded(model):
        h = model.prefill(ids[:, :first], regime="soft", cache=cache)
        for t in range(first, ids.shape[1]):
            h = model.step(ids[:, t : t + 1], regime="soft", cache=cache)
    return cache, h[0, -1]


def feedback_map(model: FullBandwidthLM, cache, token: int):
    """F(h): [M, D] -> [M, D], the carried state after feeding ``token`` with previous state h,
    reading (never writing) ``cache``. Differentiable in h (torch.func works on it). Not guarded:
    a fixed-point search evaluates F at wild states and handles what comes back itself."""
    feedback_model(model)
    device = model.embed.W_E.device

    def F(h: Tensor) -> Tensor:
        toks = torch.full((h.shape[0], 1), token, dtype=torch.long, device=device)
        fuse = torch.ones_like(toks, dtype=torch.bool)
        # the fused CPU attention kernels have no forward-mode derivative; JVPs need the math one
        with sdpa_kernel(SDPBackend.MATH):
            return model.final_states(toks, fuse_mask=fuse, cache=cache, state=h, commit=False)[:, -1]

    return F


@dataclass
class Rollout:
    tokens: list[int]  # the token fed at each step
    states: Tensor  # [steps, d_model] the carried states h_t
    state_norm: Tensor  # [steps] ||h_t||
    input_norm: Tensor  # [steps] ||u_t|| (the fused stack input)
    gate_mean: Tensor  # [steps]
    gate_entropy: Tensor  # [steps] mean binary entropy of the gate, in nats
    logit_entropy: Tensor  # [steps] entropy of the next-token distribution, in nats
    standard_distance: Tensor  # [steps] ||h_t - h_t(standard)|| on the same tokens
    perturbation_ratio: Tensor | None  # [steps - t0] ||dh_t|| / ||dh_t0|| when perturbed
    # [steps - t0, k] log-growth of k tangent directions per step (Benettin, QR), with ``tangents``:
    # through each step's feedback map F_t (the context frozen), and through the whole decoding
    # step (the tangent also lives in the keys and values the step writes, and acts from there)
    tangent_log_growth: Tensor | None = None
    tangent_full_log_growth: Tensor | None = None
    slid_at: list[int] = field(default_factory=list)  # steps at which the window slid
    stopped: str | None = None  # why the rollout ended early, if it did


def _binary_entropy(p: Tensor) -> Tensor:
    p = p.clamp(1e-7, 1 - 1e-7)
    return -(p * p.log() + (1 - p) * (1 - p).log())


def _renormalise_tangents(h: Tensor, cache, frozen: slice, full: slice) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """One Benettin step for the rollout's two tangent sets, whose carried-state parts are the
    tangent of ``h`` [rows, D] in rows ``frozen`` and ``full``: each set re-orthonormalised by QR;
    the cached keys' and values' tangents set to zero in the frozen rows (the next step sees the
    context fixed) and, in the full rows, mixed by the same triangular map as their states (a
    tangent is a state and its cache together). Returns the dual state and the two log-growths."""
    primal, tangent = forward_ad.unpack_dual(h)
    assert tangent is not None  # the rollout made h dual at the first tangent step
    tangent = tangent.clone()
    tangent[frozen], log_frozen = tangent_qr(tangent[frozen])
    tangent[full], log_full, M = tangent_qr_map(tangent[full])
    for layer in cache.layers:
        for kv in (layer.k, layer.v):
            whole = forward_ad.unpack_dual(kv).tangent
            assert whole is not None  # every step since the first tangent step wrote dual keys and values
            cached = whole[:, :, : layer.length]  # [rows, heads, pos, d_head]
            cached[frozen] = 0
            cached[full] = (M @ cached[full].flatten(1)).view_as(cached[full])
    return forward_ad.make_dual(primal, tangent), (log_frozen.double().cpu(), log_full.double().cpu())


@torch.no_grad()
def rollout(
    model: FullBandwidthLM,
    prompt: list[int],
    horizon: int,
    *,
    tokens: list[int] | None = None,
    perturb_at: int | None = None,
    eps: float = 1e-3,
    context_rule: str = "slide",
    seed: int = 0,
    tangents: int = 0,
    on_step: Callable[[int], None] | None = None,
) -> Rollout:
    """``soft`` decoding of ``horizon`` steps after ``prompt`` (greedy, or teacher-forced on
    ``tokens``), next to a ``standard`` rollout on the same tokens and, with ``perturb_at``, a
    perturbed copy of the carried state at that step.

    With ``tangents`` = k, two sets of k tangent vectors of the soft state start at that step (or
    step 0), the first along the perturbation, and are carried by forward-mode derivatives in
    extra batch rows that follow the soft row's tokens: one set through each step's feedback map
    F_t alone (the keys and values of earlier steps held fixed: the products of the Jacobians whose
    fixed points ``find_fixed_points`` studies), one through the whole decoding step, where a
    tangent also lives in the keys and values each step writes and acts on every later step from
    there (the linearisation of the perturbation curve). Both are re-orthonormalised each step
    by QR on their carried-state part (``tangent_qr``; the full set's cached part is transformed
    alike, so it stays the tangent of the same directions): the cumulative mean of their log-growth
    is the k leading Lyapunov exponents along the rollout, with no round-off floor.

    ``on_step(step)`` is called after each step. A non-finite activation (a norm input, a logit,
    the carried state that ``ln_final`` makes) raises ``RolloutDiverged`` naming the step and the
    site."""
    feedback_model(model)
    if context_rule not in CONTEXT_RULES:
        raise BadInput(f"context_rule={context_rule!r}: expected one of {CONTEXT_RULES}")
    if not prompt:
        raise BadInput("a rollout needs a prompt of at least one token")
    if horizon < 1:
        raise BadInput(f"horizon={horizon}: expected an integer >= 1")
    if tokens is not None and len(tokens) < horizon:
        raise BadInput(f"teacher-forced rollout needs {horizon} tokens, got {len(tokens)}")
    if perturb_at is not None and not 0 <= perturb_at < horizon:
        raise BadInput(f"perturb_at={perturb_at}: expected a step in [0, {horizon})")
    if not 0 <= tangents <= model.cfg.d_model:
        raise BadInput(f"tangents={tangents}: expected 0..d_model={model.cfg.d_model}")
    device, dtype, D = model.embed.W_E.device, model.embed.W_E.dtype, model.cfg.d_model
    n = 3 if perturb_at is not None else 2  # rows: soft, standard, perturbed soft; then the tangents
    frozen, full = slice(n, n + tangents), slice(n + tangents, n + 2 * tangents)
    rows = n + 2 * tangents
    if tokens is not None and (bad := [t for t in tokens[:horizon] if not 0 <= t < model.cfg.d_vocab]):
        raise BadInput(f"token id {bad[0]} is outside the vocabulary [0, {model.cfg.d_vocab})")
    ids = torch.tensor([prompt] * rows, device=device)
    model_check(model.check_tokens, ids)
    # buffers for the tokens this rollout can hold (every row preallocates its capacity), the same
    # slides as at n_ctx: the window fills only where the prompt and horizon pass n_ctx
    cache = model.make_cache(min(model.cfg.n_ctx, len(prompt) + horizon))
    fuse = torch.ones(rows, 1, dtype=torch.bool, device=device)
    fuse[1] = False
    out = {k: [] for k in ("state", "input", "gate_mean", "gate_entropy", "logit_entropy", "standard", "ratio")}
    fed, slid, stopped, d0, kept, growth = [], [], None, None, [], []
    t0 = perturb_at or 0
    direction = torch.randn(D, generator=torch.Generator().manual_seed(seed), dtype=torch.float32).to(device, dtype)
    direction = direction / direction.norm()
    names = ["blocks.0.hook_resid_pre"] + (["fusion.hook_gate"] if model.fusion.W_G is not None else [])
    step = nxt = None  # where a non-finite activation arose: the prefill, or a step (and its token)
    try:
        # forward-mode derivatives go through attention's math kernel (the fused CPU ones have none)
        with guard_numerics(model), forward_ad.dual_level(), sdpa_kernel(SDPBackend.MATH) if tangents else nullcontext():
            h = model.prefill(ids, regime="soft", cache=cache)[:, -1]
            for step in range(horizon):
                nxt = None  # not chosen yet: the readout below may be what fails
                logits = model.readout(h[:1])
                logp = logits.float().log_softmax(-1)
                nxt = tokens[step] if tokens is not None else int(logits.argmax())
                if cache.length + 1 > cache.capacity:
                    if context_rule == "stop":
                        stopped = f"context full after {cache.length} tokens (n_ctx={model.cfg.n_ctx}) at step {step}"
                        break
                    cache.slide(cache.capacity // 2)
                    slid.append(step)
                if perturb_at == step:
                    h = h.clone()
                    h[2] = h[0] + eps * direction
                    cache.state = h
                    d0 = float((h[2] - h[0]).norm())
                if tangents and step == t0:  # the first direction is the perturbation's
                    start = tangent_basis(D, tangents, dtype, device, seed)
                    start = tangent_qr(torch.cat((direction[None], start[:-1])))[0]
                    tangent = torch.zeros_like(h)
                    tangent[frozen], tangent[full] = start, start
                    h = cache.state = forward_ad.make_dual(h, tangent)
                with ActivationRecorder(model, names) as rec:
                    h = model.final_states(torch.full((rows, 1), nxt, device=device), fuse_mask=fuse, cache=cache)[:, -1]
                if tangents and step >= t0:
                    h, logs = _renormalise_tangents(h, cache, frozen, full)
                    cache.state = h
                    growth.append(logs)
                hp = forward_ad.unpack_dual(h).primal
                h0 = hp[0]
                u = rec.calls("blocks.0.hook_resid_pre")[-1].value[0, -1]
                fed.append(nxt)
                kept.append(h0.float().cpu())
                out["state"].append(float(h0.norm()))
                out["input"].append(float(u.norm()))
                if "fusion.hook_gate" in names:
                    gate = rec.calls("fusion.hook_gate")[-1].value[0, -1].float()
                    out["gate_mean"].append(float(gate.mean()))
                    out["gate_entropy"].append(float(_binary_entropy(gate).mean()))
                out["logit_entropy"].append(float(-(logp.exp() * logp).sum()))
                out["standard"].append(float((h0 - hp[1]).norm()))
                if d0 is not None:
                    out["ratio"].append(float((hp[2] - h0).norm()) / d0)
                if on_step is not None:
                    on_step(step)
    except NonFiniteActivation as err:
        if step is None:
            raise RolloutDiverged(f"{err.what} in the prompt's prefill (before step 0)") from err
        token = f" (token {nxt})" if nxt is not None else ""
        raise RolloutDiverged(f"{err.what} at step {step}{token}: the carried state diverged") from err
    t = lambda key: torch.tensor(out[key], dtype=torch.float64)
    states = torch.stack(kept) if kept else torch.empty(0, model.cfg.d_model)
    return Rollout(
        fed,
        states,
        t("state"),
        t("input"),
        t("gate_mean"),
        t("gate_entropy"),
        t("logit_entropy"),
        t("standard"),
        t("ratio") if d0 is not None else None,
        torch.stack([g for g, _ in growth]) if growth else None,
        torch.stack([g for _, g in growth]) if growth else None,
        slid,
        stopped,
    )


@torch.no_grad()
def kpass_convergence(model: FullBandwidthLM, tokens: list[int], max_passes: int) -> dict:
    """For k = 2..max_passes: relative residual ||H^k - H^(k-1)|| / ||H^k|| and mean KL(p^k || p^(k-1))
    of next-token distributions (whole sequence), and per position ||H^k_t - H*_t|| against the
    exact recurrence H*. Positions < k are exact after k passes."""
    feedback_model(model)
    check_passes(model, max_passes, "max_passes")
    ids = torch.tensor([tokens], device=model.embed.W_E.device)
    model_check(model.check_tokens, ids)
    with guarded(model):  # step 0: the K passes; step t + 1: position t of the exact recurrence
        states = model.run_passes(ids, max_passes)
        exact = model.prefill(ids, regime="fused", passes="exact")
        rows = []
        for k in range(1, max_passes + 1):
            H = states[k - 1][0]
            row = {"passes": k, "error_to_exact": (H - exact[0]).norm(dim=-1).tolist()}
            if k > 1:
                prev = states[k - 2][0]
                logp, logq = (model.readout(x).float().log_softmax(-1) for x in (H, prev))
                row["relative_residual"] = float((H - prev).norm() / H.norm())
                row["kl_to_previous"] = float((logp.exp() * (logp - logq)).sum(-1).mean())
            rows.append(row)
    return {"tokens": len(tokens), "rows": rows}
