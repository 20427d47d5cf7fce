"""What tf_failure_handling relies on in TensorFlow's private Python code, pinned by a
fingerprint per release (``test_tf_versions.py`` checks the installed TensorFlow).

The package mirrors or subclasses TensorFlow's private Python code: the
coordinator's ``Cluster``, ``Worker``, ``WorkerPreemptionHandler`` and closure
queue (``coordinator.py`` re-creates ``Cluster.__init__`` and overrides three
methods), the worker/PS failure classifier (``src/failure.rs`` mirrors
``_is_worker_failure`` / ``_is_ps_failure`` and their error strings), and the
handler's protocol (keys, exit codes, checkpoint layout of
``PreemptionCheckpointHandler``). Where a TensorFlow release differs in any of
these, the difference is recorded here, in :data:`RELEASES`, under the release
that introduced it, and nowhere else.

Each internal is pinned by a fingerprint of its code: the SHA-256 of its
abstract syntax tree with docstrings removed (:func:`fingerprint`), so comments,
docstrings and formatting do not count and any change of behaviour does.
``test_tf_versions.py`` fingerprints the installed TensorFlow and
compares it with the entry for its release (:func:`expected`): the
compatibility matrix (``make test-compat``) runs it on every release in
``tf_versions.TESTED``, so a release that changes something the package relies on fails
there, naming the internal.

Read from TensorFlow 2.16.2 and 2.21.0 (``make test-compat`` on 2.16/3.11 and
2.21/3.13): every internal below is the same in both. The Python sources of
``distribute/coordinator/``, ``distribute/failure_handling/`` and the
coordination-service methods of ``eager/context.py`` differ between the two only
in comments, docstrings and formatting; the one move in between (``eager/context.py``
imports ``coordination_config_pb2`` from ``tensorflow.tsl.protobuf`` in 2.16 and
from ``tensorflow.compiler.xla.tsl.protobuf`` in 2.21) concerns nothing this
package imports. The internals the coordinator's closures rely on
(``_coordinator/function_cache.py``, ``remote_values.py`` and ``worker_loop.py``: the
coordinator's ``values``, ``coordinator_context`` and ``metric_utils``,
``CancellationManager``, ``function_context.make_function_context``) were fingerprinted
from both releases' sources and are the same too; the C methods of ``EagerTensor`` they
read (``_datatype_enum``, ``_shape_tuple``) are exercised by
``tests/unit/test_coordinator_cache.py``. The error strings the classifier looks
for are the same too (``tests/compat/test_real_errors.py`` classifies the errors
each release raises).

The saves' internals (``functional_saver``'s ``MultiDeviceSaver`` and
``_single_shard_save``, ``sharding_util``'s callback protocol: the ``memory`` and
``shares`` modes) were fingerprinted from the sources of every release 2.16.2 to 2.21.0:
2.17 and 2.19 changed annotations and a log message in them (:data:`RELEASES`), nothing
the saves rely on. At run time ``saver_hook.missing`` checks that the names exist when a
mode is installed; a TensorFlow without one gets TensorFlow's own save.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import textwrap
from typing import Any

from tf_failure_handling._integrations.tf_versions import _key

_CC = "tensorflow.python.distribute.coordinator.cluster_coordinator"
_FH = "tensorflow.python.distribute.failure_handling.failure_handling"
_PW = "tensorflow.python.distribute.failure_handling.preemption_watcher"
_CTX = "tensorflow.python.eager.context"
_VALUES = "tensorflow.python.distribute.coordinator.values"
_DISPATCH = "tensorflow.python.distribute.coordinator.coordinator_context"
_METRICS = "tensorflow.python.distribute.coordinator.metric_utils"
_UTILS = "tensorflow.python.distribute.coordinator.utils"
_CANCEL = "tensorflow.python.eager.cancellation"
_FCTX = "tensorflow.python.eager.polymorphic_function.function_context"
_FS = "tensorflow.python.checkpoint.functional_saver"
_SU = "tensorflow.python.checkpoint.sharding.sharding_util"
_IO = "tensorflow.python.ops.gen_io_ops"
_CKCTX = "tensorflow.python.checkpoint.checkpoint_context"

#: What is relied on, ``"module:qualified.name"`` -> why.
RELIED_ON = {
    f"{_CC}:Cluster.__init__": "re-created by coordinator._Cluster.__init__",
    f"{_CC}:Cluster._record_and_ignore_transient_ps_failure": "replaced by the native counters",
    f"{_CC}:Cluster._record_and_ignore_transient_timeouts": "replaced by the native counters",
    f"{_CC}:WorkerPreemptionHandler": (
        "subclassed; three methods overridden; TF's own stopped at exit by tf_exit.stop_recovery"
    ),
    f"{_CC}:Worker": "subclassed by _closures.Worker (_process_queue, _process_closure overridden)",
    f"{_CC}:Closure": "re-created by _coordinator.function_cache.Closure",
    f"{_CC}:_select_worker_slice": "called by _closures.run_on",
    f"{_CC}:_get_error_from_remote_values": "called by _closures.run_on",
    f"{_CC}:_maybe_as_type_spec": "mirrored by _closures.argument_key",
    f"{_VALUES}:RemoteValueImpl": "subclassed by _closures.ClosureRemoteValue (no Event)",
    f"{_VALUES}:PerWorkerValues": "_closures keys on its first value's type spec",
    f"{_VALUES}:PerWorkerDistributedIterator": "keyed as PerWorkerValues",
    f"{_DISPATCH}:maybe_get_remote_value": "called by _closures.run_on",
    f"{_DISPATCH}:with_dispatch_context": "entered by _closures.run_on",
    f"{_METRICS}:monitored_timer": "mirrored by _closures (cells added to directly)",
    f"{_METRICS}:_init": "its metric names are read by _closures",
    f"{_CANCEL}:CancellationManager": "get_cancelable_function wraps cached functions",
    f"{_FCTX}:make_function_context": "what _closures.context_key keys on",
    f"{_CC}:_CoordinatedClosureQueue": "its behaviour is the native queue's (src/closure_queue.rs)",
    f"{_CC}:ClusterCoordinator": "subclassed",
    f"{_CC}:ResourceClosure": "told apart by _closures.Worker._process_queue; subclassed "
    "by resource_values (its remote value's class)",
    f"{_CC}:PerWorkerVariableClosure": "subclassed by resource_values (its remote value's class)",
    f"{_VALUES}:RemoteVariable": "subclassed by resource_values.ResourceVariable (checked waits)",
    f"{_CC}:_CLOSURE_QUEUE_MAX_SIZE": "read by coordinator._Cluster (TF's tests set it)",
    f"{_CC}:CoordinationServicePreemptionHandler": "used as is (coordination-service mode)",
    f"{_UTILS}:RepeatedTimer": "its poller thread is stopped at shutdown by tf_exit",
    f"{_CC}:ClosureInputError": "unwrapped by the classifier",
    f"{_CC}:ClosureAbortedError": "unwrapped by the classifier",
    f"{_CC}:PSUnavailableError": "a PS failure for the classifier",
    f"{_CC}:_is_worker_failure": "mirrored by src/failure.rs",
    f"{_CC}:_is_ps_failure": "mirrored by src/failure.rs",
    f"{_CC}:_extract_failed_ps_instances": "mirrored by src/failure.rs",
    f"{_CC}:_handle_graph_execution_error_as_worker_failure": "mirrored by src/failure.rs",
    f"{_FH}:PreemptionCheckpointHandler": "replaced: keys, exit codes, checkpoints",
    f"{_FH}:TerminationConfig": "replaced",
    f"{_PW}:PreemptionWatcher": "replaced",
    f"{_CTX}:Context.get_config_key_value": "the coordination service (handler, watcher)",
    f"{_CTX}:Context.set_config_key_value": "the coordination service",
    f"{_CTX}:Context.delete_config_key_value": "the coordination service",
    f"{_CTX}:Context.report_error_to_cluster": "the coordination service",
    f"{_CTX}:Context.check_collective_ops_peer_health": "peer probes after a lost peer",
    # The saves (``memory`` and ``shares``: _integrations/saver_hook.py, tf_reads_only.py,
    # tf_shares.py; saver_hook.missing checks at the mode's install that they exist).
    f"{_FS}:MultiDeviceSaver.save": "replaced by saver_hook (TF's own: saver_hook.original)",
    f"{_FS}:MultiDeviceSaver.__init__": (
        "sets _registered_savers and _num_unique_tasks, read by tf_reads_only.cannot_skip"
    ),
    f"{_FS}:MultiDeviceSaver._get_shards_by_task": "called by tf_reads_only and tf_shares",
    f"{_FS}:_single_shard_save": "called by tf_shares (a worker's share)",
    f"{_FS}:sharded_filename": "its part names are mirrored by tf_shares",
    f"{_SU}:ShardableTensor": "its fields are read by tf_reads_only._Count and tf_shares._Split",
    f"{_SU}:ShardingCallback": "mirrored by tf_reads_only._Count and tf_shares._Split",
    f"{_IO}:merge_v2_checkpoints": "called by tf_shares (the chief's merge)",
    f"{_CTX}:async_wait": "called by tf_reads_only and tf_shares (the reads waited for)",
    f"{_CKCTX}:preemption_save_context": "entered by every save (checkpoints.py)",
}

#: Fingerprints as of TensorFlow 2.16.2 (the same in 2.21.0, on Python 3.10-3.13).
_TF_2_16 = {
    f"{_CC}:Cluster.__init__": "42eed6bb3688",
    f"{_CC}:Cluster._record_and_ignore_transient_ps_failure": "d9e12b929d5c",
    f"{_CC}:Cluster._record_and_ignore_transient_timeouts": "6cd758f516b2",
    f"{_CC}:WorkerPreemptionHandler": "020484b250d8",
    f"{_CC}:Worker": "2667d88dbec6",
    f"{_CC}:Closure": "6f783d5cdce4",
    f"{_CC}:_select_worker_slice": "47365e5b067c",
    f"{_CC}:_get_error_from_remote_values": "89a90e480e14",
    f"{_CC}:_maybe_as_type_spec": "885441a86329",
    f"{_VALUES}:RemoteValueImpl": "f991dd752677",
    f"{_VALUES}:PerWorkerValues": "d39dbec169c3",
    f"{_VALUES}:PerWorkerDistributedIterator": "28ef35692773",
    f"{_DISPATCH}:maybe_get_remote_value": "4c44ed5cf9d3",
    f"{_DISPATCH}:with_dispatch_context": "400c553d14fd",
    f"{_METRICS}:monitored_timer": "b11070fb3eeb",
    f"{_METRICS}:_init": "f156714bf411",
    f"{_CANCEL}:CancellationManager": "5a446aa2cdff",
    f"{_FCTX}:make_function_context": "7bc00970b640",
    f"{_CC}:_CoordinatedClosureQueue": "323aadc33065",
    f"{_CC}:ClusterCoordinator": "cf2028be6ca0",
    f"{_CC}:ResourceClosure": "41747f043316",
    f"{_CC}:PerWorkerVariableClosure": "97d9ffc98f6c",
    f"{_VALUES}:RemoteVariable": "4f5ada9eb11a",
    f"{_CC}:_CLOSURE_QUEUE_MAX_SIZE": "dcddbed51736",
    f"{_CC}:CoordinationServicePreemptionHandler": "6d414a6a46b2",
    # Read from 2.21.0: distribute/coordinator/ is the same in 2.16.2 (module docstring).
    f"{_UTILS}:RepeatedTimer": "9e796c4ab095",
    f"{_CC}:ClosureInputError": "f9f4db757755",
    f"{_CC}:ClosureAbortedError": "efb346ca8c69",
    f"{_CC}:PSUnavailableError": "b12367400e12",
    f"{_CC}:_is_worker_failure": "e34906515654",
    f"{_CC}:_is_ps_failure": "378ecef900ff",
    f"{_CC}:_extract_failed_ps_instances": "ba313f8e155e",
    f"{_CC}:_handle_graph_execution_error_as_worker_failure": "153fe13b07b8",
    f"{_FH}:PreemptionCheckpointHandler": "a2883701b691",
    f"{_FH}:TerminationConfig": "b33725894a49",
    f"{_PW}:PreemptionWatcher": "5a069823f9dc",
    f"{_CTX}:Context.get_config_key_value": "5346c35e31b8",
    f"{_CTX}:Context.set_config_key_value": "b8607170050a",
    f"{_CTX}:Context.delete_config_key_value": "e89d4e0d22c6",
    f"{_CTX}:Context.report_error_to_cluster": "5b1a82fdf378",
    f"{_CTX}:Context.check_collective_ops_peer_health": "abaa30f89eac",
    f"{_FS}:MultiDeviceSaver.save": "6347072970cb",
    f"{_FS}:MultiDeviceSaver.__init__": "80db17554509",
    f"{_FS}:MultiDeviceSaver._get_shards_by_task": "597a1947e426",
    f"{_FS}:_single_shard_save": "d7837b5ff554",
    f"{_FS}:sharded_filename": "dceb3715a926",
    f"{_SU}:ShardableTensor": "81a28653d9d0",
    f"{_SU}:ShardingCallback": "c761408147ec",
    f"{_IO}:merge_v2_checkpoints": "99cb612c9e68",
    f"{_CTX}:async_wait": "0bb81e33a864",
    f"{_CKCTX}:preemption_save_context": "6ff6fee61bc7",
}

#: TensorFlow 2.17: the saver's type annotations (``sharding_util.Shard`` for
#: ``TensorSliceDict``, ``TensorKeyAndSliceSpec``, ``RestoreFn``), ``_get_shards_by_task``'s
#: loop over the tasks written out, ``_single_shard_save``'s ``len(tensors)`` as
#: ``tensors``, and ``ShardingCallback``'s ``description`` no longer a class annotation.
#: What the saves rely on is the same: the names, ``__init__``'s two attributes, the
#: ``(task, shards)`` list and the callback's protocol (read from the 2.17.1 wheel).
_TF_2_17 = {
    **_TF_2_16,
    f"{_FS}:MultiDeviceSaver.__init__": "fdc8941a1079",
    f"{_FS}:MultiDeviceSaver._get_shards_by_task": "01f41f04e0c2",
    f"{_FS}:_single_shard_save": "770acee657f7",
    f"{_SU}:ShardingCallback": "d89d5a4b7043",
}

#: TensorFlow 2.19: ``_get_shards_by_task`` logs its callback's duration "in
#: microseconds" (read from the 2.19.1 wheel; 2.20.0 and 2.21.0 are the same).
_TF_2_19 = {
    **_TF_2_17,
    f"{_FS}:MultiDeviceSaver._get_shards_by_task": "4076d7ebc2ff",
}

#: Each release that changed something relied on -> the fingerprints from it on.
#: A release not listed has those of the nearest listed release before it.
RELEASES: dict[str, dict[str, str]] = {
    "2.16": _TF_2_16,
    "2.17": _TF_2_17,
    "2.19": _TF_2_19,
}


def release(version: str) -> str:
    """``major.minor`` of a TensorFlow version string (``"2.16.2"`` -> ``"2.16"``)."""
    return ".".join(str(part) for part in _key(version))


def expected(version: str) -> dict[str, str]:
    """The fingerprints the release of ``version`` should have (see :data:`RELEASES`).

    Raises:
      ValueError: ``version`` is older than every recorded release.
    """
    older = [r for r in RELEASES if _key(r) <= _key(version)]
    if not older:
        raise ValueError(f"TensorFlow {version} is older than {min(RELEASES, key=_key)}")
    return RELEASES[max(older, key=_key)]


def _resolve(internal: str) -> Any:
    module, _, qualname = internal.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return _unhooked(obj)


def _unhooked(obj: Any) -> Any:
    """TensorFlow's own code where the package put its hook (``saver_hook`` replaces
    ``MultiDeviceSaver.save`` at the first save of a mode, for the rest of the process):
    the fingerprint is TensorFlow's, whichever test saved first."""
    from tf_failure_handling._integrations import saver_hook

    if obj is saver_hook._hooked:
        return saver_hook._original
    return obj


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]
    return tree


def _dump(node: Any) -> str:
    """``ast.dump`` without empty fields, so that the text is the same on Python 3.10-3.13
    (3.12 added ``type_params=[]`` to every function and class)."""
    if isinstance(node, ast.AST):
        fields = (
            f"{name}={_dump(value)}"
            for name, value in ast.iter_fields(node)
            if value not in (None, [])
        )
        return f"{type(node).__name__}({', '.join(fields)})"
    if isinstance(node, list):
        return f"[{', '.join(_dump(item) for item in node)}]"
    return repr(node)


def fingerprint(internal: str) -> str:
    """The first 12 hex digits of the SHA-256 of ``internal``'s code, without docstrings.

    Raises:
      ImportError, AttributeError: the installed TensorFlow does not have it.
    """
    obj = _resolve(internal)
    if not (inspect.isclass(obj) or inspect.isroutine(obj)):
        # A module-level setting (``_CLOSURE_QUEUE_MAX_SIZE``): what is relied on
        # is that it exists with this type; its value may be set by anyone.
        return hashlib.sha256(f"value of type {type(obj).__name__}".encode()).hexdigest()[:12]
    source = textwrap.dedent(inspect.getsource(obj))
    tree = _strip_docstrings(ast.parse(source))
    return hashlib.sha256(_dump(tree).encode()).hexdigest()[:12]


def installed() -> dict[str, str]:
    """Fingerprints of every internal in the installed TensorFlow (``"missing"`` if absent)."""
    out = {}
    for internal in RELIED_ON:
        try:
            out[internal] = fingerprint(internal)
        except (ImportError, AttributeError):
            out[internal] = "missing"
    return out
