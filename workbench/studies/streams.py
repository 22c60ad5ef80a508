"""Hidden Decoding stream analyses (for the Streams page and notebook of the app issue):
stream-to-stream similarity by layer, attention mass within vs across streams, and a per-stream
logit lens. All on one forward pass of a batch of sequences."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from models import HiddenDecodingLM, unstack_streams
from workbench.data.splits import heldout_task
from workbench.data.tasks import TaskConfig
from workbench.data.windows import IGNORE, TokenStream, batch_windows
from workbench.runtime.activations import ActivationRecorder
from workbench.runtime.tokenizer import TokenizerBase
from workbench.storage.errors import BadInput


def task_windows(
    task: str,
    n_sequences: int,
    seq_len: int,
    seed: int = 0,
    *,
    tokenizer: TokenizerBase,
    data: TaskConfig | None = None,
    completion_only: bool = False,
    example_starts: bool = False,
) -> tuple[Tensor, Tensor]:
    """[n_sequences, seq_len] windows of held-out ``task`` text (a task spec: the held-out stream,
    independent of every training seed's; a prepared corpus's held-out documents), encoded by
    ``tokenizer`` (the run's), and their next-token targets, ``IGNORE`` where a training run with
    ``completion_only`` scored none (prompts). ``data``: the task settings (pass the run's;
    default: the tasks' defaults); ``example_starts``: windows start at problems, as the run's did
    with ``data.windows=example``."""
    if n_sequences < 1 or seq_len < 2:
        raise BadInput(f"n_sequences={n_sequences}, seq_len={seq_len}: expected n_sequences >= 1 and seq_len >= 2")
    examples = heldout_task(task, max(8, n_sequences), seed, data, tokenizer)
    stream = TokenStream.from_examples(examples, tokenizer, completion_only=completion_only, example_starts=example_starts)
    return batch_windows(stream, seed, 0, n_sequences, seq_len)


def _check(model) -> None:
    if "hook_stream_embed" not in model.hook_dict:  # the analyses read per-stream embeddings
        raise BadInput(f"stream analyses need a Hidden Decoding model, got arch {model.arch!r}")


@torch.no_grad()
def stream_similarity(model: HiddenDecodingLM, tokens: Tensor) -> Tensor:
    """[n_layers, n_streams, n_streams]: mean cosine similarity between the streams' residual
    states (``hook_resid_post``) at the same token, per layer."""
    _check(model)
    names = [f"blocks.{i}.hook_resid_post" for i in range(model.cfg.n_layers)]
    with ActivationRecorder(model, names) as rec:
        model(tokens)
    out = []
    for name in names:
        x = F.normalize(unstack_streams(rec.calls(name)[-1].value.float(), model.n_streams), dim=-1)  # [b, L, n, d]
        out.append(torch.einsum("blnd,blmd->nm", x, x) / (x.shape[0] * x.shape[1]))
    return torch.stack(out)


@torch.no_grad()
def attention_mass(model: HiddenDecodingLM, tokens: Tensor) -> dict[int, dict[str, float]]:
    """Per layer: the attention probability a query puts on its own stream, on other streams of
    the same token, and on other streams of earlier tokens (averaged over batch, heads, queries).
    Intra-stream layers put everything on their own stream by construction."""
    _check(model)
    n, L = model.n_streams, tokens.shape[1]
    names = [f"blocks.{i}.attn.hook_pattern" for i in range(model.cfg.n_layers)]
    with ActivationRecorder(model, names) as rec:
        model(tokens)
    stream = torch.arange(n * L) % n
    token = torch.arange(n * L) // n
    out = {}
    for i, name in enumerate(names):
        p = rec.calls(name)[-1].value.float()
        if p.dim() == 5:  # intra-stream layer: [batch, n_streams, heads, L, L]
            out[i] = {"own_stream": 1.0, "other_stream_same_token": 0.0, "other_stream_earlier_tokens": 0.0}
            continue
        same_stream = (stream[:, None] == stream[None, :]).float()
        same_token = (token[:, None] == token[None, :]).float()
        mean = lambda mask, p=p: float((p * mask).sum(-1).mean())
        out[i] = {
            "own_stream": mean(same_stream),
            "other_stream_same_token": mean((1 - same_stream) * same_token),
            "other_stream_earlier_tokens": mean((1 - same_stream) * (1 - same_token)),
        }
    return out


@torch.no_grad()
def stream_logit_lens(model: HiddenDecodingLM, tokens: Tensor, targets: Tensor | None = None) -> dict:
    """Read every stream's final state through the tied readout: per stream, the next-token loss
    and top-1 accuracy against ``targets`` [batch, pos] (default: the next token of ``tokens``),
    over the positions whose target is not ``IGNORE`` (``positions``: how many); the last stream
    is the model's prediction."""
    _check(model)
    if targets is None:
        targets = F.pad(tokens[:, 1:], (0, 1), value=IGNORE)
    logits = model(tokens, all_streams=True).float()  # [batch, pos, n, vocab]
    keep = targets != IGNORE
    if not keep.any():
        raise BadInput("no position is scored in these windows: lengthen them or score all positions")
    picked, target = logits[keep], targets[keep]  # [scored, n, vocab], [scored]
    target = target[:, None].expand(-1, model.n_streams)
    loss = F.cross_entropy(picked.flatten(0, 1), target.flatten(), reduction="none").view(target.shape)
    acc = (picked.argmax(-1) == target).float()
    return {"loss": loss.mean(0).tolist(), "accuracy": acc.mean(0).tolist(), "positions": int(keep.sum())}


@torch.no_grad()
def stream_norms(model: HiddenDecodingLM, tokens: Tensor) -> Tensor:
    """[n_layers + 1, n_streams]: mean residual norm of each stream at the stack input
    (``blocks.0.hook_resid_pre``) and after every block."""
    _check(model)
    names = ["blocks.0.hook_resid_pre", *[f"blocks.{i}.hook_resid_post" for i in range(model.cfg.n_layers)]]
    with ActivationRecorder(model, names) as rec:
        model(tokens)
    return torch.stack(
        [unstack_streams(rec.calls(n)[-1].value.float(), model.n_streams).norm(dim=-1).mean(dim=(0, 1)) for n in names]
    )
