"""A run's checkpoints: ``save_checkpoint`` commits a step's weights and optimizer state into
``train_state/`` and publishes the run directory's files from it; ``load_checkpoint`` reads back
what the last commit names. A process killed at any point leaves one whole checkpoint."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from models import DecoderLM
from workbench.runtime.checkpoint import load_weights, model_from_weights, save_weights
from workbench.runtime.tokenizer import TokenizerBase
from workbench.storage.errors import BadInput
from workbench.storage.files import link_or_copy, read_json, remove_stale_temps, write_json
from workbench.storage.outputs import MANIFEST, Output
from workbench.training.runconfig import RunConfig

STATE_DIR = "train_state"
RUN = "run"  # the kind of output a run directory is (``workbench.storage.outputs``)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def save_checkpoint(out: Output, model: DecoderLM, opt, cfg: RunConfig, step: int, tokenizer: TokenizerBase) -> None:
    """Write the step's weights and optimizer state into ``train_state/`` under names that carry the
    step, then commit them by writing ``train_state/state.json``; only then publish the run
    directory's ``model.safetensors`` (a hard link), ``config.json`` and tokenizer, and delete older
    steps' files. A process killed at any point leaves state.json naming a complete checkpoint (the
    previous one or this one) and the run directory's files loadable, except in one window: when an
    HD run has just grown its streams, between publishing the weights and the config (a resume
    publishes them again). The files deleted are those of the checkpoint this one supersedes, and
    no other: a checkpoint a user put back into ``train_state/`` stays."""
    state_dir = out.directory / STATE_DIR
    state_dir.mkdir(exist_ok=True)
    superseded = _committed_files(state_dir)
    made = [state_dir]
    if not all((state_dir / name).is_file() for name in TOKENIZER_FILES):  # it never changes: committed once
        tokenizer.save(state_dir)
        made += [state_dir / name for name in TOKENIZER_FILES]
    meta = {"step": str(step)}
    files = {"weights": f"model-{step}.safetensors", "optimizer": f"optimizer-{step}.safetensors"}
    save_weights(state_dir / files["weights"], model.state_dict(), {"arch": model.arch, **meta})
    made.append(state_dir / files["weights"])
    sd = opt.state_dict()
    opt_tensors, scalars = {}, {}
    for idx, state in sd["state"].items():
        for key, value in state.items():
            if torch.is_tensor(value):
                opt_tensors[f"{idx}.{key}"] = value
            else:
                scalars[f"{idx}.{key}"] = value
    save_weights(state_dir / files["optimizer"], opt_tensors, meta)
    made.append(state_dir / files["optimizer"])
    write_json(
        state_dir / "state.json",
        {
            "step": step,
            "n_streams": model.n_streams,
            "model": model.cfg.to_dict(),
            **files,
            "param_groups": sd["param_groups"],
            "scalars": scalars,
        },
    )
    _publish(out, cfg, model.cfg, files, tokenizer, superseded, [*made, state_dir / "state.json"])


def _committed_files(state_dir: Path) -> list[str]:
    """The file names ``state.json`` commits now (none if it is missing or unreadable)."""
    try:
        state = read_json(state_dir / "state.json")
    except (OSError, ValueError):
        return []
    return [name for name in (state.get("weights"), state.get("optimizer")) if isinstance(name, str)]


def _publish(
    out: Output,
    cfg: RunConfig,
    model_cfg,
    files: dict,
    tokenizer: TokenizerBase,
    superseded: Sequence[str] = (),
    made: Sequence[Path] = (),
) -> None:
    """The run directory's files from the committed checkpoint ``files``; then delete the superseded
    checkpoint's files and the temporary files of writes a killed process left behind: only what
    the run's manifest lists, so a file the run did not write stays. The manifest is written once,
    with the published files and the checkpoint's own (``made``), each alone: a folder's other
    files (a user's backup in ``train_state/``) stay unlisted."""
    run_dir = out.directory
    state_dir = run_dir / STATE_DIR
    link_or_copy(state_dir / files["weights"], run_dir / "model.safetensors")
    write_json(run_dir / "config.json", {**cfg.to_dict(), "model": model_cfg.to_dict()})
    tokenizer.save(run_dir, model_cfg.n_ctx)
    for name in set(superseded) - set(files.values()):
        if out.owns(f"{STATE_DIR}/{name}"):
            (state_dir / name).unlink(missing_ok=True)
    published = (run_dir / name for name in ("model.safetensors", "config.json", *TOKENIZER_FILES))
    out.wrote(*made, *published, alone=True)  # and drops what is gone
    remove_stale_temps(run_dir, ["model.safetensors", "config.json", *TOKENIZER_FILES, "metrics.jsonl", MANIFEST])
    remove_stale_temps(state_dir)


def load_checkpoint(
    run_dir: Path,
    cfg: RunConfig,
    device,
    new_optimizer: Callable[[DecoderLM], torch.optim.AdamW],
    tokenizer: TokenizerBase,
    out: Output | None = None,
) -> tuple[DecoderLM, torch.optim.AdamW, int]:
    """The model, optimizer (made by ``new_optimizer``, its state loaded) and step committed by
    ``train_state/state.json``; every problem is an error naming the file. With ``out`` (the
    process that writes the run), the run directory's files (with ``tokenizer``) are published
    again from it, in case the process that wrote it was killed before it had published them."""
    state_dir = run_dir / STATE_DIR
    state_path = state_dir / "state.json"
    state = read_json(state_path)
    step = state.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise BadInput(f"{state_path}: step={step!r}, expected an integer >= 0")
    files = {k: state.get(k) for k in ("weights", "optimizer")}
    if not all(isinstance(f, str) and f and f == Path(f).name for f in files.values()):
        raise BadInput(f"{state_path}: 'weights' and 'optimizer' must name files in {state_dir}, got {files}")
    weights_name, optimizer_name = str(files["weights"]), str(files["optimizer"])  # checked above
    model = model_from_weights(cfg.arch, state.get("model"), state_dir / weights_name, state_path, device)
    opt_path = state_dir / optimizer_name
    tensors, meta = load_weights(opt_path)
    if meta.get("step") != str(step):
        raise BadInput(
            f"inconsistent checkpoint in {run_dir}: {state_path} says step {step}, {opt_path} holds step {meta.get('step')}"
        )
    groups, scalars = state.get("param_groups"), state.get("scalars")
    if not isinstance(groups, list) or not isinstance(scalars, dict):
        raise BadInput(f"{state_path}: 'param_groups' must be a list and 'scalars' an object")
    sd = {"state": {}, "param_groups": groups}
    for key, value in [*tensors.items(), *scalars.items()]:
        idx, _, name = key.partition(".")
        if not idx.isdigit() or not name:
            raise BadInput(f"unexpected optimizer entry {key!r} in {opt_path} or {state_path}")
        sd["state"].setdefault(int(idx), {})[name] = value.to(device) if torch.is_tensor(value) and name != "step" else value
    opt = new_optimizer(model)
    try:
        opt.load_state_dict(sd)
        for p in (p for group in opt.param_groups for p in group["params"]):
            for name, value in opt.state.get(p, {}).items():
                if torch.is_tensor(value) and value.dim() and value.shape != p.shape:
                    raise BadInput(f"{name} has shape {list(value.shape)} for a parameter of shape {list(p.shape)}")
    except (ValueError, KeyError, TypeError, IndexError, RuntimeError) as err:
        raise BadInput(f"the optimizer state in {opt_path} and {state_path} does not fit the model: {err}") from err
    if out is not None:
        _publish(out, cfg, model.cfg, files, tokenizer, made=[state_dir, state_path, state_dir / weights_name, opt_path])
    return model, opt, step


def last_checkpoint_step(run_dir: Path) -> int | None:
    """The step ``train_state/state.json`` commits, if there is one."""
    path = run_dir / STATE_DIR / "state.json"
    return read_json(path)["step"] if path.is_file() else None
