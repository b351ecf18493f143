"""JSON for operators and orchestrators: the fleet view and the scaling signal.

Staff sessions, or ``Authorization: Bearer $FLEET_SIGNAL_TOKEN`` for an
orchestrator (the token is off when unset).
"""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, JsonResponse

from fleet.autoscale import fleet_signal
from fleet.selectors import fleet_view
from fleet.snapshot import asnapshot_current, snapshot_reader_status
from wire.bus import BusUnavailable, get_bus


async def _allowed(request: HttpRequest) -> bool:
    token = settings.FLEET_SIGNAL_TOKEN
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer "):
        return hmac.compare_digest(header.removeprefix("Bearer ").strip(), token)
    user = await request.auser()
    return bool(user.is_authenticated and user.is_staff)


def _denied() -> JsonResponse:
    return JsonResponse({"error": "staff session or fleet token required"}, status=403)


async def _workers():
    try:
        return await get_bus().list_workers(), None
    except BusUnavailable:
        return [], JsonResponse({"error": "the bus (Redis) is unreachable"}, status=503)


async def signal(request: HttpRequest) -> JsonResponse:
    if not await _allowed(request):
        return _denied()
    workers, error = await _workers()
    if error:
        return error
    snapshot = await asnapshot_current()
    signals = [s.to_dict() for s in fleet_signal(workers=workers, snapshot=snapshot)]
    return JsonResponse({"models": signals})


async def state(request: HttpRequest) -> JsonResponse:
    if not await _allowed(request):
        return _denied()
    workers, error = await _workers()
    if error:
        return error
    await asnapshot_current()
    return JsonResponse({**fleet_view(workers=workers), "reader": snapshot_reader_status()})
