"""README parts on annotation and decode speed: throughput, dtypes, the decode loop's races, the AVX2 host."""

from __future__ import annotations

from pathlib import Path

from .formatting import Json, gib, load, md_table, shown_command


def annotate_throughput(r: Path) -> dict[str, str]:
    d = load("annotate_throughput", r)
    naive, candor, annotate = d["naive_seconds"], d["candor_seconds"], d["annotate_seconds"]
    naive_cpu = d["naive_cpu_seconds"]
    rss = d["peak_rss_mib"]
    rows = [
        [
            "naive: 1 greedy + 5 sampled `model.generate` calls per question",
            f"{naive:.1f}",
            f"{naive_cpu:.1f}",
            "1×",
            f"{rss['naive']} MiB",
        ],
    ]
    if "stock_seconds" in d:
        stock = d["stock_seconds"]
        rows.append(
            [
                "candor `HFBackend.generate`, `nn.Linear`'s own kernels (`pack_linears=False`)",
                f"{stock:.1f}",
                f"{d['stock_cpu_seconds']:.1f}",
                f"{naive / stock:.1f}× / {naive_cpu / d['stock_cpu_seconds']:.1f}×",
                f"{rss['candor-stock']} MiB",
            ]
        )
    rows += [
        [
            "candor `HFBackend.generate` (prepacked oneDNN weights, small ops of a step on one thread: the default)",
            f"{candor:.1f}",
            f"{d['candor_cpu_seconds']:.1f}",
            f"**{naive / candor:.1f}× / {naive_cpu / d['candor_cpu_seconds']:.1f}×**",
            f"{rss['candor']} MiB",
        ],
        [
            "full `candor.annotate` (generation + judges + fsync'd records)",
            f"{annotate:.1f}",
            f"{d['annotate_cpu_seconds']:.1f}",
            f"{naive / annotate:.1f}× / {naive_cpu / d['annotate_cpu_seconds']:.1f}×",
            f"{rss['annotate']} MiB",
        ],
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
        text += (
            f"; the prepacked weights (with each decode step's small ops on one thread) are "
            f"{d['packed_speedup']:.2f}× faster by wall time "
            f"({d['packed_cpu_time_speedup']:.2f}× by CPU time) than `nn.Linear`'s own kernels in the same run, "
            f"with {d['packed_greedy_identical_count']}/{d['questions']} greedy answers identical and "
            f"greedy log-probs within {d['packed_greedy_logprob_max_abs_diff']:.0e}"
        )
    prof = d.get("profile")
    if prof:
        shares = ", ".join(f"{group} {100 * share:.0f}%" for group, share in prof["share_of_op_time"].items())
        text += (
            f". Profiled (`{shown_command(prof['command'])}`): {prof['tokens_per_second']:.0f} tokens/s, "
            f"{prof['roofline_fraction']:.2f} of the measured float32 GEMM roofline by wall time "
            f"({prof['roofline_fraction_cpu_time']:.2f} per CPU second); operator time: {shares}"
        )
        kernels = prof.get("gemm_gflops_by_kernel", {})
        if "lm_head" in kernels:
            mlp, head = kernels["mlp"], kernels["lm_head"]
            text += (
                f". float32 GEMM at 96 rows, MKL (`nn.Linear`) / prepacked oneDNN: MLP shape "
                f"{mlp['mkl']:.0f} / {mlp['onednn_packed']:.0f} GFLOP/s, LM head "
                f"{head['mkl']:.0f} / {head['onednn_packed']:.0f} GFLOP/s"
            )
    steps = d.get("steps")
    if steps:
        text += ". " + _annotate_steps(steps)
    return text


def _annotate_steps(steps: dict) -> str:
    """The step-by-step split of the decode loop's wall time (annotate_steps.py)."""
    phases = steps["phases"]
    by_rows = [
        f"{b['steps']} steps at {b['rows']} rows {b['seconds']:.1f} s"
        + (f" ({b['ms_per_step']:.0f} ms each)" if b["ms_per_step"] else "")
        for b in steps["decode_steps_by_rows"]
        if b["steps"]
    ]
    (one, one_ms), (full, full_ms) = steps["bare_step_ms"].items()
    return (
        f"Step by step (`{shown_command(steps['command'])}`, {steps['seconds']:.1f} s in all): "
        f"{'; '.join(by_rows)}; prefill {phases['prefill']['seconds']:.1f} s, admitting rows "
        f"{phases['admit rows (KV writes)']['seconds']:.1f} s. One bare decode step of the model costs "
        f"{one_ms:.0f} ms at {one} and {full_ms:.0f} ms at {full}: a step reads all the weights whatever its "
        f"rows, so a 1-row step of the tail (long answers decoded after the last prompts joined) takes "
        f"{one_ms / full_ms:.0%} of the time of a {full} step for one token instead of {full.split()[0]}"
    )


def peer_polygraph(r: Path) -> dict[str, str]:
    d = load("peer_polygraph", r)
    peer, ours = d["polygraph"], d["candor"]
    rows = [
        [
            "lm-polygraph `UEManager` (every answer to the cap or EOS)",
            f"{peer['seconds']:.1f}",
            f"{peer['cpu_seconds']:.1f}",
            "1×",
        ],
        [
            "candor, same token cap (no stop string)",
            f"{ours['seconds_to_token_cap']:.1f}",
            f"{ours['cpu_seconds_to_token_cap']:.1f}",
            f"**{d['cpu_ratio_polygraph_to_candor_same_token_cap']:.2f}×**",
        ],
        [
            "candor, cut at the first newline (its annotation default)",
            f"{ours['seconds']:.1f}",
            f"{ours['cpu_seconds']:.1f}",
            f"{d['cpu_ratio_polygraph_to_candor']:.2f}×",
        ],
    ]
    load_avg = d.get("load_average")
    note = (
        f"load average {load_avg['before'][0]:.1f} before, {load_avg['after'][0]:.1f} after"
        if load_avg
        else "load average not recorded"
    )
    return {
        "table:peer-polygraph": md_table(["run", "wall s", "CPU s", "CPU-time ratio"], "lrrr", rows),
        "value:peer-polygraph-agreement": (
            f"{d['greedy_capped_agreement']}/{d['job']['questions']} greedy answers equal at the same cap; {note}"
        ),
    }


def machine_phrase(machine: Json) -> str:
    """``AMD EPYC (x86_64, 2 cores, AVX2; no 16-bit products)``: the CPU a results file names."""
    native = ", ".join(machine["native_16bit"]) or "no 16-bit products"
    return (
        f"{machine['name']} ({machine['architecture']}, {machine['physical_cores']} cores, "
        f"{machine['vector_level']}; {native})"
    )


def avx2_host(r: Path) -> dict[str, str]:
    """The speed jobs rerun on a CPU without AVX512 (``results/avx2/``), each against its same-run baseline."""
    throughput, dtype, race = (
        load(f"avx2/{name}", r) for name in ("annotate_throughput", "annotate_dtype", "peer_polygraph")
    )
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
    return f"lm-polygraph took {peer:.2f}× the CPU time of the run above, and candor at the same cap {ours:.2f}×"


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
    return (
        f" ({race['completions_same_tokens']} of {race['completions']} completions with the same tokens, "
        f"log-probs within {race['max_logprob_gap_same_tokens']:.1e})"
    )


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


def annotate_ray(r: Path) -> dict[str, str]:
    """What ``--engine ray`` adds (fixed, and per question), the 2-replica ratio and the seed checks."""
    d = load("annotate_ray", r)
    job, cost, ratio, agree, sampled = (
        d["settings"],
        d["overhead"],
        d["two_replicas_vs_one"],
        d["agreement"],
        d["sampling"],
    )
    cpu = job["machine"]
    same = {key: sum(arm[key] for arm in agree.values()) for key in next(iter(agree.values()))}
    fixed, each = cost["fixed_seconds"], cost["per_question_seconds"]

    def rng(x: dict, fmt: str) -> str:
        return f"{x['median']:{fmt}} ({x['min']:{fmt}} to {x['max']:{fmt}})"

    # A run that went on from an earlier one's rounds: the load when it did, too.
    later = "".join(
        f", {r['load_average'][0]:.1f} when it went on after round {r['after_round']}" for r in d.get("resumed", [])
    )
    return {
        "value:annotate-ray": (
            f"on a {cpu['physical_cores']}-core {cpu['name']} shared with other jobs (load average "
            f"{d['load_average']['before'][0]:.1f} before the run{later}), {job['questions']['S']} and "
            f"{job['questions']['L']} NQ questions with k = {job['samples']} on `transformers serve` (one thread "
            f"per replica, serving a copy of the model that samples), medians of {d['rounds_done']} rounds in rotated "
            f"order with their ranges: `--engine ray` adds a fixed {rng(fixed, '.1f')} s (actor start-up and "
            f"pipeline drain) and {rng(each, '+.2f')} s per question against the single-process `--backend "
            f"openai` path on the same server; 2 replicas finish {job['questions']['L']} questions "
            f"{rng(ratio, '.2f')}× as fast as one; Ray's own start-up {d['ray_startup_seconds']:.1f} s apart; "
            f"{same['greedy_identical']} of {same['records']} greedy answers and {same['samples_identical']} of "
            f"{same['samples']} samples identical to the single-process run, and {sampled['unlike_greedy']} of "
            f"{sampled['samples']} samples unlike their question's greedy answer "
            + (
                "(the servers sample, so the seeds are what makes them equal)"
                if sampled["unlike_greedy"]
                else "(none differs: this run does not show that the seeds matter)"
            )
        )
    }
