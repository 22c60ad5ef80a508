"""Record every firing of chosen hook points, labelled by forward call (step) and FBT pass.

TransformerLens's ``run_with_cache`` keeps one tensor per hook name, so a hook that fires once per
pass, or once per decoding step, silently keeps only its last call. ``ActivationRecorder`` keeps
all of them, labelled by step and pass.

Passes are keyed by their 0-based index (``k`` is pass ``k + 1``) for every hook. Not every hook
fires in every pass: the FBT fusion hooks run in passes 2..K of a prompt with no carried state,
``hook_embed`` once per call (labelled pass 0). ``per_pass`` maps pass index to value for the
passes a hook ran in; ``by_pass`` stacks them along a pass axis only when the hook ran in every
pass of the step, and refuses otherwise (a stack would shift its pass axis).

    with ActivationRecorder(model, ["fusion.hook_fused", "blocks.0.hook_resid_pre"]) as rec:
        generate(model, prompts, regime="fused", passes=3)
    rec.by_pass("blocks.0.hook_resid_pre", step=0)   # [n_passes, batch, pos, d_model]
    rec.per_pass("fusion.hook_fused", step=0)        # {1: pass 2's value, 2: pass 3's value}
    rec.by_step("blocks.0.hook_resid_pre")           # [batch, all positions, d_model]
"""

from __future__ import annotations

import difflib
import fnmatch
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from models import DecoderLM

_levels = itertools.count(1)


@dataclass
class Record:
    step: int  # index of the forward call within the recording (0: the first, e.g. the prefill)
    pass_index: int  # FBT pass within that call (0-based); always 0 for other architectures
    value: Tensor


def resolve_hook_names(model: DecoderLM, names: str | Sequence[str] | Callable[[str], bool] | None) -> list[str]:
    """Hook names selected by a name, a list of names or glob patterns (``blocks.*.hook_resid_post``),
    or a predicate (None: all). Unknown names raise an error listing the closest valid ones."""
    valid = list(model.hook_dict)
    if names is None:
        return valid
    if callable(names):
        return [n for n in valid if names(n)]
    names = [names] if isinstance(names, str) else list(names)
    expanded = []
    for name in names:
        if any(c in name for c in "*?["):  # a glob pattern, e.g. blocks.*.hook_resid_post
            matches = [n for n in valid if fnmatch.fnmatchcase(n, name)]
            if not matches:
                raise ValueError(f"hook pattern {name!r} matches no hook point of arch {model.arch!r}")
            expanded += [m for m in matches if m not in expanded]
        elif name not in expanded:
            expanded.append(name)
    names = expanded
    for name in names:
        if name not in model.hook_dict:
            close = difflib.get_close_matches(name, valid, n=5, cutoff=0.4)
            raise ValueError(
                f"unknown hook name {name!r} for arch {model.arch!r}; closest valid names: {close or valid[:5]}"
                f" ({len(valid)} hook points in all, see model.hook_dict)"
            )
    return names


class ActivationRecorder:
    """Context manager that records chosen hooks at every call, with step and pass labels.

    A step is one forward call of the model (``generate``: the prefill, then one per fed-back
    token). ``device`` moves recorded tensors (e.g. ``'cpu'`` when the model is on a GPU).
    """

    def __init__(self, model: DecoderLM, names=None, device: str | torch.device | None = None):
        self.model = model
        self.names = resolve_hook_names(model, names)
        self.device = device
        self.records: dict[str, list[Record]] = {name: [] for name in self.names}
        self._first_call = model.forward_calls
        self._last_call: int | None = None
        self._level = -next(_levels)

    def _save(self, tensor: Tensor, hook) -> None:
        value = tensor.detach()
        if self.device is not None:
            value = value.to(self.device)
        step = self.model.forward_calls - self._first_call - 1
        self.records[hook.name].append(Record(step, self.model.current_pass, value))

    def __enter__(self) -> ActivationRecorder:
        self._first_call = self.model.forward_calls
        self._last_call = None
        for name in self.names:
            self.model.hook_dict[name].add_hook(self._save, dir="fwd", level=self._level)
        return self

    def __exit__(self, *exc) -> None:
        for name in self.names:
            self.model.hook_dict[name].remove_hooks("fwd", level=self._level)
        self._last_call = self.model.forward_calls

    # ---- views -------------------------------------------------------------------------------

    def calls(self, name: str) -> list[Record]:
        if name not in self.records:
            raise KeyError(f"hook {name!r} was not recorded; recorded: {self.names}")
        return self.records[name]

    @property
    def n_steps(self) -> int:
        """Forward calls made inside the ``with`` block (so far, while it is open)."""
        end = self.model.forward_calls if self._last_call is None else self._last_call
        return end - self._first_call

    def per_pass(self, name: str, step: int = 0) -> dict[int, Tensor]:
        """``{pass index: value}`` for the passes of one forward call in which the hook fired, in
        pass order; index ``k`` is pass ``k + 1`` (e.g. ``{1: ..., 2: ...}`` for a fusion hook in a
        3-pass prompt, which has no carried state to fuse in pass 1)."""
        records = [r for r in self.calls(name) if r.step == step]
        if not records:
            raise ValueError(f"hook {name!r} did not fire in step {step} (steps recorded: {self.n_steps})")
        out: dict[int, Tensor] = {}
        for r in records:
            if r.pass_index in out:
                raise ValueError(f"hook {name!r} fired twice in pass {r.pass_index + 1} of step {step}")
            out[r.pass_index] = r.value
        return out

    def n_passes(self, step: int = 0) -> int:
        """Passes of one forward call, as seen by the recorded hooks (the last pass fires every
        hook that fires at all)."""
        indices = [r.pass_index for records in self.records.values() for r in records if r.step == step]
        if not indices:
            raise ValueError(f"no recorded hook fired in step {step} (steps recorded: {self.n_steps})")
        return max(indices) + 1

    def by_pass(self, name: str, step: int = 0) -> Tensor:
        """[n_passes, batch, pos, ...]: every pass of one forward call, index ``k`` = pass ``k + 1``.
        Raises for a hook that did not fire in every pass (use ``per_pass``)."""
        values = self.per_pass(name, step)
        n = self.n_passes(step)
        if list(values) != list(range(n)):
            fired = [k + 1 for k in values]
            raise ValueError(
                f"hook {name!r} fired in passes {fired} of {n} of step {step}, not in every pass: "
                "a stack would misalign the pass axis; use per_pass(name, step), keyed by pass index"
            )
        return torch.stack(list(values.values()))

    def by_step(self, name: str) -> Tensor:
        """[batch, pos, ...] over all steps, concatenated along pos, taking the last pass of each
        step (the one whose keys, values and states the sequence carried on with)."""
        last: dict[int, Tensor] = {}
        for r in self.calls(name):
            last[r.step] = r.value
        if not last:
            raise ValueError(f"hook {name!r} never fired")
        return torch.cat([last[s] for s in sorted(last)], dim=1)


def run_with_pass_cache(
    model: DecoderLM, tokens: Tensor, names=None, **forward_kwargs
) -> tuple[Tensor, dict[str, dict[int, Tensor]]]:
    """One forward call; returns logits and ``{hook name: {pass index: value}}``, the passes each
    hook fired in, keyed by 0-based pass index for every hook (``cache[name][k]`` is pass ``k + 1``;
    a fusion hook of a 3-pass prompt has keys 1 and 2 only). ``torch.stack(list(cache[name].values()))``
    is ``[n_passes, batch, pos, ...]`` for a hook that fired in every pass.

    The multi-pass counterpart of ``run_with_cache`` (``passes=K`` goes in ``forward_kwargs``).
    """
    with ActivationRecorder(model, names) as rec:
        logits = model(tokens, **forward_kwargs)
    return logits, {name: rec.per_pass(name) for name in rec.names if rec.calls(name)}
