"""Hash splits, seeded draws and HonestyBench-mini."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from candor.data import (
    IN_DOMAIN,
    OUT_OF_DOMAIN,
    QAItem,
    dedupe_questions,
    hash_split,
    hash_unit,
    honestybench_mini,
    load_named,
    seeded_shuffle,
    split_items,
)
from candor.util.errors import CandorError

QUESTIONS = [f"synthetic question number {i}?" for i in range(1000)]


def item(i: int, question: str | None = None) -> QAItem:
    return QAItem(id=f"s:{i}", dataset="s", split="", question=question or QUESTIONS[i], answers=("a",))


def test_hash_split_is_about_80_20():
    sides = [hash_split(q) for q in QUESTIONS]
    assert set(sides) == {"train", "test"}
    # Binomial(1000, 0.8) has sd 12.6; the split is deterministic, so this cannot flake.
    assert 760 <= sides.count("train") <= 840
    assert [hash_split(q) for q in QUESTIONS] == sides


def test_hash_split_fraction_and_salt():
    assert {hash_split(q, train_fraction=0.0) for q in QUESTIONS[:50]} == {"test"}
    assert {hash_split(q, train_fraction=1.0) for q in QUESTIONS[:50]} == {"train"}
    assert 450 <= [hash_split(q, 0.5) for q in QUESTIONS].count("train") <= 550
    # Monotone in the fraction: a train question stays train when the fraction grows.
    assert all(hash_split(q, 0.9) == "train" for q in QUESTIONS if hash_split(q, 0.5) == "train")
    salted = [hash_split(q, salt="other") for q in QUESTIONS]
    assert salted != [hash_split(q) for q in QUESTIONS]
    with pytest.raises(CandorError, match="train_fraction"):
        hash_split("q", train_fraction=1.5)


# Pinned: these sides decide which benchmark questions are test questions. If the digest, the salt
# rule or the byte layout changes, every question moves and test questions can leak into training.
PINNED = [
    ("who got the first nobel prize in physics", 0.6774566692428268, "train"),
    ("who got the first nobel prize in physics?", 0.8454275028719611, "test"),
    ("what is the capital of australia?", 0.29724849373276563, "train"),
    ("how many legs does a spider have?", 0.8881529898773926, "test"),
    ("which element has the chemical symbol fe?", 0.8510854877966005, "test"),
    ("when is the next deadpool movie being released?", 0.47624898707780944, "train"),
    ("Who produces Honda Stream?", None, "test"),
]


@pytest.mark.parametrize(("question", "unit", "side"), PINNED)
def test_hash_split_is_pinned(question, unit, side):
    if unit is not None:
        assert hash_unit(question) == unit
    assert hash_split(question) == side


def test_hash_unit_is_sha256_of_salt_nul_text():
    # The documented rule, written out: the first 8 bytes of SHA-256("candor\0" + text), big-endian, over 2**64.
    digest = hashlib.sha256(b"candor\x00what is the capital of australia?").digest()
    assert hash_unit("what is the capital of australia?") == int.from_bytes(digest[:8], "big") / 2**64


def test_real_nq_split_is_pinned(shared_data):
    items = dedupe_questions(load_named("nq", data_dir=shared_data / "honestybench"))
    test_questions = sorted(i.question for i in items if hash_split(i.question) == "test")
    assert (len(items), len(test_questions)) == (3610, 696)
    digest = hashlib.sha256("\n".join(test_questions).encode()).hexdigest()
    assert digest == "c1b2e8f6a4774548210666f0e22e1985452105ff2a08fed51c50f05413c384f1"


def test_hash_split_is_stable_across_processes():
    # Python's hash() changes with PYTHONHASHSEED; the split must not.
    code = (
        "import json; from candor.data import hash_split; "
        "print(json.dumps([hash_split(f'synthetic question number {i}?') for i in range(200)]))"
    )
    here = [hash_split(q) for q in QUESTIONS[:200]]
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert json.loads(out.stdout) == here


def test_split_items_sets_split_and_keeps_order():
    items = [item(i) for i in range(100)] + [item(100, QUESTIONS[3])]  # a repeated question
    train, test = split_items(items)
    assert len(train) + len(test) == 101
    assert [i.id for i in train] == sorted((i.id for i in train), key=lambda s: int(s[2:]))
    assert {i.split for i in train} == {"train"} and {i.split for i in test} == {"test"}
    assert {i.question for i in train}.isdisjoint(i.question for i in test)
    side = "train" if any(i.id == "s:3" for i in train) else "test"
    assert any(i.id == "s:100" for i in (train if side == "train" else test))


def test_split_sides_are_pinned_for_the_default_and_a_custom_salt():
    # Fixed values of SHA-256("candor\x00" + question): a change to the hash rule, the salt or the
    # byte order moves questions between train and test, and must fail here.
    assert hash_unit(QUESTIONS[0]) == 0.12134539376522874
    assert hash_unit(QUESTIONS[5]) == 0.8602115021617632
    assert hash_unit(QUESTIONS[6], salt="other") == 0.7887728910191858
    items = [item(i) for i in range(12)]
    train, test = split_items(items)
    assert [i.id for i in test] == ["s:5", "s:6"]
    train, test = split_items(items, train_fraction=0.5, salt="other")
    assert [i.id for i in train] == ["s:0", "s:5", "s:7", "s:8", "s:9"]


def test_dedupe_and_seeded_shuffle():
    items = [item(0), item(1), item(2, QUESTIONS[0])]
    assert [i.id for i in dedupe_questions(items)] == ["s:0", "s:1"]
    numbers = list(range(20))
    once = seeded_shuffle(numbers, 7)
    assert once == seeded_shuffle(numbers, 7)
    assert once != seeded_shuffle(numbers, 8)
    assert sorted(once) == numbers and numbers == list(range(20))  # a copy, not in place


# ------------------------------------------------------- HonestyBench-mini


def check_mini(bench, test_size: int, train_pool: int, n_dev: int) -> None:
    assert set(bench.train) == set(bench.dev) == set(bench.test_id) == set(IN_DOMAIN)
    assert set(bench.test_ood) == set(OUT_OF_DOMAIN)
    for name in IN_DOMAIN:
        assert len(bench.test_id[name]) == test_size
        assert len(bench.dev[name]) == n_dev
        assert len(bench.train[name]) == train_pool - n_dev
        assert {i.split for i in bench.train[name]} == {"train"}
        assert {i.split for i in bench.dev[name]} == {"dev"}
        assert {i.dataset for i in bench.train[name]} == {name}
    for name in OUT_OF_DOMAIN:
        assert len(bench.test_ood[name]) == test_size
    tests = [i for part in (bench.test_id, bench.test_ood) for items in part.values() for i in items]
    assert {i.split for i in tests} == {"test"}
    train_q = {i.question for items in bench.train.values() for i in items}
    dev_q = {i.question for items in bench.dev.values() for i in items}
    test_q = {i.question for i in tests}
    assert not (train_q | dev_q) & test_q
    assert not train_q & dev_q
    all_items = bench.all_items()
    assert len(all_items) == len({i.id for i in all_items})
    assert len(all_items) == sum(n for part in bench.sizes().values() for n in part.values())


def write_bench(root: Path, n: int) -> Path:
    files = {
        "nq/test.jsonl": "nq",
        "hq/dev.jsonl": "hq",
        "2wikimultihopqa/dev.jsonl": "wiki",
        "pararel_patterns/test.jsonl": "pararel",
        "squad/dev.jsonl": "squad",
        "musique/dev.jsonl": "musique",
    }
    for rel, tag in files.items():
        path = root / rel
        path.parent.mkdir(parents=True)
        rows = [{"question": f"{tag} question {i}?", "answer": [str(i)]} for i in range(n)]
        rows.append(dict(rows[0]))  # a repeated question, as ParaRel has
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def test_mini_on_small_files(tmp_path):
    root = write_bench(tmp_path / "hb", 60)
    bench = honestybench_mini(root, test_size=5, train_pool=20, dev_fraction=0.1, seed=0)
    check_mini(bench, test_size=5, train_pool=20, n_dev=2)
    again = honestybench_mini(root, test_size=5, train_pool=20, dev_fraction=0.1, seed=0)
    assert [i.id for i in again.all_items()] == [i.id for i in bench.all_items()]
    other = honestybench_mini(root, test_size=5, train_pool=20, dev_fraction=0.1, seed=1)
    assert [i.id for i in other.all_items()] != [i.id for i in bench.all_items()]
    # The hash split does not depend on the seed: no seed moves a test question into training.
    assert not {i.question for i in other.train["nq"]} & {i.question for i in bench.test_id["nq"]}


def test_mini_bad_arguments(tmp_path):
    with pytest.raises(CandorError, match="dev_fraction"):
        honestybench_mini(tmp_path, dev_fraction=1.0)
    with pytest.raises(CandorError, match="test_size"):
        honestybench_mini(tmp_path, test_size=-1)


@pytest.fixture(scope="module")
def real_bench(shared_data):
    return honestybench_mini(shared_data / "honestybench")


def test_mini_on_real_data(real_bench, shared_data):
    check_mini(real_bench, test_size=200, train_pool=500, n_dev=50)
    again = honestybench_mini(shared_data / "honestybench")
    assert [i.id for i in again.all_items()] == [i.id for i in real_bench.all_items()]
    assert [i.question for i in again.test_id["nq"]] == [i.question for i in real_bench.test_id["nq"]]
