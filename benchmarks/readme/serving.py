"""README parts on serving: conversations, hostile load, and candor serve against the engine."""

from __future__ import annotations

from pathlib import Path

from .formatting import DASH, DATASET_NAMES, METRIC_LABELS, Json, load, md_table, pct, shown_command, signed, with_ci

CONVERSATION_SHAPES = ("single", "2-turn", "3-turn")


def serve_conversations(r: Path) -> dict[str, str]:
    """The last turn of 2- and 3-turn chats against the same questions asked alone (serve_conversations.py)."""
    d = load("serve_conversations", r)
    rows = []
    for method, m in d["methods"].items():
        for shape in CONVERSATION_SHAPES:
            s, gap = m["shapes"][shape], m["minus_single"].get(shape)
            rows.append(
                [
                    f"`{method}`",
                    shape,
                    str(s["n"]),
                    pct(s["accuracy"]),
                    with_ci(s["auroc"], s["ci95"]["auroc"]),
                    with_ci(s["ece"], s["ci95"]["ece"]),
                    _signed_ci(gap["auroc"]) if gap else DASH,
                    _signed_ci(gap["ece"]) if gap else DASH,
                    _signed_ci(gap["accuracy"]) if gap else DASH,
                    f"{gap['answers_changed']} / {s['n']}" if gap else DASH,
                ]
            )
    header = ["method", "asked", "n", "accuracy", "AUROC", "ECE", "Δ AUROC", "Δ ECE", "Δ accuracy", "answers changed"]
    shifts = "; ".join(_conversation_shift(method, m["minus_single"]) for method, m in d["methods"].items())
    return {
        "table:serve-conversations": md_table(header, "llrrrrrrrr", rows),
        "value:serve-conversations-run": _conversation_run(d),
        "value:serve-conversations-shifts": shifts,
        "value:serve-conversations-verdict": _conversation_verdict(d),
        **_system_prompt_rows(d.get("system_prompt")),
    }


SYSTEM_PROMPT_TUNINGS = {"alone": "questions alone", "system_prompt": "the same system prompt"}


def _system_prompt_rows(d: Json | None) -> dict[str, str]:
    """The "system prompt" rows: test questions asked after one system prompt, calibrated and thresholded on dev
    questions asked alone or after it (serve_conversations.py --rows system-prompt)."""
    if not d or not d["methods"]:
        return {}
    rows = []
    for method, m in d["methods"].items():
        raw = m["raw"]
        rows.append(
            [
                f"`{method}`",
                "not tuned (the raw value)",
                DASH,
                str(m["n_test"]),
                _ci(raw["auroc"]),
                _ci(raw["ece"]),
                DASH,
                DASH,
            ]
        )
        for key, words in SYSTEM_PROMPT_TUNINGS.items():
            t = m["tuned"][key]
            rows.append(
                [
                    f"`{method}`",
                    words,
                    str(t["n_dev"]),
                    str(m["n_test"]),
                    DASH,
                    _ci(t["ece"]),
                    _ci(t["coverage"]),
                    _ci(t["answered_accuracy"]),
                ]
            )
    header = [
        "method",
        "calibrator and threshold tuned on",
        "dev n",
        "test n",
        "AUROC",
        "ECE",
        "coverage",
        "answered accuracy",
    ]
    first = next(iter(d["methods"].values()))
    verdicts = "; ".join(
        f"`{method}` ECE {_signed_ci(m['system_prompt_minus_alone']['ece'])}, coverage "
        f"{_signed_ci(m['system_prompt_minus_alone']['coverage'])}"
        for method, m in d["methods"].items()
    )
    run = shown_command(d["answered_by"] or d["command"])
    return {
        "table:serve-system-prompt": md_table(header, "llrrrrrr", rows),
        "value:serve-system-prompt-run": (
            f'`{run}`: the system prompt "{first["system_prompt"]}" (`{first["shape"]}`); a '
            f"{first['calibrator']} calibrator and a threshold for {pct(first['coverage_target'], 0)}% coverage fitted "
            f"on {d['per_dataset']} dev questions per in-domain dataset, evaluated on the test questions asked after "
            "the system prompt; intervals resample the test questions"
        ),
        "value:serve-system-prompt-verdict": (
            f"tuned with the system prompt minus tuned alone: {verdicts}; {_zero_verdict(d)} (a Platt calibrator "
            "is monotone, so the AUROC is the raw value's whatever it was tuned on)"
        ),
    }


def _zero_verdict(d: Json) -> str:
    """Which of the (system prompt minus alone) intervals lie wholly on one side of 0."""
    apart = [
        f"`{method}` {METRIC_LABELS.get(metric, metric)}"
        for method, m in d["methods"].items()
        for metric, gap in m["system_prompt_minus_alone"].items()
        if not gap["ci95"][0] <= 0 <= gap["ci95"][1]
    ]
    if not apart:
        return "every interval includes 0: at this size the two tunings are not told apart"
    return f"the intervals exclude 0 for {', '.join(apart)}"


def _ci(cell: Json) -> str:
    return with_ci(cell["value"], cell["ci95"])


def _conversation_verdict(d: Json) -> str:
    """Which differences from asking alone the intervals tell from 0, and how often the answer itself changed."""
    apart = [
        f"`{method}` {METRIC_LABELS[metric]} {shape}"
        for method, m in d["methods"].items()
        for shape in CONVERSATION_SHAPES[1:]
        for metric in ("auroc", "ece")
        if not m["minus_single"][shape][metric]["ci95"][0] <= 0 <= m["minus_single"][shape][metric]["ci95"][1]
    ]
    verdict = (
        "every interval of an AUROC or ECE difference includes 0: at this size no change of the "
        "confidence's ranking or calibration is told apart from none"
        if not apart
        else f"the intervals exclude 0 for {', '.join(apart)}; the other AUROC and ECE differences include 0"
    )
    changed = [
        m["minus_single"][shape]["answers_changed"] / m["n"]
        for m in d["methods"].values()
        for shape in CONVERSATION_SHAPES[1:]
    ]
    return (
        f"{verdict}. The earlier turns changed the model's greedy answer itself in "
        f"{pct(min(changed), 0)}–{pct(max(changed), 0)}% of the questions, so a conversation's confidence is "
        "often that of another answer than the lone question's"
    )


def _conversation_run(d: Json) -> str:
    """The command, how many questions every shape of every method answered, the judge and the resamples."""
    sizes = sorted({m["n"] for m in d["methods"].values()})
    answered = " or ".join(str(n) for n in sizes)
    names = ", ".join(DATASET_NAMES.get(ds, ds) for ds in d["datasets"])
    run = shown_command(d["answered_by"] or d["command"])
    return (
        f"`{run}` ({answered} questions answered in all three ways, taken in turn "
        f"from the in-domain test sets {names}; judge `{d['judge']}`, ECE on {d['ece_bins']} bins, "
        f"{d['bootstrap']} bootstrap resamples)"
    )


def _conversation_shift(method: str, gaps: Json) -> str:
    """``n-prob`` AUROC and ECE after one and after two earlier turns, minus asked alone (×100)."""
    two, three = gaps["2-turn"], gaps["3-turn"]
    return (
        f"`{method}` AUROC {_signed_ci(two['auroc'])} after one earlier turn and {_signed_ci(three['auroc'])} "
        f"after two, ECE {_signed_ci(two['ece'])} and {_signed_ci(three['ece'])}"
    )


def _signed_ci(gap: Json) -> str:
    """A paired difference ×100 with its interval: ``−3.1 [−9.0, +2.4]``."""
    low, high = gap["ci95"]
    return f"{signed(gap['value'])} [{signed(low)}, {signed(high)}]"


def serve_hostile(r: Path) -> dict[str, str]:
    d = load("serve_load", r)["hostile"]
    cold = d["temperature_0.01"]
    rows = []
    for kind, outcomes in d["hostile"].items():
        got = ", ".join(f"{outcome} ({count}×)" for outcome, count in sorted(outcomes.items())) or "not sent"
        if kind == "temperature 0.01":
            got += (
                f"; confidence equal to the greedy request's in {cold['requests'] - cold['confidence_mismatches']}"
                f" of {cold['requests']} (largest difference {cold['max_confidence_difference']:.1e})"
            )
        rows.append([kind, got])
    u = load("serve_load", r)["hostile_micro_batched"]["well_formed"]
    m = load("serve_load", r)["head_memory"]
    return {
        "value:serve-head-memory": (
            f"resident memory {m['head_from_prefill']['rss_mb']:.0f} MB with the head read from the prefill, "
            f"{m['rss_ratio_over_no_head']['head_from_prefill']:.3f}x the {m['no_head']['rss_mb']:.0f} MB of n-prob "
            f"without a head, against {m['rss_ratio_over_no_head']['head_own_pass']:.2f}x when the head runs its own "
            f"pass (SmolLM2-135M, {m['questions']} questions answered; `python -m benchmarks.serve_load --phases "
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
        ["(a) generated tokens/s, candor / engine, c = 32", _times(q["a_tokens_per_s_candor_over_engine_at_32"]), DASH],
        ["(b) answered p50, head / no head, c = 1", _times(q["b_answered_p50_head_over_candor_at_1"]), "≤ 1.05"],
        ["(b) peak resident memory, head / no head", _times(q["b_peak_rss_head_over_candor"]), "≤ 1.05"],
        *[
            [
                f"(b) mean latency at {pct(row['abstention_share'], 0)}% abstention, c = 1",
                f"{_seconds(row['mean_ms'])} s",
                "falls with the share",
            ]
            for row in q["b_mean_latency_by_abstention_at_1"]
        ],
        *[
            [f"(c) p50 latency, chain / engine, c = {c}", _times(v), "≤ 1.15"]
            for c, v in q["c_p50_chain_over_engine"].items()
        ],
    ]
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


def serve_traffic(r: Path) -> dict[str, str]:
    """Issue 42's acceptance: short questions beside long prompts, real chat traffic, unique stop lists."""
    res = load("serve_resources", r)
    runs = [(key, res[key]) for key in sorted(res) if key.startswith("long_prompts")]
    long_rows = [_long_prompt_row(d) for _, d in runs]
    stops = res["stops"]
    traffic = load("serve_load", r)
    traffic_rows = [_traffic_row(traffic[key]) for key in sorted(traffic) if key.startswith("traffic")]
    return {
        "table:serve-long-prompts": md_table(
            [
                "confidence",
                "idle p50",
                "p50 / p99 beside long prompts",
                "× idle p50",
                "confidences bit-equal",
                "long prompts (tokens: seconds)",
                "memory after / before",
            ],
            "lrrrrrr",
            long_rows,
        ),
        "value:serve-stops": (
            f"{stops['unique_stop_lists']:,} requests with unique stop lists changed the server's resident memory by "
            f"{stops['rss_growth_mib']:+.1f} MiB (goal ≤ +{stops['acceptance_mib']})"
        ),
        "table:serve-traffic": md_table(
            [
                "clients",
                "well-formed (failed)",
                "confidence ≠ alone",
                "hostile: what they got",
                "short p50 / p99",
                "p99 × idle p50",
                "completed/s (queueing: clients ÷ rate)",
                "memory after / before (after 5 s idle)",
                "unique stop lists: memory",
            ],
            "rrrlrrrrr",
            traffic_rows,
        ),
    }


def _long_prompt_row(d: Json) -> list[str]:
    under, idle = d["under_long_prompts"], d["idle"]
    longs = ", ".join(f"{x['prompt_tokens']:,}: {x['latency_s']:.0f}" for x in d["long_prompts"])
    if d.get("long_prompt_failures"):
        longs += f"; {len(d['long_prompt_failures'])} failed"
    return [
        d["confidence"],
        f"{idle['p50_s']:.2f} s",
        f"{under['p50_s']:.2f} / {under['p99_s']:.2f} s",
        f"{d['p50_over_idle_p50']:.2f}× / **{d['p99_over_idle_p50']:.2f}×**",
        d["short_confidences_bit_equal_to_idle"],
        longs,
        f"{d['rss_after_over_before']:.3f}×",
    ]


def _traffic_row(d: Json) -> list[str]:
    w, short, mem = d["well_formed"], d["short_single_under_load"], d["resident_mib"]
    hostile = ", ".join(f"{kind} {count}×" for kind, count in sorted(d["hostile"].items())) or DASH
    rate = d.get("completed_per_s")
    queue = f"{rate:.2f} ({d['littles_law_mean_latency_s']:.0f} s)" if rate is not None else DASH
    idle_ratio = mem.get("ratio_after_idle")
    memory = f"{mem['ratio']:.3f}×" + (f" ({idle_ratio:.3f}×)" if idle_ratio is not None else "")
    return [
        str(d["clients"]),
        f"{w['requests']} ({w['failures']})",
        str(w["confidence_mismatches"]),
        hostile,
        f"{short['p50_s']:.1f} / {short['p99_s']:.1f} s",
        f"**{short['p99_over_idle_p50']:.0f}×**",
        queue,
        memory,
        _stops_growth(d.get("unique_stops")),
    ]


def _stops_growth(stops: Json | None) -> str:
    if not stops:
        return DASH
    return f"{stops['requests']:,}: {stops['growth_mib']:+.1f} MiB"


def serve_production(r: Path) -> dict[str, str]:
    """Issue 53's acceptance (serve_production.py): two replicas on PostgreSQL under load, reloaded meanwhile."""
    d = load("serve_load", r)["production"]
    w, opts, labels, audit, mem = d["well_formed"], d["options"], d["labels"], d["audit"], d["resident_mib"]
    hostile = ", ".join(f"{kind} {count}×" for kind, count in d["hostile"].items()) or DASH
    reloads = d["reloads"]
    kinds = ", ".join(f"{count} {kind.replace('_', ' ')}" for kind, count in w["by_kind"].items())
    gauges = audit["replicas"][0]
    audited = gauges["candor_feedback_audited"]
    rows = [
        ["well-formed requests that failed", "0", f"{w['failures']} of {w['requests']} ({kinds})"],
        ["labels posted that failed", "0", f"{w['feedback_failures']} of {w['feedback_posts']}"],
        ["hostile requests answered other than 4xx", "0", f"{d['hostile_not_4xx']} ({hostile})"],
        [
            "choices served with other options than the deployment's",
            "0",
            f"{opts['violations']} of {opts['checked']}",
        ],
        [
            "labels lost / attached to another choice / on another version",
            "0 / 0 / 0",
            f"{labels['lost']} / {labels['foreign']} / {labels['version_mismatches']} of {labels['posted']} "
            f"({', '.join(f'{n} {s}' for s, n in labels['posted_by_source'].items())})",
        ],
        [
            "reloads during the load",
            "2 per replica",
            f"{sum(r['ok'] for r in reloads)} of {len(reloads)} ok ("
            + ", ".join(f"replica {r['replica'] + 1} {'POST' if r['how'] == 'post' else 'SIGHUP'}" for r in reloads)
            + f"); both end on `{d['final_versions'][0]}`"
            + ("" if d["final_versions"][0] == d["final_versions"][1] else f" / `{d['final_versions'][1]}`"),
        ],
        ["resident memory after / before", f"≤ {MEMORY_GOAL}×", _memory(mem)],
        [
            "`/metrics` audit gauges of the two replicas",
            "equal",
            f"{'equal' if audit['equal'] else '**differ**'} ({_count(audited)} responses audited, "
            f"{audit['expected_audited']} expected from the labels posted)",
        ],
        [
            "throughput; p50 / p99 latency",
            DASH,
            f"{w['per_s']:.2f} requests/s; {w['p50_s']:.1f} / {w['p99_s']:.1f} s (labels "
            f"{w['feedback_p50_s']:.2f} / {w['feedback_p99_s']:.2f} s)",
        ],
    ]
    opts_text = " ".join(d["serve_flags"])
    return {
        "table:serve-production": md_table(["check", "goal", "measured"], "lll", rows),
        "value:serve-production-run": (
            f"`{shown_command(d['command'])}`: {d['clients']} clients for {d['seconds']:.0f} s "
            f"({d['wall_seconds']:.0f} s until the last answer), two `candor serve` replicas of SmolLM2-135M "
            f"(n-prob) with `{opts_text}` "
            f"(options digest `{d['deployment_digest']}`), {d['server_omp_threads']} OpenMP thread each, on "
            f"{d['cpu_count']} shared CPU cores at load average {d['load_average_at_end'][0]:.0f}"
        ),
    }


MEMORY_GOAL = 1.2  # issue 53: each replica's resident memory after the load at most this times before


def _memory(mem: Json) -> str:
    """Each replica's resident memory after / before, and of its anonymous part (the heap) when recorded."""
    text = " and ".join(
        f"{f'**{r:.3f}×**' if r > MEMORY_GOAL else f'{r:.3f}×'} ({b:,.0f} → {a:,.0f} MiB)"
        for r, b, a in zip(mem["ratio"], mem["before"], mem["after"], strict=True)
    )
    anon = mem.get("anon_ratio")
    if anon and all(x is not None for x in anon):
        text += (
            "; anonymous part (the heap; the rest is mapped weights the kernel drops and reads back): "
            + " and ".join(f"{x:.3f}×" for x in anon)
        )
    return text


def _count(x: float | None) -> str:
    return DASH if x is None else f"{x:.0f}"


def prefill_chunks(r: Path) -> dict[str, str]:
    """What one chunk of a long prompt costs (prefill_chunks.py): the floor of what it adds to a short question."""
    d = load("prefill_chunks", r)
    c = d["chunk_s"]
    return {
        "value:prefill-chunks": (
            f"a {d['chunk']}-token chunk of a {d['prompt_tokens']:,}-token prompt takes {c['first']:.2f} s at its "
            f"start and up to {c['max_before_last']:.2f} s near its end, and the last one ({c['last_rows']} rows) "
            f"{c['last']:.2f} s; the whole prompt takes {d['chunked_total_s']:.0f} s in chunks against "
            f"{d['one_piece_s']:.0f} s in one piece ({d['chunked_over_one_piece']:.2f}×; "
            f"`{shown_command(d['command'])}`)"
        ),
    }


DRIFT_RULES = {
    "betting": "anytime-valid upper bound (betting, what `candor serve` does)",
    "fixed-level": "fixed-level Clopper–Pearson bound at every look (before)",
}


def drift(r: Path) -> dict[str, str]:
    """The drift alarm looked at after every label: false alarms at the promise, labels to alarm below it (drift.py)."""
    d = load("drift", r)
    rows = []
    for name, rule in d["rules"].items():
        f, w = rule["false_alarms"], rule["delay"]
        quartiles = DASH if w["q1"] is None or w["q3"] is None else f"{w['q1']}–{w['q3']}"
        rows.append(
            [
                DRIFT_RULES.get(name, name),
                f"{f['fired']} / {f['runs']}",
                f"{100 * f['rate']:.1f} [{100 * f['ci95'][0]:.1f}, {100 * f['ci95'][1]:.1f}]",
                DASH if w["median"] is None else str(w["median"]),
                quartiles,
                str(w["never"]),
            ]
        )
    header = [
        "alarm",
        "false alarms",
        "rate % [95% CI]",
        f"median labels to alarm at {pct(d['drifted_accuracy'], 0)}%",
        "quartiles",
        "never fired",
    ]
    return {
        "table:drift": md_table(header, "lrrrrr", rows),
        "value:drift-run": (
            f"`{d['command']}`: {d['runs']:,} seeded runs of {d['labels']:,} audit labels each, a look after every "
            f"label, promise {pct(d['promise'], 0)}%, δ = {d['delta']}; false alarms with the accuracy at the "
            f"promise, labels to alarm with it at {pct(d['drifted_accuracy'], 0)}%"
        ),
    }


def faults(r: Path) -> dict[str, str]:
    """Faults survived: what a client saw, /ready, what was lost and the recovery, per fault (faults.py)."""
    d = load("faults", r)
    rows = []
    for f in d["faults"]:
        if "not_measured" in f:
            rows.append([f["fault"], f["not_measured"], DASH, DASH, DASH, DASH, DASH, DASH])
            continue
        ready = f["ready_during"]
        if "survivor" in ready:  # two replicas: the killed one's probe, and the survivor's
            said = f"killed: {_tally(ready['killed'])}; survivor: {_tally(ready['survivor'])}"
        else:
            said = _tally(ready)
        noticed = DASH if f["ready_noticed_s"] is None else f"{f['ready_noticed_s']:.1f} s"
        rows.append(
            [
                f["fault"],
                f["injected"],
                _tally(f["client_sees"]) or DASH,
                f"{said} (expected {f['ready_truth']}, seen after {noticed}; "
                f"{'truthful' if f['ready_truthful'] else 'NOT truthful'})",
                f"{1000 * f['health_max_s']:.0f} ms",
                f"{f['acknowledged_answers']} / {f['acknowledged_labels']}",
                f"{f['lost_answers']} / {f['lost_labels']}",
                DASH if f["recovery_s"] is None else f"{f['recovery_s']:.1f} s",
            ]
        )
    header = [
        "fault",
        "injected",
        "clients saw (answers, while it lasted)",
        "/ready while it lasted",
        "/health max",
        "acknowledged answers / labels",
        "lost",
        "recovery",
    ]
    machine = d["machine"]
    others = [f"{f['fault']}: {run['note']}." for f in d["faults"] for run in f.get("other_runs", [])]
    return {
        "table:faults": md_table(header, "llllrrrr", rows),
        "value:faults-others": " ".join(others) or "none: every row is the fault's only run.",
        "value:faults-run": (
            f"`{d['command']}` ({d['model']}; {machine['cpus']} CPUs, Python {machine['python']}); "
            f"each fault lasted {d['scale']['fault_s']:g} s between {d['scale']['phase_s']:g} s of load before"
            " and after."
        ),
    }


def _tally(counts: Json) -> str:
    """``{"200": 5, "503 store_unavailable": 2}`` as ``200 ×5, 503 store_unavailable ×2``."""
    return ", ".join(f"{k} ×{v}" for k, v in counts.items())
