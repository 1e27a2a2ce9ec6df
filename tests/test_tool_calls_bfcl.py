"""candor.tool_calls.bfcl: BFCL v4's loader (type names → JSON Schema) and the AST judge.

The judge's cases are the real items checked by hand against their files: simple_python_0 (an optional
argument), simple_python_2 (an optional argument whose accepted values are "" and 0), simple_python_89
(a nested dict), simple_python_307 (an accepted value of the wrong declared type), multiple_0 (the right
function among several), parallel_0 and parallel_5 (calls in any order; list alternatives), irrelevance_0.
"""

from __future__ import annotations

import pytest

from candor.tool_calls import Call, calls_schema
from candor.tool_calls.bfcl import CATEGORIES, judge, load, standardize, to_json_schema
from candor.util.errors import CandorError


@pytest.fixture(scope="module")
def bfcl(shared_data):
    folder = shared_data / "bfcl"
    if not folder.is_dir():
        pytest.skip(f"BFCL data not found at {folder}")
    return {category: {item.id: item for item in load(folder, category)} for category in CATEGORIES}


def test_loads_every_category_in_full(bfcl):
    assert {category: len(items) for category, items in bfcl.items()} == {
        "simple": 400,
        "multiple": 200,
        "parallel": 200,
        "irrelevance": 240,
    }
    assert all(item.answers is None for item in bfcl["irrelevance"].values())
    item = bfcl["simple"]["simple_python_0"]
    assert item.messages == [
        {"role": "user", "content": "Find the area of a triangle with a base of 10 units and height of 5 units."}
    ]
    assert item.tools[0].parameters == {
        "type": "object",
        "properties": {
            "base": {"type": "integer", "description": "The base of the triangle."},
            "height": {"type": "integer", "description": "The height of the triangle."},
            "unit": {"type": "string", "description": "The unit of measure (defaults to 'units' if not specified)"},
        },
        "required": ["base", "height"],
    }


def test_bfcl_type_names_become_json_schema():
    spec = {
        "type": "dict",
        "properties": {
            "x": {"type": "float", "optional": True, "format": "weird"},
            "pair": {"type": "tuple", "items": {"type": "dict", "properties": {"k": {"type": "any"}}}},
            "anything": {"type": "any", "description": "d"},
        },
        "required": ["x", "missing"],
    }
    assert to_json_schema(spec) == {
        "type": "object",
        "properties": {
            "x": {"type": "number"},
            "pair": {"type": "array", "items": {"type": "object", "properties": {"k": {}}}},
            "anything": {"description": "d"},
        },
        "required": ["x"],
    }
    with pytest.raises(CandorError, match=r"parameters\.properties\.y\.type: unknown BFCL type 'decimal'"):
        to_json_schema({"type": "dict", "properties": {"y": {"type": "decimal"}}})


def test_every_item_converts_to_a_schema_jsonschema_accepts(bfcl):
    jsonschema = pytest.importorskip("jsonschema")
    for category, items in bfcl.items():
        for item in items.values():
            jsonschema.Draft202012Validator.check_schema(calls_schema(item.tools, CATEGORIES[category].parallel))


def test_standardize_is_bfcls():
    assert standardize("Bluebird High-School") == standardize("bluebird_high.school") == "bluebirdhighschool"
    assert standardize("it's") == 'it"s'


@pytest.mark.parametrize(
    ("category", "item_id", "calls", "correct"),
    [
        ("simple", "simple_python_0", [Call("calculate_triangle_area", {"base": 10, "height": 5})], True),
        (
            "simple",
            "simple_python_0",
            [Call("calculate_triangle_area", {"base": 10, "height": 5, "unit": "Units"})],
            True,
        ),
        (
            "simple",
            "simple_python_0",
            [Call("calculate_triangle_area", {"base": 10, "height": 5, "unit": "cm"})],
            False,
        ),
        ("simple", "simple_python_0", [Call("calculate_triangle_area", {"base": 10})], False),  # required missing
        ("simple", "simple_python_0", [Call("calculate_triangle_area", {"base": 10.0, "height": 5})], False),  # int
        ("simple", "simple_python_0", [Call("calculate_triangle_area", {"base": 10, "height": 5, "h": 5})], False),
        ("simple", "simple_python_0", [Call("triangle_area", {"base": 10, "height": 5})], False),
        ("simple", "simple_python_0", None, False),
        ("simple", "simple_python_2", [Call("math.hypot", {"x": 4, "y": 5})], True),
        ("simple", "simple_python_2", [Call("math.hypot", {"x": 4, "y": 5, "z": 0})], True),
        ("simple", "simple_python_2", [Call("math.hypot", {"x": 4, "y": 5, "z": 1})], False),
        ("simple", "simple_python_2", [Call("math.hypot", {"x": 5, "y": 4})], False),
        (
            "simple",
            "simple_python_89",
            [
                Call(
                    "db_fetch_records",
                    {
                        "database_name": "StudentDB",
                        "table_name": "students",
                        "conditions": {"department": "science", "school": "Bluebird HS"},
                    },
                )
            ],
            True,
        ),
        (
            "simple",
            "simple_python_89",
            [
                Call(
                    "db_fetch_records",
                    {"database_name": "StudentDB", "table_name": "students", "conditions": {"department": "Science"}},
                )
            ],
            False,  # the nested school is not optional
        ),
        # venue accepts true, but the function declares a string: as BFCL, the type check rejects it
        (
            "simple",
            "simple_python_307",
            [Call("game_result.get_winner", {"teams": ["Lakers", "Clippers"], "date": "2021-01-28", "venue": True})],
            False,
        ),
        (
            "simple",
            "simple_python_307",
            [Call("game_result.get_winner", {"teams": ["Clippers", "Lakers"], "date": "01/28/2021"})],
            True,
        ),
        ("multiple", "multiple_0", [Call("triangle_properties.get", {"side1": 5, "side2": 4, "side3": 3})], True),
        (
            "multiple",
            "multiple_0",
            [Call("triangle_properties.get", {"side1": 5, "side2": 4, "side3": 3, "get_area": False})],
            False,
        ),
        ("multiple", "multiple_0", [Call("circle_properties.get", {"radius": 5})], False),
        (
            "multiple",
            "multiple_0",
            [Call("triangle_properties.get", {"side1": 5, "side2": 4, "side3": 3})] * 2,
            False,  # one call expected
        ),
        (
            "parallel",
            "parallel_0",
            [
                Call("spotify.play", {"artist": "Maroon 5", "duration": 15}),
                Call("spotify.play", {"artist": "Taylor Swift", "duration": 20}),
            ],
            True,  # any order
        ),
        (
            "parallel",
            "parallel_0",
            [
                Call("spotify.play", {"artist": "Maroon 5", "duration": 20}),
                Call("spotify.play", {"artist": "Taylor Swift", "duration": 15}),
            ],
            False,  # durations swapped
        ),
        ("parallel", "parallel_0", [Call("spotify.play", {"artist": "Taylor Swift", "duration": 20})], False),
        (
            "parallel",
            "parallel_0",
            [Call("spotify.play", {"artist": "Taylor Swift", "duration": 20})] * 2,
            False,  # one expected call twice is not both
        ),
        (
            "parallel",
            "parallel_5",
            [
                Call(
                    "streaming_services.shows_list_and_ratings",
                    {
                        "streaming_service": "Hulu",
                        "show_list": ["Stranger Things", "The Office"],
                        "sort_by_rating": True,
                    },
                ),
                Call(
                    "streaming_services.shows_list_and_ratings",
                    {"streaming_service": "Netflix", "show_list": ["Friends"], "sort_by_rating": True},
                ),
            ],
            True,
        ),
        (
            "parallel",
            "parallel_5",
            [
                Call(
                    "streaming_services.shows_list_and_ratings",
                    {"streaming_service": "Hulu", "show_list": ["The Office"], "sort_by_rating": True},
                ),
                Call(
                    "streaming_services.shows_list_and_ratings",
                    {"streaming_service": "Netflix", "show_list": ["Friends"], "sort_by_rating": True},
                ),
            ],
            False,  # a show missing from the list
        ),
        ("irrelevance", "irrelevance_0", None, True),
        ("irrelevance", "irrelevance_0", [], True),
        ("irrelevance", "irrelevance_0", [Call("determine_body_mass_index", {"weight": 10, "height": 5})], False),
    ],
)
def test_judge_on_hand_checked_items(bfcl, category, item_id, calls, correct):
    verdict = judge(bfcl[category][item_id], calls)
    assert verdict.correct is correct, verdict.reason
    assert (verdict.reason == "ok") is correct


def test_unknown_category_and_missing_files_are_named(tmp_path):
    with pytest.raises(CandorError, match="unknown BFCL category 'live'"):
        load(tmp_path, "live")
    with pytest.raises(CandorError, match=r"BFCL_v4_simple_python\.json: no such file"):
        load(tmp_path, "simple")
    (tmp_path / "possible_answer").mkdir()
    (tmp_path / "possible_answer" / "BFCL_v4_multiple.json").write_text('{"id": "multiple_0", "ground_truth": []}\n')
    (tmp_path / "BFCL_v4_multiple.json").write_text('{"id": "multiple_0", "question": [[]], "function": []}\n{oops\n')
    with pytest.raises(CandorError, match=r"BFCL_v4_multiple\.json:2: not JSON"):
        load(tmp_path, "multiple")
    (tmp_path / "BFCL_v4_multiple.json").write_text('{"id": "multiple_0", "question": [[]], "function": []}\n')
    with pytest.raises(CandorError, match=r"BFCL_v4_multiple\.json:1: 'function' must be a non-empty list"):
        load(tmp_path, "multiple")
