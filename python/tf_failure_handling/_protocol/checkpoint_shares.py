"""The ``shares`` mode of the non-chief saves: every worker writes a share of the one
checkpoint into the chief's folder (TensorFlow's sharded layout,
``_integrations/tf_shares.py``), merged by the chief.

Each save has its own token (the chief's token of the handler and the save's number) in
its coordination-service keys (:func:`share_keys`) and paths; the folder is probed at the
handler's construction (:func:`probe`: every worker sees it, or an error then); the
chief's wait for the shares and a non-chief's wait for the merge are bounded by the
core's (a save's ``SharesWaits`` of the handler's ``ProtocolCore``, with the notice's
deadline and the merges the handler measured), and so is whether the chief starts its merge.
"""

from __future__ import annotations

import collections
import itertools
import secrets
from typing import Any, Callable, Optional

from .. import _errors
from .._integrations import tf_shares
from .._native import SharesWaits
from .checkpoint_files import delete_file, make_dirs, read_or_none
from .non_chief_saves import NON_CHIEF_SAVES_ENV

#: The coordination-service keys by which a non-chief tells the chief its share is written.
SHARE_KEY = "tf_failure_handling/share"
#: The probe file the chief writes into its checkpoint folder at construction (shares):
#: ``<folder>/<PROBE_FILE><token>``, holding the token; removed once every worker answered.
PROBE_FILE = "tf_failure_handling_probe_"
#: The shares-mode handlers this process made, by worker: their probe keys, the same on
#: every worker (the workers of the unit tests share one process).
_probes: dict = collections.defaultdict(itertools.count)


def share_keys(token: str, number: int) -> str:
    """The coordination-service keys of save ``number`` (from 1) of the handler whose
    token is ``token``."""
    return f"{SHARE_KEY}/{token}/{number}"


def probe(client: Any, worker: int, workers: int, directory: str) -> str:
    """The chief writes a probe file with a random token into ``directory`` and
    publishes the token; every other worker looks for the file in its own
    ``directory`` and answers; any worker that cannot see it raises
    ``FailedPreconditionError`` here, and so does the chief. The core bounds each wait
    and paces the looks for the file (the probe's ``SharesWaits``: this thread builds the
    handler, never a daemon). Returns the token."""
    from tensorflow.python.lib.io import file_io

    key = f"{SHARE_KEY}/probe/{next(_probes[worker])}"
    advice = (
        f"with {NON_CHIEF_SAVES_ENV}=shares every worker writes its part of each save "
        "into the chief's checkpoint folder, so it must be one every worker sees "
        f"(gs://, s3://, a shared file system); or set {NON_CHIEF_SAVES_ENV}=memory"
    )
    waits = SharesWaits(probe=True)
    if worker == 0:
        token = secrets.token_hex(8)
        probe = f"{directory.rstrip('/')}/{PROBE_FILE}{token}"
        make_dirs(directory)
        file_io.write_string_to_file(probe, token)
        answer = "ok"
        try:
            client.set(key, token)
            for other in range(1, workers):
                wait = waits.poll()
                answer = client.get(f"{key}/{other}", wait.timeout)
                if answer != "ok":
                    break
        finally:
            delete_file(probe)
        if answer == "ok":
            return token
        if answer is None:
            raise _errors.make(
                "DeadlineExceededError",
                f"Waited {wait.bound:g}s at the handler's construction for worker "
                f"{other} to say whether it sees the probe file {probe} "
                f"({key}/{other}): is it building its handler?",
            )
        raise _errors.make(
            "FailedPreconditionError",
            f"Worker {other} cannot see the probe file {probe} the chief "
            f"wrote ({answer}): {advice}.",
        )

    wait = waits.poll()
    token = client.get(key, wait.timeout)
    if token is None:
        raise _errors.make(
            "DeadlineExceededError",
            f"Waited {wait.bound:g}s at the handler's construction for the chief's probe of "
            f"the checkpoint folder ({key}): is the chief building its handler?",
        )
    probe = f"{directory.rstrip('/')}/{PROBE_FILE}{token}"
    waits.handle("token")
    # The core paces the looks: a shared file system may show the file a little later.
    while isinstance(look := waits.poll(), SharesWaits.Action.Look):
        waits.handle("looked", seen=read_or_none(probe) == token)
    seen, looked = look.seen, look.looked
    if not seen:
        client.set(f"{key}/{worker}", f"it looked for {probe} for {looked:g}s")
        raise _errors.make(
            "FailedPreconditionError",
            f"Worker {worker} cannot see the probe file {probe} the chief wrote into its "
            f"checkpoint folder (looked for it {looked:g}s): {advice}.",
        )
    client.set(f"{key}/{worker}", "ok")
    return token


def writing_shares(
    directory: str,
    worker: int,
    workers: int,
    client: Any,
    keys: str,
    token: str,
    core: Callable[[], Any],
    fallback: Callable[[str], None],
    where: Optional[Callable[[str, str], str]] = None,
) -> Any:
    """One save's :class:`tf_shares.Plan` in effect: ``worker`` of ``workers`` writes its
    share into ``directory``, reporting through ``client`` under ``keys`` (the save's
    :func:`share_keys`); ``token`` is the save's; ``core()`` is the handler's
    ``ProtocolCore`` (or None), whose ``SharesWaits`` bounds each wait and decides the
    merge's start; ``fallback`` hears why the workers could not
    write it together; ``where`` (a non-chief's) says where the whole copy then goes."""

    def done(name: str, value: str) -> None:
        client.set(f"{keys}/{name}/{worker}", value)

    def wait(name: str, other: int, digest: str, seconds: float) -> tuple:
        value = client.get(f"{keys}/{name}/{other}", seconds)
        what = f"Worker {other}'s share of checkpoint {name} in {directory}"
        fields = (value or "").split(" ")
        if value is None:
            kind = "DeadlineExceededError"
            why = f"was not written within {seconds:.0f}s ({keys}/{name}/{other})"
        elif value.startswith("error "):
            kind, why = "AbortedError", f"could not be written: {value[len('error ') :]}"
        elif len(fields) != 4 or fields[0] != "ok":
            kind, why = "FailedPreconditionError", f"was reported as {value!r}"
        elif fields[1] != digest:
            kind = "FailedPreconditionError"
            why = (
                f"holds other tensors than the chief's ({fields[1]}, not "
                f"{digest}): every worker must build the same model, or set "
                f"{NON_CHIEF_SAVES_ENV}=memory"
            )
        else:
            return int(fields[2]), fields[3]
        raise _errors.make(
            kind, f"{what} {why} -- the checkpoint is not used (parts: {name}_temp_{token})."
        )

    def merged(name: str, value: str) -> None:
        client.set(f"{keys}/{name}/merged", value)

    def wait_merged(name: str, seconds: float) -> None:
        what = f"The chief did not merge checkpoint {name} in {directory}"
        errors = _errors.module()
        try:
            value = client.get(f"{keys}/{name}/merged", seconds)
        except errors.OpError as e:
            # The chief is gone (it holds the coordination service), or the service
            # failed: no word that the state file names the checkpoint.
            raise _errors.from_code(
                e.error_code,
                f"{what}: the wait for its report ({keys}/{name}/merged) failed: {e.message}",
            ) from e
        if value == "ok":
            return
        if value is None:
            raise _errors.make(
                "DeadlineExceededError",
                f"{what}: waited {seconds:.1f}s for its report ({keys}/{name}/merged) "
                "after writing this worker's part.",
            )
        raise _errors.make("AbortedError", f"{what}: {value[len('error ') :]}")

    plan = tf_shares.Plan(
        directory,
        worker,
        workers,
        token,
        done,
        wait,
        merged,
        wait_merged,
        lambda: SharesWaits(core(), chief=worker == 0),
        fallback,
        where,
    )
    return tf_shares.writing_shares(plan)
