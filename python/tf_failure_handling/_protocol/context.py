"""What every part of a handler reads and reports to, passed to each as one
:class:`Context`: the shared state (configuration, lifecycle), the Rust core's
protocol object, the error reports and the preemption records' stages.

A part's constructor takes the context and at most four other parts, the ones it calls
(docs/how-it-works.md, "The parts of a handler").
"""

from __future__ import annotations

from dataclasses import dataclass

from .._native import ProtocolCore
from .records_hooks import StageRecords
from .reporting import ErrorReports
from .state import HandlerState


@dataclass(frozen=True)
class Context:
    #: Configuration (set once) and lifecycle.
    state: HandlerState
    #: The protocol object: every decision, bound and round, on its own clock.
    core: ProtocolCore
    #: Where a background thread's error goes (raised by the next ``run()``).
    errors: ErrorReports
    #: Each stage of a preemption as a line of the records.
    records: StageRecords
