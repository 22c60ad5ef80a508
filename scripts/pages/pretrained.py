"""The pretrained model's pages: SmolLM2-135M-Instruct imported (``PRETRAINED``: its parity with
``transformers``, trace studies in the chat format, a probe) and continued on GSM8K as FBT and HD
(``CPT``: memory, loss curves, held-out eval, resume, and the training FLOPs on one H200)."""

from __future__ import annotations

from .render import Page, code, fixed, sci, small, table


def pretrained_traces_table(studies: list[dict]) -> str:
    rows = []
    for summary in studies:
        for key, g in summary["groups"].items():
            rows.append(
                [
                    f"`{summary['task'].split(':')[0]}`",
                    f"`{key}`",
                    str(g["n"]),
                    fixed(g["accuracy"], 3),
                    fixed(g["answered"], 3),
                    fixed(g["accuracy_last_number"], 3),
                    fixed(g["unfinished"], 3),
                    fixed(g["mean_trace"], 1),
                    fixed(g["mean_trace_chars"], 1),
                    fixed(summary["timing"][key]["problems_per_s"], 2),
                ]
            )
    return table(
        [
            "task",
            "run/regime",
            "problems",
            "accuracy (#### rule)",
            "wrote ####",
            "last number right",
            "unfinished",
            "mean trace (tokens)",
            "mean trace (characters)",
            "problems/s",
        ],
        rows,
    )


def pretrained_difficulty_table(summary: dict) -> str:
    rows = [
        [f"`{key}`", d, str(v["n"]), fixed(v["accuracy"], 3), fixed(v["unfinished"], 3), fixed(v["mean_trace"], 1)]
        for key, g in summary["groups"].items()
        for d, v in g["by_difficulty"].items()
    ]
    return table(["run/regime", "steps", "problems", "accuracy", "unfinished", "mean trace (tokens)"], rows)


def pretrained_body(imported: dict, chain: dict, gsm8k: dict, probe: dict) -> list[str]:
    model, parity = imported["model"], imported["source"]["parity"]
    instruction = chain["chat"]["instruction"] if chain.get("chat") else None
    return [
        "## The imported model",
        "",
        table(
            ["d_model", "layers", "heads (key/value)", "d_mlp", "vocabulary", "context", "tied", "source sha256"],
            [
                [
                    str(model["d_model"]),
                    str(model["n_layers"]),
                    f"{model['n_heads']} ({model['n_kv_heads']})",
                    str(model["d_mlp"]),
                    f"{model['d_vocab']:,}",
                    f"{model['n_ctx']:,}",
                    str(model["tie_embeddings"]).lower(),
                    f"`{imported['source']['sha256'][:16]}...`",
                ]
            ],
        ),
        f"Parity with `transformers` (recorded by the import, fp32, {parity['text_tokens']} tokens of text): "
        f"max |logit difference| {sci(parity['max_abs_logit_diff'])}, greedy next tokens "
        f"{'identical at every position' if parity['argmax_agree'] else 'different'}.",
        "",
        "## Trace studies (chat format)",
        "",
        f"Every problem is a user turn of the model's chat template: the question and the instruction {instruction!r}"
        if instruction
        else "Completion format.",
        "The `####` rule is GSM8K's; `last number right` is a lenient diagnostic (the last number of the text is the answer).",
        "",
        pretrained_traces_table([chain, gsm8k]),
        "### By difficulty: `chain` (steps of the problem)",
        "",
        pretrained_difficulty_table(chain),
        "### By difficulty: GSM8K (`<<...>>` steps of the reference solution)",
        "",
        pretrained_difficulty_table(gsm8k),
        f"## Probe: the `{probe['target']}` label of `{probe['task']}` ({probe['n_sequences']} held-out sequences)",
        "",
        table(
            ["hook", "accuracy", "chance", "control accuracy", "selectivity", "train / test rows"],
            [
                [
                    f"`{r['hook']}`",
                    fixed(r["accuracy"], 3),
                    fixed(r["chance"], 3),
                    fixed(r["control_accuracy"], 3),
                    small(r["selectivity"]),
                    f"{r['n_train']} / {r['n_test']}",
                ]
                for r in probe["rows"]
            ],
        ),
    ]


PRETRAINED = Page(
    ("smollm2_import.json", "smollm2_traces_chain.json", "smollm2_traces_gsm8k.json", "smollm2_probe_value.json"),
    "SmolLM2-135M-Instruct, imported (measured)",
    pretrained_body,
)


def curve_rows(curve: list[dict], keys: list[str], every: int = 5) -> list[list[str]]:
    last = curve[-1]["step"]
    return [
        [str(r["step"])] + [fixed(r.get(k), 3) for k in keys] for r in curve if r["step"] in (1, last) or r["step"] % every == 0
    ]


def cpt_eval_table(runs: dict) -> str:
    rows = []
    for name, run in runs.items():
        for row in run["eval"]["tasks"].values():
            for regime, accuracy in row["accuracy"].items():
                rows.append(
                    [
                        f"`{name}`",
                        str(row["n"]),
                        fixed(row["loss"]["standard"], 3),
                        fixed(row["loss"].get("recurrent"), 3),
                        f"`{regime}`",
                        fixed(row["answer_loss"][regime], 3),
                        fixed(accuracy, 3),
                    ]
                )
    return table(
        ["run", "held-out problems", "loss (plain)", "loss (recurrent)", "regime", "answer loss", "accuracy (#### rule)"], rows
    )


def cpt_body(cpt: dict, flops: dict) -> list[str]:
    corpus, fbt, hd, control = cpt["corpus"], cpt["runs"]["fbt"], cpt["runs"]["hd"], cpt["runs"]["baseline"]
    memory = cpt["train_step_memory"]
    commands = cpt["runs"]["commands"] + cpt["runs"]["control_commands"] + cpt["resume"]["commands"] + memory["commands"]
    return [
        "## The corpus",
        "",
        table(
            ["split", "documents", "tokens"],
            [[name, f"{split['documents']:,}", f"{split['tokens']:,}"] for name, split in corpus.items()],
        ),
        "## Training at batch 4 x 256: peak resident memory of the whole process",
        "",
        "Each row is its own 3-step `workbench train` process: the checkpoint loaded, the model, gradients, AdamW's two",
        "moments (made by the first step) and a step's activations; the peak after steps 1, 2 and 3 shows the moments",
        "arriving. tokens/s: the third step, on a shared 2-core machine.",
        "",
        table(
            ["arch", "activation checkpointing", "peak RSS after steps 1, 2, 3 (MiB)", "tokens/s"],
            [
                [
                    f"`{r['arch']}`",
                    "yes" if r["checkpoint_blocks"] else "no",
                    ", ".join(f"{v:,.0f}" for v in r["peak_rss_mib_by_step"]),
                    fixed(r["tokens_per_s"], 1),
                ]
                for r in memory["rows"]
            ],
        ),
        "## Before training (`init.json`, step 0's batch)",
        "",
        "The `fbt` row's losses skip each window's first position, which has no previous state to fuse (so its plain",
        "and fused losses score the same positions); the `hd` and control rows score every position, as the curves'",
        "step 1 does.",
        "",
        table(
            ["run", "loss, plain inputs", "loss, every position after the first fused", "fusion init", "fit R^2 (positions)"],
            [
                [
                    "`fbt`",
                    fixed(fbt["init"]["loss_plain"], 3),
                    fixed(fbt["init"]["loss_fused"], 3),
                    f"`{fbt['init']['fusion_init']}`",
                    f"{fixed(fbt['init']['fusion_fit']['r2'], 3)} ({fbt['init']['fusion_fit']['positions']:,})",
                ],
                ["`hd` (n=2)", fixed(hd["init"]["loss_plain"], 3), "", "", ""],
                ["`baseline` (the control)", fixed(control["init"]["loss_plain"], 3), "", "", ""],
            ],
        ),
        f"## Loss curves ({cpt['steps']} steps; every 5th step)",
        "",
        "### FBT (`loss` = pass 1 + pass 2 (+ pass 3 on a 3-pass step))",
        "",
        table(
            ["step", "loss", "pass 1 (plain)", "pass 2 (fused)", "passes"],
            curve_rows(fbt["curve"], ["loss", "loss_pass1", "loss_pass2", "passes"]),
        ),
        "### HD, n=2 streams",
        "",
        table(["step", "loss"], curve_rows(hd["curve"], ["loss"])),
        "### The control: plain continued pretraining of the baseline on the same batches",
        "",
        table(["step", "loss"], curve_rows(control["curve"], ["loss"])),
        "## Held-out eval (`workbench eval RUN --n 32`: the corpus's held-out GSM8K documents)",
        "",
        cpt_eval_table(
            {"smollm2 (before CPT)": cpt["runs"]["baseline_before_cpt"], "baseline CPT": control, "fbt": fbt, "hd": hd}
        ),
        "## Resume",
        "",
        f"FBT, {cpt['resume']['steps']} steps in one process against 2 steps, stop, resume, 2 more "
        f"({cpt['resume']['threads']} thread): {cpt['resume']['tensors']} tensors, "
        f"{'identical bit for bit' if cpt['resume']['identical'] else 'max |difference| ' + sci(cpt['resume']['max_abs_diff'])}.",
        "",
        "## Commands (recorded in the JSON, with their wall time)",
        "",
        table(["command", "seconds"], [[code(c["command"]), fixed(c["seconds"], 1)] for c in commands]),
        f"## Training FLOPs per token and one H200 (assumed MFU {flops['assumed_mfu']})",
        "",
        f"Counted by torch on one step at T={flops['counted_seq_len']} (every matmul; the fused attention kernel is added by",
        "formula, 12 L d_model T per token per pass or stream). H200 SXM bf16 dense peak "
        f"{flops['h200_bf16_dense_flops'] / 1e12:.0f} TFLOP/s.",
        "",
        table(
            ["arch", "matmul GFLOP/token", "recipe", "tokens", "T", "batch", "steps", "PFLOP", "H200 time"],
            [
                [
                    f"`{arch}`",
                    fixed(row["matmul_flops_per_token"] / 1e9, 3),
                    f"`{name}`",
                    f"{r['tokens']:,}",
                    str(r["seq_len"]),
                    str(r["batch"]),
                    f"{r['steps']:,}",
                    fixed(r["flops"] / 1e15, 1),
                    f"{r['h200_hours'] * 60:.1f} min",
                ]
                for arch, row in flops["archs"].items()
                for name, r in row["recipes"].items()
            ],
        ),
    ]


CPT = Page(
    ("smollm2_cpt.json", "smollm2_cpt_flops.json"),
    "SmolLM2-135M-Instruct, continued pretraining on GSM8K (measured)",
    cpt_body,
)
