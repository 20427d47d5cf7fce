"""The handler's protocol driver: what ``PreemptionCheckpointHandler`` performs between its
API and the Rust core.

The Rust core (``HandlerCore``, ``src/step_resolution.rs``) decides; the classes here
perform each decision against TensorFlow and own the threads that feed the core:

* **inputs** arrive in one inbox (``_native.Inbox``, ``src/inbox.rs``), read by one
  loop (``driver``): notices from every termination source, the step keys a leader
  publishes (read by the reader thread of ``step_keys``), a reader's failure, and the
  stop of ``close()``. The training thread is the other actor: the check before a step
  (``step_check``) publishes (``agreement``) and saves (``save``);
* **decisions** come back typed: ``_native.NoticeAction`` (lead, claim, absorb),
  ``_native.StepAction`` (proceed, publish, save), ``_native.KeyAction`` (acknowledge,
  stop), ``_native.SaveAction`` (exit, countdown);
* **effects** (claim, announce, publish, acknowledge, await, save, exit, shutdown
  writes, error reports) each follow one rule when they fail, the table in
  ``src/step_resolution.rs`` ("Failures"): retried within the bound (``retries``: the
  driver's writes without sleeping, between which it keeps taking inputs; the training
  thread's by waiting), then an error naming the key and the cause reaches the next
  ``run()`` (``reporting``), so no thread of the handler ends without the handler
  learning of it.

One concern a class, each in its own module. ``PreemptionCheckpointHandler``
(``handler.py``) is all of them plus the API, on one object: TensorFlow's libraries and
the native ``run()`` call the handler's private hooks, and the classes meet only through
``self``. Each class's docstring names the attributes it owns and those it reads.

=================  ====================  =====================================  ==============
module             class                 concern                                thread
=================  ====================  =====================================  ==============
``step_check``     ``StepCheck``         the check before a step; the step's    training
                                         failure
``agreement``      ``Agreement``         the leader publishes the step and      training
                                         awaits every acknowledgement
``save``           ``SaveAndExit``       the save at the agreed step, the exit  training
``driver``         ``ProtocolDriver``    the loop over the inbox; the threads   driver
``notices``        ``NoticeResponse``    claim, lead, absorb or hand on a       driver
                                         notice; announce it
``step_keys``      ``StepKeyWatch``      read the leader's step keys;           reader, driver
                                         acknowledge each
``retries``        ``Retries``           retry a failing call within the        driver,
                                         bound; name it when it gives up        training
``reporting``      ``ErrorReporting``    a step's error to the cluster, a       all
                                         thread's error to ``run()``
``ownership``      ``NoticeOwnership``   one handler per worker acts            driver, reader
``ps_steps``       ``PsSteps``           a parameter-server coordinator's       poller,
                                         watch and steps around a save          training
``records_hooks``  ``StageRecords``      each stage as a preemption record      all
``checkpoints``    ``Checkpoints``       the checkpoint managers, the run       training
                                         counter, the worker temp dirs
``keys``           —                     the keys and the bounds                —
=================  ====================  =====================================  ==============

``state`` (``HandlerState``) is what the parts share. The parts being turned into
objects the handler holds (``StageRecords`` as ``_stage_records``) take the state and
what they need at construction; the others are still bases of the handler.

Floors: ``keys``, ``state``, ``retries``, ``checkpoints`` and ``records_hooks`` at the
bottom; every other module imports only those, the packages below (``_platforms``,
``_cluster``, the parameter-server control) and the ground floor (``_native``,
``_errors``, ``records``): never another of the classes above, which meet only on the
handler, and never the handler.
"""
