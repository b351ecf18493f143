"""The web <-> worker contract, free of Django (and of torch).

Both sides import this package and it imports neither: the web apps
(``inference``, ``console``, ``fleet``, ``billing``) enqueue
``GenerationRequest``s and read events; the GPU workers (``gpuworkers``)
take requests and publish events. What crosses the boundary is a typed
record defined here and nowhere else, and encoded in one place:

- ``requests``: the generation request as enqueued on a worker's stream,
  with its service class.
- ``sampling``: how to sample it (the engine's ``SamplingParams`` fields;
  the limits and checks both sides apply are ``sampling_rules``').
- ``events``: the response stream's events (``Created``, ``Delta``,
  ``Terminal``) and what they carry (usage, timings, logprobs, errors).
- ``codec``: the one encoder and decoder of events and requests.
- ``usage``: each billed response's usage entry and the stream it travels on.
- ``workers``: worker info (the heartbeat) and worker states.
- ``snapshot``: the control snapshot's schema, its stores and its reader.
- ``bus``: the bus interface with its Redis and in-process transports.
"""

from wire.bus.base import Bus, BusUnavailable, WorkerBus
from wire.events import Created, Delta, Event, EventType, Terminal
from wire.requests import GenerationRequest, ServiceClass
from wire.sampling import Sampling
from wire.workers import WorkerInfo, WorkerState

__all__ = [
    "Bus",
    "BusUnavailable",
    "Created",
    "Delta",
    "Event",
    "EventType",
    "GenerationRequest",
    "Sampling",
    "ServiceClass",
    "Terminal",
    "WorkerBus",
    "WorkerInfo",
    "WorkerState",
]
