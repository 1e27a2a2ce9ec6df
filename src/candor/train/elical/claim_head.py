"""The EliCal claim head: confidence per claim of a long answer (docs/claims.md "A trained claim head").

The question head (:mod:`candor.train.elical.model`) reads the prompt's last
token before any answer exists. The claim head reads the answer: one forward
pass of the frozen backbone over the prompt's tokens followed by the answer's
own token ids (``Completion.token_ids``, as generated), and a claim's feature
is the configured layer's hidden state

- ``last``: at the claim's last token (the last answer token whose characters
  overlap the claim's span, ``Claim.tokens``), position
  ``len(prompt tokens) + max(claim.tokens)`` (:func:`claim_last_position`); or
- ``mean``: averaged over the claim's tokens.

The same ``LinearHead`` (a standardization, ``Linear(hidden, 1)``, a sigmoid)
turns it into a confidence, trained by the question head's stages on claim rows
(:func:`candor.train.elical.pipeline.train_feature_stage`): stage 1 on each
claim's self-consistency over the samples (no labels,
:mod:`candor.train.elical.claim_targets`), stage 2 on a budget of claim labels
with the stage-2 rule of the config's ``target`` (:mod:`candor.train.elical.rules`,
``universal`` by default), early stopping on a dev slice of prompts carved from
the training pool. ``pooling="auto"`` trains both poolings and keeps the one
whose finished head ranks the dev slice's claims better (AUROC against their
labels); the choice and both dev AUROCs are written in the head's config.

A saved claim head is a head folder (:func:`candor.train.elical.model.save_head`)
whose config's ``meta`` says ``level: claim`` and its pooling; the question-level
``elical`` estimator refuses it, and the ``elical-claims`` claim estimator
(:mod:`candor.train.elical.claim_estimator`) refuses a question head.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.metrics import roc_auc_score

from candor.annotation.claim_labels import label_compound
from candor.annotation.claim_split import split_claims
from candor.annotation.claims import Claim
from candor.annotation.contamination import write_manifest
from candor.annotation.judges import DEFAULT_CONSISTENCY_JUDGE, get_consistency_judge
from candor.annotation.prompts import records_template
from candor.annotation.records import Record
from candor.backends.chat import TokenizerChat
from candor.backends.tokens import encode, pad_batch
from candor.train.common import TrainResult, load_causal_lm
from candor.train.elical.budgets import WHOLE_POOL, Budget
from candor.train.elical.claim_targets import claim_consistency, claim_labels
from candor.train.elical.config import EliCalConfig
from candor.train.elical.model import ConfidenceHead, HeadConfig, LinearHead, load_linear_head
from candor.train.elical.pipeline import StageResult, StageSpec, stages_cost, train_feature_stage
from candor.util.errors import CandorError
from candor.util.files import atomic_write_text

logger = logging.getLogger(__name__)

CLAIM_LEVEL = "claim"
POOLINGS = ("last", "mean")
AUTO = "auto"
STAGE1_TARGET, STAGE2_TARGET = "claim-consistency", "claim-label"


# ---------------------------------------------------------------- features


def claim_last_position(claim: Claim, n_prompt: int) -> int:
    """Where the claim's last token sits in ``prompt tokens + answer tokens``: ``n_prompt + max(claim.tokens)``."""
    if not claim.tokens:
        raise CandorError(f"claim {claim.text!r} rests on no token of the answer; the claim head cannot read it")
    return n_prompt + max(claim.tokens)


def pooled_features(states: np.ndarray, n_prompt: int, claims: Sequence[Claim]) -> dict[str, np.ndarray]:
    """Per pooling, ``[claims, hidden]``: each claim's feature from one answer's states.

    ``states`` is the head's layer at every position of ``prompt tokens + answer tokens`` (no padding),
    ``n_prompt`` the prompt's token count; ``last`` reads the claim's last token, ``mean`` averages its tokens.
    """
    end = len(states)
    for claim in claims:
        if claim_last_position(claim, n_prompt) >= end:
            raise CandorError(f"claim {claim.text!r} names a token past the answer's end")
    return {
        "last": np.stack([states[claim_last_position(c, n_prompt)] for c in claims]),
        "mean": np.stack([states[[n_prompt + t for t in c.tokens]].mean(0) for c in claims]),
    }


@torch.no_grad()
def claim_features(
    head: ConfidenceHead,
    prompts: Sequence[str],
    answers: Sequence[Sequence[int]],
    claims: Sequence[Sequence[Claim]],
    batch_size: int = 8,
) -> dict[str, list[np.ndarray]]:
    """Per pooling (:data:`POOLINGS`), per answer, ``[claims, hidden]`` float32 features.

    ``answers[i]`` are the token ids of the answer generated from ``prompts[i]``; ``claims[i]`` its claims
    (each with its ``tokens``). One left-padded forward pass per batch; the backbone stays frozen.
    """
    if not len(prompts) == len(answers) == len(claims):
        raise CandorError(f"got {len(prompts)} prompts, {len(answers)} answers and {len(claims)} claim lists")
    hidden = int(head.config.hidden_size)
    out: dict[str, list[np.ndarray]] = {p: [np.zeros((0, hidden), np.float32)] * len(prompts) for p in POOLINGS}
    prompt_ids = encode(head.tokenizer, prompts) if prompts else []
    for i, (ids, answer, own) in enumerate(zip(prompt_ids, answers, claims, strict=True)):
        for claim in own:
            if claim_last_position(claim, len(ids)) >= len(ids) + len(answer):
                raise CandorError(f"answer {i}: claim {claim.text!r} names a token past the answer's end")
    was_training = head.training
    head.eval()
    try:
        pad_id = int(head.tokenizer.pad_token_id)
        todo = [i for i in range(len(prompts)) if claims[i]]
        for start in range(0, len(todo), batch_size):
            rows = todo[start : start + batch_size]
            seqs = [list(prompt_ids[i]) + list(answers[i]) for i in rows]
            ids, mask = pad_batch(seqs, pad_id, "left", device=head.device)
            states = head.token_states(ids, mask).float().cpu().numpy()
            width = ids.shape[1]
            for row, i in enumerate(rows):
                own = states[row, width - len(seqs[row]) :]  # left padding off
                for pooling, x in pooled_features(own, len(prompt_ids[i]), claims[i]).items():
                    out[pooling][i] = x
    finally:
        head.train(was_training)
    return out


# ---------------------------------------------------------------- claim rows


@dataclass
class ClaimRows:
    """The claims of some records as rows: features by pooling, the two stage targets, whose they are.

    ``consistency`` is NaN for a claim at no question's position, ``label`` NaN for a claim not scored.
    ``record`` names each row's record (its index in the records the rows were read from).
    """

    features: dict[str, np.ndarray]
    consistency: np.ndarray
    label: np.ndarray
    record: np.ndarray
    claim: np.ndarray
    ids: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.consistency)

    def take(self, mask: np.ndarray) -> ClaimRows:
        """The rows where ``mask`` holds."""
        mask = np.asarray(mask, dtype=bool)
        return ClaimRows(
            features={p: x[mask] for p, x in self.features.items()},
            consistency=self.consistency[mask],
            label=self.label[mask],
            record=self.record[mask],
            claim=self.claim[mask],
            ids=[i for i, keep in zip(self.ids, mask, strict=True) if keep],
        )

    @property
    def has_consistency(self) -> np.ndarray:
        return ~np.isnan(self.consistency)

    @property
    def scored(self) -> np.ndarray:
        return ~np.isnan(self.label)


def claim_rows(
    head: ConfidenceHead, records: Sequence[Record], judge: str = DEFAULT_CONSISTENCY_JUDGE, batch_size: int = 8
) -> ClaimRows:
    """Every claim with tokens of ``records`` (compound prompts with claims, labels and samples) as a row."""
    kept = [[c for c in rec.claims or [] if c.tokens] for rec in records]
    consistency = claim_consistency(records, get_consistency_judge(judge))
    labels = claim_labels(records)
    feats = claim_features(head, head.prompts(records), [r.greedy.token_ids for r in records], kept, batch_size)
    cons, labs, owner, index, ids = [], [], [], [], []
    for i, rec in enumerate(records):
        for j, claim in enumerate(rec.claims or []):
            if not claim.tokens:
                continue
            cons.append(np.nan if consistency[i][j] is None else consistency[i][j])
            labs.append(np.nan if labels[i][j] is None else labels[i][j])
            owner.append(i)
            index.append(j)
            ids.append(rec.id)
    hidden = int(head.config.hidden_size)
    return ClaimRows(
        features={p: np.concatenate([*v, np.zeros((0, hidden), np.float32)]) for p, v in feats.items()},
        consistency=np.asarray(cons, dtype=np.float32),
        label=np.asarray(labs, dtype=np.float32),
        record=np.asarray(owner, dtype=int),
        claim=np.asarray(index, dtype=int),
        ids=ids,
    )


# ---------------------------------------------------------------- training


def fresh_head(model: Any, tokenizer: Any, template: str, config: EliCalConfig) -> ConfidenceHead:
    """A new claim head (head mode, seeded) on ``model``'s frozen decoder."""
    spec = HeadConfig(backbone=config.model, template=template, layer=config.layer, mode="head")
    return ConfidenceHead.create(model, tokenizer, spec, seed=config.seed)


def train_stage_one(head: ConfidenceHead, train: ClaimRows, dev: ClaimRows, pooling: str, config: EliCalConfig):
    """Stage 1 in place: the claims' self-consistency (rows with a target), early stopping on ``dev``'s."""
    tr, dv = train.take(train.has_consistency), dev.take(dev.has_consistency)
    if not len(tr) or not len(dv):
        raise CandorError(f"stage 1 of the claim head needs claims with samples: {len(tr)} train, {len(dv)} dev")
    spec = StageSpec(stage="eli", target=STAGE1_TARGET, n_train=len(tr), n_dev=len(dv), fresh=True, full_set=True)
    return train_feature_stage(
        head, tr.features[pooling], tr.consistency, dv.features[pooling], dv.consistency, spec=spec, config=config
    )


def train_stage_two(
    head: ConfidenceHead, train: ClaimRows, dev: ClaimRows, pooling: str, config: EliCalConfig, budget: Budget
) -> StageResult:
    """Stage 2 in place, resuming stage 1: ``budget`` labelled claims of ``train`` (seeded draw), the config's
    stage-2 rule, early stopping on ``dev``'s labelled claims."""
    labelled = np.flatnonzero(train.scored)
    chosen = np.zeros(len(train), dtype=bool)
    chosen[budget.draw(list(labelled), config.seed)] = True
    tr, dv = train.take(chosen), dev.take(dev.scored)
    if not len(dv):
        raise CandorError("stage 2 of the claim head needs labelled claims in the dev slice to stop on")
    spec = StageSpec(
        stage="cal", target=STAGE2_TARGET, n_train=len(tr), n_dev=len(dv), fresh=False, full_set=budget.is_all
    )
    return train_feature_stage(
        head,
        tr.features[pooling],
        tr.label,
        dv.features[pooling],
        dv.label,
        spec=spec,
        config=config,
        dev_correct=dv.label.astype(int),
    )


def score_rows(head: ConfidenceHead, rows: ClaimRows, pooling: str) -> np.ndarray:
    """The head's confidence for each row."""
    with torch.no_grad():
        x = torch.from_numpy(np.ascontiguousarray(rows.features[pooling])).to(head.device)
        return head.head(x).float().cpu().numpy().astype(float) if len(rows) else np.zeros(0)


def dev_auroc(head: ConfidenceHead, dev: ClaimRows, pooling: str) -> float | None:
    """AUROC of the head on the dev slice's labelled claims (None with one class)."""
    scored = dev.take(dev.scored)
    if len(set(scored.label.tolist())) < 2:
        return None
    return float(roc_auc_score(scored.label.astype(int), score_rows(head, scored, pooling)))


@dataclass
class FittedClaimHead:
    """A trained claim head, its pooling, its stages, and how the pooling was chosen."""

    head: ConfidenceHead
    pooling: str
    stages: list[StageResult]
    choice: dict[str, Any]


def fit_claim_heads(
    make_head: Any,
    train: ClaimRows,
    dev: ClaimRows,
    config: EliCalConfig,
    budgets: Sequence[Budget] = (WHOLE_POOL,),
    pooling: str = AUTO,
) -> dict[str, FittedClaimHead]:
    """Stage 1, then stage 2 at each budget resuming it (one stage 1 per pooling); ``make_head()`` gives a fresh
    head. Keyed by ``str(budget)``.

    ``pooling="auto"`` trains both poolings and keeps, at each budget, the better dev-slice claim AUROC (ties
    and a one-class dev slice: ``last``). Only the dev slice decides; test claims are never an input here.
    """
    candidates = list(POOLINGS) if pooling == AUTO else [pooling]
    if any(p not in POOLINGS for p in candidates):
        raise CandorError(f"unknown claim pooling {pooling!r}; known: {', '.join((*POOLINGS, AUTO))}")
    fitted: dict[str, dict[str, FittedClaimHead]] = {str(b): {} for b in budgets}
    for name in candidates:
        stage1 = make_head()
        first = train_stage_one(stage1, train, dev, name, config)
        for budget in budgets:
            head = copy_head(stage1)
            second = train_stage_two(head, train, dev, name, config, budget)
            fitted[str(budget)][name] = FittedClaimHead(head, name, [first, second], {})
    out = {}
    for key, by_pooling in fitted.items():
        scores = {name: dev_auroc(f.head, dev, name) for name, f in by_pooling.items()}
        if len(candidates) == 1:
            best, by = candidates[0], "set by the user"
        else:
            best = max(candidates, key=lambda p: -1.0 if scores[p] is None else float(scores[p]))  # type: ignore[arg-type]
            by = "the dev slice's claim AUROC (ties: last)"
            if all(v is None for v in scores.values()):
                by = "no dev AUROC (one class in the dev slice): last"
        out[key] = by_pooling[best]
        out[key].choice = {"pooling": best, "by": by, "dev_auroc": scores}
    return out


def prepare_claims(records: Sequence[Record], tokenizer: Any) -> dict[str, Any]:
    """Split the records' answers into claims where they have none, and label them by the compound gold."""
    for rec in records:
        if rec.claims is None:
            rec.claims = split_claims(rec.greedy.text, rec.greedy, decode=tokenizer.decode)
    return label_compound(records)


def train_claim_head(
    train_records: Sequence[Record],
    dev_records: Sequence[Record],
    *,
    out_dir: str | Path,
    config: EliCalConfig | None = None,
    budget: Budget = WHOLE_POOL,
    pooling: str = AUTO,
    judge: str = DEFAULT_CONSISTENCY_JUDGE,
    model: Any = None,
    tokenizer: Any = None,
    source: str | Path | None = None,
    dev_source: str | Path | None = None,
) -> TrainResult:
    """``candor train elical-claims``: a claim head on compound-prompt records, saved to ``out_dir``."""
    config = config or EliCalConfig(cal_target="hard")
    if config.mode != "head":
        raise CandorError("the claim head reads a frozen backbone (mode=head); mode=lora is not offered for claims")
    if not dev_records:
        raise CandorError("the claim head needs a dev slice for early stopping")
    if model is None or tokenizer is None:
        model, tokenizer = load_causal_lm(config.model, dtype=config.dtype, device=config.device)
    records = [*train_records, *dev_records]
    counts = prepare_claims(records, tokenizer)
    template = records_template(records, config.template, TokenizerChat(tokenizer, config.model))
    probe = fresh_head(model, tokenizer, template, config)
    rows = claim_rows(probe, records, judge, batch_size=config.eval_batch_size)
    is_train = rows.record < len(train_records)
    train, dev = rows.take(is_train), rows.take(~is_train)
    budget.size(int(train.scored.sum()))  # a budget over the labelled claims fails before training
    make = lambda: fresh_head(model, tokenizer, template, config)  # noqa: E731
    fitted = fit_claim_heads(make, train, dev, config, [budget], pooling)[str(budget)]
    head = fitted.head
    head.config.meta = {
        "method": "elical-claims",
        "level": CLAIM_LEVEL,
        "pooling": fitted.pooling,
        "pooling_choice": fitted.choice,
        "judge": judge,
        "budget": budget.as_json(),
        "cal_target": "claim label",
        "stages": [s.name for s in fitted.stages],
        "claims": {"train": len(train), "dev": len(dev), "labels": counts},
    }
    path = Path(out_dir)
    result = TrainResult(
        path=path,
        method="elical-claims",
        n_train=fitted.stages[-1].n_train,
        n_dev=fitted.stages[-1].n_dev,
        cost=stages_cost(fitted.stages),
        config={**config.fingerprint(), "pooling": fitted.pooling, "pooling_choice": fitted.choice, "judge": judge},
        stages=fitted.stages,
        budget=budget.as_json(),
        model=head,
    )
    head.save_pretrained(path)
    seen = [q for rec in records for q in (rec.item.question, *[p["question"] for p in rec.item.meta["parts"]])]
    sources = [str(s) for s in (source, dev_source) if s is not None]
    write_manifest(path, seen, sources)
    atomic_write_text(path / "training.json", json.dumps(result.to_dict(), indent=2, default=str) + "\n")
    return result


# ---------------------------------------------------------------- loading


def is_claim_head(config: HeadConfig) -> bool:
    return config.meta.get("level") == CLAIM_LEVEL


class ClaimHead:
    """A saved claim head, loaded: :meth:`score` gives one confidence per claim of each answer."""

    def __init__(self, head: ConfidenceHead) -> None:
        if not is_claim_head(head.config):
            raise CandorError(
                "this EliCal head is question-level (it reads the prompt only); elical-claims needs a head trained "
                "by `candor train elical-claims`"
            )
        self.head = head
        self.pooling = str(head.config.meta["pooling"])

    @classmethod
    def from_pretrained(cls, folder: str | Path, device: str | None = None, dtype: str | None = None) -> ClaimHead:
        config = HeadConfig.read(Path(folder))
        if not is_claim_head(config):
            raise CandorError(
                f"{folder}: a question-level EliCal head; elical-claims needs a head trained by "
                "`candor train elical-claims`"
            )
        return cls(ConfidenceHead.from_pretrained(folder, device=device, dtype=dtype))

    def prompts(self, questions: Sequence[str]) -> list[str]:
        """The prompts of ``questions`` under the head's template (the compound one for a compound question)."""
        return self.head.prompts(list(questions))

    def score(
        self, prompts: Sequence[str], answers: Sequence[Sequence[int]], claims: Sequence[Sequence[Claim]]
    ) -> list[np.ndarray]:
        """Per answer, one confidence per claim."""
        return head_values(self.head.head, claim_features(self.head, prompts, answers, claims)[self.pooling])


def head_values(linear: LinearHead, features: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The linear head's confidence of each row of each answer's ``[claims, hidden]`` features."""
    device = next(linear.parameters()).device
    out = []
    with torch.no_grad():
        for x in features:
            value = linear(torch.from_numpy(np.ascontiguousarray(x)).to(device)) if len(x) else torch.zeros(0)
            out.append(value.float().cpu().numpy().astype(float))
    return out


class ServedClaimHead:
    """A claim head's linear layer on the served model's own pass over the answer: no backbone of its own.

    :meth:`score` feeds the served backend the prompt's token ids (``backend.encode``, as its engine
    read them) followed by the answer's generated ids, reads the head's layer at every position
    (:data:`~candor.backends.base.TOKEN_STATES`, the forward stopped at that layer), pools each claim
    as the head does (:func:`pooled_features`) and applies the head's linear layer: the numbers of
    :meth:`ClaimHead.score` on the same prompt and ids when the backend holds the head's backbone.
    """

    def __init__(self, config: HeadConfig, linear: LinearHead) -> None:
        if not is_claim_head(config):
            raise CandorError(
                "this EliCal head is question-level (it reads the prompt only); elical-claims needs a head trained "
                "by `candor train elical-claims`"
            )
        self.config = config
        self.linear = linear.eval()
        self.pooling = str(config.meta["pooling"])

    @classmethod
    def from_folder(cls, folder: str | Path) -> ServedClaimHead:
        return cls(HeadConfig.read(Path(folder)), load_linear_head(folder))

    def score(
        self,
        backend: Any,
        prompts: Sequence[str],
        answers: Sequence[Sequence[int]],
        claims: Sequence[Sequence[Claim]],
    ) -> list[np.ndarray]:
        """Per answer, one confidence per claim, from ``backend.token_hidden_states`` at the head's layer."""
        if not len(prompts) == len(answers) == len(claims):
            raise CandorError(f"got {len(prompts)} prompts, {len(answers)} answers and {len(claims)} claim lists")
        todo = [i for i in range(len(prompts)) if claims[i]]
        prompt_ids = backend.encode([prompts[i] for i in todo]) if todo else []
        seqs = [list(ids) + list(answers[i]) for ids, i in zip(prompt_ids, todo, strict=True)]
        states = backend.token_hidden_states(seqs, self.config.layer) if seqs else []
        hidden = int(self.config.hidden_size)
        feats = [np.zeros((0, hidden), np.float32)] * len(prompts)
        for i, ids, own in zip(todo, prompt_ids, states, strict=True):
            feats[i] = pooled_features(own, len(ids), claims[i])[self.pooling]
        return head_values(self.linear, feats)


def copy_head(head: ConfidenceHead) -> ConfidenceHead:
    """A head on the same frozen backbone with its own copy of the linear head (one stage 1, many stage 2s)."""
    return ConfidenceHead(head.backbone, copy.deepcopy(head.head), copy.deepcopy(head.config), head.tokenizer)
