"""Every text the model sees is listed for the screen, and put back in place."""

from __future__ import annotations

import json

from inference.prompts.screened import SEPARATOR, screen_texts, with_screened
from inference.request import ChatPrompt, ChatTurn, TextPrompt, ToolCallRef
from safety.moderation import texts_moderate
from safety.policy import Action, Policy

TOOL = {
    "type": "function",
    "function": {
        "name": "notify",
        "description": "Mail ops@example.com when done.",
        "parameters": {
            "type": "object",
            "properties": {
                "to": {
                    "type": "string",
                    "description": "Who, e.g. jane@example.com",
                    "enum": ["team", "boss"],
                }
            },
        },
    },
}
CALL = ToolCallRef("call_1", "notify", json.dumps({"to": "team", "note": "cc bob@example.org"}))
PROMPT = ChatPrompt(
    turns=(
        ChatTurn("user", "hello"),
        ChatTurn("assistant", "", tool_calls=(CALL,)),
        ChatTurn("tool", "sent to bob@example.org", tool_call_id="call_1"),
    ),
    template_tools=[TOOL],
)
REDACT = Policy(classifier=Action.OFF, pii=Action.REDACT, deny=Action.OFF)


def test_tool_text_is_listed_with_what_must_stay_verbatim():
    texts = screen_texts(PROMPT)
    free = [t.text for t in texts if not t.verbatim]
    fixed = [t.text for t in texts if t.verbatim]
    assert free == [
        "hello",
        "",
        "sent to bob@example.org",
        "team",
        "cc bob@example.org",
        "Mail ops@example.com when done.",
        "Who, e.g. jane@example.com",
    ]
    # Names, keys and enforced values: one joined text a call or tool.
    assert fixed[0] == SEPARATOR.join(["notify", "to", "note"])
    assert "team" in fixed[1].split(SEPARATOR) and "notify" in fixed[1].split(SEPARATOR)
    assert {t.param for t in texts} == {"messages", "tools"}


def test_redaction_reaches_tool_descriptions_and_call_arguments():
    texts = screen_texts(PROMPT)
    verdict = texts_moderate(
        [t.text for t in texts],
        REDACT,
        verbatim={i for i, t in enumerate(texts) if t.verbatim},
    )
    assert verdict.redacted and not verdict.blocked
    redacted = with_screened(PROMPT, verdict.texts)
    function = redacted.template_tools[0]["function"]
    assert function["description"] == "Mail <EMAIL_ADDRESS> when done."
    assert function["parameters"]["properties"]["to"]["description"] == "Who, e.g. <EMAIL_ADDRESS>"
    assert function["parameters"]["properties"]["to"]["enum"] == ["team", "boss"]
    call = redacted.turns[1].tool_calls[0]
    assert json.loads(call.arguments) == {"to": "team", "note": "cc <EMAIL_ADDRESS>"}
    assert redacted.turns[2].text == "sent to <EMAIL_ADDRESS>"
    # The client's own documents are untouched.
    assert TOOL["function"]["description"] == "Mail ops@example.com when done."


def test_pii_where_the_model_must_see_it_as_sent_blocks():
    tool = json.loads(json.dumps(TOOL))
    tool["function"]["parameters"]["properties"]["to"]["enum"] = ["jane@example.com"]
    prompt = ChatPrompt(turns=(ChatTurn("user", "hi"),), template_tools=[tool])
    texts = screen_texts(prompt)
    verdict = texts_moderate(
        [t.text for t in texts], REDACT, verbatim={i for i, t in enumerate(texts) if t.verbatim}
    )
    assert verdict.blocked


def test_arguments_that_are_no_json_object_are_screened_raw():
    call = ToolCallRef("c", "f", "call me on jane@example.com")
    prompt = ChatPrompt(turns=(ChatTurn("assistant", "", tool_calls=(call,)),))
    texts = screen_texts(prompt)
    verdict = texts_moderate([t.text for t in texts], REDACT)
    redacted = with_screened(prompt, verdict.texts)
    assert redacted.turns[0].tool_calls[0].arguments == "call me on <EMAIL_ADDRESS>"


def test_a_text_prompt_is_one_text():
    assert [t.text for t in screen_texts(TextPrompt("x"))] == ["x"]
    assert with_screened(TextPrompt("x"), ["y"]) == TextPrompt("y")
