"""One prompt, generated under a regime, with per-token statistics of the feedback path and an
optional intervention (what the app's Playground page shows).

Interventions, applied through hook points at every forward call of the generation:
- FBT ``state_scale``: the carried state ``h_{t-1}`` entering the fusion is multiplied by it
  (0 removes the feedback, 1 changes nothing);
- HD ``ablate_stream``: that stream's embedding is zeroed at every token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from models import DecoderLM
from workbench.runtime.activations import ActivationRecorder
from workbench.runtime.decoding import generate
from workbench.runtime.tokenizer import CharTokenizer, TokenizerBase
from workbench.storage.errors import BadInput

FED_BACK = ("soft", "fused")  # the regimes whose steps take the carried state back in; standard has none


@dataclass
class Intervention:
    state_scale: float = 1.0
    ablate_stream: int | None = None

    def changes(self, regime: str) -> bool:
        """Whether this intervention can change a generation under ``regime``: the carried state
        enters only the fed-back regimes; a stream's embedding enters every one."""
        return self.ablate_stream is not None or (self.state_scale != 1.0 and regime in FED_BACK)

    def hooks(self, model: DecoderLM) -> list[tuple[str | Callable, Callable]]:
        hooks = []
        if self.state_scale != 1.0:
            if "fusion.hook_state" not in model.hook_dict:
                raise BadInput(
                    f"state_scale={self.state_scale} needs an FBT model (it scales the carried state), got arch {model.arch!r}"
                )
            scale = self.state_scale
            hooks.append(("fusion.hook_state", lambda x, hook: x * scale))
        if self.ablate_stream is not None:
            if "hook_stream_embed" not in model.hook_dict:
                raise BadInput(f"ablate_stream={self.ablate_stream} needs a Hidden Decoding model, got arch {model.arch!r}")
            if not 0 <= self.ablate_stream < model.n_streams:
                raise BadInput(f"ablate_stream={self.ablate_stream}: expected a stream index 0..{model.n_streams - 1}")
            s = self.ablate_stream

            def ablate(x, hook):  # [batch, pos, n_streams, d_model]
                x = x.clone()
                x[:, :, s] = 0
                return x

            hooks.append(("hook_stream_embed", ablate))
        return hooks


@torch.no_grad()
def inspect_generation(
    model: DecoderLM,
    prompt: str,
    *,
    regime: str = "standard",
    passes: int | str = 2,
    max_new_tokens: int = 48,
    intervention: Intervention | None = None,
    tokenizer: TokenizerBase | None = None,
    stop_at_eos: bool = True,
) -> dict:
    """Greedy generation of one prompt; per generated token: its text, the norm of the state that
    produced it and, for FBT's fed-back steps, the gate ``sigmoid(W_G e)``'s mean and its spread over
    d_model (``gate_sd``: a mean near 0.5 says nothing of which features pass) and the value-path
    norm ``||W_U h||`` with which the token re-entered the stack (None where it did not)."""
    tokenizer = tokenizer or CharTokenizer()
    if not prompt:
        raise BadInput("the prompt is empty: type some text to continue")
    ids = tokenizer.encode(prompt)
    budget = min(max_new_tokens, model.cfg.n_ctx - len(ids))
    if budget < 1:
        raise BadInput(f"the prompt has {len(ids)} tokens, which leaves no room in the context n_ctx={model.cfg.n_ctx}")
    intervention = intervention or Intervention()
    names = ["fusion.hook_gate", "fusion.hook_value"] if "fusion.hook_gate" in model.hook_dict else []
    with model.hooks(fwd_hooks=intervention.hooks(model)), ActivationRecorder(model, names) as rec:
        out = generate(
            model,
            [ids],
            regime=regime,
            passes=passes,
            max_new_tokens=budget,
            eos_token_id=tokenizer.eos_id if stop_at_eos else None,
            pad_token_id=tokenizer.pad_id,
        )
    n = int(out.lengths[0])
    new = out.new_tokens[0, :n].tolist()
    gate: list[float | None] = [None] * n
    spread: list[float | None] = [None] * n
    value: list[float | None] = [None] * n
    if names and regime != "standard":
        # the token generated at step j re-enters the stack at forward call j + 1 (call 0 is the prefill)
        last = {name: {r.step: r.value for r in rec.calls(name)} for name in names}
        for j in range(n):
            if j + 1 in last["fusion.hook_gate"]:
                g = last["fusion.hook_gate"][j + 1][0, -1].float()  # [d_model]
                gate[j], spread[j] = float(g.mean()), float(g.std())
                value[j] = float(last["fusion.hook_value"][j + 1][0, -1].float().norm())
    return {
        "regime": regime,
        "passes": passes,
        "prompt": prompt,
        "ids": new,
        "tokens": [tokenizer.decode([i], skip_special=False) for i in new],
        "text": tokenizer.decode(new),
        "state_norm": out.states[0, :n].float().norm(dim=-1).tolist(),
        "gate_mean": gate,
        "gate_sd": spread,
        "value_norm": value,
        "finished": bool(out.finished[0]),
        "intervention": {"state_scale": intervention.state_scale, "ablate_stream": intervention.ablate_stream},
    }
