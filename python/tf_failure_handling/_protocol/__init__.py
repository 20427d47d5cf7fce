"""The parts of ``PreemptionCheckpointHandler``: each performs what the Rust core decides
(notices, agreement, step keys, save and exit, retries, records), one concern a module.

The handler builds them and passes each its ``Context`` (the shared ``HandlerState``, the
core's ``ProtocolCore``, the error reports and the stage records) and the parts it
calls, at most four; none imports or calls the handler, and a module imports another
only from a lower floor: ``keys``, ``state``, ``checkpoint_files``, ``host_memory`` and
``records_hooks``; then ``non_chief_saves``; then ``checkpoint_shares``; then
``checkpoints``, ``retries``, ``reporting`` and ``ownership``; then ``context``; then
``step_keys``, ``ps_steps`` and ``agreement``; then ``notices`` and ``save``; then
``driver`` and ``step_check``. docs/how-it-works.md ("The parts of a
handler") lists them in the order a notice meets them.
"""
