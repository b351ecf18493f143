"""A client's JSON Schema makes the server fetch nothing and do bounded work.

Tool ``parameters`` and ``response_format`` schemas: a ``$ref`` (or a
``$schema``) that is not inside the document is a 400 before any library
sees it; a listener on a local port records that no connection was tried,
and a ``file://`` ref to a real file never shows its content.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest

from inference.errors import InvalidRequest
from inference.tool_calls import checks
from inference.tool_calls.schema_guard import (
    MAX_SCHEMA_CHARS,
    MAX_SCHEMA_DEPTH,
    schema_compile,
    schema_shape_check,
)
from tests.plugins.request_path import DEMO, auth

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "What is the weather in Paris?"}]
SECRET = "h28a-secret-7f3a91"


class Listener:
    """A TCP server on a free local port that counts the connections made to it."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            # Never answers: what a stalling server does.
            conn.close()

    def url(self, path: str = "schema.json") -> str:
        return f"http://127.0.0.1:{self.port}/{path}"

    def close(self) -> None:
        self._stop.set()
        self.thread.join(2)
        self.sock.close()


@pytest.fixture
def listener():
    server = Listener()
    yield server
    server.close()


@pytest.fixture
def secret_file(tmp_path):
    path = tmp_path / "secret.json"
    path.write_text(json.dumps({"type": "string", "description": SECRET}))
    return path


def hostile_schemas(listener: Listener, secret_file) -> dict[str, dict]:
    return {
        "http $ref": {"type": "object", "properties": {"a": {"$ref": listener.url()}}},
        "https $ref": {
            "type": "object",
            "properties": {"a": {"$ref": f"https://127.0.0.1:{listener.port}/x"}},
        },
        "file $ref": {
            "type": "object",
            "properties": {"a": {"$ref": secret_file.as_uri()}},
        },
        "relative $ref under a remote $id": {
            "$id": listener.url("base/"),
            "type": "object",
            "properties": {"a": {"$ref": "other.json"}},
        },
        "relative $ref": {"type": "object", "properties": {"a": {"$ref": "other.json#/x"}}},
        "remote $dynamicRef": {
            "type": "object",
            "properties": {"a": {"$dynamicRef": listener.url()}},
        },
        "remote $schema": {"$schema": listener.url(), "type": "object"},
        "nested remote $ref": {
            "type": "object",
            "$defs": {"d": {"anyOf": [{"items": [{"$ref": listener.url("deep")}]}]}},
        },
    }


def tool(parameters: dict) -> dict:
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


def post(client, key, **fields):
    body = json.dumps({"model": DEMO, "messages": HI, **fields})
    return client.post(CHAT, body, content_type="application/json", **auth(key))


def test_non_local_refs_are_refused_before_any_io(listener, secret_file):
    for label, schema in hostile_schemas(listener, secret_file).items():
        with pytest.raises(InvalidRequest) as caught:
            schema_shape_check(schema, param="tools[0].function.parameters", what="function 'f'")
        assert caught.value.param == "tools[0].function.parameters", label
        assert SECRET not in caught.value.message, label
    assert listener.connections == 0


def test_local_refs_and_known_drafts_pass():
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://example.com/tool",
        "type": "object",
        "$defs": {"city": {"type": "string"}, "node": {"$ref": "#"}},
        "properties": {"city": {"$ref": "#/$defs/city"}, "tree": {"$ref": "#/$defs/node"}},
        # A property that happens to be called "$ref" is data, not a reference.
        "required": ["city"],
    }
    schema["properties"]["$ref"] = {"type": "string"}
    schema_shape_check(schema, param="p", what="w")
    schema_compile(schema, param="p", what="w")


def test_compile_never_retrieves_even_unchecked(listener, secret_file):
    """The compile refuses retrieval by itself too (offline), should a
    caller skip the shape check."""
    for label, schema in hostile_schemas(listener, secret_file).items():
        try:
            schema_compile(schema, param="p", what="w")
        except InvalidRequest as exc:
            assert SECRET not in exc.message, label
    assert listener.connections == 0


def test_depth_and_size_are_bounded():
    deep: dict = {"type": "string"}
    for _ in range(MAX_SCHEMA_DEPTH):
        deep = {"type": "array", "items": deep}
    with pytest.raises(InvalidRequest, match="nests deeper"):
        schema_shape_check({"type": "object", "properties": {"a": deep}}, param="p", what="w")
    wide = {
        "type": "object",
        "properties": {f"p{i}": {"type": "string", "description": "x" * 100} for i in range(700)},
    }
    with pytest.raises(InvalidRequest, match=f"at most {MAX_SCHEMA_CHARS}"):
        schema_shape_check(wide, param="p", what="w")


def test_a_schema_at_the_limits_compiles_quickly():
    """Size and depth bound the compile's time: the worst we let through,
    deep and full of regex patterns, takes well under a second."""
    deep: dict = {"type": "string", "pattern": "^(a+)+(b|c)*[d-z]{1,50}$"}
    for _ in range(MAX_SCHEMA_DEPTH // 2 - 2):
        deep = {"type": "object", "properties": {"x": deep}}
    properties = {"deep": deep}
    i = 0
    while len(json.dumps(properties)) < MAX_SCHEMA_CHARS - 200:
        properties[f"p{i}"] = {"type": "string", "pattern": f"^(x{i}|y+)+[a-z]{{1,{i % 90 + 1}}}$"}
        i += 1
    schema = {"type": "object", "properties": properties}
    schema_shape_check(schema, param="p", what="w")
    started = time.perf_counter()
    schema_compile(schema, param="p", what="w")
    assert time.perf_counter() - started < 5.0


@pytest.mark.django_db(transaction=True)
def test_api_refuses_remote_refs_with_400_and_no_connection(
    client, pro_key, fake_worker, listener, secret_file
):
    worker = fake_worker()
    for label, schema in hostile_schemas(listener, secret_file).items():
        response = post(client, pro_key, tools=[tool(schema)])
        assert response.status_code == 400, (label, response.content)
        error = json.loads(response.content)["error"]
        assert error["type"] == "invalid_request_error", label
        assert error["param"] == "tools[0].function.parameters", label
        assert error["code"] == "invalid_function_parameters", label
        assert SECRET not in response.content.decode(), label

        formatted = {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}
        response = post(client, pro_key, response_format=formatted)
        assert response.status_code == 400, (label, response.content)
        assert json.loads(response.content)["error"]["param"] == "response_format", label
        assert SECRET not in response.content.decode(), label
    assert listener.connections == 0
    assert worker.received == []


@pytest.mark.django_db(transaction=True)
def test_tool_schemas_compile_off_the_event_loop(client, pro_key, fake_worker, monkeypatch):
    """The compile runs in a worker thread: no event loop runs where it runs."""
    fake_worker()
    seen: list[bool] = []
    compile_for_real = checks.schema_compile

    def spy(schema, **kwargs):
        try:
            asyncio.get_running_loop()
            seen.append(True)
        except RuntimeError:
            seen.append(False)
        return compile_for_real(schema, **kwargs)

    monkeypatch.setattr(checks, "schema_compile", spy)
    parameters = {"type": "object", "properties": {"city": {"type": "string"}}}
    response = post(client, pro_key, tools=[tool(parameters)])
    assert response.status_code == 200, response.content
    assert seen == [False]
