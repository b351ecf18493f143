"""The request path's two safety stages and /v1/moderations (checks: safety/).

- ``prompt_screen``: before admission. Every text the model will see is
  screened: the messages, and the tools' names, descriptions and schemas
  and earlier tool calls' arguments (``inference.prompts.screened``). A
  text over SAFETY_MAX_SCREEN_CHARS is a 400 before any check runs. A
  prompt the tenant's policy blocks is a 400 ``content_policy_violation``:
  it never reaches a worker, takes no rate-limit tokens and bills nothing.
  PII is redacted from those texts when the policy says so, before they
  are tokenized (or blocks, where the model must see a text as sent).
- ``reply_guard``: the relay's filter over a response's events
  (``ResponseTap(guard=...)``): a ``safety.stream.ReplyScreen`` decides
  what the client sees. On a cut, the owning tap writes the ``incomplete``
  ending (finish_reason ``content_filter``) to the response's stream, so
  resumes and the worker see it, and asks the worker to abort, which frees
  the KV blocks before its next step. Usage counts the tokens sent.
- ``moderations_create``: OpenAI's moderation object from the same checks.

Every flag, redaction, refusal and cut is recorded as a ``SafetyEvent``.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, replace
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import DatabaseError

from inference.errors import ContentPolicyViolation, InvalidRequest, ModelNotFound
from inference.prompts.screened import screen_texts, with_screened
from inference.relay.dispatch import cancel_request
from inference.relay.tap import Guard, ResponseRoute, spawn
from inference.request import InferenceRequest
from safety import selectors as safety_selectors
from safety.checks import CLASSIFIER, DENY_LIST, PII, Finding
from safety.checks.classifier import profanity_model
from safety.models import SafetyEvent
from safety.moderation import finding_summary, texts_moderate
from safety.policy import Action, Policy
from safety.services import safety_event_record
from safety.stream import ReplyScreen, ScreenResult
from tenants.models import ApiKey, Tenant
from wire import logs
from wire.bus import get_bus
from wire.events import Created, Delta, Event, EventType, Terminal, Timings, TokenUsage

logger = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class Subject:
    """Whose request an event is recorded against."""

    tenant_id: int
    model: str
    source: str
    api_key_id: int | None = None
    user_id: int | None = None


async def policy_get(tenant: Tenant) -> Policy:
    # Through the module, so a test can stand in a stub policy.
    return await sync_to_async(safety_selectors.policy_for_tenant)(tenant=tenant)


async def _record(subject: Subject, policy: Policy, **fields: Any) -> None:
    try:
        await sync_to_async(safety_event_record)(
            tenant_id=subject.tenant_id,
            api_key_id=subject.api_key_id,
            user_id=subject.user_id,
            source=subject.source,
            model=subject.model,
            store_text=policy.store_text,
            **fields,
        )
    except DatabaseError:
        # Moderation itself must not fail with the database; the record is lost.
        logger.warning("Could not record a safety event of %s", subject.tenant_id, exc_info=True)


@dataclass(slots=True, frozen=True)
class PromptSafety:
    """What the prompt stage hands on: the policy and whose request it is."""

    policy: Policy
    subject: Subject

    def reply_guard(self, route: ResponseRoute, *, sent_at: float | None) -> Guard | None:
        return reply_guard(policy=self.policy, route=route, subject=self.subject, sent_at=sent_at)


async def prompt_screen(
    *,
    tenant: Tenant,
    request: InferenceRequest,
    model: str,
    api_key: ApiKey | None = None,
    user: AbstractBaseUser | None = None,
) -> tuple[InferenceRequest, PromptSafety]:
    """The prompt stage: the request to serve (PII redacted) and what the reply needs.

    Raises ContentPolicyViolation when a check whose action is BLOCK finds something.
    """
    subject = Subject(
        tenant_id=tenant.pk,
        model=model,
        source=str(request.source),
        api_key_id=api_key.pk if api_key is not None else None,
        user_id=user.pk if user is not None else None,
    )
    # Every text the model will see (tool text too), bounded before any check.
    screened = screen_texts(request.prompt)
    screen_bounds_check((t.text, t.param) for t in screened)
    policy = await policy_get(tenant)
    texts = [t.text for t in screened]
    verbatim = {i for i, t in enumerate(screened) if t.verbatim}
    # CPU work without the database: any pool thread.
    verdict = await sync_to_async(texts_moderate, thread_sensitive=False)(
        texts, policy, verbatim=verbatim
    )
    if verdict.action:
        await _record(
            subject,
            policy,
            stage=SafetyEvent.Stage.PROMPT,
            outcome=verdict.action,
            findings=finding_summary(verdict.findings),
            text="\n".join(verdict.texts),
            request_ref=logs.context().get("request_id") or "",
        )
    if verdict.blocked:
        raise ContentPolicyViolation()
    if verdict.redacted:
        request = replace(request, prompt=with_screened(request.prompt, verdict.texts))
    return request, PromptSafety(policy, subject)


def screen_bounds_check(texts: Iterable[tuple[str, str]]) -> None:
    """A 400 for a (text, param) longer than SAFETY_MAX_SCREEN_CHARS, before
    any check runs: the checks are linear, but a text's length is the
    client's to choose, and the work happens before admission."""
    limit = settings.SAFETY_MAX_SCREEN_CHARS
    for text, param in texts:
        if len(text) > limit:
            raise InvalidRequest(
                f"Invalid '{param}': a text of {len(text)} characters is longer than the "
                f"{limit} characters the safety screen takes. Please shorten it.",
                param=param,
                code="string_above_max_length",
            )


@dataclass(slots=True, frozen=True)
class _Owner:
    """The tap that owns a response: it ends the stream and records events."""

    route: ResponseRoute
    subject: Subject
    sent_at: float | None


def reply_guard(
    *,
    policy: Policy,
    route: ResponseRoute | None = None,
    n: int = 1,
    subject: Subject | None = None,
    sent_at: float | None = None,
) -> Guard | None:
    """The relay's filter for one response; None when the policy checks no output.

    With a ``route`` and ``subject`` the guard owns the response: on a cut
    it ends the stream and aborts the worker, and it records events.
    Without (a resume, a console socket) it only shows what the owner
    showed: the screen is deterministic, so it cuts at the same event.
    """
    if not policy.checks_output:
        return None
    owner = _Owner(route, subject, sent_at) if route and subject else None
    choices = route.n if route is not None else n

    def guard(events: AsyncIterator[Event]) -> AsyncIterator[Event]:
        return _screened(events, policy, choices, owner)

    return guard


async def _screened(
    events: AsyncIterator[Event], policy: Policy, n: int, owner: _Owner | None
) -> AsyncIterator[Event]:
    if policy.classifier != Action.OFF:
        # Loaded once per process (scikit-learn), never on the event loop.
        await sync_to_async(profanity_model, thread_sensitive=False)()
    screen = ReplyScreen(policy)
    sent = _Sent()
    try:
        async for event in events:
            if isinstance(event, Delta):
                result = screen.feed(event)
            elif isinstance(event, Terminal):
                result = screen.finish()
            else:
                sent.add(event)
                yield event
                continue
            for released in result.release:
                sent.add(released)
                yield released
            if owner is not None and result.flags:
                spawn(_record_output(owner, policy, result, SafetyEvent.Outcome.FLAGGED))
            if result.cut is not None:
                ending = sent.ending(event.seq, n, owner.sent_at if owner else None)
                if owner is not None:
                    await _cut(owner.route, ending)
                    spawn(_record_output(owner, policy, result, SafetyEvent.Outcome.BLOCKED))
                yield ending
                return
            if isinstance(event, Terminal):
                yield event
                return
    finally:
        await events.aclose()


class _Sent:
    """What the client was sent: the usage of a reply cut short."""

    __slots__ = ("prompt_tokens", "completion_tokens", "finished", "first_at")

    def __init__(self) -> None:
        self.prompt_tokens = self.completion_tokens = 0
        self.finished: set[int] = set()
        self.first_at: float | None = None

    def add(self, event: Event) -> None:
        if isinstance(event, Created):
            self.prompt_tokens = event.prompt_tokens
            return
        self.first_at = self.first_at or time.time()
        if isinstance(event, Delta):
            for choice in event.choices:
                self.completion_tokens += len(choice.token_ids)
                if choice.finish_reason:
                    self.finished.add(choice.index)

    def ending(self, seq: int, n: int, sent_at: float | None) -> Terminal:
        """The ``incomplete`` terminal: content_filter for every unfinished choice."""
        now = time.time()
        metrics = Timings(
            ttft_ms=(self.first_at - sent_at) * 1000 if sent_at and self.first_at else None,
            duration_ms=(now - sent_at) * 1000 if sent_at else 0.0,
        )
        reasons = {i: "content_filter" for i in range(n) if i not in self.finished}
        usage = TokenUsage(self.prompt_tokens, self.completion_tokens)
        return Terminal(
            EventType.INCOMPLETE, seq, usage=usage, metrics=metrics, finish_reasons=reasons
        )


async def _cut(route: ResponseRoute, ending: Terminal) -> None:
    """End the response on its stream, then stop the worker (frees its KV at once)."""
    try:
        # First, so the worker's own ``cancelled`` ending cannot land instead.
        await get_bus().publish_if_open(route.response_id, ending)
    except Exception:
        logger.warning("Could not end %s on its stream", route.response_id, exc_info=True)
    try:
        await cancel_request(route.response_id, worker_id=route.worker_id)
    except Exception:
        logger.warning("Could not abort %s", route.response_id, exc_info=True)


async def _record_output(owner: _Owner, policy: Policy, result: ScreenResult, outcome: str) -> None:
    findings = [result.cut] if result.cut is not None else result.flags
    await _record(
        owner.subject,
        policy,
        stage=SafetyEvent.Stage.OUTPUT,
        outcome=outcome,
        findings=finding_summary(findings),
        text=result.text,
        request_ref=owner.route.response_id,
    )


# --- /v1/moderations ---

MODERATION_MODEL = "llmp-moderation-1"
# OpenAI's model names are accepted and answered by ours.
MODERATION_ALIASES = {
    MODERATION_MODEL,
    "omni-moderation-latest",
    "text-moderation-latest",
    "text-moderation-stable",
}
# OpenAI's categories; the classifier's "offensive" is reported as harassment.
OPENAI_CATEGORIES = (
    "harassment",
    "harassment/threatening",
    "hate",
    "hate/threatening",
    "illicit",
    "illicit/violent",
    "self-harm",
    "self-harm/intent",
    "self-harm/instructions",
    "sexual",
    "sexual/minors",
    "violence",
    "violence/graphic",
)
# Ours, from the same checks as the chat path: PII and the tenant's deny list.
OWN_CATEGORIES = ("pii", "deny_list")
_CATEGORY_OF_CHECK = {CLASSIFIER: "harassment", PII: "pii", DENY_LIST: "deny_list"}


async def moderations_create(*, tenant: Tenant, inputs: list[str], model: str | None) -> dict:
    """OpenAI's moderation object for ``inputs`` under the tenant's policy.

    Each check the policy runs (action not ``off``) reports; ``flagged``
    is true when any of them found something, whether the chat path would
    flag, redact or block it. Nothing is recorded: the caller asked.
    """
    if model is not None and model not in MODERATION_ALIASES:
        raise ModelNotFound(model)
    screen_bounds_check((text, "input") for text in inputs)
    policy = await policy_get(tenant)
    verdicts = await sync_to_async(_moderate_each, thread_sensitive=False)(inputs, policy)
    return {
        "id": f"modr-{uuid.uuid4().hex}",
        "model": MODERATION_MODEL,
        "results": [_result(findings, score) for findings, score in verdicts],
    }


def _moderate_each(inputs: list[str], policy: Policy) -> list[tuple[list[Finding], float]]:
    out = []
    for text in inputs:
        verdict = texts_moderate([text], policy)
        out.append((verdict.findings, verdict.score or 0.0))
    return out


def _result(findings: list[Finding], classifier_score: float) -> dict[str, Any]:
    names = OPENAI_CATEGORIES + OWN_CATEGORIES
    flagged = {_CATEGORY_OF_CHECK.get(f.check, f.check) for f in findings}
    scores = {name: 0.0 for name in names}
    scores["harassment"] = round(classifier_score, 6)
    for name in flagged - {"harassment"}:
        scores[name] = 1.0
    return {
        "flagged": bool(flagged),
        "categories": {name: name in flagged for name in names},
        "category_scores": scores,
        "category_applied_input_types": {name: ["text"] for name in names},
    }
