"""Sparse autoencoders: what features a hook's activations (FBT's carried state, its fused input,
HD's streams) are made of; each latent's density and the contexts where it fires most."""

from pathlib import Path

import pandas as pd
import streamlit as st

from app import jobs
from app.charts import latent_densities
from app.state import find, pick_run, runs, shown_errors
from workbench.probing.sae_study import LATENTS, N_SEQUENCES, REPORT, default_out
from workbench.probing.study import default_hooks
from workbench.storage.files import read_json
from workbench.storage.shapes import check_shape

# what the page reads of the report and the latents ``workbench sae`` writes
REPORT_SHAPE = {
    "test": {"explained": float, "l0": float, "dead": int, "mse": float},
    "settings": {"k": int, "d_sae": int},
    "rows": {"train": int, "test": int},
    "n_sequences": int,
    "task": (str, None),
}
CONTEXT = {"activation": float, "before": str, "token": str}
LATENTS_SHAPE = {"latents": [{"latent": int, "density": float, "top": [CONTEXT]}]}
CARRIED = "ln_final.hook_normalized"  # the last layer's state: what FBT carries to the next position


def saved_sae(directory: Path) -> tuple[dict, pd.DataFrame]:
    """The report and latents ``workbench sae`` wrote in ``directory``, the latents as a table
    (latent, density, and the top context written out); ``BadInput`` naming the file and field
    when they are not what it writes."""
    report, latents = read_json(directory / REPORT), read_json(directory / LATENTS)
    check_shape(report, REPORT_SHAPE, directory / REPORT)
    check_shape(latents, LATENTS_SHAPE, directory / LATENTS)
    rows = latents["latents"]
    table = pd.DataFrame(
        {
            "latent": [r.get("latent") for r in rows],
            "density": [r.get("density") for r in rows],
            "top activation": [r["top"][0]["activation"] if r["top"] else 0.0 for r in rows],
            "top contexts": [" | ".join(f"{c['before']}[{c['token']}]" for c in r["top"][:4]) for r in rows],
        }
    )
    return report, table


st.title("Sparse autoencoders")
st.caption(
    "A TopK sparse autoencoder on one hook's activations over the run's held-out problems: which directions "
    "the state is made of, how often each fires, and where. Saved in SAELens's layout."
)
run = pick_run("Run", key="sae_run", default=find(runs(), "fbt"))
if run is None:
    st.stop()
hooks = [CARRIED, *default_hooks(run.config["model"]["n_layers"])]
c1, c2, c3 = st.columns(3)
hook = c1.selectbox(
    "Hook",
    hooks,
    key="sae_hook",
    help=f"{CARRIED}: the carried state (FBT feeds it back one position later); blocks.0.hook_resid_pre: the (fused) "
    "input to block 0",
)
prefill, passes = "standard", 1
if run.arch == "fbt":
    prefill = c2.selectbox("Prefill", ["standard", "recurrent"], index=1, key="sae_prefill")
    if prefill == "recurrent":
        passes = int(c3.selectbox("Recurrent prefill K", [2, 3, 4, 8], key="sae_passes"))
n_sequences = st.number_input("Sequences", min_value=10, max_value=20000, value=N_SEQUENCES, step=64, key="sae_n")

out = default_out(run.path, hook, prefill, passes, None)
previous = (out / REPORT).exists()
busy = jobs.running("sae", out)
label = "Retrain the SAE (replaces the saved one)" if previous else "Train an SAE"
if st.button(label, key="sae_train", type="primary", disabled=bool(busy)):
    argv = ["sae", str(run.path), "--hook", hook, "--prefill", prefill, "--passes", str(passes), "--n", str(int(n_sequences))]
    argv += ["--overwrite"] if previous else []
    if jobs.start(argv, title=f"SAE on {hook} of {run.name}", page="sae", outputs=[out]):
        st.rerun()
jobs.panel("sae")
if busy:
    st.info(f"Training an SAE on {hook} of {run.name}: it appears here when the job is done.")
    st.stop()
if not previous:
    st.info(f"No saved SAE for {hook} ({prefill}) on {run.name}: press **Train an SAE**.")
    st.stop()

report = None
with shown_errors(f"Reading the saved SAE {out}"):
    report, table = saved_sae(out)
if report is None:
    st.stop()
test, settings = report["test"], report["settings"]
cols = st.columns(4)
cols[0].metric("Variance explained", f"{test['explained']:.3f}", help="1 - squared error / variance, on held-out rows")
cols[1].metric("L0", f"{test['l0']:.1f}", help=f"active latents a row (k = {settings['k']})")
cols[2].metric("Dead latents", f"{test['dead']} of {settings['d_sae']}", help="fire on none of the held-out rows")
cols[3].metric("MSE", f"{test['mse']:.3g}")
st.caption(
    f"Saved in {out} ({report['rows']['train']:,} training and {report['rows']['test']:,} held-out rows of "
    f"{report['n_sequences']} sequences, task {report['task']}); load it in SAELens with SAE.load_from_disk."
)
st.subheader("Latents by density")
alive = table[table["density"] > 0].sort_values("density", ascending=False)
st.altair_chart(latent_densities(alive), width="stretch")
st.caption("Each latent's top contexts: the tokens before the position, and [the token at it], strongest first.")
st.dataframe(alive, hide_index=True, width="stretch")
