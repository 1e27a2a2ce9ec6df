"""The diagnose report: Markdown, JSON and plots, models side by side.

:func:`write_diagnosis_report` writes::

    out/
      diagnose.md          headline table (one column per model), plots, top tokens
      diagnose.json        config and each model's summary
      details/<model>.json every per-question and per-example value
      jsd_hist.png         pairwise JSD between candidates' P(C), per model
      mu_by_correctness.png μ of correct vs wrong candidates, per model
      masking.png          mean P(C) with the real answer and with it masked
      rollout.png          rollout mass from the confidence position per region
      attribution_<model>.html  one example's tokens shaded by IG attribution
      diagnose.html        all of it on one self-contained page, an IG view per candidate
                           (:mod:`candor.diagnose.diagnosis_page`)

A plot whose stage did not run is left out, and so is its section.
"""

from __future__ import annotations

import html
import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from candor.diagnose.attribution import AttributionExample
from candor.diagnose.config_and_results import DiagnoseConfig, ModelDiagnosis
from candor.diagnose.diagnosis_page import PAGE_FILE, write_diagnosis_page
from candor.diagnose.regions import REGIONS
from candor.diagnose.sensitivity import JSD_THRESHOLD
from candor.evaluation.plots import BAR_COLOR, CORRECT_COLOR, UNDER_COLOR, WRONG_COLOR, confidence_histograms, save_png
from candor.evaluation.report import safe_filenames
from candor.util.files import atomic_write_text
from candor.verbal.formats import get_format

logger = logging.getLogger(__name__)

MODEL_COLORS = (BAR_COLOR, UNDER_COLOR, CORRECT_COLOR, WRONG_COLOR, "0.45")
MISSING = "–"
LOG_FLOOR = 1e-10  # smallest mass drawn on a log axis
UNCONVERGED = 0.2  # IG median |delta| / |gap| above which the report warns


def write_diagnosis_report(
    diagnoses: Mapping[str, ModelDiagnosis], out_dir: str | Path, config: DiagnoseConfig, title: str = "Diagnose"
) -> dict[str, Path]:
    """Write the report files for one or more models; returns name → path of each file written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stems = safe_filenames(list(diagnoses))
    files: dict[str, Path] = {}
    for name, diag in diagnoses.items():
        details = json.dumps(_clean(diag.details()), ensure_ascii=False, separators=(",", ":")) + "\n"
        files[f"details/{name}"] = _write_text(out / "details" / f"{stems[name]}.json", details)
    files.update(_plots(diagnoses, out, config, stems))
    summaries = {name: d.summary(config.top_k) for name, d in diagnoses.items()}
    files["json"] = _write_text(
        out / "diagnose.json", _json({"title": title, "config": config.to_dict(), "models": summaries})
    )
    files["html"] = write_diagnosis_page(out / PAGE_FILE, diagnoses, config, headline_rows(summaries), title=title)
    files["md"] = _write_text(out / "diagnose.md", _markdown(diagnoses, summaries, files, out, config, title))
    logger.info("diagnose report written to %s", out)
    return files


# ---------------------------------------------------------------- plots


def _plots(
    diagnoses: Mapping[str, ModelDiagnosis], out: Path, config: DiagnoseConfig, stems: Mapping[str, str]
) -> dict[str, Path]:
    files: dict[str, Path] = {}
    sens = {n: d.sensitivity for n, d in diagnoses.items() if d.sensitivity is not None and d.sensitivity.questions}
    if sens:
        files["jsd_hist"] = jsd_histogram({n: s.all_jsd for n, s in sens.items()}, out / "jsd_hist.png")
        arrays = {}
        for n, s in sens.items():
            mu = np.concatenate([q.mu for q in s.questions])
            arrays[n] = (mu, np.concatenate([q.correct for q in s.questions]))
        files["mu_by_correctness"] = confidence_histograms(
            arrays, out / "mu_by_correctness.png", title="μ of candidate answers: correct vs wrong"
        )
    masks = {n: d.masking for n, d in diagnoses.items() if d.masking is not None and d.masking.examples}
    if masks:
        files["masking"] = masking_plot(
            {n: m.mean_distributions() for n, m in masks.items()}, get_format(config.fmt).labels, out / "masking.png"
        )
    rolls = {n: d.rollout.summary() for n, d in diagnoses.items() if d.rollout is not None and d.rollout.examples}
    if rolls:
        files["rollout"] = rollout_plot(rolls, out / "rollout.png")
    for n, d in diagnoses.items():
        if d.attribution is not None and d.attribution.examples:
            path = out / f"attribution_{stems[n]}.html"
            files[f"attribution/{n}"] = _write_text(path, attribution_html(d.attribution.examples[0], n))
    return files


def jsd_histogram(values: Mapping[str, np.ndarray], path: Path, n_bins: int = 35) -> Path:
    """Share of candidate pairs per JSD bin over [0, ln 2], one panel per model, 0.1 marked."""
    names = list(values)
    fig = Figure(figsize=(4.4 * len(names), 3.4), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(names), squeeze=False)).ravel()
    edges = np.linspace(0.0, math.log(2), n_bins + 1)
    for ax, name, color in zip(axes, names, MODEL_COLORS * len(names), strict=False):
        v = np.asarray(values[name], dtype=float)
        ax.hist(v, bins=edges, weights=np.full(len(v), 1 / max(1, len(v))), color=color, edgecolor="white")
        ax.axvline(JSD_THRESHOLD, color="0.2", linestyle="--", linewidth=1)
        share = float(np.mean(v <= JSD_THRESHOLD)) if len(v) else float("nan")
        ax.set_title(f"{name}: {100 * share:.1f}% of pairs ≤ {JSD_THRESHOLD}  (n = {len(v)})", fontsize="medium")
        ax.set_xlim(0, math.log(2))
        ax.set_xlabel("JSD between candidates' P(C)  (nats)")
        ax.set_ylabel("share of pairs")
        ax.grid(alpha=0.3)
    fig.suptitle("Answer sensitivity")
    return save_png(fig, path)


def masking_plot(means: Mapping[str, tuple[np.ndarray, np.ndarray]], labels: tuple[str, ...], path: Path) -> Path:
    """Mean P(C) over questions with the real answer and with it masked, one panel per model."""
    names = list(means)
    fig = Figure(figsize=(max(4.4, 0.45 * len(labels) + 1.5) * len(names), 3.4), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(names), squeeze=False, sharey=True)).ravel()
    x = np.arange(len(labels))
    for ax, name in zip(axes, names, strict=True):
        real, masked = means[name]
        ax.bar(x - 0.2, real, width=0.4, color=BAR_COLOR, label="real answer")
        ax.bar(x + 0.2, masked, width=0.4, color=UNDER_COLOR, label="answer masked (pad tokens)")
        ax.set_xticks(x, labels, fontsize="small", rotation=0 if len(labels) <= 12 else 90)
        ax.set_title(name)
        ax.set_xlabel("confidence label")
        ax.set_ylabel("mean P(C)")
        ax.legend(fontsize="small")
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle("Answer masking: confidence distribution averaged over questions")
    return save_png(fig, path)


def rollout_plot(summaries: Mapping[str, Mapping[str, Any]], path: Path) -> Path:
    """Mean rollout mass per region, one bar per model; linear on the left, log scale on the right.

    Rollout over many layers puts nearly all mass on BOS (the attention sink),
    so the small question and answer masses only show on the log scale.
    """
    names = list(summaries)
    fig = Figure(figsize=(10.0, 3.8), layout="constrained")
    axes = fig.subplots(1, 2)
    width = 0.8 / len(names)
    x = np.arange(len(REGIONS))
    for ax, log in zip(axes, (False, True), strict=True):
        for k, (name, color) in enumerate(zip(names, MODEL_COLORS * len(names), strict=False)):
            heights = np.array([summaries[name][r] for r in REGIONS], dtype=float)
            if log:
                heights = np.maximum(heights, LOG_FLOOR)
            ax.bar(x + (k - (len(names) - 1) / 2) * width, heights, width=width, color=color, label=name)
        ax.set_xticks(x, REGIONS)
        if log:
            ax.set_yscale("log")
            ax.set_ylim(LOG_FLOOR, 1.5)
        else:
            ax.set_ylim(0, 1)
        ax.set_ylabel("mass from the confidence position")
        ax.set_title("log scale" if log else "linear scale")
        ax.legend(fontsize="small")
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle("Attention rollout (0.5·A + 0.5·I, multiplied over all layers)")
    return save_png(fig, path)


def attribution_html(example: AttributionExample, name: str) -> str:
    """The prompt's tokens shaded by attribution: green raises μ, red lowers it; answer tokens underlined."""
    scale = float(np.abs(example.scores).max()) or 1.0
    spans = []
    for token, score, role in zip(example.tokens, example.scores, example.roles, strict=True):
        alpha = min(1.0, abs(score) / scale)
        rgb = "42,157,92" if score >= 0 else "209,73,91"
        style = f"background: rgba({rgb},{alpha:.3f});"
        if REGIONS[role] == "answer":
            style += " text-decoration: underline;"
        spans.append(f'<span title="{score:+.4g} ({REGIONS[role]})" style="{style}">{html.escape(token)}</span>')
    top = "".join(
        f"<li><code>{html.escape(t['token'])}</code> ({t['region']}): {t['attribution']:+.4g}</li>"
        for t in example.top()
    )
    return (
        "<!doctype html><meta charset='utf-8'>"
        f"<title>Integrated gradients: {html.escape(name)}</title>"
        "<body style='font-family: sans-serif; max-width: 60em'>"
        f"<h1>Integrated gradients toward μ: {html.escape(name)}</h1>"
        f"<p>Question <code>{html.escape(example.item_id)}</code>, answer <b>{html.escape(example.answer)}</b>. "
        f"μ(input) = {example.mu_input:.4f}, μ(pad baseline) = {example.mu_baseline:.4f}, "
        f"sum of attributions = {example.scores.sum():+.4f}, convergence delta = {example.delta:+.2e}. "
        f"First answer token ranked {example.first_answer_rank} of {len(example.tokens)} by |attribution|.</p>"
        f"<pre style='white-space: pre-wrap; line-height: 1.7'>{''.join(spans)}</pre>"
        f"<h2>Top tokens</h2><ol>{top}</ol></body>\n"
    )


# ---------------------------------------------------------------- text


def _write_text(path: Path, text: str) -> Path:
    return atomic_write_text(path, text)


def _clean(value: Any) -> Any:
    """NaN → None, numpy scalars → Python numbers, recursively (JSON has no NaN)."""
    if isinstance(value, Mapping):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _json(payload: Any) -> str:
    return json.dumps(_clean(payload), indent=2, ensure_ascii=False) + "\n"


# Headline rows: (label, path into the summary, scale, format spec).
_ROWS = (
    ("questions", ("sensitivity", "n_questions"), 1, ".0f"),
    ("candidates", ("sensitivity", "n_candidates"), 1, ".0f"),
    ("candidate accuracy (%)", ("sensitivity", "candidate_accuracy"), 100, ".1f"),
    ("pairs with JSD ≤ 0.1 (%)", ("share_jsd_le_0.1",), 100, ".1f"),
    ("mean pairwise JSD", ("mean_jsd",), 1, ".4f"),
    ("median pairwise JSD", ("sensitivity", "median_jsd"), 1, ".4f"),
    ("mean μ", ("sensitivity", "mean_mu"), 1, ".3f"),
    ("corr(μ, correct), pooled", ("sensitivity", "corr_mu_correct"), 1, ".3f"),
    ("corr(μ, correct), within question", ("sensitivity", "within_question_corr_mu_correct"), 1, ".3f"),
    ("AUROC(μ → correct)", ("sensitivity", "auroc_mu_correct"), 100, ".1f"),
    ("mask shift: mean |μ − μ_masked|", ("mask_shift",), 1, ".4f"),
    ("mean μ, real → masked", ("masking",), None, ".3f"),
    ("rollout: BOS", ("rollout", "bos"), 1, ".4f"),
    ("rollout: template", ("rollout", "template"), 1, ".4f"),
    ("rollout: question", ("rollout", "question"), 1, ".3g"),
    ("rollout: answer", ("rollout", "answer"), 1, ".3g"),
    ("rollout without BOS: template", ("rollout", "excl_bos", "template"), 1, ".3f"),
    ("rollout without BOS: question", ("rollout", "excl_bos", "question"), 1, ".3g"),
    ("rollout without BOS: answer", ("rollout", "excl_bos", "answer"), 1, ".3g"),
    ("IG: mean rank of first answer token", ("attribution", "mean_first_answer_rank"), 1, ".1f"),
    ("IG: mean tokens per prompt", ("attribution", "mean_n_tokens"), 1, ".0f"),
    ("IG: |attribution| share on answer", ("attribution", "abs_attribution_share", "answer"), 1, ".3f"),
    ("IG: |attribution| share on question", ("attribution", "abs_attribution_share", "question"), 1, ".3f"),
    ("IG: mean |convergence delta|", ("attribution", "mean_abs_delta"), 1, ".4f"),
    ("IG: mean |μ(input) − μ(baseline)|", ("attribution", "mean_abs_mu_gap"), 1, ".4f"),
    ("IG: median |delta| / |gap|", ("attribution", "median_delta_over_gap"), 1, ".2f"),
)


def _lookup(summary: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = summary
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    return value


def _cell(summary: Mapping[str, Any], path: tuple[str, ...], scale: float | None, spec: str) -> str:
    value = _lookup(summary, path)
    if value is None:
        return MISSING
    if scale is None:  # the masking pair
        if not value.get("n"):
            return MISSING
        return f"{value['mean_mu_real']:{spec}} → {value['mean_mu_masked']:{spec}}"
    if isinstance(value, float) and math.isnan(value):
        return MISSING
    return f"{scale * value:{spec}}"


def headline_rows(summaries: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, list[str]]]:
    """The headline table: (label, one formatted cell per model), rows no model has left out."""
    rows = []
    for label, path, scale, spec in _ROWS:
        cells = [_cell(summary, path, scale, spec) for summary in summaries.values()]
        if any(c != MISSING for c in cells):
            rows.append((label, cells))
    return rows


def _markdown(
    diagnoses: Mapping[str, ModelDiagnosis],
    summaries: Mapping[str, Mapping[str, Any]],
    files: Mapping[str, Path],
    root: Path,
    config: DiagnoseConfig,
    title: str,
) -> str:
    names = list(diagnoses)
    parts = [f"# {title}", ""]
    parts.append(
        f"Is the model's confidence grounded in its answer? Format `{get_format(config.fmt).name}`, "
        f"variant `{config.variant}`; up to {config.max_candidates} candidates per question (greedy, "
        "samples, gold aliases, answers borrowed from other questions), judged by "
        f"`{config.judge}`. Masking, rollout and IG use each question's greedy answer."
    )
    parts += ["", "| model | weights |", "|---|---|"]
    parts += [
        f"| {n} | `{d.model}`" + (f" + adapter `{d.adapter}`" if d.adapter else "") + " |" for n, d in diagnoses.items()
    ]
    parts += ["", "| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    parts += [f"| {_md(label)} | " + " | ".join(cells) + " |" for label, cells in headline_rows(summaries)]
    parts += [
        "",
        "Untrained models keep most candidate pairs at JSD ≤ 0.1 (their confidence barely depends on "
        "the answer); a mask shift near 0 says the same. JSD uses the natural log (at most ln 2 ≈ 0.693).",
        "",
    ]
    for key, caption in (
        ("jsd_hist", "Answer sensitivity"),
        ("mu_by_correctness", "μ by correctness"),
        ("masking", "Answer masking"),
        ("rollout", "Attention rollout"),
    ):
        if key in files:
            parts += [f"## {caption}", "", f"![{caption}]({_rel(files[key], root)})", ""]
    parts += _attribution_md(diagnoses, files, root, config)
    parts += _cost_md(diagnoses)
    parts += [
        "## Files",
        "",
        f"- [diagnose.html]({_rel(files['html'], root)}): everything on one page that opens "
        "offline, with an integrated-gradients view per candidate",
        f"- [diagnose.json]({_rel(files['json'], root)}): config and summaries",
    ]
    parts += [f"- [{_rel(p, root)}]({_rel(p, root)})" for k, p in files.items() if k.startswith("details/")]
    return "\n".join(parts) + "\n"


def _attribution_md(
    diagnoses: Mapping[str, ModelDiagnosis], files: Mapping[str, Path], root: Path, config: DiagnoseConfig
) -> list[str]:
    parts: list[str] = []
    for name, d in diagnoses.items():
        if d.attribution is None or not d.attribution.examples:
            continue
        if not parts:
            parts += [
                "## Integrated gradients",
                "",
                f"{d.attribution.steps} steps, pad-embedding baseline; tokens ranked by |attribution|.",
                "",
            ]
        parts += [f"### {name}", ""]
        ratio = d.attribution.summary()["median_delta_over_gap"]
        if ratio > UNCONVERGED:
            parts += [
                f"Not converged: the median |convergence delta| is {ratio:.2f} × |μ(input) − μ(baseline)|, "
                "so the attributions do not add up to the change in μ; read ranks as rough.",
                "",
            ]
        link = _rel(files[f"attribution/{name}"], root)
        parts += [
            f"[one example's token attributions]({link})",
            "",
            "| question | answer | first-answer rank | top tokens |",
            "|---|---|---:|---|",
        ]
        for ex in d.attribution.examples:
            top = ", ".join(
                f"`{_md(t['token'].strip() or repr(t['token']))}` {t['attribution']:+.3g}"
                for t in ex.top(min(5, config.top_k))
            )
            parts.append(f"| {_md(ex.item_id)} | {_md(ex.answer)} | {ex.first_answer_rank} | {top} |")
        parts.append("")
    return parts


def _cost_md(diagnoses: Mapping[str, ModelDiagnosis]) -> list[str]:
    rows = [(n, stage, c) for n, d in diagnoses.items() for stage, c in d.costs.items()]
    if not rows:
        return []
    parts = ["## Cost", "", "| model | stage | wall (s) | peak RSS (MiB) |", "|---|---|---:|---:|"]
    parts += [
        f"| {n} | {s} | {c.get('wall_s', float('nan')):.1f} | {c.get('peak_rss_mib', float('nan')):.0f} |"
        for n, s, c in rows
    ]
    return [*parts, ""]


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()
