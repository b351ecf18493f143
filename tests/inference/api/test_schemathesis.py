"""Property-based checks of /v1 against its own OpenAPI schema (schemathesis).

Schemathesis generates valid and invalid requests for every operation of the
published schema and sends them to the ASGI app in this process; a scripted
worker on the in-process bus answers whatever gets through, so valid
requests stream real frames without a model. Every answer must be a
non-5xx that the schema documents (status, content type, body), and
invalid input must be refused with a 4xx. Bounded and deterministic:
``MAX_EXAMPLES`` per operation and mode, derandomized.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import CHECKS

from tests.plugins.request_path import DEMO

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

MAX_EXAMPLES = 25
CHECK_NAMES = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
)


def _checks():
    by_name = {check.__name__: check for check in CHECKS.get_all()}
    return [by_name[name] for name in CHECK_NAMES]


@pytest.fixture
def api_schema():
    from config.asgi import application

    return schemathesis.openapi.from_asgi("/v1/openapi.json", application)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_v1_conforms_to_its_schema_with_no_server_errors(api_schema, fake_worker, pro_key, mode):
    """Generated requests: never a 5xx, always a documented answer; bad input is a 4xx."""
    fake_worker(tokens=2)
    headers = {"Authorization": f"Bearer {pro_key}"}
    checks = _checks()
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/models", "/v1/chat/completions"}
    for operation in operations:
        strategy = operation.as_strategy(generation_mode=mode)

        @given(case=strategy)
        @settings(
            max_examples=MAX_EXAMPLES,
            derandomize=True,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def run(case):
            # Half the valid bodies name the served model, so they reach the worker.
            body = case.body if isinstance(case.body, dict) else {}
            if mode == GenerationMode.POSITIVE and len(str(body.get("model"))) % 2:
                body["model"] = DEMO
            response = case.call(headers=headers)
            case.validate_response(response, checks=checks, headers=headers)

        run()
