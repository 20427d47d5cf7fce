"""What a termination notice of this worker starts, once the driver takes it.

The core (``Event.Notice``) answers each notice: **claim** ``TERMINATED_WORKER``
(the first worker to write it leads the round; the others stand down), **lead** at once
(local mode: there is nobody to claim against), or **absorb** it (this handler already
acts on an earlier one). A won claim, and a lead, **announce** the notice to the
``PreemptionWatcher`` objects: through the coordination service's
``TF_DEFAULT_PREEMPTION_NOTICE_KEY``, then in this process (``_platforms.in_process``).
A notice that a newer handler of the same worker owns is **handed on** to it
(``ownership``).

The claim and the announce are writes the core queues when it answers the notice
(``Event.Notice``) and the driver performs: a failed one is retried within the bound
between the driver's other inputs, and the core queues the announce of a won claim
itself; the driver reports each finished one here (:meth:`NoticeResponse.claimed`,
:meth:`NoticeResponse.announced`).
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from .._native import Action, Event
from .._platforms import in_process
from .._platforms.notice_sources import Notice
from .context import Context
from .keys import PREEMPTION_NOTICE_KEY
from .ownership import Ownership
from .ps_steps import PsSteps

log = logging.getLogger("tf_failure_handling")


#: The end of the claim's log line when a ``run()`` was under way then.
CLAIMED_IN_RUN = ", a run() under way"


class NoticeResponse:
    """Claim, lead, absorb or hand on a notice of this worker; announce the one it leads."""

    def __init__(self, ctx: Context, ownership: Ownership, ps: PsSteps) -> None:
        self._ctx = ctx
        self._state, self._core = ctx.state, ctx.core
        self._errors, self._records = ctx.errors, ctx.records
        self._ownership = ownership
        self._ps = ps

    def start(self, notice: Notice) -> Optional[bool]:
        """Acts on ``notice``: True when the core queued a write for it (a claim, an
        announce), False when it is done with (absorbed, handed to a newer handler, or
        led in local mode), None when the core did not take it yet (the write of the
        notice before it is pending: ``Action.Wait``)."""
        try:
            owner = self._ownership.current_owner()
            if owner is None:
                return self._on_own_notice(notice)
            if not owner.came_after(notice.at):
                # It reached this handler before the newer one was built (as a signal
                # reaches only the handlers installed then, in TensorFlow): the newer
                # one does not act on it, and this one acts on nothing any more.
                log.info(
                    "Termination notice from %s arrived before the newer handler of "
                    "worker %s was built: neither acts on it.",
                    notice.source,
                    self._state.membership.id_in_cluster,
                )
                return False
            log.info(
                "Termination notice from %s handed to the newer handler of worker %s.",
                notice.source,
                self._state.membership.id_in_cluster,
            )
            owner.hand_on(notice.source, notice.deadline, notice.kill)
        except BaseException as e:  # noqa: BLE001 - handed to the next run()
            self._errors.fail_in_background(f"handling the notice from {notice.source}", e)
        return False

    def _on_own_notice(self, notice: Notice) -> Optional[bool]:
        source = notice.source
        message = in_process.notice_message(self._state.membership.id_in_cluster, source, notice.at)
        # The notice's line is written before any line of a stage it leads to.
        with self._records.taking_notice():
            # The core answers, and queues the write the answer starts (the claim; the
            # announce of a notice this worker leads in a cluster). Platforms announce
            # wall-clock times; the core converts them to its clock as it takes them.
            action = self._core.handle(Event.Notice(source, message, notice.deadline, notice.kill))
            if isinstance(action, Action.Wait):
                return None
            if notice.deadline is not None and notice.at is not None:
                log.info(
                    "The notice from %s gives %.1fs until the machine goes away.",
                    source,
                    notice.deadline - notice.at,
                )
            # Where training was when the core took the notice: the first step that can
            # save at it is the next run() to start (read after the core took it, so a
            # run() that started in between and saw it is counted as before it).
            runs = self._core.run_counter
            in_run = self._core.threads[0] != 0
            absorbed = isinstance(action, Action.Absorb)
            fit = None if absorbed else self._say_what_fits(source)
            replan = isinstance(action, Action.Replan)
            self._records.notice(
                source, notice.deadline, fit, replan=replan, runs=runs, in_run=in_run
            )
        if isinstance(action, Action.Lead):
            log.info("Received termination notice from %s.", source)
            self._ps.on_notice(action.final_round)
            if self._state.membership.local:
                # Local mode: this process's watchers only (in a cluster, the announce
                # the core queued tells the peers' too, then this process's).
                in_process.publish_local(message)
            return action.writes
        if isinstance(action, Action.Claim):
            # The claim of TERMINATED_WORKER: a failure of the coordination service is
            # retried within the bound (TF drops the notice at the first failure); after
            # it, the UnavailableError reaches the next run().
            return True
        if isinstance(action, Action.Replan):
            log.warning(
                "Termination notice from %s ends earlier than the one this worker planned "
                "for: the final save is planned for it now (this worker publishes the final "
                "round itself if the leader would be too late).",
                source,
            )
            return False
        log.info(
            "Termination notice from %s absorbed: this handler already acts on an earlier one.",
            source,
        )
        return False

    def _say_what_fits(self, source: str) -> Optional[str]:
        """At the notice, what the core says still fits before this worker's earliest
        deadline; a warning at once when the grace period's second save or even one save
        does not (the fastest path, one save at once, is taken all the same)."""
        answer = self._core.handle(Event.Fit())
        if answer is None:
            return None
        fit, left, needed, final_round = answer
        if fit == "unknown":
            leaves = "sets no deadline" if left == float("inf") else f"leaves {left:.1f}s"
            log.warning(
                "The notice from %s %s; no save has been timed in this process (nor a "
                "restore at start), so whether a save ends before the machine goes away "
                "is not known. Saving at the next step.",
                source,
                leaves,
            )
        elif fit == "neither":
            log.warning(
                "The notice from %s leaves %.1fs; a save needs about %.1fs (step, save as "
                "measured, slack): it may not end before the machine goes away. Saving at "
                "the next step all the same.",
                source,
                left,
                needed,
            )
        elif fit == "one_save" and final_round:
            log.warning(
                "The notice from %s leaves %.1fs, not the %.1fs two saves need: the first "
                "save is the last (no training through the grace period).",
                source,
                left,
                needed,
            )
        return fit

    def claimed(self, claim: Any, error: Optional[BaseException]) -> None:
        """The claim's write ended (the core's report, ``Action.Written``, ``WriteGaveUp`` or
        ``Raised``): won (the core queued the announce), lost, or failed (the core no
        longer counts on it; ``error`` reaches the next ``run()``)."""
        source, member = claim.subject, claim.value
        if error is not None:
            self._errors.fail_in_background(f"handling the notice from {source}", error)
            return
        if claim.won:
            # Where training was when the claim was won: the leader's first check from
            # now on publishes (TF's message, then the run count and whether a run()
            # was under way, its check made; tools read when the step could be agreed
            # from it).
            runs, in_run = self._core.run_counter, self._core.threads[0] != 0
            log.info(
                "Member %s has received termination notice (%s); claimed at run count %d%s.",
                member,
                source,
                runs,
                CLAIMED_IN_RUN if in_run else "",
            )
            return
        log.info(
            "Member %s has received termination notice (%s), but another worker "
            "received one first; it decides when to checkpoint.",
            member,
            source,
        )

    def announced(self, announce: Any, error: Optional[BaseException]) -> None:
        """The announce's write finished (or gave up: for ``PreemptionWatcher`` objects
        only, the protocol goes on): this process's watchers get the message now. A
        script that closes and exits when its own watcher reports must not take the
        coordination service down before peers could read it."""
        if error is not None:
            log.warning("Could not publish %s: %s", PREEMPTION_NOTICE_KEY, error)
        in_process.publish_local(announce.value)
