#!/usr/bin/env python3
"""The workbench's SAEs in SAELens, both directions, across two environments (SAELens requires
transformer-lens < 4, which cannot install beside the workbench's 4.x): CI runs it from
``.ci/run``.

    # the workbench's environment: an SAE with its training rows exported, and a reference
    .venv/bin/workbench sae RUN --hook HOOK --saelens-activations --out SAE
    .venv/bin/python scripts/saelens_check.py reference SAE [SAE ...]
    # SAELens's environment (pip install -r .ci/saelens-requirements.txt): no workbench import
    .saelens-venv/bin/python scripts/saelens_check.py check SAE [SAE ...]

``reference`` writes ``SAE/reference.safetensors``: held-out-free sample rows from the export,
and the workbench's latents and reconstruction of them. ``check`` loads the SAE with
``sae_lens.SAE.load_from_disk`` (a TopK SAE as ``TopKSAE``, a BatchTopK one as the ``JumpReLUSAE``
SAELens saves those as) and asserts the same latents and reconstruction (atol 1e-5), loads the
export as SAELens's cached-activations store does (``datasets.load_from_disk``, the hook's column
of shape [context_size, d_in]) and trains SAELens's training SAE of the same recipe
(``TopKTrainingSAE``, ``BatchTopKTrainingSAE`` from the saved threshold) on it with its
``SAETrainer`` for a few steps, from the workbench's weights: the loss stays finite and the
trained SAE saves in SAELens's layout.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REFERENCE = "reference.safetensors"


def reference(sae_dir: Path) -> None:
    import torch
    from datasets import load_from_disk
    from safetensors.torch import save_file

    from workbench.probing.sae import load_sae

    sae, cfg = load_sae(sae_dir)
    hook = cfg["metadata"]["hook_name"]
    ds = load_from_disk(str(sae_dir / "activations")).with_format("torch")
    x = ds[:4][hook].reshape(-1, cfg["d_in"]).float()
    with torch.no_grad():
        z = sae.encode(x)
        save_file({"x": x, "z": z, "x_hat": sae.decode(z)}, str(sae_dir / REFERENCE))
    print(f"wrote {sae_dir / REFERENCE}: {len(x)} rows of {hook}")


def check(sae_dir: Path) -> None:
    import torch
    from datasets import load_from_disk
    from sae_lens import (
        SAE,
        BatchTopKTrainingSAE,
        BatchTopKTrainingSAEConfig,
        JumpReLUSAE,
        TopKSAE,
        TopKTrainingSAE,
        TopKTrainingSAEConfig,
    )
    from sae_lens.config import SAETrainerConfig
    from sae_lens.training.sae_trainer import SAETrainer
    from safetensors.torch import load_file

    # 1. the SAE loads and computes what the workbench computes
    cfg = json.loads((sae_dir / "cfg.json").read_text())
    batchtopk = cfg.get("trained_as") == "batchtopk"
    sae = SAE.load_from_disk(str(sae_dir))
    assert isinstance(sae, JumpReLUSAE if batchtopk else TopKSAE), type(sae)
    ref = load_file(str(sae_dir / REFERENCE))
    with torch.no_grad():
        z = sae.encode(ref["x"])
        torch.testing.assert_close(z, ref["z"], rtol=0, atol=1e-5)
        torch.testing.assert_close(sae.decode(z), ref["x_hat"], rtol=0, atol=1e-5)
    print(f"SAELens {sae.cfg.architecture()} SAE from {sae_dir}: the workbench's latents and reconstruction on {len(z)} rows")

    # 2. the export reads as SAELens's cached activations (load_cached_activation_dataset's checks)
    hook = cfg["metadata"]["hook_name"]
    store = json.loads((sae_dir / "sae.json").read_text())["saelens_activations"]
    ds = load_from_disk(str(sae_dir / store["path"]))
    assert ds.features[hook].shape == (store["context_size"], cfg["d_in"]), ds.features[hook].shape
    ds.set_format(type="torch", columns=[hook, "token_ids"], dtype=torch.float32)
    rows = ds[:][hook].reshape(-1, cfg["d_in"])

    # 3. SAELens trains on it, from the workbench's weights
    shape = dict(d_in=cfg["d_in"], d_sae=cfg["d_sae"], k=cfg["k"], device="cpu")
    if batchtopk:
        training = BatchTopKTrainingSAE(BatchTopKTrainingSAEConfig(**shape))
        training.topk_threshold.fill_(float(sae.threshold[0].detach()))  # one threshold for every latent, as saved
    else:
        training = TopKTrainingSAE(TopKTrainingSAEConfig(**shape))
    weights = {name: w for name, w in sae.state_dict().items() if name != "threshold"}
    missing, _ = training.load_state_dict(weights, strict=False)
    assert not {"W_enc", "W_dec", "b_enc", "b_dec"} & set(missing), missing
    batch, steps = 256, 20
    generator = torch.Generator().manual_seed(0)

    def batches():
        while True:
            yield rows[torch.randint(len(rows), (batch,), generator=generator)]

    trainer = SAETrainer(
        SAETrainerConfig(
            total_training_samples=batch * steps, train_batch_size_samples=batch, lr=1e-3, lr_end=1e-3, device="cpu"
        ),
        training,
        batches(),
    )
    losses = []
    step = trainer.step
    trainer.step = lambda x: losses.append(float((out := step(x)).loss.detach())) or out  # type: ignore[method-assign]
    trained = trainer.fit()
    assert len(losses) == steps and all(map(torch.isfinite, torch.tensor(losses))), losses
    out = sae_dir / "saelens_trained"
    trained.save_inference_model(str(out))  # what SAELens loads for use: BatchTopK as a JumpReLU
    again = SAE.load_from_disk(str(out))
    assert again.cfg.d_sae == cfg["d_sae"]
    print(f"SAELens trained {steps} steps of {batch} rows on {sae_dir / store['path']}: loss {losses[0]:.4g} -> {losses[-1]:.4g}")


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("reference", "check"):
        raise SystemExit(__doc__)
    for directory in sys.argv[2:]:
        {"reference": reference, "check": check}[sys.argv[1]](Path(directory))
