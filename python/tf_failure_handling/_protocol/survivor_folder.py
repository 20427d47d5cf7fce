"""The checkpoint folder as the survivors of a lost worker agree through it (issue 62).

When the chief is gone, the coordination service is gone with it; the folder is what
every survivor still reaches. Beside the checkpoints (a local folder, or any of
TensorFlow's file systems: ``gs://``...):

* ``lost-worker/job``: this job's token, written by the chief at the start and read by
  every other worker at its first held step. A worker that finds another token there
  when it would save was paused (or cut off) while a newer job started: it does not
  write.
* ``lost-worker/<token>/claim-<writer>``: a survivor's claim, JSON ``{"writer", "runs",
  "lost", "checkpoint"}``, written after its checkpoint's files, so a claim names a
  whole checkpoint.

The protocol decides from what is read here (``src/protocol/lost.rs``); this module only
reads and writes. Every file is written whole (TensorFlow's atomic write: a temporary
file renamed on a local folder, one object on ``gs://``): a reader sees a whole claim
or none. The state file (``checkpoint``) is written the way ``tf.train.CheckpointManager``
writes it, and only ever names a checkpoint whose claim was read.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any, Callable, NamedTuple, Optional

from .._native import Action, Event
from .._record_paths import _join
from . import checkpoint_files

log = logging.getLogger("tf_failure_handling")

#: The folder of the survivors' marks and claims, inside the checkpoint folder.
FOLDER = "lost-worker"
#: The claims of a worker that never read its job's token (the chief's mark failed).
UNMARKED = "unmarked"


class SurvivorFolder:
    """The marks and claims of the survivors' save in checkpoint folder ``directory``."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._mark = _join(directory, FOLDER, "job")
        #: This job's token (None: not known; its claims are then ``unmarked``).
        self.token: Optional[str] = None

    def mark(self) -> None:
        """The chief, at the start: a new token for this job, written over the last.

        The last job's writers are fenced from then on; their claims are then cleared:
        a claim's checkpoint the state file does not list is deleted (a writer that
        settled before a later claim landed keeps its files until here), then the claims.
        The state file is left as it is: the other workers restore what it names now.
        """
        from tensorflow.python.lib.io import file_io

        token = uuid.uuid4().hex
        checkpoint_files.make_dirs(_join(self.directory, FOLDER))
        before = checkpoint_files.read_or_none(self._mark)
        file_io.atomic_write_string_to_file(self._mark, token)
        self.token = token
        for previous in {(before or "").strip() or UNMARKED, UNMARKED}:
            self._clear(previous)

    def _clear(self, token: str) -> None:
        """Deletes the claims of job ``token``, and their checkpoints the state file
        does not list."""
        from tensorflow.python.checkpoint import checkpoint_management

        old = SurvivorFolder(self.directory)
        old.token = token
        claims = old.claims()
        if not claims:
            return
        state = checkpoint_management.get_checkpoint_state(self.directory)
        listed = set(state.all_model_checkpoint_paths) if state is not None else set()
        for claim in claims.values():
            if claim["checkpoint"] not in listed:
                old.discard(claim["writer"], claim["checkpoint"])
                log.info(
                    "Deleted %s, a survivors' save no checkpoint state names.", claim["checkpoint"]
                )
        checkpoint_files.delete_recursively(old._claims_dir())

    def read_mark(self) -> None:
        """Another worker, at its first held step: the token the chief wrote."""
        text = checkpoint_files.read_or_none(self._mark)
        self.token = text.strip() if text else None

    def current(self) -> bool:
        """Whether the folder's mark is still this job's (True when this worker never
        learned its token: nothing to compare)."""
        if self.token is None:
            return True
        text = checkpoint_files.read_or_none(self._mark)
        return text is None or text.strip() == self.token

    def _claims_dir(self) -> str:
        return _join(self.directory, FOLDER, self.token or UNMARKED)

    def _claim_path(self, writer: int) -> str:
        return _join(self._claims_dir(), f"claim-{writer}")

    def claims(self) -> dict:
        """This job's claims, by writer: each a dict of ``writer``, ``runs``, ``lost`` and
        ``checkpoint`` (a claim that cannot be read whole is left out, with a warning)."""
        from tensorflow.python.platform import gfile

        folder = self._claims_dir()
        if not gfile.Exists(folder):
            return {}
        found = {}
        for name in gfile.ListDirectory(folder):
            name = name.rstrip("/")
            if not name.startswith("claim-"):
                continue
            text = checkpoint_files.read_or_none(_join(folder, name))
            try:
                claim = json.loads(text or "")
                found[int(claim["writer"])] = {
                    "writer": int(claim["writer"]),
                    "runs": int(claim["runs"]),
                    "lost": [int(worker) for worker in claim["lost"]],
                    "checkpoint": str(claim["checkpoint"]),
                }
            except (ValueError, KeyError, TypeError) as e:
                log.warning("Ignoring the survivors' claim %s, not whole: %s", name, e)
        return found

    def claim(self, writer: int, runs: int, lost: list, checkpoint: str) -> None:
        """Writes this writer's claim; its checkpoint's files are written already."""
        from tensorflow.python.lib.io import file_io

        checkpoint_files.make_dirs(self._claims_dir())
        body = {"writer": writer, "runs": runs, "lost": list(lost), "checkpoint": checkpoint}
        file_io.atomic_write_string_to_file(self._claim_path(writer), json.dumps(body))

    def name_latest(self, checkpoint: str, claimed: list, stamp: float) -> None:
        """Makes the state file name ``checkpoint`` as the latest (saved at Unix time
        ``stamp``), keeping the checkpoints it listed, less those of ``claimed`` (every
        claim's checkpoint of this job: one is named, the others are discarded)."""
        from tensorflow.python.checkpoint import checkpoint_management

        state = checkpoint_management.get_checkpoint_state(self.directory)
        paths, stamps, preserved = [], [], 0.0
        if state is not None:
            preserved = state.last_preserved_timestamp
            old = list(state.all_model_checkpoint_paths)
            old_stamps = list(state.all_model_checkpoint_timestamps)
            if len(old_stamps) != len(old):
                old_stamps = [preserved] * len(old)
            for path, old_stamp in zip(old, old_stamps):
                if path not in claimed and path != checkpoint:
                    paths.append(path)
                    stamps.append(old_stamp)
        paths.append(checkpoint)
        stamps.append(stamp)
        checkpoint_management.update_checkpoint_state_internal(
            save_dir=self.directory,
            model_checkpoint_path=checkpoint,
            all_model_checkpoint_paths=paths,
            all_model_checkpoint_timestamps=stamps,
            last_preserved_timestamp=preserved,
            save_relative_paths=True,
        )

    def discard(self, writer: int, checkpoint: Optional[str]) -> None:
        """Deletes this writer's checkpoint files and its claim (it lost, or stopped)."""
        from tensorflow.python.platform import gfile

        if checkpoint:
            for path in gfile.Glob(checkpoint + ".*"):
                checkpoint_files.delete_file(path)
        checkpoint_files.delete_file(self._claim_path(writer))


def _read(core: Any, folder: SurvivorFolder) -> tuple:
    """Reads the folder and hands it to the protocol: ``(claims, its answer)``."""
    claims = folder.claims()
    seen = [(c["writer"], c["runs"], c["lost"]) for c in claims.values()]
    return claims, core.handle(Event.Claims(folder.current(), seen))


class Agreed(NamedTuple):
    """How the writers' agreement ended for this writer."""

    #: ``Action.Settled`` (the state file names ``named``) or ``Action.Refuse``.
    end: Any
    #: This writer's checkpoint, when it was written (deleted if ``end.discard``).
    path: Optional[str] = None
    #: The claim the state file names (``Settled``).
    named: Optional[dict] = None


def agree(
    core: Any,
    folder: SurvivorFolder,
    writer: int,
    runs: int,
    lost: list,
    write: Callable[[], Optional[str]],
) -> Optional[Agreed]:
    """The writer's side of the survivors' save, as the protocol leads it
    (``Event.Claims`` after each read of the folder): ``write()`` saves the checkpoint
    (its path; None: nothing to save, and None is returned), then the claim is written,
    and the state file named, until the protocol settles or refuses."""
    path: Optional[str] = None
    claims, action = _read(core, folder)
    while True:
        if isinstance(action, Action.SaveLastStep):
            path = write()
            if path is None:
                return None
            folder.claim(writer, runs, lost, path)
        elif isinstance(action, Action.NameLatest):
            named = claims[action.writer]["checkpoint"]
            claimed = [c["checkpoint"] for c in claims.values()]
            folder.name_latest(named, claimed, action.unix_time)
        elif isinstance(action, (Action.Settled, Action.Refuse)):
            if action.discard:
                folder.discard(writer, path)
            named = claims.get(action.writer) if isinstance(action, Action.Settled) else None
            return Agreed(action, path, named)
        else:
            raise RuntimeError(f"the protocol answered a read of the folder with {action!r}")
        claims, action = _read(core, folder)
