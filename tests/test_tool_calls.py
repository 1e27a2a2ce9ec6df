"""candor.tool_calls: tool declarations, parsing and agreement of calls, the calls' schema, the tool prompt.

The prompt is rendered with the embedded model's real tokenizer (SmolLM2, whose chat template has no
tools: the documented prompt) and with that tokenizer carrying a Qwen-style template that takes tools.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from candor.tool_calls import (
    TOOL_PROMPT,
    Call,
    Tool,
    ToolsError,
    calls_agree,
    calls_canonical,
    calls_schema,
    may_become_call,
    parse_calls,
    render_tool_prompt,
    starts_like_call,
    template_takes_tools,
    tools_from_openai,
)
from candor.tool_calls.schema import MAX_PARALLEL_CALLS

QWEN_TEMPLATE = Path(__file__).parent / "data" / "qwen_tools_template.jinja"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "name": "get_time", "description": "The time in a city.", "parameters": None}


# --- tools -------------------------------------------------------------------------------------------


def test_tools_from_openai_reads_chat_and_responses_shapes():
    weather, time = tools_from_openai([WEATHER, TIME])
    assert weather == Tool(
        name="get_weather", description="The weather in a city.", parameters=WEATHER["function"]["parameters"]
    )
    assert time.name == "get_time" and time.parameters == {"type": "object", "properties": {}}
    assert weather.to_openai() == {**WEATHER}


@pytest.mark.parametrize(
    ("tools", "param"),
    [
        ([WEATHER, {"type": "function", "function": {"description": "no name"}}], "tools.1.function.name"),
        ([{"type": "function", "function": {"name": "f", "parameters": [1]}}], "tools.0.function.parameters"),
        ([{"type": "web_search"}], "tools.0.type"),
        ([{"type": "function", "name": ""}], "tools.0.name"),
        (["get_weather"], "tools.0"),
        ({"get_weather": {}}, "tools"),
        ([WEATHER, WEATHER], "tools.1"),
    ],
)
def test_tools_from_openai_names_the_bad_field(tools, param):
    with pytest.raises(ToolsError) as caught:
        tools_from_openai(tools)
    assert caught.value.param == param
    assert str(caught.value).startswith(param + ": ")


# --- calls -------------------------------------------------------------------------------------------


def test_canonical_sorts_keys_and_writes_whole_numbers_as_integers():
    a = Call(name="f", arguments={"b": 1.0, "a": [2.0, 2.5, True], "c": {"z": None, "y": "x"}})
    b = Call(name="f", arguments={"c": {"y": "x", "z": None}, "a": [2, 2.5, True], "b": 1})
    assert a.canonical() == b.canonical() == '{"arguments":{"a":[2,2.5,true],"b":1,"c":{"y":"x","z":null}},"name":"f"}'
    assert Call(name="f", arguments={"b": True}).canonical() != Call(name="f", arguments={"b": 1}).canonical()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"name": "f", "arguments": {"x": 1}}', [Call("f", {"x": 1})]),
        (
            '  [{"name": "f", "arguments": {"x": 1}}, {"name": "g", "arguments": {}}]',
            [Call("f", {"x": 1}), Call("g", {})],
        ),
        ('```json\n{"name": "f", "arguments": {"x": 1}}\n```', [Call("f", {"x": 1})]),
        (
            '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>\n<tool_call>\n{"name": "g"}\n</tool_call>',
            [Call("f", {"x": 1}), Call("g", {})],
        ),
        ('{"name": "f", "arguments": "{\\"x\\": 1}"}', [Call("f", {"x": 1})]),
        ('{"name": "f", "parameters": {"x": 1}}', [Call("f", {"x": 1})]),
        ('{"type": "function", "function": {"name": "f", "arguments": "{}"}}', [Call("f", {})]),
        ('{"name": "f", "arguments": {"x": 1}}\nThis computes f.', [Call("f", {"x": 1})]),
        ("It is sunny in Paris.", None),
        ('The call would be {"name": "f"}', None),
        ('{"name": "f", "arguments": {"x": 1}', None),
        ('{"answer": 3}', None),
        ('[{"name": "f", "arguments": {}}, 3]', None),
        ('{"name": "f", "arguments": [1]}', None),
        ("[]", None),
        ("", None),
    ],
)
def test_parse_calls(text, expected):
    assert parse_calls(text) == expected


def test_starts_like_call_tells_an_attempt_from_a_plain_answer():
    assert starts_like_call(' {"name": ') and starts_like_call("[1,") and starts_like_call("```json\n{}\n```")
    assert not starts_like_call("Sure, {here}") and not starts_like_call("")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "  ",
        '{"na',
        "[",
        "`",
        "``",
        "```",
        "```js",
        "```json",
        "```json\n",
        "```json\n{",
        "```\n[",
        "<tool",
        "<tool_call>",
    ],
)
def test_a_prefix_that_may_still_become_a_call(text):
    assert may_become_call(text)


@pytest.mark.parametrize("text", ["The", " Sure", "```python", "```json\nThe", "``x", "<b>", "<tool_calls", "I {"])
def test_a_prefix_that_is_already_a_plain_answer(text):
    assert not may_become_call(text)
    assert parse_calls(text + '{"name": "f", "arguments": {}}') is None  # nothing after it can make it a call


def test_parallel_calls_agree_as_a_set_and_differ_on_any_value():
    one = [Call("f", {"x": 1}), Call("f", {"x": 2})]
    assert calls_agree(one, [Call("f", {"x": 2.0}), Call("f", {"x": 1})])
    assert (
        calls_canonical(one)
        == calls_canonical(list(reversed(one)))
        == ('[{"arguments":{"x":1},"name":"f"},{"arguments":{"x":2},"name":"f"}]')
    )
    assert not calls_agree(one, [Call("f", {"x": 1})])
    assert not calls_agree(one, [Call("f", {"x": 1}), Call("f", {"x": 1})])
    assert not calls_agree([Call("f", {"x": 1})], [Call("g", {"x": 1})])
    assert not calls_agree([Call("f", {"x": "1"})], [Call("f", {"x": 1})])
    assert calls_agree([], [])


# --- schema ------------------------------------------------------------------------------------------


def test_calls_schema_accepts_exactly_the_calls_of_the_offered_tools():
    jsonschema = pytest.importorskip("jsonschema")
    tools = tools_from_openai([WEATHER, TIME])
    one = calls_schema(tools, parallel=False)
    many = calls_schema(tools, parallel=True)
    good = {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}
    accepted = [(one, good), (one, {"name": "get_time", "arguments": {}}), (many, [good, good]), (many, good)]
    for schema, value in accepted:
        jsonschema.validate(value, schema)
    bad = [
        (one, {"name": "get_wether", "arguments": {"city": "Paris"}}),  # no such tool
        (one, {"name": "get_weather", "arguments": {"days": 2}}),  # required argument missing
        (one, {"name": "get_weather", "arguments": {"city": "Paris", "days": "2"}}),  # wrong type
        (one, {"name": "get_weather", "arguments": {"city": "P"}, "extra": 1}),  # nothing else
        (one, [good]),  # one call is not a list
        (many, []),  # at least one call
        (many, [good] * (MAX_PARALLEL_CALLS + 1)),  # a bounded list: a model that repeats itself stops
    ]
    for schema, value in bad:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(value, schema)
    single = calls_schema(tools[:1], parallel=False)
    assert single["properties"]["name"] == {"const": "get_weather"} and "anyOf" not in single


# --- prompt ------------------------------------------------------------------------------------------

HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    {"role": "assistant", "content": "It is 18 C and sunny."},
    {"role": "user", "content": [{"type": "text", "text": "And the time?"}]},
]


def test_documented_prompt_on_the_embedded_tokenizer(tokenizer):
    assert not template_takes_tools(tokenizer)
    tools = tools_from_openai([WEATHER, TIME])
    prompt = render_tool_prompt(tokenizer, HISTORY, tools, "auto")
    listed = "\n".join(json.dumps(tool.to_json()) for tool in tools)
    system = TOOL_PROMPT.format(tools=listed, choice="If no tool helps, answer in plain text instead.")
    assert prompt == (
        f"<|im_start|>system\n{system}<|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        '<|im_start|>assistant\n{"name": "get_weather", "arguments": {"city": "Paris"}}<|im_end|>\n'
        "<|im_start|>user\nResult of the tool get_weather: 18 C, sunny<|im_end|>\n"
        "<|im_start|>assistant\nIt is 18 C and sunny.<|im_end|>\n"
        "<|im_start|>user\nAnd the time?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert "reply with only a JSON object" in system and "JSON list" in system


def test_documented_prompt_keeps_the_system_message_and_honours_tool_choice(tokenizer):
    tools = tools_from_openai([WEATHER, TIME])
    messages = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Time in Oslo?"}]
    required = render_tool_prompt(tokenizer, messages, tools, "required")
    assert required.startswith("<|im_start|>system\nBe brief.\n\nYou can call these tools")
    assert "You must call at least one tool." in required and "plain text" not in required
    only = render_tool_prompt(tokenizer, messages, tools, tools[1])
    assert '"name": "get_time"' in only and "get_weather" not in only and "You must call" in only
    none = render_tool_prompt(tokenizer, messages, tools, "none")
    assert "get_time" not in none and none.startswith("<|im_start|>system\nBe brief.<|im_end|>")
    with pytest.raises(ToolsError) as caught:
        render_tool_prompt(tokenizer, messages, tools, "sometimes")
    assert caught.value.param == "tool_choice"


@pytest.fixture(scope="module")
def tools_tokenizer(smollm_dir, tmp_path_factory):
    """The embedded tokenizer with a Qwen-style chat template that takes ``tools`` (a local folder, no hub)."""
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("qwen_style")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(smollm_dir / name, folder / name)
    shutil.copy(QWEN_TEMPLATE, folder / "chat_template.jinja")
    return AutoTokenizer.from_pretrained(folder)


def test_a_template_that_takes_tools_renders_them_its_own_way(tools_tokenizer):
    assert template_takes_tools(tools_tokenizer)
    tools = tools_from_openai([WEATHER, TIME])
    prompt = render_tool_prompt(tools_tokenizer, HISTORY, tools, "auto")
    assert "<tools>\n" + json.dumps(tools[0].to_openai()) in prompt  # the template's own listing
    assert "You can call these tools" not in prompt  # not the documented prompt
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<tool_response>\n18 C, sunny\n</tool_response>" in prompt
    assert prompt.endswith("<|im_start|>user\nAnd the time?<|im_end|>\n<|im_start|>assistant\n")
    none = render_tool_prompt(tools_tokenizer, HISTORY[:1], tools, "none")
    assert "<tools>" not in none
    only = render_tool_prompt(tools_tokenizer, HISTORY[:1], tools, tools[1])
    assert "get_time" in only and "get_weather" not in only
