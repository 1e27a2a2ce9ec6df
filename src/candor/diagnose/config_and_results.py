"""The settings of a diagnosis and what it finds for one model (base, or base + adapter)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from candor.diagnose.attribution import TOP_K, AttributionResult
from candor.diagnose.candidates import MAX_CANDIDATES
from candor.diagnose.masking import MaskingResult
from candor.diagnose.rollout import RolloutResult
from candor.diagnose.sensitivity import SensitivityResult
from candor.util.errors import CandorError

STAGE_NAMES = ("sensitivity", "masking", "rollout", "attribution")


@dataclass(frozen=True)
class DiagnoseConfig:
    """What to run and how much of it.

    Masking, rollout and integrated gradients use each question's first
    candidate, the model's own greedy answer; ``None`` example counts mean
    every question. IG is the costly stage (``ig_steps`` forward and backward
    passes per example), hence its smaller default count.
    """

    fmt: str = "number"
    variant: str = "default"
    max_candidates: int = MAX_CANDIDATES
    seed: int = 0
    judge: str = "contains"
    stages: tuple[str, ...] = STAGE_NAMES
    mask_examples: int | None = None
    rollout_examples: int | None = None
    ig_examples: int = 10
    ig_steps: int = 32
    ig_batch_size: int = 8
    top_k: int = TOP_K
    batch_size: int = 8

    def __post_init__(self) -> None:
        unknown = [s for s in self.stages if s not in STAGE_NAMES]
        if unknown:
            raise CandorError(f"unknown diagnose stage(s) {unknown}; known: {', '.join(STAGE_NAMES)}")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stages"] = list(self.stages)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DiagnoseConfig:
        """The inverse of :meth:`to_dict` (the ``config`` of a diagnose.json)."""
        return cls(**{**d, "stages": tuple(d.get("stages", STAGE_NAMES))})


@dataclass
class ModelDiagnosis:
    """The results of every stage that ran for one model, and what each stage cost."""

    name: str
    model: str
    adapter: str | None = None
    sensitivity: SensitivityResult | None = None
    masking: MaskingResult | None = None
    rollout: RolloutResult | None = None
    attribution: AttributionResult | None = None
    costs: dict[str, dict[str, float]] = field(default_factory=dict)

    def summary(self, top_k: int = TOP_K) -> dict[str, Any]:
        """Headline numbers first (JSD share, mean JSD, mask shift, rollout), then each stage's summary."""
        out: dict[str, Any] = {"model": self.model, "adapter": self.adapter}
        if self.sensitivity is not None:
            sens = self.sensitivity.summary()
            out["share_jsd_le_0.1"] = sens["share_jsd_le_0.1"]
            out["mean_jsd"] = sens["mean_jsd"]
            out["sensitivity"] = sens
        if self.masking is not None:
            mask = self.masking.summary()
            out["mask_shift"] = mask.get("mask_shift", float("nan"))
            out["masking"] = mask
        if self.rollout is not None:
            out["rollout"] = self.rollout.summary()
        if self.attribution is not None:
            out["attribution"] = self.attribution.summary(top_k)
        out["cost"] = self.costs
        return out

    @classmethod
    def from_details(cls, d: dict[str, Any]) -> ModelDiagnosis:
        """A diagnosis back from its details file (``details/<model>.json``); costs are not kept there."""
        stages = {
            "sensitivity": SensitivityResult,
            "masking": MaskingResult,
            "rollout": RolloutResult,
            "attribution": AttributionResult,
        }
        return cls(
            name=d["name"],
            model=d["model"],
            adapter=d.get("adapter"),
            **{name: kind.from_dict(d[name]) for name, kind in stages.items() if d.get(name) is not None},
        )

    def details(self) -> dict[str, Any]:
        """Every per-question and per-example value, for the details file."""
        out: dict[str, Any] = {"name": self.name, "model": self.model, "adapter": self.adapter}
        for stage in STAGE_NAMES:
            result = getattr(self, stage)
            if result is not None:
                out[stage] = result.to_dict()
        return out
