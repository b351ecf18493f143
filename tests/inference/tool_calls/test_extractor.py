"""The tool-call extractor: whole texts, and the same texts streamed in pieces."""

import json

import pytest

from inference.tool_calls.extractor import ToolCallExtractor, merge_tool_calls, parse_tool_calls
from inference.tool_calls.records import ToolCall, ToolCallDelta
from inference.tool_calls.setup import ARGUMENTS, LIST, TAGGED, ToolParsing

AUTO = ToolParsing(TAGGED, ("get_weather", "add"))


def ids(k: int) -> str:
    return f"call_{k}"


def parse(text: str, parsing: ToolParsing = AUTO):
    return parse_tool_calls(text, parsing, ids)


def call(k: int, name: str, arguments: str) -> ToolCall:
    return ToolCall(ids(k), name, arguments)


def test_a_single_hermes_call_has_no_content():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert parse(text) == (None, [call(0, "get_weather", '{"city": "Paris"}')])


def test_parallel_calls_in_blocks_and_in_a_list_keep_their_order_and_the_text_around():
    blocks = (
        'Sure.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Pa}ris\\"x"}}'
        '</tool_call>\n<tool_call>{"name": "add", "arguments": {"a": [1, 2]}}</tool_call> Done.'
    )
    content, calls = parse(blocks)
    # The whitespace before the first call separates the text around the calls.
    assert content == "Sure.\nDone."
    assert calls == [
        call(0, "get_weather", '{"city": "Pa}ris\\"x"}'),
        call(1, "add", '{"a": [1, 2]}'),
    ]
    assert [json.loads(c.arguments) for c in calls][0] == {"city": 'Pa}ris"x'}
    listed = (
        '<tool_call>[{"name": "get_weather", "arguments": {"city": "Oslo"}}, '
        '{"name": "add", "parameters": {}}]</tool_call>'
    )
    assert parse(listed) == (
        None,
        [call(0, "get_weather", '{"city": "Oslo"}'), call(1, "add", "{}")],
    )


@pytest.mark.parametrize(
    "text",
    [
        "Just an answer, with trailing space.  \n",
        "x <tool_call>not json</tool_call> y",
        '<tool_call>{"name": "undeclared", "arguments": {}}</tool_call>',
        '<tool_call>{"arguments": {}, "name": "add"}</tool_call>',
        '<tool_call>{"name": "add", "arguments": "{}"}</tool_call>',
        '<tool_call>{"name": "get_w',
        "a <tool_c",
        "<tool_call>",
    ],
)
def test_text_that_is_no_call_comes_back_exactly(text):
    assert parse(text) == (text, [])


def test_a_call_cut_short_keeps_the_arguments_so_far():
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Par'
    assert parse(text) == (None, [call(0, "get_weather", '{"city": "Par')])


def test_an_empty_call_list_is_no_call_and_no_content():
    assert parse("<tool_call>[]</tool_call>") == ("", [])


def test_without_parallel_calls_only_the_first_is_kept():
    one = ToolParsing(TAGGED, ("add",), parallel=False)
    text = (
        '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
        '<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>'
    )
    assert parse(text, one) == (None, [call(0, "add", '{"a": 1}')])


def test_required_output_is_a_bare_list_and_named_output_the_arguments():
    required = ToolParsing(LIST, ("get_weather", "add"))
    text = ' [{"name": "add", "arguments": {"a": 1}}, {"name": "get_weather", "arguments": {}}] '
    assert parse(text, required) == (
        None,
        [call(0, "add", '{"a": 1}'), call(1, "get_weather", "{}")],
    )
    named = ToolParsing(ARGUMENTS, ("get_weather", "add"), name="add")
    assert parse(' {"a": {"b": [1]}} ', named) == (None, [call(0, "add", '{"a": {"b": [1]}}')])


STREAMED = [
    "Hello there!  ",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    'Let me see. <tool_call>[{"name": "add", "arguments": {"a": "}]"}}, '
    '{"name": "get_weather", "arguments": {}}]</tool_call> ok',
    "x <tool_call>not json</tool_call> y <tool_call>",
    'x<tool_call>y<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call> after',
    '<tool_call>{"name": "add", "arguments": {"a": 1',
]


def streamed(text: str, cuts: list[int], parsing: ToolParsing = AUTO):
    extractor = ToolCallExtractor(parsing, ids)
    bounds = [0, *cuts, len(text)]
    parts = [extractor.feed(text[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]
    parts.append(extractor.finish())
    content = "".join(p.content for p in parts)
    deltas = [d for p in parts for d in p.tool_calls]
    calls = merge_tool_calls(deltas)
    return ((content or None) if calls else content), calls, deltas


@pytest.mark.parametrize("text", STREAMED)
def test_a_stream_split_at_any_character_reassembles_to_the_whole_texts_calls(text):
    whole = parse(text)
    for cut in range(len(text) + 1):
        content, calls, _ = streamed(text, [cut])
        assert (content, calls) == whole, cut
    content, calls, deltas = streamed(text, list(range(1, len(text))))
    assert (content, calls) == whole
    # Each call's first delta names it; the rest carry only argument text.
    firsts = [d for d in deltas if d.id is not None]
    assert [d.name for d in firsts] == [c.name for c in whole[1]]
    assert all(d.name is None for d in deltas if d.id is None)


def test_the_name_goes_out_before_the_arguments_end():
    extractor = ToolCallExtractor(AUTO, ids)
    first = extractor.feed('<tool_call>{"name": "add", "arguments": {"a": ')
    assert first.tool_calls == [ToolCallDelta(0, '{"a": ', id="call_0", name="add")]
    assert [d.payload() for d in first.tool_calls] == [
        {
            "index": 0,
            "id": "call_0",
            "type": "function",
            "function": {"name": "add", "arguments": '{"a": '},
        }
    ]
    later = extractor.feed("12}}</tool_call>").tool_calls
    assert [d.payload() for d in later] == [{"index": 0, "function": {"arguments": "12}"}}]
