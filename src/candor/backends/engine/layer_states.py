"""One layer's hidden states, the forward stopped at that layer; the ``hf`` backend's ``token_hidden_states``.

A reader of one layer (EigenScore's continuation states, a claim head) needs
the input of the decoder layer after it, not the layers above: a forward
pre-hook on that decoder layer (:func:`decoder_layer`) stores its input and
stops the pass (:func:`stop_before`), so the layers above are never computed.
The last, normed state (and a model whose decoder layers cannot be found) is
read from ``output_hidden_states`` of the whole pass.

:func:`token_hidden_states` feeds given token ids (a served prompt's ids and
the answer's own generated ids, as the engine read them) and returns every
position's state at the layer: the numbers of ``output_hidden_states[layer]``
of a pass over the same ids, up to float round-off. Only the backend's public
plumbing is used (``model``, ``device``, ``pad_id``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from candor.backends.tokens import accepts_logits_to_keep, base_model, pad_batch, positions_from_mask
from candor.util.errors import CandorError


class StopForward(Exception):
    """Raised by the hook once the wanted hidden state is in hand: the layers above it are not run."""


def decoder_layer(model: Any, layer: int) -> Any:
    """The decoder layer whose input is hidden state ``layer`` (None for the last, normed one, or unknown models)."""
    layers = getattr(getattr(base_model(model), "model", None), "layers", None)
    n = int(model.config.num_hidden_layers)
    if layers is None or len(layers) < n or layer >= n:
        return None
    return layers[layer]


@contextmanager
def stop_before(module: Any) -> Iterator[list[Any]]:
    """While open, a forward reaching ``module`` stores its input hidden states and stops (no-op for None)."""
    caught: list[Any] = []
    if module is None:
        yield caught
        return

    def hook(_module: Any, args: tuple, kwargs: dict) -> None:
        caught.append(args[0] if args else kwargs["hidden_states"])
        raise StopForward

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield caught
    finally:
        handle.remove()


def absolute_index(model: Any, layer: int) -> int:
    """``layer`` as an index into ``output_hidden_states`` (``num_hidden_layers + 1`` entries; -1 the last)."""
    count = int(model.config.num_hidden_layers) + 1
    if not -count <= layer < count:
        raise CandorError(f"layer {layer} is out of range: the model has {count} hidden states")
    return layer % count


def token_hidden_states(
    backend: Any, sequences: Sequence[Sequence[int]], layer: int = -1, batch_size: int = 8
) -> list[np.ndarray]:
    """Per sequence of token ids, ``[len(sequence), hidden]`` float32: each position's ``layer`` hidden state.

    ``layer`` indexes ``output_hidden_states`` (0 the embeddings, -1 the final normed output). Rows run
    left-padded in batches of ``batch_size``, with position ids that count real tokens only, so a row's
    states do not depend on its padding; no cache is kept.
    """
    model = backend.model
    index = absolute_index(model, layer)
    if any(not s for s in sequences):
        raise CandorError("token_hidden_states: a sequence of token ids is empty")
    stop_at = decoder_layer(model, index)
    extra = {"logits_to_keep": 1} if stop_at is None and accepts_logits_to_keep(model) else {}
    out: list[np.ndarray] = []
    for start in range(0, len(sequences), batch_size):
        chunk = [list(s) for s in sequences[start : start + batch_size]]
        ids, mask = pad_batch(chunk, int(backend.pad_id), "left", device=backend.device)
        with stop_before(stop_at) as caught:
            try:
                result = model(
                    input_ids=ids,
                    attention_mask=mask,
                    position_ids=positions_from_mask(mask),
                    use_cache=False,
                    output_hidden_states=stop_at is None,
                    **extra,
                )
                states = result.hidden_states[index]
            except StopForward:
                states = caught[0]
        width = ids.shape[1]
        for row, seq in enumerate(chunk):
            out.append(states[row, width - len(seq) :].float().cpu().numpy())
    return out
