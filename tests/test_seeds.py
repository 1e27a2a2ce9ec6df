"""candor.util.seeds: the one per-item seed rule."""

import hashlib

from candor.util.seeds import item_rng, item_seed


def test_item_seed_is_the_annotation_rule_and_labels_separate_streams():
    # The annotation's per-item seed: SHA-256 of "seed:id", first 4 bytes little-endian, 31 bits (pinned).
    digest = hashlib.sha256(b"0:nq:12").digest()
    assert item_seed(0, "nq:12") == int.from_bytes(digest[:4], "little") & 0x7FFFFFFF
    assert item_seed("self-consistency", 0, "nq:12") != item_seed(0, "nq:12")
    assert item_rng(3, 1).random() == item_rng(3, 1).random()
    assert item_rng(3, 1).random() != item_rng(3, 2).random()
