"""The registry: every function that writes README parts, grouped by the module that holds it.

Each takes the results folder and returns ``{"table:NAME": text, "value:NAME": text}``; a new results
file gets its renderer in the module of its topic and one line here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from . import adapt, advice, baselines, claims, clients, elical, estimators, serving, speed, tool_calls

Section = Callable[[Path], dict[str, str]]

SECTIONS: list[Section] = [
    speed.annotate_throughput,
    speed.annotate_dtype,
    speed.annotate_workers,
    speed.annotate_ray,
    speed.peer_polygraph,
    speed.decode_threads,
    speed.decode_step_parts,
    speed.decode_processes,
    speed.decode_lean,
    speed.prefix_split,
    speed.avx2_host,
    speed.avx2_races,
    baselines.judge_agreement,
    baselines.baselines,
    baselines.baselines_strong,
    baselines.baselines_debias,
    baselines.judge_noise,
    elical.elical,
    elical.elical_targets,
    elical.elical_cost,
    advice.advice,
    advice.advice_budget,
    advice.advice_balanced,
    advice.diagnose13,
    serving.serve_hostile,
    serving.serve_hostile_threads2,
    serving.serve_engine,
    serving.serve_conversations,
    serving.serve_traffic,
    serving.serve_production,
    serving.prefill_chunks,
    serving.drift,
    serving.faults,
    clients.client_matrix,
    estimators.estimator_table,
    estimators.eigenscore_cost,
    estimators.verbal_pruned,
    claims.claims_section,
    claims.claims_head_section,
    adapt.adapt,
    tool_calls.tool_calls,
]
