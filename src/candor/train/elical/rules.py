"""Stage 2's rules and the claim each one ships for (docs/methods.md "EliCal").

A *rule* is how stage 2 trains when it resumes stage 1: what stops it, how hard
it is held to the stage-1 weights, what it trains (:data:`RULES`, the
candidates :mod:`candor.train.elical.selection` compares by leaving one domain
out). A *target* is the claim the head is trained for, and so which rule it
ships with (:data:`TARGETS`, ``candor train elical -s target=NAME``):

- ``universal`` (the default): more labels must not cost ranking on **any**
  unseen domain. Its rule is the best mean held-out AUROC among the rules that
  lose no held-out domain's AUROC from 100 labels to all labels beyond that
  domain's seed noise (issue 46; benchmarks/README.md, "EliCal").
- ``in-domain``: the best *mean* held-out AUROC over domains, budgets and seeds
  (issue 25's rule), which an average domain likes and a single domain may not.

Each target's rule is the one the benchmark selected under its criterion; the
shipped table below is checked against ``benchmarks/results/elical.json`` by
the tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from candor.util.errors import CandorError

# What stage 2 trains when it resumes stage 1 (``cal_scope``): every trainable weight (the paper), or only a
# scale and a bias on the head's logit, which recalibrates without reordering (Cal-Only, from scratch, trains all).
ALL_WEIGHTS, BIAS_SCALE = "all", "bias-scale"
CAL_SCOPES = (ALL_WEIGHTS, BIAS_SCALE)
RULE_FIELDS = ("cal_stop", "cal_anchor", "cal_scope")


@dataclass(frozen=True)
class StageTwoRule:
    """One candidate for how stage 2 trains: what stops it, how hard it is held to stage 1, what it trains."""

    name: str
    cal_stop: str = "loss"
    cal_anchor: float = 0.0
    cal_scope: str = ALL_WEIGHTS

    def settings(self) -> dict[str, Any]:
        """The ``EliCalConfig`` fields this rule sets (``candor train elical -s KEY=VALUE``)."""
        return {k: v for k, v in asdict(self).items() if k != "name"}

    def apply(self, config: Any) -> Any:
        """``config`` (an ``EliCalConfig``) with this rule's stage-2 fields."""
        return replace(config, **self.settings())


RULES: dict[str, StageTwoRule] = {
    rule.name: rule
    for rule in (
        StageTwoRule("loss-stop"),  # the paper: early stopping on the dev loss, every weight trains
        StageTwoRule("auroc-stop", cal_stop="auroc"),
        # L2-SP toward the stage-1 weights, from nearly free to nearly frozen
        StageTwoRule("L2-SP 0.01", cal_anchor=0.01),
        StageTwoRule("L2-SP 0.1", cal_anchor=0.1),
        StageTwoRule("L2-SP 1", cal_anchor=1.0),
        StageTwoRule("L2-SP 10", cal_anchor=10.0),
        StageTwoRule("bias-scale", cal_scope=BIAS_SCALE),  # Platt scaling of the stage-1 logit: no reordering
    )
}


@dataclass(frozen=True)
class Target:
    """A claim a head is trained for: the selection criterion that states it and the rule it chose."""

    name: str
    rule: str
    optimizes: str


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(
            "universal",
            "L2-SP 1",
            "no held-out domain loses AUROC from 100 labels to all labels beyond its seed noise; then the best "
            "mean held-out AUROC",
        ),
        Target("in-domain", "L2-SP 0.1", "the best mean held-out AUROC over domains, budgets and seeds (ties by ECE)"),
    )
}
DEFAULT_TARGET = "universal"


def target_rule(target: str) -> StageTwoRule:
    """The rule a target ships with; an unknown target names the known ones."""
    if target not in TARGETS:
        raise CandorError(f"unknown EliCal target {target!r}; known: {', '.join(TARGETS)}")
    return RULES[TARGETS[target].rule]


def rule_of(config: Any) -> str | None:
    """The name of the rule ``config`` (an ``EliCalConfig``) follows, or None when its stage-2 fields match no
    candidate."""
    return _rule_named({name: getattr(config, name) for name in RULE_FIELDS})


def _rule_named(fields: Mapping[str, Any]) -> str | None:
    return next((name for name, rule in RULES.items() if rule.settings() == dict(fields)), None)


def stage_two_line(settings: Mapping[str, Any]) -> str:
    """What ``candor train elical`` prints: the target, its rule, and any stage-2 field set apart from it.

    ``settings``: an ``EliCalConfig`` as a dict (a trained head's ``config``)."""
    target = TARGETS[settings["target"]]
    shipped = RULES[target.rule].settings()
    changed = {k: settings[k] for k in RULE_FIELDS if settings[k] != shipped[k]}
    text = f"stage 2: target {target.name} ({target.optimizes}) → rule {target.rule}"
    if changed:
        actual = _rule_named({k: settings[k] for k in RULE_FIELDS})
        text += "; overridden by your settings: " + ", ".join(f"{k}={v}" for k, v in changed.items())
        text += f" (rule {actual or 'not a candidate'})"
    return text
