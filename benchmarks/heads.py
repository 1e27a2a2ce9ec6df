"""EliCal heads the serving benchmarks serve when only what the process holds matters, not what the head learned."""

from __future__ import annotations

from pathlib import Path


def untrained_head(model: str, folder: Path, template: str) -> Path:
    """An EliCal head on ``model``'s backbone with seeded random weights (memory does not depend on training)."""
    from candor.train.common import load_causal_lm
    from candor.train.elical import ConfidenceHead, HeadConfig

    lm, tokenizer = load_causal_lm(model, device="cpu")
    return ConfidenceHead.create(lm, tokenizer, HeadConfig(backbone=model, template=template), seed=0).save_pretrained(
        folder
    )
