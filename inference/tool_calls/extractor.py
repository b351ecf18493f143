"""Tool calls out of a model's text, incrementally: ``ToolCallExtractor``.

One extractor reads one choice's text as it streams (``feed`` per delta,
``finish`` at the end) and splits it into content and OpenAI tool-call
deltas. The whole-text parser is the same extractor fed once, so a streamed
response and a non-streamed one always agree.

Formats (``ToolParsing.mode``):

- TAGGED (tool_choice "auto"): hermes / SmolLM2 style, text with blocks
  ``<tool_call>{"name": "f", "arguments": {...}}</tool_call>``; a block may
  also hold a JSON list of such objects (SmolLM2's own format).
- LIST ("required"): the whole output is that JSON list, untagged.
- ARGUMENTS (a named function): the whole output is the arguments object.

A call is committed once its header ``{"name": "<declared tool>",
"arguments":`` and the opening ``{`` of its arguments are seen: its first
delta (id, type, name) goes out then, argument fragments as they arrive.
Until then the text is held back; a block that cannot be a call (not JSON,
an undeclared name, another key order) goes out as content, unchanged.
After a commit nothing is taken back: a block cut by max_tokens keeps the
arguments sent so far (finish_reason "length", as OpenAI's), and anything
after a committed call up to ``</tool_call>`` is dropped.

Whitespace around calls is not content: "Sure.\\n<tool_call>..." has the
content "Sure.", "A <tool_call>...</tool_call> B" has "A B", and a reply of
only calls has none. Text without a call comes out exactly as the model
wrote it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

import regex

from inference.tool_calls.records import ToolCall, ToolCallDelta
from inference.tool_calls.setup import ARGUMENTS, LIST, TAGGED, ToolParsing

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"
# A call's header up to its arguments value; "parameters" is Llama's word.
_HEADER = regex.compile(
    r'\{\s*"name"\s*:\s*"([A-Za-z0-9_.\-]{1,64})"\s*,\s*"(?:arguments|parameters)"\s*:\s*'
)
# A header still incomplete after this many characters is not one (the
# pattern's \s* would otherwise hold back text without end).
_MAX_HEADER = 256


class _S(Enum):
    TEXT = "text"  # content, watching for OPEN_TAG
    OPEN = "open"  # after OPEN_TAG (or an untagged list's start): "{" or "["
    ELEMENT = "element"  # in a list: the next call's "{", or "]"
    HEADER = "header"  # a call's header, not yet committed
    ARGS = "args"  # a committed call's arguments value
    TAIL = "tail"  # the rest of the call's object after its arguments
    NEXT = "next"  # in a list after a call: "," or "]"
    CLOSE = "close"  # expecting CLOSE_TAG
    SKIP = "skip"  # dropping text up to CLOSE_TAG
    DONE = "done"  # untagged output complete: the rest is dropped
    PLAIN = "plain"  # untagged output that is no call: all content


@dataclass(slots=True)
class Extracted:
    """What one feed produced: content text and tool-call deltas."""

    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)


def _held_prefix(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that could begin ``tag``."""
    for k in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


class ToolCallExtractor:
    """Splits one choice's text into content and tool-call deltas as it streams."""

    __slots__ = (
        "_parsing",
        "_call_id",
        "_state",
        "_buf",
        "_out",
        "_ws",
        "_ws_before_block",
        "_drop_ws",
        "_block_raw",
        "_committed",
        "_in_list",
        "_calls",
        "_emitting",
        "_depth",
        "_in_string",
        "_escaped",
        "_finished",
    )

    def __init__(self, parsing: ToolParsing, call_id: Callable[[int], str]):
        """``call_id(k)``: the id of the choice's k-th call (stable across resumes)."""
        self._parsing = parsing
        self._call_id = call_id
        self._state = {TAGGED: _S.TEXT, LIST: _S.OPEN, ARGUMENTS: _S.ARGS}[parsing.mode]
        self._buf = ""
        self._out = Extracted()
        # Whitespace not yet known to be content (see the module docstring).
        self._ws = ""
        self._ws_before_block = ""
        self._drop_ws = False
        # Text of the current block since OPEN_TAG, to restore it as content.
        self._block_raw = ""
        self._committed = False
        self._in_list = False
        self._calls = 0
        self._emitting = False
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._finished = False
        if parsing.mode == ARGUMENTS:
            self._commit(parsing.name)

    @property
    def calls(self) -> int:
        """Tool calls begun so far (their first delta sent)."""
        return self._calls

    def feed(self, text: str) -> Extracted:
        """Read more of the choice's text; returns what can be sent now."""
        self._buf += text
        self._run()
        return self._take()

    def finish(self) -> Extracted:
        """The choice ended: send whatever was held back."""
        if not self._finished:
            self._finished = True
            self._run()
            # An unfinished block that never committed is text; giving it
            # back may uncover another (each round consumes a tag).
            while self._state in (_S.OPEN, _S.ELEMENT, _S.HEADER) and not self._committed:
                self._fail()
                self._run()
            if self._state in (_S.TEXT, _S.PLAIN):
                self._text(self._buf)
            self._buf = ""
            if self._calls == 0:
                self._out.content += self._ws
            self._ws = ""
        return self._take()

    def _take(self) -> Extracted:
        out, self._out = self._out, Extracted()
        return out

    # The state machine: each step consumes from _buf; False means "need more".

    def _run(self) -> None:
        while self._step():
            pass

    def _step(self) -> bool:
        state = self._state
        if state is _S.TEXT:
            return self._step_text()
        if state in (_S.OPEN, _S.ELEMENT, _S.NEXT, _S.CLOSE):
            return self._step_punctuation()
        if state is _S.HEADER:
            return self._step_header()
        if state in (_S.ARGS, _S.TAIL):
            return self._step_value()
        if state is _S.SKIP:
            return self._step_skip()
        if state is _S.PLAIN:
            self._text(self._buf)
        self._buf = ""  # DONE and PLAIN keep nothing
        return False

    def _step_text(self) -> bool:
        at = self._buf.find(OPEN_TAG)
        if at < 0:
            keep = _held_prefix(self._buf, OPEN_TAG)
            self._text(self._buf[: len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep :]
            return False
        self._text(self._buf[:at])
        self._buf = self._buf[at + len(OPEN_TAG) :]
        self._ws_before_block, self._ws = self._ws, ""
        self._block_raw, self._committed, self._in_list = "", False, False
        self._state = _S.OPEN
        return True

    def _consume(self, n: int) -> None:
        self._block_raw += self._buf[:n]
        self._buf = self._buf[n:]

    def _step_punctuation(self) -> bool:
        stripped = self._buf.lstrip()
        self._consume(len(self._buf) - len(stripped))
        if not self._buf:
            return False
        state, char = self._state, self._buf[0]
        if state is _S.CLOSE:
            if self._buf.startswith(CLOSE_TAG):
                self._buf = self._buf[len(CLOSE_TAG) :]
                self._end_block()
                return True
            if CLOSE_TAG.startswith(self._buf):
                return False
            self._state = _S.SKIP
            return True
        if state is _S.OPEN and char == "[":
            self._in_list = True
            self._consume(1)
            self._state = _S.ELEMENT
        elif char == "{" and (
            state is _S.ELEMENT or (state is _S.OPEN and self._parsing.mode == TAGGED)
        ):
            self._state = _S.HEADER
        elif state is _S.ELEMENT and char == "]" and not self._committed:
            # An empty list: the model's "no call"; nothing to send.
            self._consume(1)
            self._after_call_object(list_closed=True)
        elif state is _S.NEXT and char in ",]":
            self._consume(1)
            if char == ",":
                self._state = _S.ELEMENT
            else:
                self._after_call_object(list_closed=True)
        else:
            self._fail()
        return True

    def _step_header(self) -> bool:
        match = _HEADER.match(self._buf, partial=True)
        if match is not None and (match.partial or match.end() == len(self._buf)):
            if len(self._buf) <= _MAX_HEADER:
                return False
            match = None
        name = match.group(1) if match is not None else None
        if name is None or self._buf[match.end()] != "{" or name not in self._parsing.names:
            self._fail()
            return True
        self._consume(match.end())
        self._commit(name)
        return True

    def _commit(self, name: str) -> None:
        self._committed = True
        # parallel_tool_calls=false: later calls are read, and dropped.
        self._emitting = self._parsing.parallel or self._calls == 0
        if self._emitting:
            delta = ToolCallDelta(self._calls, id=self._call_id(self._calls), name=name)
            self._out.tool_calls.append(delta)
            self._calls += 1
        self._depth, self._in_string, self._escaped = 0, False, False
        self._state = _S.ARGS

    def _step_value(self) -> bool:
        """Scan JSON structure (strings, escapes, nesting) to the value's end."""
        args = self._state is _S.ARGS
        if args and self._depth == 0 and not self._in_string:
            self._buf = self._buf.lstrip()
        buf = self._buf
        depth, in_string, escaped = self._depth, self._in_string, self._escaped
        end = -1
        for i, char in enumerate(buf):
            if in_string:
                if escaped:
                    escaped = False
                elif char == "\\":
                    escaped = True
                elif char == '"':
                    in_string = False
            elif char == '"':
                in_string = True
            elif char in "{[":
                depth += 1
            elif char in "}]":
                depth -= 1
                if depth == 0:
                    end = i + 1
                    break
        taken = buf if end < 0 else buf[:end]
        self._buf = "" if end < 0 else buf[end:]
        self._depth, self._in_string, self._escaped = depth, in_string, escaped
        if args and self._emitting and taken:
            self._fragment(taken)
        if end < 0:
            return False
        if args:
            if self._parsing.mode == ARGUMENTS:
                self._state = _S.DONE
            else:
                # The rest of the call's object, whose "{" is already open.
                self._depth, self._in_string, self._escaped = 1, False, False
                self._state = _S.TAIL
        else:
            self._after_call_object(list_closed=False)
        return True

    def _fragment(self, text: str) -> None:
        calls, index = self._out.tool_calls, self._calls - 1
        if calls and calls[-1].index == index:
            calls[-1].arguments += text
        else:
            calls.append(ToolCallDelta(index, text))

    def _after_call_object(self, *, list_closed: bool) -> None:
        if self._in_list and not list_closed:
            self._state = _S.NEXT
        elif self._parsing.mode == TAGGED:
            self._state = _S.CLOSE
        else:
            self._state = _S.DONE

    def _step_skip(self) -> bool:
        at = self._buf.find(CLOSE_TAG)
        if at < 0:
            self._buf = self._buf[len(self._buf) - _held_prefix(self._buf, CLOSE_TAG) :]
            return False
        self._buf = self._buf[at + len(CLOSE_TAG) :]
        self._end_block()
        return True

    def _end_block(self) -> None:
        # The block and the whitespace after it go; the whitespace before
        # it separates the content around it.
        self._state = _S.TEXT
        self._ws, self._ws_before_block, self._drop_ws = self._ws_before_block, "", True

    def _fail(self) -> None:
        """The text at hand is no call: give an uncommitted block back as content."""
        if self._committed:
            self._state = _S.SKIP if self._parsing.mode == TAGGED else _S.DONE
            return
        raw, self._buf = self._block_raw + self._buf, ""
        if self._parsing.mode == TAGGED:
            self._ws = self._ws_before_block
            self._text(OPEN_TAG)
            self._buf, self._state = raw, _S.TEXT
        else:
            self._buf, self._state = raw, _S.PLAIN

    def _text(self, text: str) -> None:
        if self._drop_ws:
            text = text.lstrip()
            self._drop_ws = not text
        if not text:
            return
        body = text.rstrip()
        if body:
            self._out.content += self._ws + body
            self._ws = text[len(body) :]
        else:
            self._ws += text


def merge_tool_calls(deltas: list[ToolCallDelta]) -> list[ToolCall]:
    """Whole ``message.tool_calls`` from a choice's deltas, in index order."""
    firsts: dict[int, ToolCallDelta] = {}
    arguments: dict[int, list[str]] = {}
    for delta in deltas:
        firsts.setdefault(delta.index, delta)
        arguments.setdefault(delta.index, []).append(delta.arguments)
    return [
        ToolCall(firsts[i].id or "", firsts[i].name or "", "".join(arguments[i]))
        for i in sorted(firsts)
    ]


def parse_tool_calls(
    text: str, parsing: ToolParsing, call_id: Callable[[int], str]
) -> tuple[str | None, list[ToolCall]]:
    """(content, tool_calls) of a whole text; content None when only calls."""
    extractor = ToolCallExtractor(parsing, call_id)
    first, last = extractor.feed(text), extractor.finish()
    content = first.content + last.content
    calls = merge_tool_calls(first.tool_calls + last.tool_calls)
    return (content or None) if calls else content, calls
