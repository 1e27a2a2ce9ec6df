"""A differentiable P(C | q, a) over a format's labels, from one causal-LM forward on token ids.

Inference reads the confidence distribution with
:func:`candor.verbal.distribution.candidate_distribution` (numpy, no
gradients, every label scored as a continuation). Training (ADVICE,
ConfTuner) and diagnostics (integrated gradients) need the same numbers as a
torch expression of the model's weights or input embeddings. This module
computes them so that both paths agree (to float round-off; a test checks
every format):

- every label is read in its two surface forms, without and with a leading
  space, tokenized as they are after ``Confidence:`` (the end of every format
  prompt); the forms' probabilities add up and the result is renormalized
  over the labels;
- a one-token form is read from the logits at the prompt's last token;
- a longer form (SmolLM2 writes " 9" as ``Ġ`` + ``9`` and " 80%" as ``Ġ`` +
  ``8`` + ``0`` + ``%``) is the product of P(first token) at the last position
  and P(next | the form's tokens so far) at each later position. The forms'
  tokens but the last are appended after each row's last real token as
  *chains*: the leaves of the trie of the forms' proper prefixes, so a chain
  serves every form it starts ("Ġ8" + "0" serves " 8%", " 80%"). Each chain is
  one copy of the batch in the same forward (causal attention: appending tokens
  does not change earlier logits). A format costs one copy per chain: none for
  ScoreLetter, one for ScoreNumber, two for ScoreText, four for ScoreFloat and
  about 180 for ScorePercent (use ``share_prefix`` there, so only the rows'
  suffixes are copied).

Position ids are derived from the attention mask, as the ``hf`` backend does,
so left and right padding give the same distribution. Logits are computed only
at the positions read (``logits_to_keep`` with the columns needed), not over
the whole sequence.

The prompt helpers render exactly :func:`candor.verbal.formats.format_prompt`
through the tokenizer's chat template and encode it as ``HFBackend`` does, and
locate the answer's tokens in it (for the LM loss and for diagnostics).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from candor.backends import tokens
from candor.backends.chat import TokenizerChat
from candor.backends.tokens import MIN_SHARED_PREFIX, encode_with_offsets, pad_batch, positions_from_mask
from candor.data.items import QAItem
from candor.util.errors import CandorError
from candor.verbal.distribution import surface_forms
from candor.verbal.formats import CONFIDENCE_CUE, VerbalFormat, format_prompt, get_format

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
    """Exactly :func:`candor.verbal.formats.format_prompt` for a backend built on ``tokenizer``."""
    return format_prompt(TokenizerChat(tokenizer), item, answer, fmt, variant)  # type: ignore[arg-type]


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
    ids, offsets = encode_with_offsets(tokenizer, text)
    start, end = token_span(offsets, char_start, char_start + len(answer.strip()))
    return PromptIds(tuple(ids), start, end, text)


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
        forms: list[tuple[int, tuple[int, ...]]] = []  # (label, the form's tokens after the context)
        for label, text in surface_forms(self.fmt.labels):
            full = list(tokenizer(context + text, add_special_tokens=False)["input_ids"])
            if full[: len(base)] != base or len(full) == len(base):
                raise CandorError(
                    f"{self.fmt.name}: label form {text!r} merges with {context!r} when tokenized; "
                    "it cannot be read at the next position"
                )
            forms.append((label, tuple(full[len(base) :])))
        self.chains = _chains([t for _, t in forms])
        self.extra = max((len(c) for c in self.chains), default=0)  # columns appended after each row
        block_of = {}
        for b, chain in enumerate(self.chains):
            for k in range(1, len(chain) + 1):
                block_of.setdefault(chain[:k], b)
        # One read per form token: (form, block, columns after the last real token, token).
        reads = []
        for f, (_, form) in enumerate(forms):
            block = block_of[form[:-1]] if len(form) > 1 else 0
            reads.extend((f, block, j, token) for j, token in enumerate(form))
        self.n_forms = len(forms)
        self._owner = torch.tensor([label for label, _ in forms], dtype=torch.long)
        self._read_form, self._read_block, self._read_offset, self._read_token = (
            torch.tensor(column, dtype=torch.long) for column in zip(*reads, strict=True)
        )

    @property
    def n_labels(self) -> int:
        return self.fmt.n_values

    @property
    def first_tokens(self) -> list[int]:
        """The first token of each chain (the appended copies), without repeats."""
        return list(dict.fromkeys(chain[0] for chain in self.chains))

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
        """Rows as given (any padding), one copy per chain with the chain written after the last real token."""
        mask = attention_mask.long()
        batch = mask.shape[0]
        last = tokens.last_token_index(mask)
        if self.chains:
            input_ids, inputs_embeds, mask = self._append_chains(model, input_ids, inputs_embeds, mask, last)
        plan = _Plan(
            input_ids=input_ids,
            inputs_embeds=inputs_embeds,
            mask=mask,
            position_ids=positions_from_mask(mask),
            batch=batch,
        )
        plan.last = last
        plan.ahead = self.extra
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
        prefix = tokens.shared_prefix_length(seqs)
        if targets is not None and bool(targets.any()):
            # Targets need the logits one position earlier, which the suffix pass must compute.
            firsts = [int(torch.nonzero(t[cols]).min()) for t, cols in zip(targets, real, strict=True) if t.any()]
            prefix = min(prefix, min(firsts) - 1)
        if prefix < MIN_SHARED_PREFIX:
            return None
        extra = self.extra
        suffixes = [s[prefix:] for s in seqs]
        width = max(len(s) for s in suffixes) + extra
        batch, device = len(seqs), input_ids.device
        blocks = []
        for chain in self.chains or [()]:
            blocks.append(pad_batch([s + _padded(chain, extra) for s in suffixes], 0, "left"))
        ids = torch.cat([b[0] for b in blocks]).to(device)
        suffix_mask = torch.cat([b[1] for b in blocks]).to(device)
        full_mask = torch.cat([suffix_mask.new_ones(len(ids), prefix), suffix_mask], dim=1)
        plan = _Plan(
            input_ids=ids,
            inputs_embeds=None,
            mask=full_mask,
            position_ids=prefix + positions_from_mask(suffix_mask),
            batch=batch,
        )
        plan.prefix_ids = input_ids[0, real[0][:prefix]].unsqueeze(0)
        plan.last = torch.full((batch,), width - 1 - extra, dtype=torch.long, device=device)
        plan.ahead = extra
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
        batch, device = plan.batch, logits.device
        log_z = torch.logsumexp(logits.float(), dim=-1)  # [fed rows, kept columns]
        # Read i of row b: block (read_block[i]) copy of row b, read_offset[i] columns after its last token.
        rows = self._read_block.to(device).unsqueeze(0) * batch + torch.arange(batch, device=device).unsqueeze(1)
        cols = plan.last.to(device).unsqueeze(1) + self._read_offset.to(device).unsqueeze(0)
        index = plan.kept_index(cols)
        token = self._read_token.to(device).expand(batch, -1)
        values = logits[rows, index, token].float() - log_z[rows, index]  # [B, reads]
        form_lp = values.new_zeros(batch, self.n_forms).index_add(1, self._read_form.to(device), values)
        label_lp = self._per_label(form_lp)
        token_lp = None
        if targets is not None:
            assert input_ids is not None
            token_lp = torch.zeros(targets.shape, dtype=torch.float32, device=device)
            if plan.target_rows.numel():
                rows_t, read_t = plan.target_rows.to(device), plan.kept_index(plan.target_read)
                picked = logits[rows_t, read_t].float()  # [N, V]
                toks = input_ids[plan.target_rows, plan.target_cols].to(device)
                values_t = picked.gather(1, toks.unsqueeze(1)).squeeze(1) - log_z[rows_t, read_t]
                token_lp = token_lp.index_put((plan.target_rows, plan.target_cols), values_t)
        return LabelForward(torch.log_softmax(label_lp, dim=-1), token_lp)

    def _per_label(self, form_lp: torch.Tensor) -> torch.Tensor:
        """logsumexp of each label's forms: ``[B, n_forms]`` → ``[B, n_labels]``."""
        owner = self._owner.to(form_lp.device)
        cols = [torch.logsumexp(form_lp[:, owner == k], dim=1) for k in range(self.n_labels)]
        return torch.stack(cols, dim=1)

    def _append_chains(
        self,
        model: Any,
        input_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
        mask: torch.Tensor,
        last: torch.Tensor,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
        """One copy of the rows per chain, the chain (padded to ``extra``) written right after the last real token."""
        batch, width = mask.shape
        device = mask.device
        extra = self.extra
        cols = last.unsqueeze(1) + 1 + torch.arange(extra, device=device)  # [B, extra]
        ext_mask = torch.cat([mask, mask.new_zeros(batch, extra)], dim=1).scatter(1, cols, 1)
        ids_blocks, emb_blocks = [], []
        for chain in self.chains:
            chain_ids = torch.tensor(_padded(chain, extra), dtype=torch.long, device=device)
            if input_ids is not None:
                ext = torch.cat([input_ids, input_ids.new_zeros(batch, extra)], dim=1)
                ids_blocks.append(ext.scatter(1, cols, chain_ids.expand(batch, -1)))
            if inputs_embeds is not None:
                hidden = inputs_embeds.shape[-1]
                ext_emb = torch.cat([inputs_embeds, inputs_embeds.new_zeros(batch, extra, hidden)], dim=1)
                vecs = _unwrap(model).get_input_embeddings()(chain_ids).to(ext_emb.dtype)  # [extra, H]
                at = cols.unsqueeze(-1).expand(-1, -1, hidden)
                emb_blocks.append(ext_emb.scatter(1, at, vecs.unsqueeze(0).expand(batch, -1, -1)))
        blocks = len(self.chains)
        new_ids = torch.cat(ids_blocks) if ids_blocks else None
        new_emb = torch.cat(emb_blocks) if emb_blocks else None
        return new_ids, new_emb, ext_mask.repeat(blocks, 1)


def _chains(forms: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The leaves of the trie of the forms' proper prefixes, in first-seen order.

    Appending a leaf after the prompt gives, in one row, the logits after each
    of its prefixes, so the leaves cover every token of every form but the first.
    """
    prefixes = dict.fromkeys(form[:k] for form in forms for k in range(1, len(form)))
    inner = {p[:k] for p in prefixes for k in range(1, len(p))}
    return [p for p in prefixes if p not in inner]


def _padded(chain: Sequence[int], width: int) -> list[int]:
    """``chain`` filled up to ``width`` by repeating its last token (causal: nothing reads past the chain)."""
    return list(chain) + [chain[-1]] * (width - len(chain)) if chain else []


@dataclass
class _Plan:
    """One scoring forward: what to feed, and which (row, column) logits to read.

    ``last[b]`` is the column whose logits predict a label's first token in
    row b; the ``ahead`` columns after it hold the appended chain (block k's
    rows are ``k * batch + b``). Target token i sits at ``(target_rows[i],
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
    ahead: int = 0
    target_rows: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    target_cols: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    target_read: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    columns: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))

    def run(self, model: Any) -> torch.Tensor:
        """Logits ``[R, K, V]`` at :attr:`columns` only (position ids from the mask)."""
        label_cols = self.last.unsqueeze(1) + torch.arange(self.ahead + 1, device=self.last.device)
        self.columns = torch.unique(torch.cat([label_cols.flatten(), self.target_read.to(self.last.device)]))
        kwargs: dict[str, Any] = {"attention_mask": self.mask, "position_ids": self.position_ids}
        if self.input_ids is not None and self.inputs_embeds is None:
            kwargs["input_ids"] = self.input_ids
        else:
            kwargs["inputs_embeds"] = self.inputs_embeds
        if self.prefix_ids is not None:
            kwargs.update(_prefix_cache(model, self.prefix_ids, len(self.mask)))
        else:
            kwargs["use_cache"] = False
        keeps = tokens.accepts_logits_to_keep(model)
        if keeps:
            kwargs["logits_to_keep"] = self.columns.to(self.mask.device)
        logits = model(**kwargs).logits
        return logits if keeps else logits[:, self.columns.to(logits.device)]

    def kept_index(self, cols: torch.Tensor) -> torch.Tensor:
        """Where fed columns ``cols`` sit among the kept logits' columns."""
        return torch.searchsorted(self.columns.to(cols.device), cols.contiguous())


def _prefix_cache(model: Any, prefix_ids: torch.Tensor, rows: int) -> dict[str, Any]:
    """Run the shared prefix once (with gradients) and return the forward kwargs of its cache, one copy per row."""
    name = tokens.cache_keyword(model)
    cache = tokens.new_cache(model)
    length = prefix_ids.shape[1]
    positions = torch.arange(length, device=prefix_ids.device).unsqueeze(0)
    kwargs: dict[str, Any] = {
        "input_ids": prefix_ids,
        "attention_mask": torch.ones_like(prefix_ids),
        "position_ids": positions,
        name: cache,
        "use_cache": True,
    }
    if tokens.accepts_logits_to_keep(model):
        kwargs["logits_to_keep"] = 1
    model(**kwargs)
    cache.batch_repeat_interleave(rows)
    return {name: cache, "use_cache": True}


def _unwrap(model: Any) -> Any:
    """The model inside DDP-style wrappers (``.module``)."""
    while hasattr(model, "module") and not hasattr(model, "get_input_embeddings"):
        model = model.module
    return model
