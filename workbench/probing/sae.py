"""Sparse autoencoders on any hook the activation store holds (FBT's carried state
``fusion.hook_state``, its fused input, HD's per-stream residuals ...): what features a state is
made of, where a probe asks only whether one is there.

The recipe is the TopK autoencoder of Gao et al. 2024 ("Scaling and evaluating sparse
autoencoders"), as SAELens and dictionary_learning document it:

    z = TopK_k(ReLU((x - b_dec) W_enc + b_enc))     x_hat = z W_dec + b_dec

(``x``: [batch, d_in]; ``W_enc``: [d_in, d_sae]; ``W_dec``: [d_sae, d_in]), trained on the mean
squared error with Adam. The decoder's rows (the latents' directions) are kept at unit norm: the
gradient's component along each row is removed before a step and the rows renormalised after it,
so a latent's activation is its coefficient. ``b_dec`` starts at the data's mean, ``W_enc`` as
``W_dec``'s transpose. Latents that have not fired for ``dead_after`` training rows are dead; the
auxiliary loss (AuxK) has the ``k_aux`` largest of them reconstruct the main reconstruction's
error, scaled by ``aux_coefficient``, which brings them back. Activations are scaled to a mean
squared norm of ``d_in`` while training (the scale is recorded) and the saved weights are those
of the same function on the raw activations.

``architecture="batchtopk"`` (Bussmann et al. 2024, "BatchTopK Sparse Autoencoders"; SAELens's
``batchtopk``) keeps the ``k x rows`` largest activations of each training batch wherever they
fall, so a row may use more latents or fewer, k on average; a threshold follows the running mean
(rate ``threshold_lr``) of each batch's smallest kept activation, and after training the SAE
encodes as a JumpReLU at it, ``z = pre * (pre > threshold)``, with no batch in sight.

Saved in SAELens's on-disk layout: ``sae_weights.safetensors`` (``W_enc``, ``W_dec``, ``b_enc``,
``b_dec``; a BatchTopK SAE also ``threshold``, [d_sae]) and ``cfg.json`` (architecture ``topk``,
or ``jumprelu`` for a BatchTopK SAE as SAELens saves one, with ``trained_as``; ``k``, ``d_in``,
``d_sae``, and the workbench's run, hook, prefill and passes in ``metadata``), so
``sae_lens.SAE.load_from_disk`` loads it.
``workbench sae`` (``sae_study``) adds its report and the latents' top contexts beside them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from workbench.runtime.config import check_fits
from workbench.storage.errors import BadInput, MissingFile
from workbench.storage.files import read_json, write_json

WEIGHTS, CONFIG = "sae_weights.safetensors", "cfg.json"  # SAELens's names
EVAL_ROWS = 8192  # rows an evaluation encodes at once
SAVED_AS = {"topk": "topk", "batchtopk": "jumprelu"}  # each architecture and SAELens's inference one of it
ARCHITECTURES = tuple(SAVED_AS)


@dataclass
class SAEConfig:
    d_in: int
    d_sae: int  # latents
    k: int  # active latents per row (batchtopk: on average over a training batch)
    architecture: str = "topk"  # or "batchtopk"
    lr: float = 2e-4 * 16  # Gao et al.'s 2e-4 / sqrt(d_sae / 2**14), at a small d_sae: set per use
    batch_size: int = 1024
    steps: int = 2000
    seed: int = 0
    k_aux: int | None = None  # dead latents in the auxiliary loss (default d_in // 2)
    aux_coefficient: float = 1 / 32
    dead_after: int = 200_000  # rows without firing before a latent counts as dead in training
    threshold_lr: float = 0.01  # batchtopk: the rate of the threshold's running mean (SAELens's)
    metadata: dict = field(default_factory=dict)  # what the activations are: run, hook, prefill, passes

    def __post_init__(self) -> None:
        for name in ("d_in", "d_sae", "k", "batch_size", "steps"):
            if getattr(self, name) < 1:
                raise BadInput(f"SAE field {name}={getattr(self, name)!r}: expected an integer >= 1")
        if self.k > self.d_sae:
            raise BadInput(f"SAE field k={self.k}: expected at most d_sae={self.d_sae} active latents")
        if not (0 < self.lr <= 1):
            raise BadInput(f"SAE field lr={self.lr!r}: expected a number in (0, 1]")
        if self.architecture not in ARCHITECTURES:
            raise BadInput(f"SAE field architecture={self.architecture!r}: expected one of {', '.join(ARCHITECTURES)}")
        if not (0 < self.threshold_lr <= 1):
            raise BadInput(f"SAE field threshold_lr={self.threshold_lr!r}: expected a number in (0, 1]")

    def check_training_fits(self, device=None) -> None:
        """Refuse (``BadInput``) an SAE whose training cannot fit in memory, before any work."""
        check_fits(
            lambda s: sae_training_bytes(self.d_in, s["d_sae"], s["batch_size"]),
            {"d_sae": self.d_sae, "batch_size": self.batch_size},
            "training an SAE (weights, gradients, AdamW's moments and a batch's latents)",
            reference={"d_sae": 16 * self.d_in, "batch_size": 1024},
            labels={"d_sae": "latents (--expansion x d_model)", "batch_size": "batch_size"},
            device=device,
        )


def sae_training_bytes(d_in: int, d_sae: int, batch_size: int) -> int:
    """A lower bound on the bytes training takes: float32 weights, gradients and AdamW's two moments
    of both matrices, and four [rows, d_sae] tensors (pre-activations, the kept latents and their
    gradients) of the larger of a training batch and an evaluation chunk."""
    parameters = 2 * d_in * d_sae + d_sae + d_in
    return 16 * parameters + 4 * 4 * max(batch_size, EVAL_ROWS) * d_sae


class SparseAutoencoder(nn.Module):
    """TopK (``threshold`` None) or, once trained as BatchTopK, a JumpReLU at ``threshold``."""

    def __init__(self, d_in: int, d_sae: int, k: int, generator: torch.Generator | None = None, threshold: float | None = None):
        super().__init__()
        self.k = k
        self.threshold: Tensor | None  # [d_sae]: a buffer, saved beside the weights
        self.register_buffer("threshold", None if threshold is None else torch.full((d_sae,), float(threshold)))
        W_dec = torch.randn(d_sae, d_in, generator=generator)
        W_dec = W_dec / W_dec.norm(dim=1, keepdim=True)
        self.W_dec = nn.Parameter(W_dec)  # [d_sae, d_in]
        self.W_enc = nn.Parameter(W_dec.t().clone())  # [d_in, d_sae]
        self.b_enc = nn.Parameter(torch.zeros(d_sae))  # [d_sae]
        self.b_dec = nn.Parameter(torch.zeros(d_in))  # [d_in]

    def pre_activations(self, x: Tensor) -> Tensor:
        """ReLU((x - b_dec) W_enc + b_enc): [batch, d_sae], before the TopK."""
        return torch.relu((x - self.b_dec) @ self.W_enc + self.b_enc)

    def encode(self, x: Tensor) -> Tensor:
        """The latents: each row's ``k`` largest pre-activations (TopK) or those above the
        threshold (a trained BatchTopK SAE), the rest 0. [batch, d_sae]"""
        pre = self.pre_activations(x)
        if self.threshold is not None:
            return pre * (pre > self.threshold)
        top = pre.topk(self.k, dim=-1)
        return torch.zeros_like(pre).scatter(-1, top.indices, top.values)

    def decode(self, z: Tensor) -> Tensor:
        return z @ self.W_dec + self.b_dec

    def forward(self, x: Tensor) -> Tensor:
        return self.decode(self.encode(x))

    @torch.no_grad()
    def normalize_decoder(self) -> None:
        self.W_dec /= self.W_dec.norm(dim=1, keepdim=True).clamp_min(1e-12)

    @torch.no_grad()
    def remove_parallel_gradient(self) -> None:
        """Drop the component of each decoder row's gradient along the row (a unit-norm row can
        only turn)."""
        if self.W_dec.grad is not None:
            rows = self.W_dec / self.W_dec.norm(dim=1, keepdim=True).clamp_min(1e-12)
            self.W_dec.grad -= (self.W_dec.grad * rows).sum(dim=1, keepdim=True) * rows


@dataclass
class SAEReport:
    """An SAE's fit on a set of rows: ``mse`` (mean over rows of the squared error, summed over
    d_in), ``fvu`` (the fraction of variance unexplained: squared error over squared distance to
    the rows' mean, both summed over all rows), ``explained`` = 1 - fvu, ``l0`` (mean active
    latents a row), ``dead`` (latents that fire on none of the rows, and their fraction),
    ``density`` per latent (the fraction of rows it fires on)."""

    mse: float
    fvu: float
    explained: float
    l0: float
    dead: int
    dead_fraction: float
    rows: int
    density: list[float]

    def summary(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "density"}


def batch_topk(pre: Tensor, k: int) -> Tensor:
    """BatchTopK's training activation: the ``k x rows`` largest of the batch's ReLU
    pre-activations ``pre`` [rows, d_sae], wherever they are, the rest 0."""
    top = pre.flatten().topk(k * len(pre))
    return torch.zeros_like(pre).flatten().scatter(0, top.indices, top.values).view_as(pre)


@torch.no_grad()
def evaluate_sae(sae: SparseAutoencoder, x: Tensor, batch_size: int = EVAL_ROWS) -> SAEReport:
    squared, fired, active = 0.0, torch.zeros(sae.W_dec.shape[0], dtype=torch.long), 0
    for start in range(0, len(x), batch_size):
        rows = x[start : start + batch_size]
        z = sae.encode(rows)
        squared += float(((sae.decode(z) - rows) ** 2).sum())
        fired += (z > 0).sum(dim=0)
        active += int((z > 0).sum())
    total = float(((x - x.mean(dim=0)) ** 2).sum())
    fvu = squared / total if total > 0 else float("nan")
    dead = int((fired == 0).sum())
    return SAEReport(
        mse=squared / len(x),
        fvu=fvu,
        explained=1 - fvu,
        l0=active / len(x),
        dead=dead,
        dead_fraction=dead / len(fired),
        rows=len(x),
        density=(fired.double() / len(x)).tolist(),
    )


def train_sae(x: Tensor, cfg: SAEConfig) -> tuple[SparseAutoencoder, dict]:
    """Train an SAE (``cfg.architecture``) on the rows ``x`` [rows, d_in] (float32, on the CPU or a
    GPU); returns it, working on raw activations, and the training record (the activation scale,
    the loss curve every 1/20th of the steps with the dead latents seen; BatchTopK's threshold)."""
    if x.ndim != 2 or x.shape[1] != cfg.d_in:
        raise BadInput(f"SAE rows of shape {tuple(x.shape)}: expected [rows, d_in={cfg.d_in}]")
    if len(x) < 2:
        raise BadInput(f"{len(x)} activation rows: an SAE needs at least 2")
    x = x.float()
    generator = torch.Generator().manual_seed(cfg.seed)
    scale = math.sqrt(cfg.d_in / float((x**2).sum(dim=1).mean()))  # E||s x||^2 = d_in
    xs = x * scale
    sae = SparseAutoencoder(cfg.d_in, cfg.d_sae, cfg.k, generator).to(x.device)
    threshold = torch.zeros((), dtype=torch.float64, device=x.device)  # batchtopk's running mean
    with torch.no_grad():
        sae.b_dec.copy_(xs.mean(dim=0))
    opt = torch.optim.Adam(sae.parameters(), lr=cfg.lr, betas=(0.9, 0.999))
    k_aux = cfg.k_aux or max(1, cfg.d_in // 2)
    since_fired = torch.zeros(cfg.d_sae, dtype=torch.long, device=x.device)  # rows since each latent last fired
    curve, every = [], max(1, cfg.steps // 20)
    for step in range(cfg.steps):
        idx = torch.randint(len(xs), (min(cfg.batch_size, len(xs)),), generator=generator).to(x.device)
        rows = xs[idx]
        pre = sae.pre_activations(rows)
        if cfg.architecture == "batchtopk":
            z = batch_topk(pre, cfg.k)
            with torch.no_grad():  # the threshold follows the smallest activation kept, read on the device
                smallest = torch.where(z > 0, z, torch.inf).min().double()  # inf: nothing kept, no update
                moved = (1 - cfg.threshold_lr) * threshold + cfg.threshold_lr * smallest
                threshold = torch.where(smallest.isfinite(), moved, threshold)
        else:
            top = pre.topk(cfg.k, dim=-1)
            z = torch.zeros_like(pre).scatter(-1, top.indices, top.values)
        x_hat = sae.decode(z)
        error = rows - x_hat
        loss = (error**2).sum(dim=-1).mean()
        fired = (z > 0).any(dim=0)
        since_fired = torch.where(fired, 0, since_fired + len(rows))
        dead = since_fired >= cfg.dead_after
        aux = torch.zeros((), device=x.device)
        if bool(dead.any()):
            # the dead latents' largest pre-activations reconstruct the error (no b_dec: it is in x_hat)
            dead_pre = pre.masked_fill(~dead, 0.0)
            top_dead = dead_pre.topk(min(k_aux, int(dead.sum())), dim=-1)
            z_dead = torch.zeros_like(pre).scatter(-1, top_dead.indices, top_dead.values)
            aux_hat = z_dead @ sae.W_dec
            target = error.detach()
            aux = ((target - aux_hat) ** 2).sum(dim=-1).mean() / (target**2).sum(dim=-1).mean().clamp_min(1e-12)
        opt.zero_grad(set_to_none=True)
        (loss + cfg.aux_coefficient * aux).backward()
        sae.remove_parallel_gradient()
        opt.step()
        sae.normalize_decoder()
        if step % every == 0 or step == cfg.steps - 1:
            curve.append({"step": step + 1, "mse": float(loss.detach()), "aux": float(aux.detach()), "dead": int(dead.sum())})
    record: dict = {"activation_scale": scale, "curve": curve}
    if cfg.architecture == "batchtopk":  # the pre-activations, and so the threshold, are those of the raw rows too
        sae.threshold = torch.full((cfg.d_sae,), float(threshold), device=x.device)
        record["threshold"] = float(threshold)
    return unscaled(sae, scale), record


@torch.no_grad()
def unscaled(sae: SparseAutoencoder, scale: float) -> SparseAutoencoder:
    """The SAE trained on activations times ``scale`` as the same function of the raw activations:
    the same latents (``W_enc`` times ``scale``, ``b_dec`` over it: the same pre-activations, so
    the same threshold) and the raw reconstruction (``W_dec`` over ``scale``)."""
    raw = SparseAutoencoder(sae.W_enc.shape[0], sae.W_enc.shape[1], sae.k)
    raw.threshold = None if sae.threshold is None else sae.threshold.detach().clone()
    raw.W_enc.copy_(sae.W_enc * scale)
    raw.b_enc.copy_(sae.b_enc)
    raw.W_dec.copy_(sae.W_dec / scale)
    raw.b_dec.copy_(sae.b_dec / scale)
    return raw.to(sae.W_enc.device)


def save_sae(sae: SparseAutoencoder, directory: str | Path, cfg: SAEConfig) -> list[Path]:
    """Write ``sae`` into the existing ``directory`` in SAELens's layout; returns the two files."""
    directory = Path(directory)
    weights = {n: p.detach().cpu().contiguous() for n, p in sae.state_dict().items()}
    save_file(weights, str(directory / WEIGHTS))
    write_json(
        directory / CONFIG,
        {
            "architecture": SAVED_AS[cfg.architecture],
            "trained_as": cfg.architecture,
            "d_in": cfg.d_in,
            "d_sae": cfg.d_sae,
            "k": cfg.k,
            "dtype": "float32",
            "device": "cpu",
            "apply_b_dec_to_input": True,
            "normalize_activations": "none",
            "reshape_activations": "none",
            "metadata": cfg.metadata,
        },
    )
    return [directory / WEIGHTS, directory / CONFIG]


def load_sae(directory: str | Path) -> tuple[SparseAutoencoder, dict]:
    """An SAE saved by ``save_sae`` (or a TopK or JumpReLU SAE in SAELens's layout with a ``k``)
    and its ``cfg.json``."""
    directory = Path(directory)
    for name in (WEIGHTS, CONFIG):
        if not (directory / name).is_file():
            raise MissingFile(f"no SAE at {directory} (missing {name})")
    cfg = read_json(directory / CONFIG)
    if cfg.get("architecture") not in SAVED_AS.values():
        raise BadInput(f"{directory / CONFIG}: architecture {cfg.get('architecture')!r}, expected 'topk' or 'jumprelu'")
    weights = load_file(str(directory / WEIGHTS))
    jumprelu = cfg["architecture"] == "jumprelu"
    sae = SparseAutoencoder(int(cfg["d_in"]), int(cfg["d_sae"]), int(cfg["k"]), threshold=0.0 if jumprelu else None)
    expected = {n: tuple(p.shape) for n, p in sae.state_dict().items()}
    found = {n: tuple(t.shape) for n, t in weights.items()}
    if found != expected:
        raise BadInput(f"{directory / WEIGHTS}: tensors {found}, expected {expected} for its cfg.json")
    sae.load_state_dict(weights)
    return sae, cfg
