"""A differentiable P(C | q, a) over a format's labels, from one causal-LM forward on token ids.

Inference reads the confidence distribution with
:func:`candor.backends.prefix_scoring.candidate_distribution` (numpy, no
gradients, every label scored as a continuation). Training (ADVICE,
ConfTuner) and diagnostics (integrated gradients) need the same numbers as a
torch expression of the model's weights or input embeddings. This module
computes them so that both paths agree (to float round-off):

- every label is read in its two surface forms, without and with a leading
  space, tokenized as they are after ``Confidence:`` (the end of every format
  prompt); the forms' probabilities add up and the result is renormalized
  over the labels;
- a one-token form is read from the logits at the prompt's last token;
- a two-token form (SmolLM2 writes " 9" as ``Ġ`` + ``9``) is the product of
  P(first token) at the last position and P(second | first) one position
  later. The first token is appended after each row's last real token, so the
  same forward pass gives both (causal attention: appending a token does not
  change earlier logits). Forms with different first tokens (ScoreText's
  "very" and " very") need one extra copy of each row per further first
  token, run in the same forward.
- Longer forms (ScoreFloat's "0.0", ScorePercent's "80%") are refused with a
  :class:`CandorError`; score those formats with ``candidate_distribution``.

Position ids are derived from the attention mask, as the ``hf`` backend does,
so left and right padding give the same distribution. Logits are computed only
at the positions read (``logits_to_keep`` with the columns needed), not over
the whole sequence.

The prompt helpers render exactly :func:`candor.verbal_formats.format_prompt`
through the tokenizer's chat template and encode it as ``HFBackend`` does, and
locate the answer's tokens in it (for the LM loss and for diagnostics).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from candor.backends.prefix_scoring import surface_forms
from candor.data.items import QAItem
from candor.errors import CandorError
from candor.prompts import TokenizerChat
from candor.verbal_formats import CONFIDENCE_CUE, VerbalFormat, format_prompt, get_format

# The longest surface form (in tokens) that one extra position can read.
MAX_FORM_TOKENS = 2
# A shared prefix shorter than this is not worth a separate forward pass.
MIN_SHARED_PREFIX = 8


# ---------------------------------------------------------------- prompts as token ids



@dataclass(frozen=True)
class PromptIds:
    """A format prompt as token ids, and where the answer's tokens are: ``ids[answer_start:answer_end]``."""

    ids: tuple[int, ...]
    answer_start: int
    answer_end: int
    text: str

    @property
    def answer_span(self) -> tuple[int, int]:
        return self.answer_start, self.answer_end


def prompt_text(tokenizer: Any, item: QAItem, answer: str, fmt: str | VerbalFormat, variant: str = "default") -> str:
    """Exactly :func:`candor.verbal_formats.format_prompt` for a backend built on ``tokenizer``."""
    return format_prompt(TokenizerChat(tokenizer), item, answer, fmt, variant)  # type: ignore[arg-type]


def encode_prompt(tokenizer: Any, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids as ``HFBackend`` encodes a prompt (special tokens, no doubled BOS), with character offsets."""
    enc = tokenizer(text, add_special_tokens=True, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
    bos = tokenizer.bos_token_id
    if bos is not None and ids[:2] == [bos, bos]:
        ids, offsets = ids[1:], offsets[1:]
    return ids, offsets  # type: ignore[return-value]


def token_span(offsets: Sequence[tuple[int, int]], start: int, end: int) -> tuple[int, int]:
    """The tokens overlapping characters ``[start, end)``: ``(first, last + 1)``; ``(n, n)`` when none.

    A token that straddles the boundary (e.g. "Ġ1989" or ".Ċ") counts as the
    answer's; zero-width (special) tokens never do.
    """
    inside = [i for i, (s, e) in enumerate(offsets) if e > s and s < end and e > start]
    if not inside or end <= start:
        return len(offsets), len(offsets)
    return inside[0], inside[-1] + 1


def build_prompt(
    tokenizer: Any, item: QAItem, answer: str, fmt: str | VerbalFormat, variant: str = "default"
) -> PromptIds:
    """The format prompt that scores ``answer`` as token ids, with the answer's token span."""
    text = prompt_text(tokenizer, item, answer, fmt, variant)
    tail = f"{answer.strip()}\n{CONFIDENCE_CUE}"
    char_start = text.rfind(tail)
    if char_start < 0:  # format_prompt always ends with this; a changed template would break the span
        raise CandorError(f"the format prompt does not end with the answer line {tail!r}")
    ids, offsets = encode_prompt(tokenizer, text)
    start, end = token_span(offsets, char_start, char_start + len(answer.strip()))
    return PromptIds(tuple(ids), start, end, text)


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int, side: str = "left") -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` padded on ``side`` ("left" or "right") to the longest sequence."""
    if side not in ("left", "right"):
        raise CandorError(f"padding side must be 'left' or 'right', got {side!r}")
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, seq in enumerate(seqs):
        cols = slice(width - len(seq), width) if side == "left" else slice(0, len(seq))
        ids[row, cols] = torch.tensor(list(seq), dtype=torch.long)
        mask[row, cols] = 1
    return ids, mask


def span_mask(spans: Sequence[tuple[int, int]], lengths: Sequence[int], width: int, side: str = "left") -> torch.Tensor:
    """A ``[B, width]`` bool mask of the token spans (given in unpadded positions) after padding."""
    out = torch.zeros((len(spans), width), dtype=torch.bool)
    for row, ((start, end), length) in enumerate(zip(spans, lengths, strict=True)):
        shift = width - length if side == "left" else 0
        out[row, start + shift : end + shift] = True
    return out


# ---------------------------------------------------------------- the scorer


@dataclass
class LabelForward:
    """What one scoring pass gives.

    ``log_probs``: ``[B, n_labels]`` log P(label), renormalized over the labels.
    ``token_logprobs``: ``[B, W]`` log-prob of each target token (0 where not a
    target), when targets were asked for.
    """

    log_probs: torch.Tensor
    token_logprobs: torch.Tensor | None = None


class LabelScorer:
    """Differentiable log P(C | q, a) over ``fmt``'s labels at the end of a format prompt.

    ``context`` is the text the prompts end with; the labels are tokenized as
    they follow it.
    """

    def __init__(self, tokenizer: Any, fmt: str | VerbalFormat, context: str = CONFIDENCE_CUE) -> None:
        self.fmt = get_format(fmt)
        self.values = torch.tensor(self.fmt.values, dtype=torch.float32)
        base = list(tokenizer(context, add_special_tokens=False)["input_ids"])
        single: list[tuple[int, int]] = []  # (label, token)
        double: list[tuple[int, int, int]] = []  # (label, first token, second token)
        for label, text in surface_forms(self.fmt.labels):
            full = list(tokenizer(context + text, add_special_tokens=False)["input_ids"])
            tail = full[len(base) :]
            if full[: len(base)] != base:
                raise CandorError(
                    f"{self.fmt.name}: label form {text!r} merges with {context!r} when tokenized; "
                    "it cannot be read at the next position"
                )
            if not 1 <= len(tail) <= MAX_FORM_TOKENS:
                raise CandorError(
                    f"{self.fmt.name}: label form {text!r} is {len(tail)} tokens after {context!r}; "
                    f"the differentiable scorer reads forms of at most {MAX_FORM_TOKENS} tokens "
                    "(use candor.backends.prefix_scoring.candidate_distribution for this format)"
                )
            if len(tail) == 1:
                single.append((label, tail[0]))
            else:
                double.append((label, tail[0], tail[1]))
        self.first_tokens = list(dict.fromkeys(f for _, f, _ in double))  # one forward block each
        n_forms = len(single) + len(double)
        self._owner = torch.tensor([k for k, _ in single] + [k for k, _, _ in double], dtype=torch.long)
        self._single_tokens = torch.tensor([t for _, t in single], dtype=torch.long)
        self._double_first = torch.tensor([f for _, f, _ in double], dtype=torch.long)
        self._double_block = torch.tensor([self.first_tokens.index(f) for _, f, _ in double], dtype=torch.long)
        self._double_second = torch.tensor([t for _, _, t in double], dtype=torch.long)
        self.n_forms = n_forms

    @property
    def n_labels(self) -> int:
        return self.fmt.n_values

    # ------------------------------------------------------------ public

    def log_distribution(
        self,
        model: Any,
        input_ids: torch.Tensor | None,
        attention_mask: torch.Tensor,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[B, n_labels]`` log-probabilities renormalized over the labels (differentiable)."""
        return self.forward(model, input_ids, attention_mask, inputs_embeds).log_probs

    def expected_value(self, log_probs: torch.Tensor) -> torch.Tensor:
        """μ = Σ_c P(c)·value(c) per row, ``[B]``."""
        return log_probs.exp() @ self.values.to(log_probs.device, log_probs.dtype)

    def forward(
        self,
        model: Any,
        input_ids: torch.Tensor | None,
        attention_mask: torch.Tensor,
        inputs_embeds: torch.Tensor | None = None,
        targets: torch.Tensor | None = None,
        share_prefix: bool = False,
    ) -> LabelForward:
        """The label distribution, and the log-probs of ``targets`` (a ``[B, W]`` bool mask) from the same pass.

        A target token at column t is predicted by the logits at column t-1;
        a target in a row's first real position has no prediction and is an
        error. With ``share_prefix`` (token ids only), the token prefix common
        to all rows (chat header, system text) runs once and its KV cache, with
        its gradient, is repeated for every row: the same numbers for less
        compute when a batch shares a long system prompt.
        """
        if input_ids is None and inputs_embeds is None:
            raise CandorError("LabelScorer needs input_ids or inputs_embeds")
        if targets is not None and input_ids is None:
            raise CandorError("target token log-probs need input_ids (the tokens to score)")
        plan = None
        if share_prefix and input_ids is not None and inputs_embeds is None:
            plan = self._shared_plan(input_ids, attention_mask, targets)
        if plan is None:
            plan = self._plain_plan(model, input_ids, attention_mask, inputs_embeds, targets)
        logits = plan.run(model)
        return self._read(logits, plan, input_ids, targets)

    # ------------------------------------------------------------ plans

    def _plain_plan(
        self,
        model: Any,
        input_ids: torch.Tensor | None,
        attention_mask: torch.Tensor,
        inputs_embeds: torch.Tensor | None,
        targets: torch.Tensor | None,
    ) -> _Plan:
        """Rows as given (any padding), each first token of a two-token form written after the last real token."""
        mask = attention_mask.long()
        batch, width = mask.shape
        device = mask.device
        last = (mask * torch.arange(width, device=device)).argmax(-1)  # last real token of each row
        if self.first_tokens:
            input_ids, inputs_embeds, mask = self._append_first_tokens(model, input_ids, inputs_embeds, mask, last)
        plan = _Plan(input_ids, inputs_embeds, mask, (mask.cumsum(-1) - 1).clamp(min=0), batch)
        plan.last = last
        if self.first_tokens:
            plan.slot = last + 1
        if targets is not None:
            rows, cols = torch.nonzero(targets, as_tuple=True)
            if bool((mask[rows, cols - 1] == 0).any()) or bool((cols == 0).any()):
                raise CandorError("a target token in a row's first position has no logits that predict it")
            plan.target_rows, plan.target_cols, plan.target_read = rows, cols, cols - 1
        return plan

    def _shared_plan(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, targets: torch.Tensor | None
    ) -> _Plan | None:
        """A prefix run once plus left-padded suffixes, or None when the rows share too short a prefix."""
        mask = attention_mask.bool()
        real = [torch.nonzero(m).flatten() for m in mask]  # padded column of each real token, per row
        seqs = [ids[cols].tolist() for ids, cols in zip(input_ids, real, strict=True)]
        limit = min(len(s) for s in seqs) - 1
        if targets is not None and bool(targets.any()):
            # Targets need the logits one position earlier, which the suffix pass must compute.
            firsts = [int(torch.nonzero(t[cols]).min()) for t, cols in zip(targets, real, strict=True) if t.any()]
            limit = min(limit, min(firsts) - 1)
        prefix = 0
        while prefix < limit and all(s[prefix] == seqs[0][prefix] for s in seqs):
            prefix += 1
        if prefix < MIN_SHARED_PREFIX:
            return None
        extra = 1 if self.first_tokens else 0
        suffixes = [s[prefix:] for s in seqs]
        width = max(len(s) for s in suffixes) + extra
        batch, device = len(seqs), input_ids.device
        blocks = []
        for token in self.first_tokens or [None]:
            tails = [s + ([token] if token is not None else []) for s in suffixes]
            blocks.append(pad_batch(tails, 0, "left"))
        ids = torch.cat([b[0] for b in blocks]).to(device)
        suffix_mask = torch.cat([b[1] for b in blocks]).to(device)
        full_mask = torch.cat([suffix_mask.new_ones(len(ids), prefix), suffix_mask], dim=1)
        plan = _Plan(ids, None, full_mask, prefix + (suffix_mask.cumsum(-1) - 1).clamp(min=0), batch)
        plan.prefix_ids = input_ids[0, real[0][:prefix]].unsqueeze(0)
        plan.last = torch.full((batch,), width - 1 - extra, dtype=torch.long, device=device)
        if self.first_tokens:
            plan.slot = plan.last + 1
        if targets is not None:
            rows, cols = torch.nonzero(targets, as_tuple=True)
            # Padded column → real position → suffix column (suffixes end at column width - 1 - extra).
            lengths = torch.tensor([len(s) for s in seqs], device=device)
            position = targets.new_zeros(targets.shape, dtype=torch.long)
            for b, c in enumerate(real):
                position[b, c] = torch.arange(len(c), device=device)
            suffix_col = position[rows, cols] - prefix + (width - extra) - (lengths[rows] - prefix)
            plan.target_rows, plan.target_cols, plan.target_read = rows, cols, suffix_col - 1
        return plan

    # ------------------------------------------------------------ reading

    def _read(
        self, logits: torch.Tensor, plan: _Plan, input_ids: torch.Tensor | None, targets: torch.Tensor | None
    ) -> LabelForward:
        batch = plan.batch
        rows = torch.arange(batch, device=logits.device)
        first = torch.log_softmax(plan.at(logits, rows, plan.last).float(), -1)
        forms = [first[:, self._single_tokens.to(first.device)]]
        if self.first_tokens:
            second = torch.stack(
                [
                    torch.log_softmax(plan.at(logits, b * batch + rows, plan.slot).float(), -1)
                    for b in range(len(self.first_tokens))
                ]
            )  # [blocks, B, V]
            lp_first = first[:, self._double_first.to(first.device)]
            block, token = self._double_block.to(first.device), self._double_second.to(first.device)
            forms.append(lp_first + second[block, :, token].T)
        label_lp = self._per_label(torch.cat(forms, dim=1))
        token_lp = None
        if targets is not None:
            assert input_ids is not None
            token_lp = torch.zeros(targets.shape, dtype=torch.float32, device=logits.device)
            if plan.target_rows.numel():
                picked = plan.at(logits, plan.target_rows, plan.target_read).float()  # [N, V]
                tokens = input_ids[plan.target_rows, plan.target_cols]
                values = picked.gather(1, tokens.unsqueeze(1)).squeeze(1) - torch.logsumexp(picked, dim=-1)
                token_lp = token_lp.index_put((plan.target_rows, plan.target_cols), values)
        return LabelForward(torch.log_softmax(label_lp, dim=-1), token_lp)

    def _per_label(self, form_lp: torch.Tensor) -> torch.Tensor:
        """logsumexp of each label's forms: ``[B, n_forms]`` → ``[B, n_labels]``."""
        owner = self._owner.to(form_lp.device)
        cols = [torch.logsumexp(form_lp[:, owner == k], dim=1) for k in range(self.n_labels)]
        return torch.stack(cols, dim=1)

    def _append_first_tokens(
        self,
        model: Any,
        input_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
        mask: torch.Tensor,
        last: torch.Tensor,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
        """One block per first token: each row with that token written right after its last real token."""
        batch, width = mask.shape
        device = mask.device
        slot_hot = torch.nn.functional.one_hot(last + 1, width + 1).bool()  # [B, W+1]
        ext_mask = torch.cat([mask, mask.new_zeros(batch, 1)], dim=1) | slot_hot.long()
        ids_blocks, emb_blocks = [], []
        for token in self.first_tokens:
            if input_ids is not None:
                ext = torch.cat([input_ids, input_ids.new_zeros(batch, 1)], dim=1)
                ids_blocks.append(torch.where(slot_hot, torch.full_like(ext, token), ext))
            if inputs_embeds is not None:
                zero = inputs_embeds.new_zeros(batch, 1, inputs_embeds.shape[-1])
                ext_emb = torch.cat([inputs_embeds, zero], dim=1)
                vec = _unwrap(model).get_input_embeddings()(torch.tensor([token], device=device)).to(ext_emb.dtype)
                emb_blocks.append(torch.where(slot_hot.unsqueeze(-1), vec.view(1, 1, -1), ext_emb))
        blocks = len(self.first_tokens)
        new_ids = torch.cat(ids_blocks) if ids_blocks else None
        new_emb = torch.cat(emb_blocks) if emb_blocks else None
        return new_ids, new_emb, ext_mask.repeat(blocks, 1)


@dataclass
class _Plan:
    """One scoring forward: what to feed, and which (row, column) logits to read.

    ``last[b]`` is the column whose logits predict a label's first token in
    row b, ``slot[b]`` the column of an appended first token (block k's rows
    are ``k * batch + b``), and target token i sits at ``(target_rows[i],
    target_cols[i])`` of the caller's tensors and is read at column
    ``target_read[i]`` of the fed rows. With ``prefix_ids`` the fed rows are
    suffixes that continue a prefix run once.
    """

    input_ids: torch.Tensor | None
    inputs_embeds: torch.Tensor | None
    mask: torch.Tensor
    position_ids: torch.Tensor
    batch: int
    prefix_ids: torch.Tensor | None = None
    last: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    slot: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    target_rows: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    target_cols: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    target_read: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    columns: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))

    def run(self, model: Any) -> torch.Tensor:
        """Logits ``[R, K, V]`` at :attr:`columns` only (position ids from the mask)."""
        self.columns = torch.unique(torch.cat([self.last, self.slot, self.target_read]))
        kwargs: dict[str, Any] = {"attention_mask": self.mask, "position_ids": self.position_ids}
        if self.input_ids is not None and self.inputs_embeds is None:
            kwargs["input_ids"] = self.input_ids
        else:
            kwargs["inputs_embeds"] = self.inputs_embeds
        if self.prefix_ids is not None:
            kwargs.update(_prefix_cache(model, self.prefix_ids, len(self.mask)))
        else:
            kwargs["use_cache"] = False
        keeps = _accepts_logits_to_keep(model)
        if keeps:
            kwargs["logits_to_keep"] = self.columns.to(self.mask.device)
        logits = model(**kwargs).logits
        return logits if keeps else logits[:, self.columns.to(logits.device)]

    def at(self, logits: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """``logits`` of fed rows ``rows`` at fed columns ``cols`` (pairwise): ``[N, V]``."""
        index = torch.searchsorted(self.columns.to(cols.device), cols)
        return logits[rows.to(logits.device), index.to(logits.device)]


def _prefix_cache(model: Any, prefix_ids: torch.Tensor, rows: int) -> dict[str, Any]:
    """Run the shared prefix once (with gradients) and return the forward kwargs of its cache, one copy per row."""
    from transformers import DynamicCache

    base = _unwrap_all(model)
    name = "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
    try:
        cache = DynamicCache(config=base.config)
    except TypeError:  # older transformers: no per-layer config
        cache = DynamicCache()
    length = prefix_ids.shape[1]
    positions = torch.arange(length, device=prefix_ids.device).unsqueeze(0)
    kwargs: dict[str, Any] = {
        "input_ids": prefix_ids, "attention_mask": torch.ones_like(prefix_ids), "position_ids": positions,
        name: cache, "use_cache": True,
    }  # fmt: skip
    if _accepts_logits_to_keep(model):
        kwargs["logits_to_keep"] = 1
    model(**kwargs)
    cache.batch_repeat_interleave(rows)
    return {name: cache, "use_cache": True}


def _unwrap_all(model: Any) -> Any:
    """The plain transformers model inside DDP-style and PEFT wrappers."""
    while hasattr(model, "module"):
        model = model.module
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _unwrap(model: Any) -> Any:
    """The model inside DDP-style wrappers (``.module``)."""
    while hasattr(model, "module") and not hasattr(model, "get_input_embeddings"):
        model = model.module
    return model


def _accepts_logits_to_keep(model: Any) -> bool:
    """Whether the model's forward takes ``logits_to_keep`` (PEFT's forward passes it through)."""
    try:
        return "logits_to_keep" in inspect.signature(_unwrap_all(model).forward).parameters
    except (TypeError, ValueError):
        return False
