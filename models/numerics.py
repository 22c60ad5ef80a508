"""An opt-in numerics guard: non-finite activations are caught where they arise, naming the site.

An overflow does not always stay visible: RMSNorm maps an input whose square overflows to a
*finite* zero (``x * rsqrt(inf) = 0``), the logits become constant and argmax emits id 0. So the
guard looks at the inputs of the norms (their mean square: inf when the square overflows, NaN
when the input holds NaN) and at the readout's logits. Every norm sits in front of something (a
block, the readout, the FBT carried state that ``ln_final`` produces), so a value that becomes
non-finite anywhere in the stack is caught at the next norm, named by its hook-style path.

Records stay on the device. Each model call (``final_states``, ``forward``, ``readout``,
``run_passes``) sums its records into one device scalar, and the sums are read on the host every
``check_every`` calls (default 1: each call; None: only when ``check()`` is called) and when the
guard ends, with one sync for all of them; a decode loop reads them at its own checkpoints, so that
its steps do not wait for the device. The records of the unread calls are kept until then, so a
non-finite value is still named by its first site, step and pass, as if each call had been checked.
The guarded computation is the unguarded one (same operations, same order), so outputs are
bit-identical; with no guard enabled the only cost is an attribute test per norm.

    with guard_numerics(model):
        model(tokens)   # raises NonFiniteActivation naming e.g. "blocks.1.ln1 input", the step and the pass
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from models.layers import RMSNorm


class _Unguarded:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:  # never swallows an exception
        return None


UNGUARDED = _Unguarded()  # what an unguarded model's calls enter


class NonFiniteActivation(RuntimeError):
    """A guarded model computed a value that is not finite. ``what`` names the site and the kind
    (``blocks.1.ln1 input overflowed``), ``step`` the forward call since the guard started (0: the
    first, e.g. a prefill), ``pass_index`` the FBT pass (0-based) or None."""

    def __init__(self, message: str, what: str = "", step: int | None = None, pass_index: int | None = None):
        super().__init__(message)
        self.what, self.step, self.pass_index = what, step, pass_index


class NumericsGuard:
    """Finiteness records of one model's guarded sites. Entered by every model call (``with
    model.guard_scope():``); the records are checked when the outermost call ends."""

    def __init__(self, model, check_every: int | None = 1):
        if check_every is not None and (not isinstance(check_every, int) or check_every < 1):
            raise ValueError(f"check_every={check_every!r}: expected None or an integer >= 1")
        self.model, self.check_every = model, check_every
        self.start = model.forward_calls
        self.pending: list[tuple[str, int, int, Tensor]] = []  # (site, step, pass, value that must be finite)
        self.depth = 0  # nested model calls (forward -> final_states -> run_passes)
        self.unread: list[tuple[list[tuple[str, int, int, Tensor]], Tensor]] = []  # (a call's records, their sum)

    def record(self, site: str, value: Tensor) -> None:
        self.pending.append((site, self.model.forward_calls - self.start - 1, self.model.current_pass, value))

    def __enter__(self) -> NumericsGuard:
        self.depth += 1
        return self

    def __exit__(self, kind, *_) -> None:  # never swallows an exception
        self.depth -= 1
        if kind is not None:  # the call failed anyway: its records go with it
            if not self.depth:
                self.pending.clear()
            return
        self.settle()

    def settle(self) -> None:
        """Sum the records if no model call is still running; read the sums every ``check_every``
        calls."""
        if self.depth or not self.pending:
            return
        pending, self.pending = self.pending, []
        values = [v for *_, v in pending]
        try:  # one call's norms share [batch, pos, 1]; torch.cat promotes a bf16 model's logits to their fp32
            flat = values[0] if len(values) == 1 else torch.cat(values, dim=-1)
        except RuntimeError:  # records of different shapes (e.g. HD's interleaved norms and per-token logits)
            flat = torch.cat([v.reshape(-1) for v in values])
        # a non-finite element makes the sum inf or NaN; a sum of finite values can overflow too,
        # so a non-finite sum is confirmed site by site in ``check``
        self.unread.append((pending, flat.float().sum() if flat.dtype != torch.float64 else flat.sum()))
        if self.check_every is not None and len(self.unread) >= self.check_every:
            self.check()

    def check(self) -> None:
        """Read every unread call's sum on the host (one sync) and raise for the first non-finite
        site, in compute order, of the first call that has one."""
        if not self.unread:
            return
        unread, self.unread = self.unread, []
        sums = unread[0][1] if len(unread) == 1 else torch.stack([total for _, total in unread])
        if bool(torch.isfinite(sums).all()):
            return
        for pending, total in unread:
            if math.isfinite(total.item()):
                continue
            for site, step, pass_index, value in pending:
                if not bool(torch.isfinite(value).all()):
                    raise self._error(site, step, pass_index, value)

    def _error(self, site: str, step: int, pass_index: int | None, value: Tensor) -> NonFiniteActivation:
        kind = "is NaN" if bool(value.isnan().any()) else "overflowed"
        if site == "readout":
            what, pass_index = f"readout logits {'are NaN' if kind == 'is NaN' else kind}", None
        else:  # a norm's mean square: inf when the input's square overflows (or it holds inf)
            what = f"{site} input {kind}"
        if self.model.arch != "fbt":
            pass_index = None
        where = f"at step {step}" + (f", FBT pass {pass_index + 1}" if pass_index is not None else "")
        return NonFiniteActivation(
            f"non-finite activation: {what} {where} (steps count forward calls, 0 = the first, e.g. a prompt's prefill)",
            what,
            step,
            pass_index,
        )


class guard_numerics:
    """``with guard_numerics(model):`` ``model`` checks its norm inputs and logits at every call and
    raises ``NonFiniteActivation`` naming the site, the step (forward calls since the block
    started) and the FBT pass. A nested block numbers its own steps. ``enabled=False`` leaves the
    model as it is. ``check_every``: read on the host every that many calls (None: at the
    guard's ``check()``) and at the block's end; the error, later, names the same site and step. Yields the ``NumericsGuard`` (None when not
    enabled)."""

    def __init__(self, model, enabled: bool = True, check_every: int | None = 1):
        self.model, self.enabled, self.check_every = model, enabled, check_every

    def __enter__(self) -> NumericsGuard | None:
        if not self.enabled:
            return None
        self.outer = self.model.numerics_guard
        self.norms = [(name, m) for name, m in self.model.named_modules() if isinstance(m, RMSNorm)]
        self.guard = NumericsGuard(self.model, self.check_every)
        self._install(self.guard)
        return self.guard

    def __exit__(self, kind, *_) -> None:  # never swallows an exception
        if self.enabled:
            self._install(self.outer)
            if kind is None:  # the calls not read yet
                self.guard.check()

    def _install(self, guard) -> None:
        self.model.numerics_guard = guard
        for name, norm in self.norms:
            norm.guard, norm.site = guard, name
