"""Regenerate benchmarks/README.md's tables and quoted numbers from benchmarks/results/*.json.

The top-level README.md may place some of the same parts (a user-facing table such as the
conversation benchmark's); they are rewritten there too, and every part it places must exist.

The README marks every generated part, so prose and tables cannot drift from the results files:

    <!-- table:NAME -->            a whole block (a table), regenerated between the markers
    ...
    <!-- /table -->
    <!-- value:NAME -->12.3<!-- /value -->    one number or phrase quoted in the prose

    python benchmarks/readme_tables.py           # rewrite README.md in place
    python benchmarks/readme_tables.py --check   # exit 1 if README.md differs from what this writes

Only the JSON files are read (no model, no cache), so this runs anywhere in a second.
tests/test_readme_tables.py fails when the committed README differs from this script's output.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from statistics import fmean
from typing import Any

from candor.data.mini import IN_DOMAIN

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
README = HERE / "README.md"
TOP_README = HERE.parent / "README.md"  # places a subset of the parts
DASH = "–"

Json = dict[str, Any]


def load(name: str, results: Path = RESULTS) -> Json:
    return json.loads((results / f"{name}.json").read_text(encoding="utf-8"))


# ---------------------------------------------------------------- formatting


def pct(x: float | None, digits: int = 1) -> str:
    """A fraction as ×100 with ``digits`` decimals; None as a dash."""
    return DASH if x is None else f"{100 * x:.{digits}f}"


def with_ci(x: float | None, ci: list[float | None] | None) -> str:
    """``75.6 [68, 82]``: the value ×100 and its interval rounded to whole points."""
    text = pct(x)
    if x is not None and ci and ci[0] is not None and ci[1] is not None:
        text += f" [{100 * ci[0]:.0f}, {100 * ci[1]:.0f}]"
    return text


def signed(x: float | None) -> str:
    """A difference ×100 with its sign, using a true minus sign."""
    if x is None:
        return DASH
    return "0.0" if round(100 * x, 1) == 0 else f"{100 * x:+.1f}".replace("-", "−")


def points(x: float) -> str:
    """A difference in whole points, signed (``+22``, ``−13``)."""
    return f"{round(100 * x):+d}".replace("-", "−")


def ratio(a: float, b: float) -> str:
    """``a / b`` as ``1.46×`` (two decimals, so 1.46 is not rounded to a flattering 1.5)."""
    return f"{a / b:.2f}×"


def gib(mib: float) -> str:
    return f"{mib / 1024:.2f} GiB"


def md_table(header: list[str], aligns: str, rows: list[list[str]]) -> str:
    """A Markdown table; ``aligns`` has one character per column: ``l`` or ``r``."""
    rule = "|" + "|".join("---" if a == "l" else "---:" for a in aligns) + "|"
    return "\n".join(["| " + " | ".join(header) + " |", rule, *("| " + " | ".join(r) + " |" for r in rows)])


def bold_best(rows: list[list[str]], column: int, values: list[float | None], lower: bool) -> None:
    """Bold the cell(s) of ``column`` holding the best value at display precision."""
    shown = [None if v is None else round(100 * v, 1) for v in values]
    finite = [v for v in shown if v is not None]
    if len(finite) < 2:
        return
    best = min(finite) if lower else max(finite)
    for row, v in zip(rows, shown, strict=True):
        if v == best:
            row[column] = f"**{row[column]}**"


# ---------------------------------------------------------------- annotation throughput and judges


def annotate_throughput(r: Path) -> dict[str, str]:
    d = load("annotate_throughput", r)
    naive, candor, annotate = d["naive_seconds"], d["candor_seconds"], d["annotate_seconds"]
    naive_cpu = d["naive_cpu_seconds"]
    rss = d["peak_rss_mib"]
    rows = [
        ["naive: 1 greedy + 5 sampled `model.generate` calls per question", f"{naive:.1f}", f"{naive_cpu:.1f}",
         "1×", f"{rss['naive']} MiB"],
    ]
    if "stock_seconds" in d:
        stock = d["stock_seconds"]
        rows.append(["candor `HFBackend.generate`, `nn.Linear`'s own kernels (`pack_linears=False`)", f"{stock:.1f}",
                     f"{d['stock_cpu_seconds']:.1f}",
                     f"{naive / stock:.1f}× / {naive_cpu / d['stock_cpu_seconds']:.1f}×", f"{rss['candor-stock']} MiB"])
    rows += [
        ["candor `HFBackend.generate` (prepacked oneDNN weights, small ops of a step on one thread: the default)",
         f"{candor:.1f}",
         f"{d['candor_cpu_seconds']:.1f}",
         f"**{naive / candor:.1f}× / {naive_cpu / d['candor_cpu_seconds']:.1f}×**", f"{rss['candor']} MiB"],
        ["full `candor.annotate` (generation + judges + fsync'd records)", f"{annotate:.1f}",
         f"{d['annotate_cpu_seconds']:.1f}", f"{naive / annotate:.1f}× / {naive_cpu / d['annotate_cpu_seconds']:.1f}×",
         f"{rss['annotate']} MiB"],
    ]
    table = md_table(["path", "wall s", "CPU s", "speedup (wall / CPU)", "peak RSS"], "lrrrr", rows)
    return {
        "table:annotate-throughput": table,
        "value:annotate-identical": f"{d['greedy_identical_count']}",
        "value:annotate-peak": gib(rss["annotate"]),
        "value:annotate-speed": _annotate_speed(d),
    }


def _annotate_speed(d: dict) -> str:
    """Generated tokens per second of the decode loop, and where its time goes (the profile block)."""
    notes = []
    if "candor_tokens_per_cpu_second" in d:
        notes.append(f"{d['candor_tokens_per_cpu_second']:.0f} per CPU second")
    if "load_average" in d:
        load_avg = d["load_average"]
        notes.append(f"load average {load_avg['before'][0]:.1f} before the run, {load_avg['after'][0]:.1f} after")
    text = f"{d['candor_tokens_per_second']:.0f} generated tokens/s"
    if notes:
        text += f" ({'; '.join(notes)})"
    if "packed_speedup" in d:
        text += (f"; the prepacked weights (with each decode step's small ops on one thread) are "
                 f"{d['packed_speedup']:.2f}× faster by wall time "
                 f"({d['packed_cpu_time_speedup']:.2f}× by CPU time) than `nn.Linear`'s own kernels in the same run, "
                 f"with {d['packed_greedy_identical_count']}/{d['questions']} greedy answers identical and "
                 f"greedy log-probs within {d['packed_greedy_logprob_max_abs_diff']:.0e}")
    prof = d.get("profile")
    if prof:
        shares = ", ".join(f"{group} {100 * share:.0f}%" for group, share in prof["share_of_op_time"].items())
        text += (f". Profiled (`{prof['command']}`): {prof['tokens_per_second']:.0f} tokens/s, "
                 f"{prof['roofline_fraction']:.2f} of the measured float32 GEMM roofline by wall time "
                 f"({prof['roofline_fraction_cpu_time']:.2f} per CPU second); operator time: {shares}")
        kernels = prof.get("gemm_gflops_by_kernel", {})
        if "lm_head" in kernels:
            mlp, head = kernels["mlp"], kernels["lm_head"]
            text += (f". float32 GEMM at 96 rows, MKL (`nn.Linear`) / prepacked oneDNN: MLP shape "
                     f"{mlp['mkl']:.0f} / {mlp['onednn_packed']:.0f} GFLOP/s, LM head "
                     f"{head['mkl']:.0f} / {head['onednn_packed']:.0f} GFLOP/s")
    steps = d.get("steps")
    if steps:
        text += ". " + _annotate_steps(steps)
    return text


def _annotate_steps(steps: dict) -> str:
    """The step-by-step split of the decode loop's wall time (annotate_steps.py)."""
    phases = steps["phases"]
    by_rows = [f"{b['steps']} steps at {b['rows']} rows {b['seconds']:.1f} s"
               + (f" ({b['ms_per_step']:.0f} ms each)" if b["ms_per_step"] else "")
               for b in steps["decode_steps_by_rows"] if b["steps"]]
    (one, one_ms), (full, full_ms) = steps["bare_step_ms"].items()
    return (f"Step by step (`{steps['command']}`, {steps['seconds']:.1f} s in all): "
            f"{'; '.join(by_rows)}; prefill {phases['prefill']['seconds']:.1f} s, admitting rows "
            f"{phases['admit rows (KV writes)']['seconds']:.1f} s. One bare decode step of the model costs "
            f"{one_ms:.0f} ms at {one} and {full_ms:.0f} ms at {full}: a step reads all the weights whatever its "
            f"rows, so a 1-row step of the tail (long answers decoded after the last prompts joined) takes "
            f"{one_ms / full_ms:.0%} of the time of a {full} step for one token instead of {full.split()[0]}")


def peer_polygraph(r: Path) -> dict[str, str]:
    d = load("peer_polygraph", r)
    peer, ours = d["polygraph"], d["candor"]
    rows = [
        ["lm-polygraph `UEManager` (every answer to the cap or EOS)", f"{peer['seconds']:.1f}",
         f"{peer['cpu_seconds']:.1f}", "1×"],
        ["candor, same token cap (no stop string)", f"{ours['seconds_to_token_cap']:.1f}",
         f"{ours['cpu_seconds_to_token_cap']:.1f}", f"**{d['cpu_ratio_polygraph_to_candor_same_token_cap']:.2f}×**"],
        ["candor, cut at the first newline (its annotation default)", f"{ours['seconds']:.1f}",
         f"{ours['cpu_seconds']:.1f}", f"{d['cpu_ratio_polygraph_to_candor']:.2f}×"],
    ]
    load_avg = d.get("load_average")
    note = (f"load average {load_avg['before'][0]:.1f} before, {load_avg['after'][0]:.1f} after"
            if load_avg else "load average not recorded")
    return {
        "table:peer-polygraph": md_table(["run", "wall s", "CPU s", "CPU-time ratio"], "lrrr", rows),
        "value:peer-polygraph-agreement": (f"{d['greedy_capped_agreement']}/{d['job']['questions']} greedy answers "
                                           f"equal at the same cap; {note}"),
    }


def machine_phrase(machine: Json) -> str:
    """``AMD EPYC (x86_64, 2 cores, AVX2; no 16-bit products)``: the CPU a results file names."""
    native = ", ".join(machine["native_16bit"]) or "no 16-bit products"
    return (f"{machine['name']} ({machine['architecture']}, {machine['physical_cores']} cores, "
            f"{machine['vector_level']}; {native})")


def avx2_host(r: Path) -> dict[str, str]:
    """The speed jobs rerun on a CPU without AVX512 (``results/avx2/``), each against its same-run baseline."""
    throughput, dtype, race = (load(f"avx2/{name}", r) for name in ("annotate_throughput", "annotate_dtype",
                                                                    "peer_polygraph"))
    fp32, bf16 = dtype["dtypes"]["float32"], dtype["dtypes"]["bfloat16"]
    return {
        "value:avx2-machine": machine_phrase(throughput["settings"]["machine"]),
        "value:avx2-throughput": (
            f"{throughput['candor_tokens_per_second']:.0f} generated tokens/s ({throughput['candor_seconds']:.1f} s, "
            f"{throughput['candor_cpu_seconds']:.1f} CPU s); `nn.Linear`'s own kernels "
            f"{throughput['stock_tokens_per_second']:.0f} tokens/s, so packing gives "
            f"{throughput['packed_speedup']:.2f}× wall and {throughput['packed_cpu_time_speedup']:.2f}× CPU; "
            f"per-question `model.generate` calls "
            f"{throughput['naive_seconds']:.0f} s ({throughput['speedup']:.1f}× wall, "
            f"{throughput['cpu_time_speedup']:.1f}× CPU); {throughput['greedy_identical_count']}/"
            f"{throughput['questions']} greedy answers identical to the naive path's"
        ),
        "value:avx2-bf16": (
            f"bfloat16 {bf16['tokens_per_second']:.0f} generated tokens/s against {fp32['tokens_per_second']:.0f} in "
            f"float32 ({dtype['bf16_speedup_wall']:.2f}x wall, {dtype['bf16_speedup_cpu']:.2f}x per CPU second; "
            f"{len(dtype['repeats']['float32'])} runs of each dtype); "
            f"{dtype['bf16_vs_fp32']['greedy_answers_changed']} of {dtype['questions']} greedy answers change"
        ),
        "value:avx2-slowdown": _slowdown(load("peer_polygraph", r), race),
        "value:avx2-polygraph": (
            f"lm-polygraph {race['polygraph']['seconds']:.1f} s ({race['polygraph']['cpu_seconds']:.1f} CPU s), "
            f"candor to the same token cap {race['candor']['seconds_to_token_cap']:.1f} s "
            f"({race['candor']['cpu_seconds_to_token_cap']:.1f} CPU s): "
            f"**{race['cpu_ratio_polygraph_to_candor_same_token_cap']:.2f}× CPU**, "
            f"{race['ratio_polygraph_to_candor_same_token_cap']:.2f}× wall; cut at the first newline "
            f"{race['cpu_ratio_polygraph_to_candor']:.2f}× CPU; {race['greedy_capped_agreement']}/"
            f"{race['job']['questions']} greedy answers equal at the same cap"
        ),
    }


def _slowdown(first: Json, second: Json) -> str:
    """How much more CPU time each side of the lm-polygraph race took in ``second``'s run than in ``first``'s."""
    peer = second["polygraph"]["cpu_seconds"] / first["polygraph"]["cpu_seconds"]
    ours = second["candor"]["cpu_seconds_to_token_cap"] / first["candor"]["cpu_seconds_to_token_cap"]
    return (f"lm-polygraph took {peer:.2f}× the CPU time of the run above, and candor at the same cap "
            f"{ours:.2f}×")


CONVERSATION_SHAPES = ("single", "2-turn", "3-turn")


def serve_conversations(r: Path) -> dict[str, str]:
    """The last turn of 2- and 3-turn chats against the same questions asked alone (serve_conversations.py)."""
    d = load("serve_conversations", r)
    rows = []
    for method, m in d["methods"].items():
        for shape in CONVERSATION_SHAPES:
            s, gap = m["shapes"][shape], m["minus_single"].get(shape)
            rows.append([f"`{method}`", shape, str(s["n"]), pct(s["accuracy"]),
                         with_ci(s["auroc"], s["ci95"]["auroc"]), with_ci(s["ece"], s["ci95"]["ece"]),
                         _signed_ci(gap["auroc"]) if gap else DASH, _signed_ci(gap["ece"]) if gap else DASH,
                         _signed_ci(gap["accuracy"]) if gap else DASH,
                         f"{gap['answers_changed']} / {s['n']}" if gap else DASH])
    header = ["method", "asked", "n", "accuracy", "AUROC", "ECE", "Δ AUROC", "Δ ECE", "Δ accuracy",
              "answers changed"]
    shifts = "; ".join(_conversation_shift(method, m["minus_single"]) for method, m in d["methods"].items())
    return {
        "table:serve-conversations": md_table(header, "llrrrrrrrr", rows),
        "value:serve-conversations-run": _conversation_run(d),
        "value:serve-conversations-shifts": shifts,
        "value:serve-conversations-verdict": _conversation_verdict(d),
    }


def _conversation_verdict(d: Json) -> str:
    """Which differences from asking alone the intervals tell from 0, and how often the answer itself changed."""
    apart = [f"`{method}` {METRIC_LABELS[metric]} {shape}" for method, m in d["methods"].items()
             for shape in CONVERSATION_SHAPES[1:] for metric in ("auroc", "ece")
             if not m["minus_single"][shape][metric]["ci95"][0] <= 0 <= m["minus_single"][shape][metric]["ci95"][1]]
    verdict = ("every interval of an AUROC or ECE difference includes 0: at this size no change of the "
               "confidence's ranking or calibration is told apart from none" if not apart else
               f"the intervals exclude 0 for {', '.join(apart)}; the other AUROC and ECE differences include 0")
    changed = [m["minus_single"][shape]["answers_changed"] / m["n"] for m in d["methods"].values()
               for shape in CONVERSATION_SHAPES[1:]]
    return (f"{verdict}. The earlier turns changed the model's greedy answer itself in "
            f"{pct(min(changed), 0)}–{pct(max(changed), 0)}% of the questions, so a conversation's confidence is "
            "often that of another answer than the lone question's")


def _conversation_run(d: Json) -> str:
    """The command, how many questions every shape of every method answered, the judge and the resamples."""
    sizes = sorted({m["n"] for m in d["methods"].values()})
    answered = " or ".join(str(n) for n in sizes)
    names = ", ".join(DATASET_NAMES.get(ds, ds) for ds in d["datasets"])
    return (f"`{d['answered_by'] or d['command']}` ({answered} questions answered in all three ways, taken in turn "
            f"from the in-domain test sets {names}; judge `{d['judge']}`, ECE on {d['ece_bins']} bins, "
            f"{d['bootstrap']} bootstrap resamples)")


def _conversation_shift(method: str, gaps: Json) -> str:
    """``n-prob`` AUROC and ECE after one and after two earlier turns, minus asked alone (×100)."""
    two, three = gaps["2-turn"], gaps["3-turn"]
    return (f"`{method}` AUROC {_signed_ci(two['auroc'])} after one earlier turn and {_signed_ci(three['auroc'])} "
            f"after two, ECE {_signed_ci(two['ece'])} and {_signed_ci(three['ece'])}")


def _signed_ci(gap: Json) -> str:
    """A paired difference ×100 with its interval: ``−3.1 [−9.0, +2.4]``."""
    low, high = gap["ci95"]
    return f"{signed(gap['value'])} [{signed(low)}, {signed(high)}]"


def judge_agreement(r: Path) -> dict[str, str]:
    d = load("judge_agreement", r)
    agree = round(d["agreement"] * d["n"])
    row = [f"`{d['judge']}`", f"**{agree} / {d['n']}**", str(len(d["false_positives"])),
           str(len(d["false_negatives"]))]
    return {"table:judge-agreement": md_table(["judge", "agreement", "false positives", "false negatives"],
                                              "lrrr", [row])}


# ---------------------------------------------------------------- baselines

BASELINE_METRICS = ("auroc", "ece", "alignment", "brier")
METRIC_LABELS = {"auroc": "AUROC", "ece": "ECE", "alignment": "Alignment", "brier": "Brier"}
DATASET_NAMES = {"nq": "NQ", "hq": "HotpotQA", "2wikimultihopqa": "2Wiki", "pararel": "ParaRel", "squad": "SQuAD",
                 "musique": "MuSiQue"}


def baselines(r: Path) -> dict[str, str]:
    d = load("baselines", r)
    header = ["method"] + [f"{g.upper()} {METRIC_LABELS[m]}" for g in ("id", "ood") for m in BASELINE_METRICS]
    rows = []
    for method, m in d["methods"].items():
        rows.append([method] + [with_ci(m[g][k], m["ci95"][g].get(k)) for g in ("id", "ood")
                                for k in BASELINE_METRICS])
    acc = d["greedy_accuracy"]
    per = ", ".join(f"{DATASET_NAMES.get(ds, ds)} {pct(acc[ds])}%" for ds in DATASET_NAMES if ds in acc)
    correct = {ds: round(acc[ds] * d["sizes"][ds]) for ds in ("squad", "musique")}
    return {
        "table:baselines": md_table(header, "l" + "r" * 8, rows),
        "value:baselines-accuracy": f"{per} (in-domain {pct(acc['id'])}%, OOD {pct(acc['ood'])}%)",
        "value:baselines-bootstrap": str(d["bootstrap"]),
        "value:baselines-ood-correct": f"SQuAD has {correct['squad']} and MuSiQue {correct['musique']} correct "
                                       f"answers out of {d['sizes']['squad']}",
        "value:baselines-peak": gib(d["peak_rss_mib"]),
    }


STRONG_METRICS = ("auroc", "ece", "aurc", "prr")
STRONG_LABELS = {"auroc": "AUROC", "ece": "ECE", "aurc": "AURC", "prr": "PRR"}


def baselines_strong(r: Path) -> dict[str, str]:
    """The strong-baseline run (benchmarks/results/baselines_strong.json), sorted by in-domain AUROC."""
    d = load("baselines_strong", r)
    header = ["method"] + [f"{g.upper()} {STRONG_LABELS[m]}" for g in ("id", "ood") for m in STRONG_METRICS]
    ranked = sorted(d["methods"].items(), key=lambda kv: -(kv[1]["id"]["auroc"] or 0.0))
    rows = [[method] + [with_ci(m[g][k], m["ci95"][g].get(k)) for g in ("id", "ood") for k in STRONG_METRICS]
            for method, m in ranked]
    best, best_m = ranked[0]
    return {
        "table:baselines-strong": md_table(header, "l" + "r" * 8, rows),
        "value:baselines-strong-best": f"`{best}` ({pct(best_m['id']['auroc'])} "
                                       f"[{pct(best_m['ci95']['id']['auroc'][0], 0)}, "
                                       f"{pct(best_m['ci95']['id']['auroc'][1], 0)}])",
        "value:baselines-strong-command": f"`{d['command']}`",
        "value:baselines-strong-seconds": f"{sum(d['seconds'].values()) / 60:.0f} minutes",
    }


DEBIAS_BLOCK = "ensemble_debias"  # baselines_strong.json: the run with the ensemble and the +debias rows


def baselines_debias(r: Path) -> dict[str, str]:
    """Each estimator's AUROC before and after length-debiasing, and the dev-chosen ensemble against its members."""
    block = load("baselines_strong", r)[DEBIAS_BLOCK]
    methods = block["methods"]
    plain = sorted((m for m in methods if not m.endswith("+debias") and m != "ensemble"),
                   key=lambda m: -(methods[m]["id"]["auroc"] or 0.0))

    def auroc(method: str, group: str) -> str:
        m = methods.get(method)
        return "–" if m is None else with_ci(m[group]["auroc"], m["ci95"][group].get("auroc"))

    header = ["method", "ID AUROC", "ID AUROC +debias", "OOD AUROC", "OOD AUROC +debias"]
    members = block["fits"]["ensemble"]["members"]
    rows = [[f"**ensemble** ({', '.join(members)})", auroc("ensemble", "id"), "", auroc("ensemble", "ood"), ""]]
    for m in plain:
        label = f"{m} (member)" if m in members else m
        rows.append([label, auroc(m, "id"), auroc(f"{m}+debias", "id"), auroc(m, "ood"), auroc(f"{m}+debias", "ood")])
    weights = block["fits"]["ensemble"]["weights"]
    return {
        "table:baselines-debias": md_table(header, "lrrrr", rows),
        "value:baselines-debias-command": f"`{block['command']}`",
        "value:baselines-debias-sizes": f"{block['sizes']['id']} in-domain and {block['sizes']['ood']} OOD test "
                                        f"records ({block['test_size']} per dataset; in-domain accuracy "
                                        f"{pct(block['greedy_accuracy']['id'])}%)",
        "value:baselines-debias-weights": ", ".join(f"{k} {v:+.2f}" for k, v in weights.items()),
        "value:baselines-debias-search": ", ".join(
            f"{'+'.join(step['members'])} {pct(step['dev_cv_auroc'])}" for step in block["fits"]["ensemble"]["search"]),
    }


def judge_noise(r: Path) -> dict[str, str]:
    """Accuracy corrected for the `contains` judge's measured errors, and how far they could move AUROC."""
    d = load("judge_noise", r)
    rows = [[DATASET_NAMES.get(ds, ds), pct(e["observed"]),
             "–" if e["corrected"] is None else with_ci(e["corrected"], e["ci"]), e["undefined"] or ""]
            for ds, e in d["accuracy"].items()]
    spreads = {m: per["all"]["sd"] for m, per in d["auroc_flip"].items() if per["all"]["sd"] is not None}
    widest = max(spreads, key=lambda m: spreads[m])
    hand, cons = d["hand_labels"], d["consistency_judge"]
    return {
        "table:judge-noise": md_table(["dataset", "judged accuracy", "corrected accuracy", "note"], "lrrl", rows),
        "value:judge-noise-rates": f"sensitivity {pct(hand['sensitivity'])}%, specificity "
                                   f"{pct(hand['specificity'])}% ({hand['n']} hand labels)",
        "value:judge-noise-auroc": f"{pct(min(spreads.values()))}–{pct(spreads[widest])} AUROC points "
                                   f"(widest: `{widest}`)",
        "value:judge-noise-consistency": f"sensitivity {pct(cons['sensitivity'])}%, specificity "
                                         f"{pct(cons['specificity'])}% on its {cons['n']} labels",
        "value:judge-noise-command": f"`{d['command']}`",
    }


# ---------------------------------------------------------------- EliCal

ELICAL_ROWS = [  # (results key, README label)
    ("Eli-Only", "Eli-Only (no labels)"),
    *[(f"{m}@{b}", f"{m}@{b}" + (" (1800)" if b == "all" else ""))
      for b in ("100", "250", "500", "1000", "all") for m in ("Cal-Only", "EliCal")],
    *[(f"EliCal@{b} (plain resume)", f"EliCal@{b}, plain resume") for b in ("100", "1000")],
    ("Eli-Only (lora)", "Eli-Only, lora (1 epoch)"),
    ("EliCal@1000 (lora)", "EliCal@1000, lora (1+1 epochs)"),
    ("N-Prob", "N-Prob"),
    ("Min-Prob", "Min-Prob"),
    ("Prob", "Prob"),
    ("Consis-Sem", "Consis-Sem"),
    ("Consis-Lex", "Consis-Lex"),
    ("Verbal-0", "Verbal-0"),
]
TRAINING_FREE = ("Prob", "Min-Prob", "Consis-Lex", "Consis-Sem", "N-Prob")


def elical(r: Path) -> dict[str, str]:
    d = load("elical", r)
    methods = d["methods"]
    rows, id_auroc, id_ece = [], [], []
    for key, label in ELICAL_ROWS:
        if key not in methods:  # a baseline not scored in this run (e.g. Verbal-0) is left out
            continue
        m = methods[key]
        rows.append([label, with_ci(m["id"]["auroc"], m["ci95"]["id"]["auroc"]),
                     signed(m["delta_vs_n_prob"]["id"]["auroc"]), with_ci(m["id"]["ece"], m["ci95"]["id"]["ece"]),
                     with_ci(m["id"]["alignment"], m["ci95"]["id"]["alignment"]),
                     with_ci(m["ood"]["auroc"], m["ci95"]["ood"]["auroc"]), pct(m["ood"]["ece"])])
        id_auroc.append(m["id"]["auroc"])
        id_ece.append(m["id"]["ece"])
    bold_best(rows, 1, id_auroc, lower=False)
    bold_best(rows, 3, id_ece, lower=True)
    table = md_table(["method", "ID AUROC", "Δ", "ID ECE", "ID Alignment", "OOD AUROC", "OOD ECE"], "lrrrrrr", rows)

    def auroc(key: str) -> float:
        return methods[key]["id"]["auroc"]

    gaps = {b: auroc(f"EliCal@{b}") - auroc(f"Cal-Only@{b}") for b in ("100", "250", "500", "1000", "all")}
    n_all = d["n_labels"]["all"]
    e100, c100 = methods["EliCal@100"]["id"], methods["Cal-Only@100"]["id"]
    ci_e, ci_c = methods["EliCal@100"]["ci95"]["id"]["auroc"], methods["Cal-Only@100"]["ci95"]["id"]["auroc"]
    ece100 = e100["ece"]
    ece_cmp = ", ".join(f"{name} {pct(methods[name]['id']['ece'])} ({ratio(methods[name]['id']['ece'], ece100)})"
                        for name in sorted(TRAINING_FREE, key=lambda n: methods[n]["id"]["ece"]))
    lora_runs = [run for run in d["training_runs"] if run["mode"] == "lora"]
    stage = {run["method"]: run["cost"]["wall_s"] for run in lora_runs}
    head_runs = len(d["seeds"]) * (1 + 2 * len(d["budgets"]))  # Eli-Only, then Cal-Only and EliCal per budget
    return {
        "table:elical": table,
        **elical_rule(d),
        "value:elical-gap-100": (f"{points(gaps['100'])} AUROC points in-domain ({with_ci(e100['auroc'], ci_e)} "
                                 f"vs {with_ci(c100['auroc'], ci_c)})"),
        "value:elical-gaps": (f"{points(gaps['250'])} at 250, {points(gaps['500'])} at 500, and "
                              f"{points(gaps['1000'])} at 1000 and {points(gaps['all'])} at {n_all}"),
        "value:elical-ece-vs-training-free": f"{pct(ece100)} at 100 labels, against {ece_cmp}",
        "value:elical-lora-cost": (f"stage 1 on {n_all} prompts took {stage['eli-only']:.0f} s, stage 2 on "
                                   f"{d['lora']['budget']} took {stage['elical']:.0f} s, peak RSS "
                                   f"{gib(d['lora']['peak_memory_mib'])}"),
        "value:elical-sweep-time": (f"the whole {len(d['seeds'])}-seed sweep ({head_runs} runs) in "
                                    f"{d['seconds']['head_sweep']:.1f} s"),
    }


def elical_rule(d: Json) -> dict[str, str]:
    """Stage 2's rule (issue 25): the held-out-domain selection, its folds, the in-domain check, before/after."""
    rule = d.get("stage2_rule")
    if rule is None or "held_out_selection" not in rule:
        return {}
    sel, check = rule["held_out_selection"], rule["in_domain_check"]
    budgets, first, last = sel["budgets"], sel["budgets"][0], sel["budgets"][-1]
    rows = []
    for name, c in sel["candidates"].items():
        gap = c["last_vs_first"]
        rows.append([f"**{name}**" if name == sel["selected"] else name,
                     *(pct(c["by_budget"][b]["auroc"]) for b in budgets), pct(c["mean_auroc"]),
                     *(pct(c["by_budget"][b]["ece"]) for b in budgets),
                     f"{signed(gap['auroc_diff'])} [{signed(gap['ci95'][0])}, {signed(gap['ci95'][1])}]"])
    eli = sel["eli_only"]
    rows.append(["Eli-Only (stage 1 alone)", *(pct(eli["auroc"]) for _ in budgets), pct(eli["auroc"]),
                 *(pct(eli["ece"]) for _ in budgets), DASH])
    selection = md_table(["stage-2 rule", *(f"AUROC @{b}" for b in budgets), "mean",
                          *(f"ECE @{b}" for b in budgets), f"AUROC @{last} − @{first} [95%]"],
                         "l" + "r" * (2 * len(budgets) + 2), rows)
    chosen, before = sel["selected"], rule["before"]["name"]
    fold_rows = []
    for domain, sizes in sel["folds"].items():
        cells = [domain, str(sizes["n_scored"]), str(sizes["n_correct"]), pct(eli["by_fold"][domain]["auroc"])]
        for name in dict.fromkeys([chosen, before]):
            cells += [pct(sel["candidates"][name]["by_budget"][b]["by_fold"][domain]["auroc"]) for b in (first, last)]
        fold_rows.append(cells)
    fold_head = ["held out", "dev questions", "correct", "Eli-Only"]
    for name in dict.fromkeys([chosen, before]):
        fold_head += [f"{name} @{first}", f"@{last}"]
    folds = md_table(fold_head, "lrrr" + "r" * (len(fold_head) - 4), fold_rows)
    check_rows = [[b, pct(r["chosen"]["auroc"]), pct(r["before"]["auroc"]),
                   f"{signed(r['auroc_diff'])} [{signed(r['ci95'][0])}, {signed(r['ci95'][1])}]",
                   pct(r["chosen"]["ece"]), pct(r["before"]["ece"])] for b, r in check.get("by_budget", {}).items()]
    in_domain = md_table(["budget", f"AUROC {check['chosen']}", f"AUROC {check['before']}", "Δ [95% paired]",
                          f"ECE {check['chosen']}", f"ECE {check['before']}"], "lrrrrr", check_rows)
    before_m, after = d["before"]["methods"], d["methods"]
    ba_rows = []
    for key in ["Eli-Only", *(f"EliCal@{b}" for b in d["budgets"])]:
        cells = [key]
        for g in ("id", "ood"):
            for side in (before_m, after):
                cells.append(with_ci(side[key][g]["auroc"], side[key]["ci95"][g]["auroc"]))
        for g in ("id", "ood"):
            cells += [pct(before_m[key][g]["ece"]), pct(after[key][g]["ece"])]
        ba_rows.append(cells)
    head = ["method", "ID AUROC before", "after", "OOD AUROC before", "after",
            "ID ECE before", "after", "OOD ECE before", "after"]
    n_correct = ", ".join(f"{k} {v['n_correct']} of {v['n']}" for k, v in check.get("scored_on", {}).items())
    return {
        "table:elical-lodo-rules": selection,
        "table:elical-lodo-folds": folds,
        "table:elical-in-domain-check": in_domain,
        "table:elical-before-after": md_table(head, "l" + "r" * 8, ba_rows),
        "value:elical-selected": rule["after"]["name"],
        "value:elical-heldout-gaps": "; ".join(
            f"{name} {signed(c['last_vs_first']['auroc_diff'])} [{signed(c['last_vs_first']['ci95'][0])}, "
            f"{signed(c['last_vs_first']['ci95'][1])}]" for name, c in sel["candidates"].items()),
        "value:elical-eli-heldout": f"{pct(eli['auroc'])} (ECE {pct(eli['ece'])})",
        "value:elical-lodo-correct": n_correct,
    }


def elical_targets(r: Path) -> dict[str, str]:
    """Stage 2 by the claim's quantifier (issue 46): each rule's 100→all change on each held-out domain,
    the tolerances, and each target's pick."""
    rule = load("elical", r).get("stage2_rule", {})
    if "selected_by_target" not in rule:
        return {}
    sel, tol = rule["held_out_selection"], rule["tolerance"]["by_domain"]
    picks, choice = rule["selected_by_target"], rule["universal_choice"]
    first, last = sel["budgets"][0], sel["budgets"][-1]
    rows = [["tolerance (−)", *(signed(-t) for t in tol.values()), DASH, DASH, DASH]]
    for name, c in sel["candidates"].items():
        cells = [signed(c["domain_change"][d]["change"]) + (" ✗" if d in choice["losing_domains"][name] else "")
                 for d in tol]  # fmt: skip
        marks = [t for t, pick in picks.items() if pick == name]
        label = f"**{name}** ({', '.join(marks)})" if marks else name
        rows.append([label, *cells, signed(choice["worst_domain_change"][name]), pct(c["mean_auroc"]),
                     "yes" if name in choice["qualified"] else "no"])
    head = [f"rule (Δ AUROC @{first} → @{last})",
            *(f"{d} ({sel['folds'][d]['n_correct']} of {sel['folds'][d]['n_scored']} correct)" for d in tol),
            "worst", "mean AUROC", "qualifies"]  # fmt: skip
    return {
        "table:elical-targets": md_table(head, "l" + "r" * (len(tol) + 2) + "l", rows),
        "value:elical-target-universal": picks["universal"],
        "value:elical-target-in-domain": picks["in-domain"],
        "value:elical-universal-how": choice["how"],
        "value:elical-tolerance": ", ".join(f"{d} {100 * t:.1f}" for d, t in tol.items()),
        "value:elical-curve-rule": rule.get("curve_rule", rule["after"]["name"]),
    }


def advice_balanced(r: Path) -> dict[str, str]:
    """ADVICE on the starter set (issue 46): each arm on the starter test part, and the hypothesis's verdict."""
    d = load("advice_balanced", r)
    rows = []
    arms = [("default", "Default", d)]
    arms += [(k, label, d) for k, label in (("conftuner", "ConfTuner"), ("advice", "ADVICE"),
                                            ("advice_conftuner", "ADVICE+ConfTuner")) if k in d]  # fmt: skip
    mini = d.get("honestybench_mini_trained") or {}
    arms += [(k, f"{label} (HonestyBench-mini-trained)", mini) for k, label in
             (("conftuner", "ConfTuner"), ("advice", "ADVICE"), ("advice_conftuner", "ADVICE+ConfTuner")) if k in mini]
    for key, label, source in arms:
        entry = source[key]
        for fmt, b in entry["by_format"].items():
            factor = entry.get("ece_ratio_to_default", {}).get(fmt)
            rows.append([label, fmt, str(b["seeds"]), with_ci(b["ece"], b["ece_ci"]),
                         with_ci(b["auroc"], b["auroc_ci"]),
                         with_ci(b["mean_confidence"], b["mean_confidence_ci"]), pct(b["accuracy"]),
                         DASH if factor is None else f"{factor['ratio']:.2f} [{factor['ci95'][0]:.2f}, "
                                                     f"{factor['ci95'][1]:.2f}]"])  # fmt: skip
    test, train = d["split"]["test"], d["split"]["train"]
    triplets = d.get("triplets", {})
    return {
        "table:advice-balanced": md_table(["method", "format", "seeds", "ECE [95%]", "AUROC [95%]",
                                           "mean confidence [95%]", "accuracy", "ECE / Default [95%]"],
                                          "llrrrrrr", rows),
        "value:advice-balanced-split": (f"train {train['n']} questions ({100 * train['accuracy']:.0f}% answered "
                                        f"correctly), dev {d['split']['dev']['n']} (held back), test {test['n']} "
                                        f"({test['n_correct']} correct, {100 * test['accuracy']:.0f}%)"),
        "value:advice-balanced-triplets": (f"{triplets.get('n', 0)} triplets ({triplets.get('sources', {})})"),
        "value:advice-balanced-settings": (f"lr {d['settings']['learning_rate']:g}, {d['settings']['epochs']:g} "
                                           f"epochs, {d['settings']['pairs_per_step']} pairs per step, seeds "
                                           f"{d['settings']['seeds']}"),
        "value:advice-balanced-verdict": d["hypothesis"] + ("" if d.get("complete") else " (partial run)"),
        "value:advice-balanced-command": f"`{d['command']}`",
        "value:advice-balanced-cost": "; ".join(
            f"{seed}: " + ", ".join(f"{name} {run['wall_s'] / 60:.0f} min on {run['examples']} examples"
                                    for name, run in by_run.items())
            for seed, by_run in d.get("training", {}).items()) or DASH,
    }


# ---------------------------------------------------------------- ADVICE

ADVICE_ROWS = [("Default", "ScoreLetter"), ("Prompting", "ScoreLetter"), ("Self-Consistency", "ScoreLetter"),
               ("ConfTuner", "ScoreLetter"), ("ADVICE", "ScoreLetter"), ("ADVICE+ConfTuner", "ScoreLetter"),
               ("Default", "ScoreNumber"), ("ConfTuner", "ScoreNumber"), ("ADVICE", "ScoreNumber")]
UNSEEN = ("ScoreText", "ScoreFloat", "ScorePercent")


def advice(r: Path) -> dict[str, str]:
    d = load("advice_small", r)
    methods = d["methods"]
    rows, id_ece = [], []
    for method, fmt in ADVICE_ROWS:
        b = methods[method][fmt]
        shown_fmt = "(any)" if method == "Self-Consistency" else fmt
        rows.append([method, shown_fmt, pct(b["id"]["ece"]), pct(b["id"]["auroc"]), pct(b["ood"]["ece"]),
                     pct(b["logiqa"]["ece"])])
        id_ece.append(b["id"]["ece"])
    bold_best(rows, 2, id_ece, lower=True)
    for fmt in UNSEEN:
        a, b = methods["Default"][fmt], methods["ADVICE"][fmt]
        rows.append(["Default → ADVICE", f"{fmt} (unseen)"]
                    + [f"{pct(a[g][k])} → {pct(b[g][k])}" for g, k in (("id", "ece"), ("id", "auroc"),
                                                                        ("ood", "ece"), ("logiqa", "ece"))])
    table = md_table(["method", "format", "ID ECE", "ID AUROC", "OOD ECE", "LogiQA ECE"], "llrrrr", rows)

    ablation = "; ".join(
        f"{label if not label.startswith('all, lr') else 'all at the paper' + chr(39) + 's lr 1e-5'} "
        f"{pct(block['ScoreLetter']['ece'])} / {pct(block['ScoreNumber']['ece'])}"
        for label, block in d["ablation"].items()
    )
    dl, al = methods["Default"]["ScoreLetter"], methods["ADVICE"]["ScoreLetter"]
    dn, an = methods["Default"]["ScoreNumber"], methods["ADVICE"]["ScoreNumber"]
    unseen = [methods["Default"][f][g]["ece"] / methods["ADVICE"][f][g]["ece"] for f in UNSEEN
              for g in ("id", "ood", "logiqa")]
    ood = dl["ood"]
    return {
        "table:advice": table,
        "value:advice-ablation": ablation,
        "value:advice-cut": (f"It cuts it {ratio(dl['id']['ece'], al['id']['ece'])} on ScoreLetter in-domain "
                             f"({pct(dl['id']['ece'])} → {pct(al['id']['ece'])}) and "
                             f"{ratio(dl['ood']['ece'], al['ood']['ece'])} OOD ({pct(dl['ood']['ece'])} → "
                             f"{pct(al['ood']['ece'])}), {ratio(dn['id']['ece'], an['id']['ece'])} on ScoreNumber, "
                             f"and {min(unseen):.1f}–{max(unseen):.1f}× (in-domain, OOD and LogiQA) on the three "
                             "formats it never saw"),
        "value:advice-ood-small": (f"OOD ({ood['n']} questions, {round(ood['n'] * ood['accuracy'])} correct) and "
                                   f"LogiQA ({dl['logiqa']['n']} questions)"),
        "value:advice-id": (f"in-domain {dl['id']['n']} questions, {100 * dl['id']['accuracy']:.2f}% correct "
                            f"({round(dl['id']['n'] * dl['id']['accuracy'])})"),
    }


GROUP_NAMES = {"id": "in-domain", "ood": "OOD", "logiqa": "LogiQA"}


def advice_budget(r: Path) -> dict[str, str]:
    """Issue 13's ADVICE run (results/advice.json): whichever methods and formats it holds."""
    d = load("advice", r)
    methods, pool, trip = d["methods"], d["training_pool"], d["triplets"]
    rows = []
    for fmt in next(iter(methods.values())):
        for method, per_format in methods.items():
            b = per_format[fmt]
            rows.append([method, fmt] + [with_ci(b[g][k], b[g].get(f"{k}_ci")) if g in b else DASH
                                         for g in GROUP_NAMES for k in ("ece", "auroc")])  # fmt: skip
    table = md_table(["method", "format", "ID ECE", "ID AUROC", "OOD ECE", "OOD AUROC", "LogiQA ECE",
                      "LogiQA AUROC"], "llrrrrrr", rows)  # fmt: skip
    factor_rows = []
    for method, per_format in d["ece_factor_vs_default"].items():
        for fmt, groups in per_format.items():
            factor_rows.append([method, fmt] + [_factor(groups.get(g)) for g in GROUP_NAMES])
    factors = md_table(["method", "format", "in-domain", "OOD", "LogiQA"], "llrrr", factor_rows)
    accuracy = "; ".join(f"{m}: {_accuracy(per_dataset)}" for m, per_dataset in d["task_accuracy"].items())
    train = "; ".join(
        f"{name}: {run['examples']} examples, {run['epochs']:g} epoch(s) at lr {run['learning_rate']:g}, "
        f"{run['wall_s']:.0f} s, peak RSS {gib(run['peak_rss_mib'])}"
        for name, run in d["training"].items()
    )
    lr = d["learning_rate"]
    first = next(iter(methods.values()))
    n_id = first[next(iter(first))]["id"]
    pool_sizes = ", ".join(f"{k} {v['questions']}" for k, v in pool["by_dataset"].items())
    pool_correct = sum(v["greedy_correct"] for v in pool["by_dataset"].values())
    trip_sizes = ", ".join(f"{k} {v}" for k, v in trip["by_dataset"].items())
    dev_brier = ", ".join(f"{k} {v:.4f}" for k, v in lr.get("dev_mean_brier", {}).items())
    eval_sizes = ", ".join(f"{k} {v['all_formats']} (ScorePercent {v['ScorePercent']})"
                           for k, v in d["eval_sizes"].items())  # fmt: skip
    return {
        "table:advice13": table,
        "table:advice13-factor": factors,
        "value:advice13-pool": (
            f"{pool['questions']} training-part questions ({pool_sizes}), {pool_correct} answered correctly"
        ),
        "value:advice13-triplets": (
            f"{trip['eligible'] - trip['dropped']} triplets ({trip['from_samples']} with a wrong sample, "
            f"{trip['from_resamples']} after drawing more samples, {trip['from_other_questions']} borrowed from "
            f"another question, {trip['dropped']} dropped; by dataset: {trip_sizes})"
        ),
        "value:advice13-lr": f"{lr['chosen']:g} ({lr['how']}; dev mean Brier: {dev_brier})",
        "value:advice13-training": train,
        "value:advice13-accuracy": accuracy or "no trained method scored yet",
        "value:advice13-eval": (f"in-domain {n_id['n']} questions ({100 * n_id['accuracy']:.1f}% answered "
                                f"correctly); per dataset {eval_sizes}"),
        "value:advice13-command": f"`{d['command']}`",
        "value:advice13-unseen": _unseen13(r),
        "value:advice13-auroc-by-dataset": _auroc_by_dataset(methods, d["groups"]["id"]),
        "value:advice13-mean-confidence": _mean_confidence(methods),
        "value:advice13-ablation": _ablation13(d.get("ablation", {})),
        "value:advice13-constant": _constant13(d.get("constant_reference")),
        "value:advice13-terms": "; ".join(f"{name}: {_term_moves(run['curve'])}"
                                          for name, run in d["training"].items()),  # fmt: skip
        "value:advice13-scope": (
            f"methods {', '.join(methods)}; formats {', '.join(first)}; "
            + ("complete" if d.get("complete") else "a partial run (the remaining methods are not scored yet)")
        ),
    }


def _ablation13(ablation: Json) -> str:
    """In-domain ECE (with its interval) of each loss set, ScoreLetter / ScoreNumber."""
    if not ablation:
        return "not run"
    return "; ".join(
        f"{label}: {with_ci(b['ScoreLetter']['ece'], b['ScoreLetter'].get('ece_ci'))} / "
        f"{with_ci(b['ScoreNumber']['ece'], b['ScoreNumber'].get('ece_ci'))}"
        for label, b in ablation.items()
    )


def _auroc_by_dataset(methods: Json, in_domain: Sequence[str] = IN_DOMAIN) -> str:
    """AUROC ×100 within each in-domain dataset, Default → each trained method, so a pooled gain that only
    sorts the datasets by their base rates cannot pass for ranking within a dataset."""
    default, out = methods.get("Default", {}), []
    for method, per_format in methods.items():
        if method in ("Default", "Prompting", "Self-Consistency"):
            continue
        for fmt in ("ScoreLetter", "ScoreNumber"):
            if fmt not in per_format or fmt not in default:
                continue
            before, after = default[fmt]["per_dataset"], per_format[fmt]["per_dataset"]
            cells = ", ".join(f"{DATASET_NAMES.get(ds, ds)} {pct(before[ds]['auroc'])} → {pct(after[ds]['auroc'])}"
                              for ds in in_domain if ds in after)  # fmt: skip
            out.append(f"{method} {fmt}: {cells}")
    return "; ".join(out) or "no trained method scored"


def _mean_confidence(methods: Json) -> str:
    """In-domain mean confidence against accuracy (nce_signed = accuracy − mean confidence), per method and format."""
    out = []
    for method, per_format in methods.items():
        for fmt in ("ScoreLetter", "ScoreNumber"):
            if fmt in per_format:
                b = per_format[fmt]["id"]
                out.append(f"{method} {fmt} {pct(b['accuracy'] - b['nce_signed'])}")
    accuracy = next(iter(next(iter(methods.values())).values()))["id"]["accuracy"]
    return f"{'; '.join(out)} (accuracy {pct(accuracy)})"


def _unseen13(r: Path) -> str:
    """Default → ADVICE on the formats it was not trained on (results/advice_unseen.json), with the ECE factor."""
    if not (r / "advice_unseen.json").exists():
        return "not run"
    d = load("advice_unseen", r)
    default, trained, factors = d["methods"]["Default"], d["methods"]["ADVICE"], d["ece_factor_vs_default"]["ADVICE"]
    return "; ".join(
        f"{fmt} {GROUP_NAMES[g]} ECE {pct(default[fmt][g]['ece'])} → {pct(trained[fmt][g]['ece'])} "
        f"({_factor(factors[fmt][g])}), AUROC {pct(default[fmt][g]['auroc'])} → {pct(trained[fmt][g]['auroc'])}"
        for fmt in trained for g in GROUP_NAMES
    )


def _constant13(ref: Json | None) -> str:
    """ECE of the one-number confidence (the training pool's accuracy), per group."""
    if not ref:
        return "not computed"
    groups = [g for g in GROUP_NAMES if g in ref]
    cells = ", ".join(f"{GROUP_NAMES[g]} {with_ci(ref[g]['ece'], ref[g].get('ece_ci'))}" for g in groups)
    return f"confidence {100 * ref['confidence']:.1f}% for every question: ECE {cells}"


def _term_moves(curve: list[Json], window: int = 5) -> str:
    """Each loss term's mean over the first and the last ``window`` logged steps: did it move?"""
    head, tail = curve[:window], curve[-window:]
    terms = [k for k in curve[0] if k.startswith("loss_")]
    return ", ".join(f"{k[5:]} {fmean(r[k] for r in head):.3f} → {fmean(r[k] for r in tail):.3f}" for k in terms)


def _factor(cell: Json | None) -> str:
    if not cell or cell["factor"] is None:
        return DASH
    low, high = cell["ci"]
    return f"{cell['factor']:.2f}× [{low:.2f}, {high:.2f}]" if low is not None else f"{cell['factor']:.2f}×"


def _accuracy(per_dataset: Json) -> str:
    n = sum(v["n"] for v in per_dataset.values())
    mine = sum(v["accuracy"] * v["n"] for v in per_dataset.values())
    base = sum(v["base_accuracy"] * v["n"] for v in per_dataset.values())
    return f"{100 * mine / n:.1f}% of {n} questions answered correctly (base model {100 * base / n:.1f}%)"


DIAGNOSE13 = {"diagnose_advice13": "advice13", "diagnose_advicect13": "advicect13"}
DIAGNOSE13_LABELS = {"base": "base model", "advice13": "ADVICE", "advicect13": "ADVICE+ConfTuner"}


def diagnose13(r: Path) -> dict[str, str]:
    """Diagnostics of issue 13's adapters beside the base model (one results file per adapter)."""
    runs: dict[str, Json] = {}
    for name, key in DIAGNOSE13.items():
        if (r / f"{name}.json").exists():
            d = load(name, r)
            runs.setdefault("base", d["base"])
            runs[key] = d[key]
    rows = []
    for key, run in runs.items():
        s, m, ro = run["sensitivity"], run["masking"], run["rollout"]["excl_bos"]
        rows.append([DIAGNOSE13_LABELS[key], pct(s["share_jsd_le_0.1"]), f"{s['mean_jsd']:.4f}",
                     pct(s["auroc_mu_correct"]), f"{s['within_question_corr_mu_correct']:.3f}",
                     f"{m['mask_shift']:.3f}", f"{ro['answer']:.1e}"])  # fmt: skip
    header = ["model", "pairs with JSD ≤ 0.1 (%)", "mean JSD (nats)", "AUROC of μ for the candidate",
              "within-question corr(μ, correct)", "answer masked: mean abs Δμ",
              "rollout to the answer (excl. BOS)"]  # fmt: skip
    return {"table:diagnose13": md_table(header, "lrrrrrr", rows)}


def elical_cost(r: Path) -> dict[str, str]:
    d = load("elical_cost", r)
    cpu, drift = d["cpu_seconds_per_question"], d["bf16_vs_float32"]
    return {
        "value:elical-cost": (
            f"annotating one question (k = {d['k']}) costs {cpu['annotate_k5']:.3f} CPU s; the float32 head "
            f"{cpu['head_shared_prefix']:.4f} (ratio {d['ratio_head_to_annotate_cpu']:.3f} CPU, "
            f"{d['ratio_head_to_annotate']:.3f} wall), the bf16 head {cpu['head_bf16']:.4f} (ratio "
            f"{d['ratio_head_bf16_to_annotate_cpu']:.3f} CPU, {d['ratio_head_bf16_to_annotate']:.3f} wall), "
            f"and the head before the shared prefix {cpu['head_left_padded']:.4f} (ratio "
            f"{d['ratio_left_padded_head_to_annotate']:.3f} wall)"
        ),
        "value:elical-bf16-drift": (
            f"largest confidence change {drift['max_abs_confidence_difference']:.1e}, mean "
            f"{drift['mean_abs_confidence_difference']:.1e}, Spearman {drift['spearman']:.4f} over "
            f"{d['questions']} questions"
        ),
    }


def serve_hostile(r: Path) -> dict[str, str]:
    d = load("serve_load", r)["hostile"]
    cold = d["temperature_0.01"]
    rows = []
    for kind, outcomes in d["hostile"].items():
        got = ", ".join(f"{outcome} ({count}×)" for outcome, count in sorted(outcomes.items())) or "not sent"
        if kind == "temperature 0.01":
            got += (f"; confidence equal to the greedy request's in {cold['requests'] - cold['confidence_mismatches']}"
                    f" of {cold['requests']} (largest difference {cold['max_confidence_difference']:.1e})")
        rows.append([kind, got])
    u = load("serve_load", r)["hostile_micro_batched"]["well_formed"]
    m = load("serve_load", r)["head_memory"]
    return {
        "value:serve-head-memory": (
            f"resident memory {m['head_from_prefill']['rss_mb']:.0f} MB with the head read from the prefill, "
            f"{m['rss_ratio_over_no_head']['head_from_prefill']:.3f}x the {m['no_head']['rss_mb']:.0f} MB of n-prob "
            f"without a head, against {m['rss_ratio_over_no_head']['head_own_pass']:.2f}x when the head runs its own "
            f"pass (SmolLM2-135M, {m['questions']} questions answered; `python benchmarks/serve_load.py --phases "
            "head_memory`)"
        ),
        "value:serve-load-micro-batched": (
            f"{u['requests']} well-formed requests, {u['failures']} failed, {u['answer_mismatches']} answers and "
            f"{u['confidence_mismatches']} confidences differed from the lone question's (largest difference "
            f"{u['max_confidence_difference']:.1e}); p50 / p99 latency {u['p50_latency_ms'] / 1000:.1f} / "
            f"{u['p99_latency_ms'] / 1000:.1f} s"
        ),
        "table:serve-hostile": md_table(["hostile request", "what it got (count)"], "ll", rows),
        "value:serve-load": _hostile_load(d),
    }


def serve_hostile_threads2(r: Path) -> dict[str, str]:
    """The hostile phase rerun with the server on 2 OpenMP threads (the decode step's split active)."""
    d = load("serve_load_threads2", r)["hostile"]
    return {"value:serve-load-threads2": _hostile_load(d)}


def _hostile_load(d: Json) -> str:
    """One hostile-phase run: the well-formed requests' failures, mismatches, latency, and the server afterwards."""
    w = d["well_formed"]
    return (
        f"{d['clients']} clients for {d['seconds']:.0f} s sent {w['requests']} well-formed requests "
        f"({w['streaming']} streaming) among the hostile ones: {w['failures']} failed, {w['answer_mismatches']} "
        f"answers differed from the same question asked alone, {w['confidence_mismatches']} confidences "
        f"differed by more than 1e-6 (largest difference {w['max_confidence_difference']:.1e}; "
        f"{w.get('confidences_bit_equal', 0)} of {w['requests']} equal bit for bit); p50 / p99 "
        f"latency {w['p50_latency_ms'] / 1000:.1f} / {w['p99_latency_ms'] / 1000:.1f} s, time to first token "
        f"{w.get('p50_ttft_ms', 0) / 1000:.1f} / {w.get('p99_ttft_ms', 0) / 1000:.1f} s (SmolLM2-135M, "
        f"{d['cpu_count']} shared CPU cores at load average {d['load_average_at_end'][0]:.0f}); the server "
        f"{'was up' if d['server_up_afterwards'] else 'was DOWN'} afterwards"
    )


SERVE_ENGINE_ARMS = {
    "generation": "transformers serve --continuous-batching (the engine alone)",
    "candor": "candor serve, in process, n-prob",
    "head": "candor serve --head (EliCal), threshold 0",
    "head-abstain": "candor serve --head, threshold at the median confidence",
    "chain": "candor serve → engine + candor serve-head (exported head)",
}


def _seconds(ms: float | None) -> str:
    return DASH if ms is None else f"{ms / 1000:.2f}"


def _times(x: float | None) -> str:
    return DASH if x is None else f"{x:.2f}×"


def _equal(counts: Json | None) -> str:
    if not counts:
        return DASH
    return f"{sum(c['equal'] for c in counts.values())} / {sum(c['of'] for c in counts.values())}"


def serve_engine(r: Path) -> dict[str, str]:
    d = load("serve_engine", r)
    conc = [str(c) for c in d["concurrency"]]
    rows = []
    for arm, label in SERVE_ENGINE_ARMS.items():
        cells = d["cells"].get(arm)
        if not cells:
            continue
        row = [label]
        for c in conc:
            cell = cells.get(c)
            row.append(DASH if cell is None else f"{cell['requests_per_s']:.2f} / {_seconds(cell['p50_ms'])}")
        rows.append(row)
    table = md_table(["arm", *(f"c = {c}: req/s / p50 s" for c in conc)], "l" + "r" * len(conc), rows)
    q = d["ratios"]
    ratio_rows = [
        ["(a) throughput, candor / engine, c = 32", _times(q["a_throughput_candor_over_engine_at_32"]), "≥ 1.0"],
        ["(a) p50 latency, candor / engine, c = 1", _times(q["a_p50_candor_over_engine_at_1"]), "≤ 1.1"],
        ["(a) generated tokens/s, candor / engine, c = 32", _times(q["a_tokens_per_s_candor_over_engine_at_32"]),
         DASH],
        ["(b) answered p50, head / no head, c = 1", _times(q["b_answered_p50_head_over_candor_at_1"]), "≤ 1.05"],
        ["(b) peak resident memory, head / no head", _times(q["b_peak_rss_head_over_candor"]), "≤ 1.05"],
        *[[f"(b) mean latency at {pct(row['abstention_share'], 0)}% abstention, c = 1",
           f"{_seconds(row['mean_ms'])} s", "falls with the share"] for row in q["b_mean_latency_by_abstention_at_1"]],
        *[[f"(c) p50 latency, chain / engine, c = {c}", _times(v), "≤ 1.15"]
          for c, v in q["c_p50_chain_over_engine"].items()],
    ]  # fmt: skip
    rss = q.get("chain_candor_peak_rss_mib")
    engine = d["cells"].get("generation") or {}
    past = sum(cell.get("past_stop", 0) for cell in engine.values())
    asked = sum(cell["requests"] for cell in engine.values())
    return {
        "value:serve-engine-answers": (
            f"{_equal(q['a_answers_equal_engine'])} of candor's in-process answers and "
            f"{_equal(q['c_answers_equal_engine'])} of the chain's equal the engine's to the same question (cut at "
            f"the template's stop); the engine ran on past the stop string in {past} of its {asked} answers "
            "(transformers serve ignores `stop`), generating up to the token cap where candor stops"
        ),
        "table:serve-engine": table,
        "table:serve-engine-ratios": md_table(["ratio", "measured", "issue's target"], "lrr", ratio_rows),
        "value:serve-engine-setup": (
            f"SmolLM2-135M, greedy answers of at most {d['max_new_tokens']} tokens, "
            f"{min(d['requests_per_cell'].values())}–{max(d['requests_per_cell'].values())} requests per cell, "
            f"{d['cpu_count']} CPU cores shared with other jobs (load average {d['load_average_at_end'][0]:.0f} "
            f"at the end), servers at {d['server_omp_threads']} OMP thread(s); candor's own process in the chain "
            f"peaked at {DASH if rss is None else f'{rss:.0f} MiB'}"
        ),
    }


def eigenscore_cost(r: Path) -> dict[str, str]:
    d = load("eigenscore_cost", r)
    old, new = d["paths"]["one_by_one"], d["paths"]["shared"]
    return {
        "value:eigenscore-cost": (
            f"{new['cpu_seconds_per_record']:.2f} CPU s per record against {old['cpu_seconds_per_record']:.2f} "
            f"with one pass per sample ({d['speedup_cpu']:.1f}x CPU, {d['speedup_wall']:.1f}x wall; k = {d['k']}, "
            f"{d['n']} NQ records, confidences equal within {d['max_abs_confidence_difference']:.0e})"
        ),
    }


def verbal_pruned(r: Path) -> dict[str, str]:
    d = load("verbal_pruned", r)
    rows = [
        [f"{float(m):g}", f"{run['cpu_ratio_to_number']:.2f}x", f"{run['mean_abs_mu_difference']:.4f}",
         f"{run['max_abs_mu_difference']:.4f}", f"{run['mean_bound']:.3f}", str(run["records_over_bound"])]
        for m, run in d["percent_pruned"].items()
    ]
    rows.insert(0, ["exact", f"{d['percent_exact']['cpu_ratio_to_number']:.2f}x", "0", "0", "0", "0"])
    header = ["min_mass", "CPU vs verbal-number", r"mean \|Δμ\|", r"max \|Δμ\|", "mean bound", "over bound"]
    return {"table:verbal-pruned": md_table(header, "l" + "r" * 5, rows), "value:verbal-pruned-n": str(d["n"])}


def annotate_dtype(r: Path) -> dict[str, str]:
    d = load("annotate_dtype", r)
    fp32, bf16, drift = d["dtypes"]["float32"], d["dtypes"]["bfloat16"], d["bf16_vs_fp32"]
    return {
        "value:annotate-bf16": (
            f"{bf16['tokens_per_second']:.0f} generated tokens/s against {fp32['tokens_per_second']:.0f} in float32 "
            f"({d['bf16_speedup_wall']:.2f}x wall, {d['bf16_speedup_cpu']:.2f}x per CPU second; {d['questions']} "
            f"NQ questions, k = {d['samples_per_question']}, {len(d['repeats']['float32'])} runs of each dtype); "
            f"{drift['greedy_answers_changed']} of "
            f"{d['questions']} greedy answers change, and where the greedy tokens agree the log-probs move by "
            f"{drift['logprob_abs_diff_mean']:.3f} on average (largest {drift['logprob_abs_diff_max']:.3f})"
        ),
    }


def decode_threads(r: Path) -> dict[str, str]:
    d = load("decode_threads", r)
    parts = []
    for name, label in (("first_newline", "cut at the first newline"), ("token_cap", "run to the 32-token cap")):
        s = d["settings"][name]
        split, wide = s["split"], s["all_threads"]
        parts.append(
            f"{label} ({s['prompts']} questions, {len(split['wall'])} pairs): {split['median_wall']:.2f} s "
            f"against {wide['median_wall']:.2f} s wall ({s['speedup_wall']:.2f}×), {split['median_cpu']:.2f} "
            f"against {wide['median_cpu']:.2f} CPU s ({s['speedup_cpu']:.2f}×), outputs "
            f"{'bit-equal' if s['outputs_bit_equal'] else 'NOT bit-equal'}{_agreement(s)}"
        )
    return {"value:decode-threads": "; ".join(parts)}


def _agreement(race: Json) -> str:
    """How far a race's arms agree when not bit for bit (files written before these fields say nothing)."""
    if race.get("outputs_bit_equal", True) or "completions_same_tokens" not in race:
        return ""
    return (f" ({race['completions_same_tokens']} of {race['completions']} completions with the same tokens, "
            f"log-probs within {race['max_logprob_gap_same_tokens']:.1e})")


def decode_step_parts(r: Path) -> dict[str, str]:
    d = load("decode_step_parts", r)
    labels = {
        "pick_tokens": ("picking tokens", "separate_passes", "shared_sort", "separate passes"),
        "admission_copy": ("admitting 96 rows", "advanced_index", "index_copy", "advanced-index assignment"),
        "compaction_copy": ("compacting 15 rows", "advanced_index", "index_copy", "advanced-index assignment"),
    }
    parts = []
    for name, (label, old, new, old_label) in labels.items():
        p = d[name]
        parts.append(
            f"{label}: {p[new]['wall_ms']:.1f} ms against {p[old]['wall_ms']:.1f} ms for {old_label} "
            f"({p['wall_ratio']:.2f}× wall, {p['cpu_ratio']:.2f}× CPU), "
            f"{'identical' if p['identical'] else 'NOT identical'}"
        )
    return {"value:decode-step-parts": "; ".join(parts)}


def decode_processes(r: Path) -> dict[str, str]:
    d = load("decode_processes", r)
    one, two = d["one_process_2_threads"], d["two_processes_1_thread"]
    runs = len(one["seconds"])
    return {
        "value:decode-processes": (
            f"{d['questions']} questions, median of {runs} runs each: one process on 2 threads "
            f"{one['median_seconds']:.2f} s ({one['tokens_per_second']:.0f} tokens/s, "
            f"{one['median_cpu_seconds']:.2f} CPU s, {one['peak_rss_mib_all_processes']} MiB peak RSS); "
            f"two processes on 1 thread each {two['median_seconds']:.2f} s ({two['tokens_per_second']:.0f} "
            f"tokens/s, {two['median_cpu_seconds']:.2f} CPU s, {two['peak_rss_mib_all_processes']} MiB "
            f"peak RSS together): {d['wall_ratio']:.2f}× wall, {d['cpu_ratio']:.2f}× CPU; greedy answers "
            f"identical {d['greedy_identical_count']}/{d['questions']}"
        )
    }


def decode_lean(r: Path) -> dict[str, str]:
    d = load("decode_lean", r)
    job, wakes = d["job"], d["wakes"]
    lean, plain = job["lean_step"], job["transformers_forward"]
    one = wakes["one_product_80_rows_us"]
    threads = f"{d['torch_threads']} threads"
    products = "; ".join(
        f"{rows}: {w['separate_ms']:.1f} against {w['stacked_ms']:.1f} ms ({w['ratio']:.2f}×)"
        for rows, w in wakes.items()
        if rows.endswith(("row", "rows"))
    )
    return {
        "value:decode-lean": (
            f"{job['prompts']} questions, {len(lean['wall'])} alternating pairs, medians: lean step "
            f"{lean['median_wall']:.2f} s ({lean['tokens_per_second']:.0f} tokens/s, {lean['median_cpu']:.2f} CPU s) "
            f"against transformers' forward {plain['median_wall']:.2f} s ({plain['tokens_per_second']:.0f} tokens/s, "
            f"{plain['median_cpu']:.2f} CPU s): {job['speedup_wall']:.2f}× wall, {job['speedup_cpu']:.2f}× CPU, "
            f"outputs bit-equal: {'yes' if job['outputs_bit_equal'] else 'NO'}. A step's q, k, v, gate and up "
            f"products over 30 layers, separate against stacked, at {products}. One [80, 576] × [576, 576] "
            f"product: {one['1 thread']} µs on one thread, {one[threads]} µs on {threads}"
        )
    }


def prefix_split(r: Path) -> dict[str, str]:
    d = load("prefix_split", r)
    names = {"annotation": "Annotation (cut at the first newline)", "to_token_cap": "every row to the 32-token cap"}
    parts = []
    for name, job in d["jobs"].items():
        once, every, out = job["prefix_kept_once"], job["prefix_in_every_row"], job["outputs"]
        parts.append(
            f"{names[name]}: kept once {once['median_wall']:.2f} s ({once['tokens_per_second']:.0f} tokens/s, "
            f"{once['median_cpu']:.2f} CPU s) against a copy in every row {every['median_wall']:.2f} s "
            f"({every['median_cpu']:.2f} CPU s), {job['speedup_wall']:.2f}× wall and {job['speedup_cpu']:.2f}× CPU; "
            f"{out['same_tokens']} of {out['completions']} completions with the same tokens, log-probs within "
            f"{out['max_abs_logprob_diff']:.1e}"
        )
    pairs = len(next(iter(d["jobs"].values()))["prefix_kept_once"]["wall"])
    return {
        "value:prefix-split": (
            f"{d['shared_prefix_tokens']} shared tokens of prompts of {d['prompt_tokens']['min']}–"
            f"{d['prompt_tokens']['max']}; {pairs} alternating pairs, medians. " + "; ".join(parts)
        )
    }


def annotate_workers(r: Path) -> dict[str, str]:
    d = load("annotate_workers", r)
    job, one, many, agree = d["settings"], d["one_process"], d["workers"], d["agreement"]
    cpu = job["machine"]
    return {
        "value:annotate-workers": (
            f"on a {cpu['physical_cores']}-core {cpu['name']} ({cpu['vector_level']}), the whole `candor annotate` of "
            f"{job['questions']} NQ questions (k = {job['samples']}, model loading included) took "
            f"{many['median_seconds']:.1f} s with `--workers {job['workers']}` against {one['median_seconds']:.1f} s "
            f"in one process ({d['wall_speedup']:.2f}× wall, {d['cpu_ratio']:.2f}× CPU; medians of "
            f"{len(one['seconds'])} alternating runs, one process {_span(one['seconds'])} s, "
            f"workers {_span(many['seconds'])} s; load average {d['load_average']['before'][0]:.1f} before the "
            f"first run); {agree['greedy_identical']} of {job['questions']} greedy "
            f"answers and {agree['answers_same_tokens']} of {agree['answers']} answers in all identical, "
            f"log-probs within {agree['max_logprob_gap_same_tokens']:.1e}"
        )
    }


def _span(values: list[float]) -> str:
    """``89–119``: the range of a few runs' seconds."""
    return f"{min(values):.0f}–{max(values):.0f}"


def avx2_races(r: Path) -> dict[str, str]:
    """The races behind the decode loop's defaults, rerun on the AVX2 host (``results/avx2/``), same wording."""
    values: dict[str, str] = {}
    for section in (decode_threads, decode_lean, prefix_split, decode_processes):
        values.update({key.replace("value:", "value:avx2-", 1): text for key, text in section(r / "avx2").items()})
    return values


def claims_section(r: Path) -> dict[str, str]:
    """Claim-level confidence (results/claims.json); the tables are written by claims_tables.py beside this file."""
    spec = importlib.util.spec_from_file_location("claims_tables", HERE / "claims_tables.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.claims_section(r)


# ---------------------------------------------------------------- the README

SECTIONS: list[Callable[[Path], dict[str, str]]] = [
    annotate_throughput, judge_agreement, baselines, baselines_strong, elical, elical_targets, advice_budget,
    diagnose13, advice, advice_balanced,
    elical_cost, serve_hostile, serve_engine, eigenscore_cost, verbal_pruned, annotate_dtype, peer_polygraph,
    decode_threads, serve_hostile_threads2, decode_step_parts, decode_processes, decode_lean, prefix_split,
    avx2_host, avx2_races, annotate_workers, serve_conversations,
    claims_section,
]
SECTIONS += [baselines_debias, judge_noise]  # issue 47: the ensemble and +debias rows, judge noise
BLOCK = re.compile(r"(<!-- table:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(\n<!-- /table -->)", re.S)
INLINE = re.compile(r"(<!-- value:(?P<name>[\w-]+) -->)(?P<body>.*?)(<!-- /value -->)", re.S)


def generated(results: Path = RESULTS) -> dict[str, str]:
    """Every generated block and value, by marker name."""
    out: dict[str, str] = {}
    for section in SECTIONS:
        out.update(section(results))
    return out


def render(text: str, parts: dict[str, str], strict: bool = True) -> str:
    """``text`` with every marked block and value replaced; an unknown marker is an error when ``strict``,
    else left as it is (the top-level README also holds parts other scripts write, such as the estimators')."""
    def block(match: re.Match[str]) -> str:
        key = f"table:{match['name']}"
        if not strict and key not in parts:
            return match.group(0)
        return match.group(1) + parts[_known(key, parts)] + match.group(4)

    def inline(match: re.Match[str]) -> str:
        key = f"value:{match['name']}"
        if not strict and key not in parts:
            return match.group(0)
        return match.group(1) + parts[_known(key, parts)] + match.group(4)

    return INLINE.sub(inline, BLOCK.sub(block, text))


def _known(key: str, parts: dict[str, str]) -> str:
    if key not in parts:
        raise SystemExit(f"README marker {key!r} has no generator; known: {', '.join(sorted(parts))}")
    return key


def unused_markers(text: str, parts: dict[str, str]) -> list[str]:
    """Generated parts the README does not place (so a rename cannot silently drop one)."""
    placed = {f"table:{m['name']}" for m in BLOCK.finditer(text)}
    placed |= {f"value:{m['name']}" for m in INLINE.finditer(text)}
    return sorted(set(parts) - placed)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="exit 1 if README.md is not what this script writes")
    p.add_argument("--readme", type=Path, default=README)
    args = p.parse_args()
    text = args.readme.read_text(encoding="utf-8")
    parts = generated()
    missing = unused_markers(text, parts)
    if missing:
        print(f"README has no marker for: {', '.join(missing)}", file=sys.stderr)
        return 1
    targets = [(args.readme, text)]
    if args.readme == README and TOP_README.exists():
        targets.append((TOP_README, TOP_README.read_text(encoding="utf-8")))
    for path, old in targets:
        new = render(old, parts, strict=path != TOP_README)
        if args.check:
            if new != old:
                print(f"{path} differs from the results files; run python benchmarks/readme_tables.py",
                      file=sys.stderr)
                return 1
            continue
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(new, encoding="utf-8")
        tmp.replace(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
