"""P(label | prompt) over a closed set of labels at inference: the verbalized P(C | q, a) and P(True).

Each label is read in several surface forms (by default without and with a
leading space) whose probabilities add up, then renormalized over the labels.
The log-probs come from the backend: :func:`candor.backends.base.score_candidates`
(the ``hf`` backend shares prefixes and candidate tokens there), or the
next-token log-probs when every form is one token. The differentiable twin
used in training is :class:`candor.verbal.scorer.LabelScorer`; a test holds
the two equal on every format.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from candor.backends.base import (
    PRUNED_CANDIDATES,
    SCORE_CANDIDATES,
    Backend,
    backend_capabilities,
    score_candidates,
)
from candor.util.errors import CandorError

SURFACE_PREFIXES = ("", " ")


def surface_forms(labels: Sequence[str], prefixes: Sequence[str] = SURFACE_PREFIXES) -> list[tuple[int, str]]:
    """``(label index, text)`` for each label written with each prefix, without duplicates."""
    seen: set[str] = set()
    out = []
    for k, label in enumerate(labels):
        for prefix in prefixes:
            text = prefix + label
            if text not in seen:
                seen.add(text)
                out.append((k, text))
    return out


def single_token_ids(backend: Backend, prompts: Sequence[str], forms: Sequence[str]) -> list[int] | None:
    """The one token id of each form after every prompt, or None when some form is not one token.

    A form is one token in context when tokenizing ``prompt + form`` gives the
    prompt's tokens plus exactly one more, the same one after every prompt.
    """
    ids: list[int] | None = None
    for prompt in prompts:
        context = backend.tokenize(prompt)
        found = []
        for form in forms:
            full = backend.tokenize(prompt + form)
            if len(full) != len(context) + 1 or full[:-1] != context:
                return None
            found.append(full[-1])
        if ids is not None and found != ids:
            return None
        ids = found
    return ids


def candidate_distribution(
    backend: Backend,
    prompts: Sequence[str],
    labels: Sequence[str],
    prefixes: Sequence[str] = SURFACE_PREFIXES,
) -> np.ndarray:
    """P(label | prompt) renormalized over ``labels``: shape ``(len(prompts), len(labels))``.

    Each label's probability is the sum over its surface forms (``prefix +
    label`` for each prefix). A backend with the ``score_candidates``
    capability (``hf``) scores every form as a continuation (a one-token form
    costs nothing beyond the prompt). Other backends use ``next_token_logprobs`` when every
    form is one token in context, and ``backend.score`` otherwise (SmolLM2
    writes "Confidence: 9" as ``:``, ``Ġ``, ``9``: reading only the
    single-token forms would drop the model's most likely path).
    """
    if not labels:
        raise CandorError("candidate_distribution: no labels")
    forms = surface_forms(labels, prefixes)
    texts = [text for _, text in forms]
    shares_work = SCORE_CANDIDATES in backend_capabilities(backend)
    ids = None if shares_work or not prompts else single_token_ids(backend, prompts, texts)
    if ids is not None:
        form_lp = np.asarray(backend.next_token_logprobs(list(prompts), ids), dtype=float)
    else:
        form_lp = score_candidates(backend, prompts, texts)
    owner = np.array([k for k, _ in forms])
    label_lp = np.stack([_logsumexp(form_lp[:, owner == k]) for k in range(len(labels))], axis=1)
    return _softmax(label_lp)


def pruned_candidate_distribution(
    backend: Backend,
    prompts: Sequence[str],
    labels: Sequence[str],
    min_mass: float,
    prefixes: Sequence[str] = SURFACE_PREFIXES,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`candidate_distribution` that expands the label trie only under nodes of probability ``min_mass`` or more.

    Labels whose every surface form lies under an unexpanded node get
    probability 0. Also returns, per prompt, the share ``u = U / (A + U)``
    where U is the probability of the unexpanded nodes and A that of the labels
    kept (before renormalizing): the exact distribution puts at most ``u`` of
    its mass on the labels dropped, so ``|μ_exact - μ| <= u · max_c |value(c) - μ|``
    (see :func:`candor.verbal.formats.mu_error_bound`). A prompt that keeps no
    label is scored exactly.
    """
    if not 0 < min_mass < 1:
        raise CandorError(f"min_mass must be in (0, 1), got {min_mass}")
    if PRUNED_CANDIDATES not in backend_capabilities(backend):
        kind = type(backend).__name__
        raise CandorError(
            f"the pruned label distribution (min_mass={min_mass}) needs a backend with {PRUNED_CANDIDATES} "
            f"(the hf backend); {kind} has none: drop the option to score exactly"
        )
    if not labels:
        raise CandorError("candidate_distribution: no labels")
    forms = surface_forms(labels, prefixes)
    form_lp, unexpanded = backend.score_candidates_pruned(list(prompts), [text for _, text in forms], min_mass)
    owner = np.array([k for k, _ in forms])
    label_lp = np.stack([_logsumexp(form_lp[:, owner == k]) for k in range(len(labels))], axis=1)
    kept = np.exp(label_lp).sum(axis=1)
    empty = np.flatnonzero(kept == 0)
    if len(empty):  # nothing kept: the exact distribution for those prompts
        exact = candidate_distribution(backend, [prompts[i] for i in empty], labels, prefixes)
        label_lp[empty], kept[empty], unexpanded[empty] = np.log(exact), 1.0, 0.0
    return _softmax(label_lp), unexpanded / (kept + unexpanded)


def _logsumexp(x: np.ndarray) -> np.ndarray:
    top = x.max(axis=1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):  # all -inf (every form dropped): log 0 = -inf
        return (top + np.log(np.exp(x - top).sum(axis=1, keepdims=True)))[:, 0]


def _softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)
