"""Seeds derived from names: the one rule for a per-item (or per-epoch) seed.

A seed made from ``(run seed, item id)`` does not depend on the batch, shard or
process an item lands in, so shards equal a single run and a resumed run draws
what an uninterrupted one would. The rule hashes the parts with SHA-256, so it
is the same in every process (Python's ``hash()`` is salted per process).
Callers that must draw differently from another caller for the same item add a
label part (``item_seed("self-consistency", seed, id)``).
"""

from __future__ import annotations

import hashlib
import random


def item_seed(*parts: object) -> int:
    """A 31-bit seed from ``parts`` (joined with ``:``): stable across processes and machines."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def item_rng(*parts: object) -> random.Random:
    """A ``random.Random`` seeded by :func:`item_seed` of ``parts``."""
    return random.Random(item_seed(*parts))
