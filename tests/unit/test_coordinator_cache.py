"""The coordinator's concrete-function cache and closure (``_coordinator/function_cache.py``),
without a cluster.

The key must separate every two ``schedule()`` calls that TF would trace
differently, and the cached closure must run as TF's ``Closure`` does. On a
real ParameterServerStrategy cluster: ``tests/integration/test_ps_coordinator.py``
(``test_schedule_cache_retraces_and_honours_input_signature``).
"""

import gc
import weakref

import pytest

tf = pytest.importorskip("tensorflow", reason="the cache keys TensorFlow's arguments")

from tensorflow.python.distribute.coordinator import cluster_coordinator as tf_cc  # noqa: E402
from tensorflow.python.distribute.coordinator import values as tf_values  # noqa: E402
from tensorflow.python.eager import cancellation  # noqa: E402
from tensorflow.python.eager import executor as tf_executor  # noqa: E402
from tf_failure_handling._coordinator import function_cache as _function_cache  # noqa: E402

LOCAL_CPU = "/job:localhost/replica:0/task:0/device:CPU:0"


def key(*args, **kwargs):
    found = _function_cache.argument_key(args, kwargs)
    return None if found is None else found[0]


def per_worker(*values, spec=None):
    """A ``PerWorkerValues`` whose remote values hold ``values`` (ready), as TF builds them."""
    remote_values = []
    for v in values:
        rv = tf_values.RemoteValueImpl(None, spec or tf.TensorSpec([], tf.int64))
        rv._set_values(v)
        remote_values.append(rv)
    return tf_values.PerWorkerValues(remote_values)


# ----------------------------------------------------------------------------- keying
def test_same_structure_same_key():
    assert key(tf.constant(1), 2, x=tf.constant([1.0, 2.0])) == key(
        tf.constant(5), 2, x=tf.constant([3.0, 4.0])
    )


@pytest.mark.parametrize(
    "a,b",
    [
        ((tf.constant(1),), (tf.constant(1.0),)),  # dtype
        ((tf.constant([1]),), (tf.constant([1, 2]),)),  # shape
        ((tf.constant([[1]]),), (tf.constant([1]),)),  # rank
        ((1,), (2,)),  # a Python scalar is traced by value
        ((1,), (True,)),  # ... and by type (1 == True)
        ((1,), (1.0,)),
        (("a",), (b"a",)),
        ((None,), ((),)),
        (((1, 2),), ([1, 2],)),  # container type
        (((1, 2),), ((1, 2, 3),)),  # length
        (({"a": 1},), ({"b": 1},)),  # dict keys
        ((), (1,)),  # number of arguments
    ],
)
def test_what_tf_traces_on_changes_the_key(a, b):
    assert key(*a) is not None and key(*b) is not None
    assert key(*a) != key(*b)


def test_keyword_names_change_the_key():
    assert key(x=tf.constant(1)) != key(y=tf.constant(1))
    assert key(tf.constant(1)) != key(x=tf.constant(1))


def test_namedtuples_are_structures():
    import collections

    P = collections.namedtuple("P", "a b")
    Q = collections.namedtuple("Q", "a b")
    assert key(P(tf.constant(1), 2)) == key(P(tf.constant(3), 2))
    assert key(P(1, 2)) != key(Q(1, 2))
    assert key(P(1, 2)) != key((1, 2))


@pytest.mark.parametrize(
    "make",
    [
        lambda: tf.Variable(1),  # a variable's trace type is more than dtype and shape
        lambda: __import__("numpy").zeros(3),
        lambda: tf.ragged.constant([[1], [2, 3]]),
        lambda: tf_values.RemoteValueImpl(None, None),  # TF raises its ValueError
        lambda: object(),
        lambda: {1, 2},
    ],
    ids=["variable", "numpy", "ragged", "remote_value", "object", "set"],
)
def test_anything_else_is_uncacheable(make):
    x = make()
    assert _function_cache.argument_key((x,), {}) is None
    assert _function_cache.argument_key((), {"x": [1, x]}) is None


def test_resource_tensors_are_uncacheable():
    v = tf.Variable(1)
    assert _function_cache.argument_key((v.handle,), {}) is None


def test_per_worker_values_are_keyed_by_their_spec_object():
    spec = tf.TensorSpec([], tf.int64)
    a = per_worker(tf.constant(1), tf.constant(2), spec=spec)
    b = per_worker(tf.constant(3), tf.constant(4), spec=spec)
    c = per_worker(tf.constant(1), tf.constant(2), spec=tf.TensorSpec([], tf.int64))
    (ka, keep, slots), (kb, _, _), (kc, _, _) = (
        _function_cache.argument_key((x,), {}) for x in (a, b, c)
    )
    assert ka == kb  # same spec object: same entry
    assert ka != kc  # an equal but new spec (a new iter()): a new entry, never a wrong one
    assert keep == [spec]  # the entry keeps the spec alive, so its id is not reused
    assert slots == (0,)


def test_per_worker_positions_are_recorded():
    pw = per_worker(tf.constant(1), tf.constant(2))
    _, _, slots = _function_cache.argument_key((1, pw), {"it": pw, "n": 3})
    assert slots == (1, "it")
    _, _, slots = _function_cache.argument_key((1,), {"n": 3})
    assert slots == ()
    _, _, slots = _function_cache.argument_key(([pw],), {})
    assert slots is None  # nested: TF's own slice selection


def test_a_per_worker_value_without_a_spec_is_uncacheable():
    rv = tf_values.RemoteValueImpl(None, None)
    assert _function_cache.argument_key((tf_values.PerWorkerValues([rv]),), {}) is None


def test_context_key_follows_the_device_scope_and_mode():
    strategy = tf.distribute.get_strategy()
    outside = _function_cache.context_key(strategy)
    with tf.device("/cpu:0"):
        inside = _function_cache.context_key(strategy)
    assert outside is not None and inside is not None and outside != inside
    with tf.Graph().as_default():
        assert _function_cache.context_key(strategy) is None


def test_context_key_refuses_another_strategys_scope():
    other = tf.distribute.OneDeviceStrategy("/cpu:0")
    with other.scope():
        assert _function_cache.context_key(object()) is None
        assert _function_cache.context_key(other) is not None


# ----------------------------------------------------------------------------- the cache
def entry(tag="x"):
    return _function_cache._Entry(tag, None, (), [])


def test_cache_hits_only_what_was_stored():
    cache = _function_cache.ConcreteFunctionCache()
    fn = tf.function(lambda x: x)
    assert cache.lookup(fn, "k") is None
    e = entry()
    cache.store(fn, "k", e)
    assert cache.lookup(fn, "k") is e
    assert cache.lookup(fn, "other") is None
    assert cache.lookup(tf.function(lambda x: x), "k") is None  # another function
    assert (cache.hits, cache.misses) == (1, 1)


def test_cache_drops_the_oldest_entry_of_a_function():
    cache = _function_cache.ConcreteFunctionCache(max_entries_per_function=3)
    fn = tf.function(lambda x: x)
    for i in range(5):
        cache.store(fn, i, entry(i))
    assert cache.entries(fn) == 3
    assert cache.lookup(fn, 0) is None and cache.lookup(fn, 1) is None
    assert cache.lookup(fn, 4).concrete_function == 4


def test_cache_holds_functions_weakly():
    cache = _function_cache.ConcreteFunctionCache()
    fn = tf.function(lambda x: x)
    ref = weakref.ref(fn)
    cache.store(fn, "k", entry())
    del fn
    gc.collect()
    assert ref() is None
    assert len(cache._by_function) == 0


def test_cache_ignores_what_cannot_be_weakly_referenced():
    cache = _function_cache.ConcreteFunctionCache()
    cache.store(42, "k", entry())
    assert cache.lookup(42, "k") is None


# ----------------------------------------------------------------------------- the closure
class FakeWorker:
    """What ``execute_on`` reads of TF's ``Worker``, on the local CPU."""

    def __init__(self, index):
        self.worker_index = index
        self.device_name = LOCAL_CPU
        self.executor = tf_executor.new_executor(enable_async=False)


def cached_closure(fn, args=(), kwargs=None):
    """Ours, built the way ``schedule()`` builds it after a miss, and TF's own."""
    mgr = cancellation.CancellationManager()
    tf_closure = tf_cc.Closure(fn, mgr, args=args, kwargs=kwargs)
    _, keep, slots = _function_cache.argument_key(args, kwargs)
    e = _function_cache._Entry(
        tf_closure._concrete_function, tf_closure._output_type_spec, slots, keep
    )
    return _function_cache.Closure(e, mgr, args, kwargs), tf_closure


@tf.function
def add_worker_index(x, y, *, z):
    return x + y + z + tf.distribute.coordinator.experimental_get_current_worker_index()


def test_closure_runs_each_workers_slice_as_tf_does():
    pw = per_worker(tf.constant(10, tf.int64), tf.constant(20, tf.int64))
    kw = per_worker(tf.constant(100, tf.int64), tf.constant(200, tf.int64))
    for index in (0, 1):
        ours, theirs = cached_closure(add_worker_index, (pw, tf.constant(1, tf.int64)), {"z": kw})
        results = []
        for closure in (ours, theirs):
            rv = closure.build_output_remote_value()
            closure.execute_on(FakeWorker(index))
            results.append(int(rv._get_values()))
        assert results[0] == results[1] == [10 + 1 + 100 + 0, 20 + 1 + 200 + 1][index]


def test_closure_wraps_an_input_error_as_tf_does():
    failed = tf_values.RemoteValueImpl(None, tf.TensorSpec([], tf.int64))
    failed._set_error(tf.errors.UnavailableError(None, None, "worker lost"))
    ok = tf_values.RemoteValueImpl(None, tf.TensorSpec([], tf.int64))
    ok._set_values(tf.constant(1, tf.int64))
    pw = tf_values.PerWorkerValues([failed, ok])
    ours, theirs = cached_closure(add_worker_index, (pw, tf.constant(1, tf.int64)), {"z": 1})
    for closure in (ours, theirs):
        with pytest.raises(tf_cc.ClosureInputError, match="worker lost"):
            closure.execute_on(FakeWorker(0))
    for closure in (ours, theirs):  # worker 1's slice is fine
        rv = closure.build_output_remote_value()
        closure.execute_on(FakeWorker(1))
        assert int(rv._get_values()) == 4


def test_closure_with_nested_per_worker_values_uses_tfs_slicing():
    @tf.function
    def first(pair):
        return pair[0] * 2

    pw = per_worker(tf.constant(3, tf.int64), tf.constant(4, tf.int64))
    ours, _ = cached_closure(first, ([pw, 0],))
    assert ours._per_worker is None
    rv = ours.build_output_remote_value()
    ours.execute_on(FakeWorker(1))
    assert int(rv._get_values()) == 8


def test_closure_is_cancelled_as_tfs():
    ours, _ = cached_closure(add_worker_index, (1, 2), {"z": 3})
    rv = ours.build_output_remote_value()
    ours.mark_cancelled()
    with pytest.raises(tf.errors.CancelledError):
        rv.fetch()
