"""The web <-> worker contract, free of Django (and of torch).

Both sides import this package and it imports neither: the web apps
(``inference``, ``console``, ``fleet``, ``billing``) enqueue
``GenerationRequest``s and read events; the GPU workers (``gpuworkers``)
take requests and publish events. What crosses the boundary is defined
here and nowhere else:

- ``requests``: the generation request as enqueued on a worker's stream.
- ``events``: the response stream's event types and their builders.
- ``workers``: worker info (the heartbeat) and worker states.
- ``limits``: the sampling limits every worker accepts.
- ``snapshot``: the control snapshot's schema, its stores and its reader.
- ``bus``: the bus interface with its Redis and in-process transports.
"""

from wire.bus.base import Bus, BusUnavailable, WorkerBus
from wire.events import TERMINAL_EVENTS, EventType
from wire.requests import GenerationRequest
from wire.workers import WorkerInfo, WorkerState

__all__ = [
    "TERMINAL_EVENTS",
    "Bus",
    "BusUnavailable",
    "EventType",
    "GenerationRequest",
    "WorkerBus",
    "WorkerInfo",
    "WorkerState",
]
