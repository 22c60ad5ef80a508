"""Feedback dynamics: long rollouts, perturbation growth, Jacobian spectra, fixed points and
K-pass convergence of FBT runs, side by side."""

import math

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st
import torch

from app import jobs
from app.state import default_prompt, find, follow, input_warnings, pick_run, runs, shown_errors
from workbench.dynamics.defaults import DEFAULTS
from workbench.dynamics.study import read_study, state_pca

st.title("Feedback dynamics")
st.caption(
    "The soft regime feeds each step's carried state back: is that map contracting, over how long a horizon, "
    "and does the K-pass training iteration converge to the exact recurrence?"
)
chosen = pick_run(
    "FBT runs (two: side by side)",
    archs=("fbt",),
    needs="these analyses follow the carried state an FBT model feeds back, which baseline runs "
    "(imported pretrained models included) and HD runs do not have",
    key="dyn_runs",
    multiple=True,
    default=find(runs(), "fbt", "fbt-3pass0", "fbt-seed1")[:2],  # beside the zoo's: no 3-pass batches, or a seed
    max_selections=2,
)
if not chosen:
    st.stop()
c1, c2, c3 = st.columns(3)
# the CLI's defaults (workbench.dynamics.defaults): the same analysis from either side
horizon = c1.number_input(
    "Horizon (steps)", min_value=10, max_value=10_000, value=DEFAULTS["horizon"], step=100, key="dyn_horizon"
)
perturb_at = c2.number_input("Perturb at step", min_value=1, max_value=1000, value=DEFAULTS["perturb_at"], key="dyn_perturb")
max_passes = c3.number_input(
    "K-pass convergence up to K", min_value=2, max_value=16, value=DEFAULTS["max_passes"], key="dyn_passes"
)
with st.expander("Spectra and fixed points"):
    d1, d2, d3 = st.columns(3)
    n_spectra = d1.number_input("Steps with a spectrum", 1, 12, DEFAULTS["n_spectra"], key="dyn_spectra")
    n_starts = d2.number_input("Fixed-point starts", 2, 64, DEFAULTS["n_starts"], key="dyn_starts")
    fp_steps = d3.number_input("Fixed-point Newton iterations", 2, 500, DEFAULTS["fp_steps"], key="dyn_fp_steps")
own = {run.name: default_prompt(run) for run in chosen}
first = own[chosen[0].name] or ""
follow("dyn_prompt", tuple(own.items()), first)
prompt = st.text_area(
    "Prompt",
    key="dyn_prompt",
    height=68,
    help="By default each run continues the first held-out problem of its own task; an edited prompt is given to every run.",
)
if not prompt:
    st.error("The prompt is empty: the rollout continues a prompt.")
    st.stop()
by_hand = prompt != first
if by_hand:
    input_warnings(chosen, prompt=prompt)
elif len(chosen) > 1 and len(set(own.values())) > 1:
    st.caption("Each run continues the first held-out problem of its own task (shown: the first run's).")
if perturb_at >= horizon:
    st.error(f"Perturb at step {perturb_at} must come before the horizon ({horizon} steps).")
    st.stop()


# the analysis runs as a background job (the CLI's ``dynamics``) into a directory named by its
# inputs (the runs' weights included): the same inputs show the saved analysis at once
names = [run.name for run in chosen]  # paths under the runs root: micro/fbt and quick/fbt compare
settings = {
    "--horizon": int(horizon),
    "--perturb-at": int(perturb_at),
    "--spectra": int(n_spectra),
    "--fixed-points": DEFAULTS["n_fixed"],
    "--starts": int(n_starts),
    "--fp-steps": int(fp_steps),
    "--max-passes": int(max_passes),
    **({"--prompt": prompt} if by_hand else {}),
}
out = jobs.keyed_output("dynamics", chosen, settings)
jobs.panel("dynamics")
if not (out / "dynamics.json").is_file():
    if jobs.running("dynamics", out):
        st.info(f"Analysing {', '.join(names)}: the results appear here when the job is done.")
    elif st.button("Analyse", key="dyn_run", type="primary"):
        argv = ["dynamics", *(str(r.path) for r in chosen), "--out", str(out), "--names", *names]
        argv += [str(part) for option, value in settings.items() for part in (option, value)]
        if jobs.start(argv, title=f"Dynamics of {', '.join(names)}", page="dynamics", outputs=[out]):
            st.rerun()
    else:
        st.info(
            "Press **Analyse**: a rollout, its Jacobian spectra, fixed points and K-pass convergence take seconds to "
            f"minutes per run (here {int(horizon)} steps). Saved analyses of the same inputs show at once."
        )
    st.stop()

results = {}
with shown_errors("Reading the analysis"):
    saved = read_study(out, names)
    results = {name: (saved[name][0], saved[name][1].numpy()) for name in names}
    st.caption(f"Saved analysis: {out}")
if not results:
    st.stop()

columns = st.columns(len(results))
for col, (name, (r, states)) in zip(columns, results.items()):
    with col:
        st.subheader(name)
        source = r.get("input") or {}
        if "warning" in source:
            st.warning(source["warning"], icon=":material/warning:")
        elif source:
            st.caption(f"Input: {source['input_task']}, the run's own task ({r['prompt'][:60]!r}).")
        if r["stopped"]:
            st.warning(f"Rollout stopped: {r['stopped']}")
        lyap, tangent, full = r["lyapunov"], r.get("lyapunov_tangent", {}), r.get("lyapunov_tangent_full", {})
        for box, (T, value) in zip(st.columns(len(lyap)), lyap.items()):
            box.metric(
                f"λ({T})",
                f"{tangent[T][0]:+.3f}" if T in tangent else f"{value:+.3f}",
                delta=(f"whole step {full[T][0]:+.3f} · " if T in full else "") + f"perturbation {value:+.3f}"
                if T in tangent
                else None,
                delta_color="off",
                delta_arrow="off",  # a second estimate beside the first, not a change up or down
                help="leading Lyapunov exponent over T steps from tangent vectors through the feedback maps F_t (the "
                "context frozen; JVPs, renormalised: no round-off floor); below it, the same through the whole decoding "
                "step (the tangent also in the cached keys and values) and the finite-perturbation estimate "
                "log(||δh_T|| / ||δh_0||) / T, the nonlinear measure",
            )
        if tangent:
            last = list(tangent)[-1]
            st.caption(
                f"leading {len(tangent[last])} exponents at T={last}: through F_t "
                + ", ".join(f"{v:+.3f}" for v in tangent[last])
                + ("; through the whole step " + ", ".join(f"{v:+.3f}" for v in full[last]) if last in full else "")
            )
        last = r["kpass"]["rows"][-1]
        st.metric(
            f"K-pass relative residual at K={last['passes']}",
            f"{last['relative_residual']:.2e}",
            help="||H^K - H^(K-1)|| / ||H^K|| over the whole sequence: 0 when the iteration has converged",
        )

        steps = pd.DataFrame(
            {
                "step": range(len(r["per_step"]["state_norm"])),
                "||h|| (carried state)": r["per_step"]["state_norm"],
                "||u|| (fused input)": r["per_step"]["input_norm"],
            }
        )
        st.markdown("**Norms over the rollout**")
        st.line_chart(steps, x="step", height=220)

        ratio = r["per_step"]["perturbation_ratio"]
        growth = pd.DataFrame({"step": np.arange(len(ratio)) + r["perturb_at"], "ratio": np.clip(ratio, 1e-12, None)})
        st.markdown("**Perturbation growth** ||δh_t|| / ||δh_t0||")
        chart = (
            alt.Chart(growth).mark_line().encode(x="step:Q", y=alt.Y("ratio:Q", scale=alt.Scale(type="log"), title="ratio (log)"))
        )
        st.altair_chart(
            chart + alt.Chart(pd.DataFrame({"y": [1.0]})).mark_rule(color="grey", strokeDash=[4, 4]).encode(y="y:Q"),
            width="stretch",
        )

        st.markdown("**Jacobian spectrum** dF/dh, unit circle in grey")
        eig = pd.DataFrame([{"Re": z[0], "Im": z[1], "step": s["step"]} for s in r["spectra"] for z in s["eigenvalues"]])
        theta = np.linspace(0, 2 * math.pi, 121)
        reach = max(1.05, float(np.hypot(eig["Re"], eig["Im"]).max()) * 1.05)
        # one domain on both axes, not rounded outwards (a 'nice' domain differs by axis), and the legend
        # below the plot: the data rectangle is square, so the unit circle is drawn round
        square = alt.Scale(domain=[-reach, reach], nice=False)
        x, y = alt.X("Re:Q", scale=square), alt.Y("Im:Q", scale=square)
        circle = (
            alt.Chart(pd.DataFrame({"Re": np.cos(theta), "Im": np.sin(theta), "i": range(121)}))
            .mark_line(color="grey")
            .encode(x=x, y=y, order="i:Q")
        )
        points = (
            alt.Chart(eig)
            .mark_circle(size=25)
            .encode(x=x, y=y, color=alt.Color("step:O", legend=alt.Legend(orient="bottom")), tooltip=["step", "Re", "Im"])
        )
        st.altair_chart((circle + points).properties(width=320, height=320), width="content")  # square: the circle stays round
        st.dataframe(
            pd.DataFrame([{k: s[k] for k in ("step", "spectral_radius", "spectral_norm", "frobenius")} for s in r["spectra"]]),
            hide_index=True,
        )

        st.markdown("**Fixed points** over the rollout's states (first two principal components)")
        P, fps = state_pca(torch.from_numpy(states), r["fixed_points"])
        traj = (
            alt.Chart(pd.DataFrame({"pc1": P[:, 0].numpy(), "pc2": P[:, 1].numpy(), "step": range(len(P))}))
            .mark_circle(size=8)
            .encode(x="pc1:Q", y="pc2:Q", color=alt.Color("step:Q", scale=alt.Scale(scheme="viridis")))
        )
        layers = traj
        if fps:
            fp = pd.DataFrame(fps).rename(columns={"label": "kind"})
            layers = traj + alt.Chart(fp).mark_point(shape="diamond", size=160, filled=True).encode(
                x="pc1:Q", y="pc2:Q", color=alt.value("red"), shape="kind:N", tooltip=["step", "kind", "spectral_radius"]
            )
        st.altair_chart(layers.properties(height=300), width="stretch")
        for f in r["fixed_points"]:
            kinds = ", ".join(p.get("label", "stable" if p["stable"] else "unstable") for p in f["points"])
            missed = f.get("unconverged", {})
            st.caption(
                f"step {f['step']}: {len(f['points'])} fixed point(s) ({kinds or 'none'}) from {f.get('n_starts', n_starts)} starts"
                + (" (path independent)" if f["path_independent"] else "")
                + (
                    f"; {missed['n']} start(s) did not converge ({missed['still_improving']} still improving: "
                    "more iterations may find more)"
                    if missed.get("n")
                    else ""
                )
            )

        st.markdown("**K-pass convergence** to the exact recurrence")
        conv = pd.DataFrame(
            [
                {"passes": row["passes"], "relative residual": row["relative_residual"], "KL to previous": row["kl_to_previous"]}
                for row in r["kpass"]["rows"]
                if "relative_residual" in row
            ]
        )
        st.altair_chart(
            alt.Chart(conv)
            .mark_line(point=True)
            .encode(x="passes:O", y=alt.Y("relative residual:Q", scale=alt.Scale(type="log"))),
            width="stretch",
        )
        grid = pd.DataFrame(
            [
                {"passes": row["passes"], "position": t, "log10 error": math.log10(max(e, 1e-16))}
                for row in r["kpass"]["rows"]
                for t, e in enumerate(row["error_to_exact"])
            ]
        )
        st.altair_chart(
            alt.Chart(grid)
            .mark_rect()
            .encode(x="position:O", y="passes:O", color=alt.Color("log10 error:Q", scale=alt.Scale(scheme="viridis")))
            .properties(height=220),
            width="stretch",
        )
