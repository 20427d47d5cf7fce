"""The private names of TensorFlow's saver that the ``memory`` and ``shares`` saves use
(issue 60, part 4): each is fingerprinted per release (``tf_internals.py``, checked by
``test_tf_versions.py``), and a TensorFlow that lacks one gets TensorFlow's own save,
decided once when the mode is installed, with a warning naming the version and the name.

A renamed name is simulated with monkeypatch while the handler's ``Checkpoints`` is
built; the saves after it run on the real TensorFlow, so they also show that nothing is
decided again at a save.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from tf_failure_handling._integrations import saver_hook, tf_reads_only
from tf_failure_handling._protocol import checkpoints as ck
from tf_failure_handling._protocol import non_chief_saves

from . import tf_internals as tv
from .test_checkpoint_shares import _checkpoint as _shares_checkpoint
from .test_checkpoint_shares import _save_in_thread, _workers

tf = pytest.importorskip("tensorflow", reason="the saves are TensorFlow's MultiDeviceSaver's")

from tensorflow.python.checkpoint import functional_saver  # noqa: E402
from tensorflow.python.checkpoint.sharding import sharding_util  # noqa: E402

ENV = non_chief_saves.NON_CHIEF_SAVES_ENV
JOIN_BOUND = 60.0
INTEGRATIONS = Path(saver_hook.__file__).resolve().parent
SAVE_MODULES = [
    INTEGRATIONS / f"{name}.py" for name in ("saver_hook", "tf_reads_only", "tf_shares")
]


def _rename_method(m: pytest.MonkeyPatch, name: str) -> None:
    """``MultiDeviceSaver.<name>`` is ``<name>_v2`` in this TensorFlow."""
    m.setattr(
        functional_saver.MultiDeviceSaver,
        f"{name}_v2",
        getattr(functional_saver.MultiDeviceSaver, name),
        raising=False,
    )
    m.delattr(functional_saver.MultiDeviceSaver, name)


def _rename_attribute(m: pytest.MonkeyPatch, name: str) -> None:
    """``MultiDeviceSaver.__init__`` sets ``<name>_v2`` instead of ``<name>``."""
    init = functional_saver.MultiDeviceSaver.__init__

    def renamed(self, *args, **kwargs):
        init(self, *args, **kwargs)
        setattr(self, f"{name}_v2", self.__dict__.pop(name))

    m.setattr(functional_saver.MultiDeviceSaver, "__init__", renamed)


def _rename_function(m: pytest.MonkeyPatch, name: str) -> None:
    m.setattr(functional_saver, f"{name}_v2", getattr(functional_saver, name), raising=False)
    m.delattr(functional_saver, name)


def _drop_field(m: pytest.MonkeyPatch, name: str) -> None:
    """``ShardableTensor`` has no field ``name`` (a dataclass's fields, as TF lists them)."""
    import dataclasses

    fields = {f.name: f for f in dataclasses.fields(sharding_util.ShardableTensor)}
    kept = {k: v for k, v in fields.items() if k != name}
    m.setattr(sharding_util.ShardableTensor, "__dataclass_fields__", kept)


#: (mode, how the name goes, what the warning names).
RENAMES = [
    (
        "memory",
        lambda m: _rename_method(m, "_get_shards_by_task"),
        "functional_saver.MultiDeviceSaver._get_shards_by_task",
    ),
    (
        "memory",
        lambda m: _rename_attribute(m, "_registered_savers"),
        "functional_saver.MultiDeviceSaver._registered_savers",
    ),
    (
        "memory",
        lambda m: _rename_attribute(m, "_num_unique_tasks"),
        "functional_saver.MultiDeviceSaver._num_unique_tasks",
    ),
    (
        "memory",
        lambda m: _drop_field(m, "checkpoint_key"),
        "sharding_util.ShardableTensor.checkpoint_key",
    ),
    (
        "shares",
        lambda m: _rename_function(m, "_single_shard_save"),
        "functional_saver._single_shard_save",
    ),
    (
        "shares",
        lambda m: _rename_attribute(m, "_num_unique_tasks"),
        "functional_saver.MultiDeviceSaver._num_unique_tasks",
    ),
]
IDS = [f"{mode}-{name.rsplit('.', 1)[-1]}" for mode, _, name in RENAMES]


@pytest.mark.parametrize(("mode", "rename", "name"), RENAMES, ids=IDS)
def test_missing_names_the_first_private_name_this_tensorflow_lacks(
    monkeypatch, mode, rename, name
):
    assert saver_hook.missing(mode) is None
    with monkeypatch.context() as m:
        rename(m)
        assert saver_hook.missing(mode) == name
    assert saver_hook.missing(mode) is None
    # shares' own name is not memory's.
    with monkeypatch.context() as m:
        _rename_function(m, "_single_shard_save")
        assert saver_hook.missing("memory") is None


def _warnings(caplog) -> list:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def _check_warning(caplog, mode: str, name: str, workers: int = 1) -> None:
    """Each of ``workers`` warned once, naming TensorFlow's version and ``name``."""
    found = [w for w in _warnings(caplog) if "private name" in w]
    assert len(found) == workers, found
    warning = found[0]
    assert len(set(found)) == 1, found
    assert f"TensorFlow {tf.__version__}'s saver has no {name}," in warning, warning
    assert f"{ENV}={mode} uses" in warning and "=storage" in warning, warning


@pytest.mark.parametrize(
    ("mode", "rename", "name"),
    [r for r in RENAMES if r[0] == "memory"],
    ids=[i for i, r in zip(IDS, RENAMES) if r[0] == "memory"],
)
def test_memory_on_a_tensorflow_without_a_name_saves_as_tensorflow_does(
    monkeypatch, tmp_path, caplog, mode, rename, name
):
    """A non-chief in ``memory`` mode on a TensorFlow that lacks a private name: the
    handler's ``Checkpoints`` says so at construction (the version and the name), and
    its saves are TensorFlow's own (the whole copy in ``workertemp_1`` beside the
    checkpoint, as ``=storage``), not the package's reads-only save. The check runs
    once, at the construction; not at the saves. On main (97acf12) the mode was
    installed anyway: the saves read through the package's hook, a renamed
    ``_num_unique_tasks`` or ``_registered_savers`` read as its default."""
    monkeypatch.delenv(ENV, raising=False)
    calls = []
    check = getattr(saver_hook, "missing", lambda m: None)  # main (97acf12) had none
    monkeypatch.setattr(saver_hook, "missing", lambda m: calls.append(m) or check(m), raising=False)
    with monkeypatch.context() as m, caplog.at_level(logging.WARNING, "tf_failure_handling"):
        rename(m)
        saves = ck.Checkpoints(_checkpoint(), str(tmp_path / "ckpt"), is_chief=False, task_id=1)
    _check_warning(caplog, mode, name)
    assert not saves.reads_only
    copy = tmp_path / "workertemp_1" / "ckpt"
    assert saves.write.directory == str(copy)
    ours = []
    monkeypatch.setattr(tf_reads_only, "_save", lambda *a: ours.append(a))
    for n in (1, 2):
        saves.save(7, (), {})
        assert (copy / f"ckpt-{n}.index").is_file()
    assert ours == [] and saves.save_fields() == {}
    assert calls == ["memory"], "decided once, when the mode is installed"
    saves.remove_worker_temp(is_chief=False)
    assert not (tmp_path / "workertemp_1").exists()


def _checkpoint():
    return tf.train.Checkpoint(v=tf.Variable(tf.range(1000, dtype=tf.float32)))


@pytest.mark.parametrize(
    ("mode", "rename", "name"),
    [r for r in RENAMES if r[0] == "shares"],
    ids=[i for i, r in zip(IDS, RENAMES) if r[0] == "shares"],
)
def test_shares_on_a_tensorflow_without_a_name_saves_as_tensorflow_does(
    monkeypatch, tmp_path, caplog, mode, rename, name
):
    """``shares`` on a TensorFlow that lacks a private name: neither worker writes a
    share (the chief writes the whole checkpoint, one data file; the non-chief its whole
    copy in ``workertemp_1``, as ``=storage``), each says why at construction. On main
    (97acf12) both were built to write shares."""
    monkeypatch.setenv(ENV, "shares")
    from tf_failure_handling import testing

    ckpt_dir = tmp_path / "ckpt"
    with monkeypatch.context() as m, caplog.at_level(logging.WARNING, "tf_failure_handling"):
        rename(m)
        chief, other = _workers(
            ckpt_dir,
            testing.InMemoryCoordinationService(),
            _shares_checkpoint(),
            _shares_checkpoint(),
        )
    assert not isinstance(chief, BaseException), chief
    assert not isinstance(other, BaseException), other
    assert chief.shared_by == other.shared_by == 1
    _check_warning(caplog, mode, name, workers=2)
    assert other.write.directory == str(tmp_path / "workertemp_1" / "ckpt")
    thread, errors = _save_in_thread(other, 7)
    chief.save(7, (), {})
    thread.join(JOIN_BOUND)
    assert not thread.is_alive() and errors == []
    assert sorted(p.name for p in ckpt_dir.glob("ckpt-1*")) == [
        "ckpt-1.data-00000-of-00001",
        "ckpt-1.index",
    ]
    assert (tmp_path / "workertemp_1" / "ckpt" / "ckpt-1.index").is_file()


def test_the_chief_in_memory_mode_checks_nothing(monkeypatch, tmp_path, caplog):
    """The chief's save in ``memory`` mode is TensorFlow's own: no check, no warning."""
    monkeypatch.delenv(ENV, raising=False)
    with monkeypatch.context() as m, caplog.at_level(logging.WARNING, "tf_failure_handling"):
        _rename_method(m, "_get_shards_by_task")
        ck.Checkpoints(_checkpoint(), str(tmp_path / "ckpt"), is_chief=True, task_id=0)
    assert _warnings(caplog) == []


@pytest.mark.parametrize("name", ["_registered_savers", "_num_unique_tasks"])
def test_cannot_skip_reads_the_savers_attributes_without_a_default(name):
    """A saver without one of them is an error, never a save that skips the reads the
    other workers' collectives wait for. On main (97acf12) ``getattr`` defaults read a
    missing ``_num_unique_tasks`` as 1 and ``_registered_savers`` as none."""
    saver = SimpleNamespace(
        _registered_savers={}, _num_unique_tasks=1, _get_shards_by_task=lambda callback: []
    )
    assert tf_reads_only.cannot_skip(saver) is None
    delattr(saver, name)
    with pytest.raises(AttributeError, match=name):
        tf_reads_only.cannot_skip(saver)


def _used_by_the_saves() -> set:
    """``functional_saver.<name>`` and the saver's ``saver._<name>`` the save modules use."""
    text = "".join(p.read_text() for p in SAVE_MODULES)
    used = set(re.findall(r"\bfunctional_saver\.(\w+)", text))
    read = re.findall(r"\bsaver\.(_\w+)", text) + re.findall(r"getattr\(saver, \"(_\w+)\"", text)
    used |= {f"MultiDeviceSaver.{n}" for n in read}
    return used - {"MultiDeviceSaver"}


def test_every_private_name_the_saves_use_is_fingerprinted_and_checked():
    """Each private name of ``functional_saver`` the save modules call or read is pinned
    in ``tf_internals.RELIED_ON`` (an attribute set by ``MultiDeviceSaver.__init__``: in
    its entry's reason) and checked by ``saver_hook.missing``. On main (97acf12) none
    was in RELIED_ON."""
    used = _used_by_the_saves()
    assert {
        "MultiDeviceSaver._get_shards_by_task",
        "MultiDeviceSaver._registered_savers",
        "MultiDeviceSaver._num_unique_tasks",
        "_single_shard_save",
    } <= used, used
    fs = "tensorflow.python.checkpoint.functional_saver"
    init = tv.RELIED_ON.get(f"{fs}:MultiDeviceSaver.__init__", "")
    unpinned = {n for n in used if f"{fs}:{n}" not in tv.RELIED_ON and n.split(".")[-1] not in init}
    assert not unpinned, f"not in tf_internals.RELIED_ON: {sorted(unpinned)}"
    checked = (INTEGRATIONS / "saver_hook.py").read_text()
    unchecked = {n for n in used if f'"{n.split(".")[-1]}"' not in checked}
    assert not unchecked, f"not checked by saver_hook.missing: {sorted(unchecked)}"
    assert f"{fs}:MultiDeviceSaver.save" in tv.RELIED_ON
    assert "tensorflow.python.checkpoint.sharding.sharding_util:ShardableTensor" in tv.RELIED_ON


def test_the_save_s_fingerprint_is_tensorflow_s_once_the_hook_is_installed():
    """``MultiDeviceSaver.save`` is fingerprinted as TensorFlow wrote it, also after a
    save of a mode put the package's hook there (in the compatibility ends' one pytest
    run, test_non_chief_saves saves before test_tf_versions fingerprints: on 568df1d the
    fingerprint was the hook's, 24798340a0fc)."""
    internal = "tensorflow.python.checkpoint.functional_saver:MultiDeviceSaver.save"
    before = tv.fingerprint(internal)
    with saver_hook.saving_with(lambda saver, prefix, options: None):
        pass
    assert functional_saver.MultiDeviceSaver.save is saver_hook._hooked
    assert tv.fingerprint(internal) == before == tv.expected(tf.__version__)[internal]
