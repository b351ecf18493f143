"""What each tool_choice asks of the prompt, the sampler and the parser."""

from inference.api.schemas import ChatCompletionRequest
from inference.tool_calls.setup import ToolParsing, tool_setup

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"$ref": "#/$defs/city"}},
            "$defs": {"city": {"type": "string"}},
        },
    },
}
ADD = {"type": "function", "function": {"name": "add", "description": "a + b"}}


def request(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "hi"}], tools=[WEATHER, ADD], **fields
    )


def test_auto_renders_the_tools_reads_tagged_calls_and_leaves_sampling_free():
    for choice in (None, "auto"):
        setup = tool_setup(request(tool_choice=choice))
        assert setup.template_tools == [WEATHER, ADD]
        assert setup.structured_output is None
        assert setup.parsing == ToolParsing("tagged", ("get_weather", "add"), parallel=True)


def test_none_renders_no_tools_and_reads_plain_text():
    setup = tool_setup(request(tool_choice="none"))
    assert (setup.template_tools, setup.parsing, setup.structured_output) == (None, None, None)


def test_required_asks_for_a_list_of_name_and_arguments_per_tool():
    setup = tool_setup(request(tool_choice="required", parallel_tool_calls=False))
    assert setup.parsing.mode == "list" and setup.parsing.parallel is False
    assert setup.structured_output == {
        "type": "json_schema",
        "strict": True,
        "schema": {
            "type": "array",
            "minItems": 1,
            "maxItems": 1,
            "items": {
                "anyOf": [
                    {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string", "enum": ["get_weather"]},
                            "arguments": {
                                "type": "object",
                                "properties": {"city": {"$ref": "#/$defs/city"}},
                            },
                        },
                        "required": ["name", "arguments"],
                        "additionalProperties": False,
                    },
                    {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string", "enum": ["add"]},
                            "arguments": {"type": "object", "properties": {}},
                        },
                        "required": ["name", "arguments"],
                        "additionalProperties": False,
                    },
                ]
            },
            "$defs": {"city": {"type": "string"}},
        },
    }
    parallel = tool_setup(request(tool_choice="required"))
    assert "maxItems" not in parallel.structured_output["schema"]


def test_a_named_function_asks_for_its_parameters():
    setup = tool_setup(
        request(tool_choice={"type": "function", "function": {"name": "get_weather"}})
    )
    assert setup.parsing.mode == "arguments" and setup.parsing.name == "get_weather"
    assert setup.structured_output == {
        "type": "json_schema",
        "schema": WEATHER["function"]["parameters"],
        "strict": True,
    }
    no_parameters = tool_setup(
        request(tool_choice={"type": "function", "function": {"name": "add"}})
    )
    assert no_parameters.structured_output["schema"] == {"type": "object", "properties": {}}
