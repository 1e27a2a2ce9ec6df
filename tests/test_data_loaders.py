"""Loaders and the named-dataset registry: values, formats and every error path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from candor.data import (
    DATA_DIR_ENV,
    DATASETS,
    Fields,
    dataset_names,
    describe_datasets,
    get_dataset,
    load_file,
    load_items,
    resolve_data_dir,
)
from candor.util.errors import CandorError


def write_lines(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def jsonl(path: Path, rows: list[dict]) -> Path:
    return write_lines(path, [json.dumps(r) for r in rows])


# ---------------------------------------------------------------------- JSONL


def test_jsonl_ids_answers_and_names(tmp_path):
    path = write_lines(
        tmp_path / "nq" / "test.jsonl",
        [
            json.dumps({"question": "q one", "answer": ["Paris", "City of Light"]}),
            json.dumps({"question": "q two", "answers": ["Rome"]}),
            "",
            json.dumps({"question": "q four", "answer": "Oslo", "id": "given-4", "topic": "geo"}),
            "   ",
            json.dumps({"question": "q six", "answer": [1969]}),
        ],
    )
    items = load_items(str(path))
    assert [i.id for i in items] == ["nq:1", "nq:2", "given-4", "nq:6"]
    assert [i.answers for i in items] == [("Paris", "City of Light"), ("Rome",), ("Oslo",), ("1969",)]
    assert {i.dataset for i in items} == {"nq"}
    assert {i.split for i in items} == {"test"}
    assert items[2].meta == {"topic": "geo"}
    assert items[0].meta == {}
    assert items[0].choices is None


def test_dataset_name_from_stem_and_overrides(tmp_path):
    path = jsonl(tmp_path / "trivia.jsonl", [{"question": "q", "answer": ["a"]}])
    (item,) = load_file(path)
    assert (item.id, item.dataset, item.split) == ("trivia:1", "trivia", "test")
    (item,) = load_file(path, dataset="mine", split="train")
    assert (item.id, item.dataset, item.split) == ("mine:1", "mine", "train")
    (item,) = load_items(str(path), split="dev")
    assert item.split == "dev"


def test_limit_stops_early(tmp_path):
    rows = [{"question": f"q{i}", "answer": ["a"]} for i in range(5)]
    path = write_lines(tmp_path / "x.jsonl", [json.dumps(r) for r in rows] + ["{broken"])
    assert [i.id for i in load_items(str(path), limit=2)] == ["x:1", "x:2"]
    assert load_items(str(path), limit=0) == []


def test_json_array_and_json_lines(tmp_path):
    array = tmp_path / "arr.json"
    array.write_text(json.dumps([{"question": "a?", "answer": ["1"]}, {"question": "b?", "answers": "2"}]))
    assert [(i.id, i.answers) for i in load_items(str(array))] == [("arr:1", ("1",)), ("arr:2", ("2",))]
    lines = jsonl(tmp_path / "lines.json", [{"question": "c?", "answer": ["3"]}])
    assert [i.id for i in load_items(str(lines))] == ["lines:1"]


def test_custom_fields(tmp_path):
    path = jsonl(tmp_path / "x.jsonl", [{"query": "q?", "golds": ["g"], "qid": 7}])
    (item,) = load_items(str(path), fields=Fields(question="query", answers=("golds",), id="qid"))
    assert (item.id, item.question, item.answers) == ("7", "q?", ("g",))


ERROR_CASES = [
    ('{"question": "q", "answer": ["a"]}\n{"question": "q2", "answer": ', 2, "malformed JSON"),
    ('{"question": "q", "answer": ["a"]}\n\n{"answer": ["a"]}', 3, "missing 'question'"),
    ('{"question": "q"}', 1, "missing answer field"),
    ('{"question": "  ", "answer": ["a"]}', 1, "empty or non-string 'question'"),
    ('{"question": "q", "answer": [{"x": 1}]}', 1, "must be a string"),
    # A file with no judgeable item at all is refused, naming its first line.
    ('{"question": "q", "answer": []}', 1, "no item can be judged"),
    ('{"question": "q", "answer": ""}\n{"question": "r", "answer": [null]}', 1, "all 2 have no non-empty"),
    ('["question", "answer"]', 1, "expected a JSON object"),
    (
        '{"question": "q", "answer": ["a"], "id": "d"}\n{"question": "r", "answer": ["b"], "id": "d"}',
        2,
        "duplicate id",
    ),
]


@pytest.mark.parametrize(("text", "line", "message"), ERROR_CASES)
def test_jsonl_errors_name_file_and_line(tmp_path, text, line, message):
    path = tmp_path / "bad_file.jsonl"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(CandorError) as err:
        load_items(str(path))
    assert f"bad_file.jsonl:{line}:" in str(err.value)
    assert message in str(err.value)


def test_unknown_suffix_and_missing_file(tmp_path):
    path = tmp_path / "questions.txt"
    path.write_text("what?\n")
    with pytest.raises(CandorError, match=r"questions\.txt: unknown QA file format '\.txt'; known: \.csv"):
        load_items(str(path))
    with pytest.raises(CandorError, match=r"nothere\.jsonl: no such file"):
        load_items(str(tmp_path / "nothere.jsonl"))


def test_unknown_name_lists_known_names():
    with pytest.raises(CandorError) as err:
        load_items("nq_typo")
    message = str(err.value)
    assert "unknown dataset 'nq_typo'" in message
    for name in ("nq", "squad", "starter", "logiqa", "2wiki"):
        assert name in message


# ------------------------------------------------------------------------ CSV


def test_csv_aliases_ids_and_line_numbers(tmp_path):
    path = tmp_path / "caps.csv"
    path.write_text(
        "question,answer,id,topic\n"
        "Capital of France?,Paris | City of Light,,geo\n"
        '"A question\nover two lines?",two,q-2,\n'
        "Capital of Italy?,Rome,,\n",
        encoding="utf-8",
    )
    items = load_items(str(path))
    assert [i.id for i in items] == ["caps:2", "q-2", "caps:5"]
    assert items[0].answers == ("Paris", "City of Light")
    assert items[0].meta == {"topic": "geo"}
    assert items[1].question == "A question\nover two lines?"
    assert items[2].meta == {}


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("query,answer\nq,a\n", 1, "no 'question' column"),
        ("question,id\nq,1\n", 2, "missing answer field"),
        ("question,answer\n,a\n", 2, "missing 'question'"),
    ],
)
def test_csv_errors(tmp_path, text, line, message):
    path = tmp_path / "bad.csv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(CandorError) as err:
        load_items(str(path))
    assert f"bad.csv:{line}:" in str(err.value)
    assert message in str(err.value)


# ---------------------------------------------------------- multiple choice


LOGIQA_ROWS = [
    {
        "id": 11,
        "text": "All A are B.",
        "question": "Which follows?",
        "options": ["w", "x", "y", "z"],
        "answer": 1,
    },
    {
        "id": 12,
        "text": "P.",
        "question": "Pick one.",
        "options": ["p", "q", "r", "s"],
        "answer": "C",
        "type": {"t": True},
    },
]


def test_multiple_choice_layout(tmp_path):
    path = jsonl(tmp_path / "logiqa2" / "test.jsonl", LOGIQA_ROWS)
    first, second = load_items(str(path))
    assert first.id == "11"
    assert first.dataset == "logiqa2"
    assert first.choices == ("w", "x", "y", "z")
    assert first.answer_index == 1
    assert first.answers == ("B", "x")
    assert first.context == "All A are B."
    assert first.is_multiple_choice
    assert (second.answer_index, second.answers, second.meta) == (2, ("C", "r"), {"type": {"t": True}})


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"question": "q", "options": ["a", "b"], "answer": 2}, "option index 0-1"),
        ({"question": "q", "options": ["a", "b"], "answer": "AB"}, "option index 0-1"),
        ({"question": "q", "options": ["a", "b"], "answer": True}, "option index 0-1"),
        ({"question": "q", "options": ["a"], "answer": 0}, "options must be"),
        ({"question": "q", "options": "a,b", "answer": 0}, "must be a list"),
        ({"question": "q", "options": ["a", "b"]}, "missing answer field"),
    ],
)
def test_multiple_choice_errors(tmp_path, row, message):
    path = jsonl(tmp_path / "mc.jsonl", [LOGIQA_ROWS[0], row])
    with pytest.raises(CandorError) as err:
        load_items(str(path))
    assert "mc.jsonl:2:" in str(err.value)
    assert message in str(err.value)


def test_logiqa_real_file(shared_data):
    path = shared_data / "logiqa2" / "test.jsonl"
    if not path.exists():
        pytest.skip(f"LogiQA 2.0 not found at {path}")
    items = load_items("logiqa", data_dir=shared_data / "honestybench")
    assert len(items) == 1572
    assert len({i.id for i in items}) == len(items)
    first = items[0]
    assert first.id == "logiqa:1"
    assert first.answer_index == 3
    assert first.answers == ("D", "There are at least 13 female teachers")
    assert first.context.startswith("One seminar had 18 participants.")
    assert first.meta["id"] == 2920
    assert all(len(i.choices) == 4 for i in items)
    # The raw file repeats source ids; loaded by path, that is an error, not a silent mix.
    with pytest.raises(CandorError, match=r"test\.jsonl:802: duplicate id '10906' \(first on line 239\)"):
        load_file(path)


# ------------------------------------------------- unjudgeable items are skipped

# Real HonestyBench files hold items whose only alias is the empty string; one of them
# sits in the middle of each file below (line 3 of 5 rows), in every loader's format.
GOOD = [
    ("Capital of France?", "Paris"),
    ("Who wrote Hamlet?", "Shakespeare"),
    ("Symbol for gold?", "Au"),
    ("Red planet?", "Mars"),
]


def mid_file_rows(bad: dict) -> list[dict]:
    rows = [{"question": q, "answer": [a]} for q, a in GOOD]
    return [*rows[:2], bad, *rows[2:]]


def skip_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]


@pytest.mark.parametrize("answer", [[""], ["  ", ""], "", [], None, [None]])
def test_jsonl_item_without_alias_in_the_middle_is_skipped_with_one_warning(tmp_path, caplog, answer):
    path = jsonl(tmp_path / "nq" / "test.jsonl", mid_file_rows({"question": "Blank gold?", "answer": answer}))
    with caplog.at_level("WARNING"):
        items = load_items(str(path))
    assert [i.question for i in items] == [q for q, _ in GOOD]
    assert [i.id for i in items] == ["nq:1", "nq:2", "nq:4", "nq:5"]  # ids keep their line numbers
    assert items.skipped == 1
    (warning,) = skip_warnings(caplog)
    assert "test.jsonl: skipped 1 item(s)" in warning and "(lines 3)" in warning
    with pytest.raises(CandorError, match=r"test\.jsonl:3: no non-empty answer alias") as err:
        load_items(str(path), strict=True)
    assert str(err.value).count("test.jsonl") == 1


def test_blank_aliases_beside_real_ones_are_dropped(tmp_path):
    # A blank alias would make the contains judge accept every response.
    path = jsonl(tmp_path / "x.jsonl", [{"question": "q", "answer": ["ok", "  ", ""]}])
    (item,) = load_items(str(path), strict=True)
    assert item.answers == ("ok",)


def test_skip_warning_counts_and_names_the_first_lines(tmp_path, caplog):
    rows = [{"question": f"q{i}", "answer": [""] if i % 2 else ["a"]} for i in range(20)]
    path = jsonl(tmp_path / "many.jsonl", rows)
    with caplog.at_level("WARNING"):
        items = load_items(str(path))
    assert (len(items), items.skipped) == (10, 10)
    (warning,) = skip_warnings(caplog)
    assert "skipped 10 item(s)" in warning and "(lines 2, 4, 6, 8, 10, ...)" in warning


def test_limit_counts_kept_items(tmp_path):
    path = jsonl(tmp_path / "x.jsonl", mid_file_rows({"question": "Blank gold?", "answer": [""]}))
    items = load_items(str(path), limit=3)
    assert [i.id for i in items] == ["x:1", "x:2", "x:4"] and items.skipped == 1


def test_csv_row_with_empty_answer_cell_is_skipped(tmp_path, caplog):
    lines = [
        "question,answer",
        *(f"{q},{a}" for q, a in GOOD[:2]),
        "Blank gold?,",
        "Blank too?, | ",
        *(f"{q},{a}" for q, a in GOOD[2:]),
    ]
    path = write_lines(tmp_path / "qa.csv", lines)
    with caplog.at_level("WARNING"):
        items = load_items(str(path))
    assert [i.question for i in items] == [q for q, _ in GOOD]
    assert items.skipped == 2 and "(lines 4, 5)" in skip_warnings(caplog)[0]
    with pytest.raises(CandorError, match=r"qa\.csv:4: no non-empty answer alias"):
        load_items(str(path), strict=True)


def test_multiple_choice_item_without_gold_option_is_skipped(tmp_path):
    rows = [LOGIQA_ROWS[0], {**LOGIQA_ROWS[1], "id": 13, "answer": None}, LOGIQA_ROWS[1]]
    path = jsonl(tmp_path / "mc.jsonl", rows)
    items = load_items(str(path))
    assert [i.id for i in items] == ["11", "12"] and items.skipped == 1
    with pytest.raises(CandorError, match=r"mc\.jsonl:2: no non-empty answer alias"):
        load_items(str(path), strict=True)


def test_hf_item_without_alias_is_skipped(tmp_path, caplog):
    import datasets

    rows = mid_file_rows({"question": "Blank gold?", "answer": [""]})
    target = tmp_path / "hfdata"
    datasets.Dataset.from_list(rows).save_to_disk(str(target))
    with caplog.at_level("WARNING"):
        items = load_items(f"hf:{target}")
    assert [i.question for i in items] == [q for q, _ in GOOD] and items.skipped == 1
    assert "(lines 3)" in skip_warnings(caplog)[0]
    with pytest.raises(CandorError, match=r"hfdata:3: no non-empty answer alias"):
        load_items(f"hf:{target}", strict=True)


# --------------------------------------------------------- Hugging Face


def test_hf_saved_dataset_dict(tmp_path):
    import datasets

    data = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"question": ["t?"], "answer": [["T"]]}),
            "test": datasets.Dataset.from_dict(
                {"question": ["a?", "b?"], "answer": [["A", "aa"], ["B"]], "id": ["x1", ""]}
            ),
        }
    )
    target = tmp_path / "mydata"
    data.save_to_disk(str(target))
    items = load_items(f"hf:{target}:test")
    assert [(i.id, i.answers, i.split, i.dataset) for i in items] == [
        ("x1", ("A", "aa"), "test", "mydata"),
        ("mydata:2", ("B",), "test", "mydata"),
    ]
    assert [i.question for i in load_items(f"hf:{target}", split="train")] == ["t?"]
    with pytest.raises(CandorError, match="several splits; choose one .available: test, train"):
        load_items(f"hf:{target}")
    with pytest.raises(CandorError, match="split 'dev' not found"):
        load_items(f"hf:{target}:dev")


def test_hf_local_json_with_nested_answers_and_fields(tmp_path):
    path = jsonl(
        tmp_path / "squadlike.jsonl",
        [
            {"q": "Where?", "answers": {"text": ["Denver", "Denver Broncos"], "answer_start": [1, 1]}},
            {"q": "Who?", "answers": {"text": ["Carolina"], "answer_start": [3]}},
        ],
    )
    items = load_items(f"hf:{path}", fields=Fields(question="q"), limit=1)
    assert [(i.id, i.question, i.answers, i.split) for i in items] == [
        ("squadlike:1", "Where?", ("Denver", "Denver Broncos"), "train")
    ]


def test_hf_missing_source(tmp_path):
    with pytest.raises(CandorError, match="cannot load the dataset"):
        load_items(f"hf:{tmp_path / 'empty_dir'}")


# ------------------------------------------------------------- registry


REGISTRY_FILES = {
    "nq": "nq/test.jsonl",
    "hq": "hq/dev.jsonl",
    "2wikimultihopqa": "2wikimultihopqa/dev.jsonl",
    "2wiki": "2wikimultihopqa/dev.jsonl",
    "pararel": "pararel_patterns/test.jsonl",
    "pararel_patterns": "pararel_patterns/test.jsonl",
    "squad": "squad/dev.jsonl",
    "musique": "musique/dev.jsonl",
    "musique-train": "musique/train.jsonl",
}


@pytest.fixture()
def data_dir(tmp_path) -> Path:
    root = tmp_path / "honestybench"
    for rel in set(REGISTRY_FILES.values()):
        jsonl(root / rel, [{"question": f"{rel}?", "answer": ["x"]}])
    jsonl(tmp_path / "logiqa2" / "test.jsonl", LOGIQA_ROWS)
    return root


@pytest.mark.parametrize(("name", "rel"), sorted(REGISTRY_FILES.items()))
def test_registry_names_resolve(data_dir, name, rel):
    spec = get_dataset(name)
    assert spec.resolve(data_dir) == data_dir / rel
    (item,) = load_items(name, data_dir=data_dir)
    assert item.question == f"{rel}?"
    assert item.id == f"{spec.name}:1"
    assert item.dataset == spec.name
    assert item.split == Path(rel).stem


def test_registry_aliases_share_canonical_name(data_dir):
    assert load_items("2wiki", data_dir=data_dir)[0].dataset == "2wikimultihopqa"
    assert load_items("pararel_patterns", data_dir=data_dir)[0].dataset == "pararel"
    assert load_items("nq", data_dir=data_dir, split="train")[0].split == "train"


def test_logiqa_resolves_beside_or_inside_data_dir(data_dir, tmp_path):
    assert get_dataset("logiqa").resolve(data_dir) == data_dir / "../logiqa2/test.jsonl"
    assert [i.id for i in load_items("logiqa", data_dir=data_dir)] == ["logiqa:1", "logiqa:2"]
    inside = tmp_path / "elsewhere" / "bench"  # no logiqa2/ beside it
    jsonl(inside / "logiqa2" / "test.jsonl", LOGIQA_ROWS[:1])
    assert get_dataset("logiqa").resolve(inside) == inside / "logiqa2/test.jsonl"


def test_registry_roles():
    assert dataset_names("in-domain") == ["2wikimultihopqa", "hq", "nq", "pararel"]
    assert dataset_names("ood") == ["logiqa", "musique", "musique-train", "squad"]
    assert dataset_names("demo") == ["starter"]


def test_nq_dev_is_not_a_dataset():
    # Its file is a shuffled copy of nq/test.jsonl: training or tuning on it would leak the test set.
    assert "nq-dev" not in DATASETS
    with pytest.raises(CandorError, match="unknown dataset 'nq-dev'"):
        load_items("nq-dev")


def test_missing_registered_file(tmp_path):
    (tmp_path / "nq").mkdir()
    with pytest.raises(CandorError, match=r"dataset 'squad': file not found \(tried .*squad/dev\.jsonl\)"):
        load_items("squad", data_dir=tmp_path)


def test_data_dir_resolution(tmp_path, monkeypatch, data_dir):
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    monkeypatch.setenv("CANDOR_CACHE", str(tmp_path / "cache"))  # candor's own folder, with no data/ yet
    with pytest.raises(CandorError, match="run `candor datasets --download`.*or pass --data-dir"):
        resolve_data_dir()
    with pytest.raises(CandorError, match=r"nope: data dir not found \(from --data-dir\)"):
        resolve_data_dir(tmp_path / "nope")
    monkeypatch.setenv(DATA_DIR_ENV, str(data_dir))
    assert resolve_data_dir() == data_dir
    assert load_items("hq")[0].question == "hq/dev.jsonl?"
    assert resolve_data_dir(tmp_path) == tmp_path  # an explicit dir beats the environment
    # The default: data/ in candor's own folder (where `candor datasets --download` writes), never a
    # folder found relative to the working directory.
    monkeypatch.delenv(DATA_DIR_ENV)
    (tmp_path / "shared" / "data" / "honestybench").mkdir(parents=True)
    work = tmp_path / "main"
    work.mkdir()
    monkeypatch.chdir(work)
    with pytest.raises(CandorError, match="no benchmark data dir"):
        resolve_data_dir()
    (tmp_path / "cache" / "data").mkdir(parents=True)
    assert resolve_data_dir() == tmp_path / "cache" / "data"


def test_describe_datasets(data_dir, tmp_path):
    lines = describe_datasets(data_dir)
    assert len(lines) == len(dataset_names())
    by_name = {line.split(" ", 1)[0]: line for line in lines}
    assert by_name["nq"].endswith(f"[in-domain] Natural Questions (open), test: {data_dir / 'nq/test.jsonl'}")
    assert "(also: 2wiki)" in by_name["2wikimultihopqa"]
    missing = {line.split(" ", 1)[0]: line for line in describe_datasets(tmp_path / "absent")}
    assert "absent: data dir not found" in missing["data"] and "not downloaded; get it with" in missing["squad"]
    assert "data dir" not in missing["squad"]
    assert missing["starter"].endswith("starter.jsonl")
