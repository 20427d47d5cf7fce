"""A real SLURM for the tests of this folder (``slurm_cluster.py``).

The session fixture :func:`slurm` installs ``slurm-wlm`` and ``munge`` with apt-get
when missing (root only), starts munged, slurmctld and slurmd for this one node, and
stops them at the end whatever happens. On a machine where that cannot be done the
tests skip with a one-line reason; under ``CI=true`` it is a failure carrying the
daemons' logs.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
from pathlib import Path

import pytest
from ci import is_ci

from .slurm_cluster import SlurmCluster, Unavailable, ensure_installed, versions

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "slurm"
TRAIN = EXAMPLES / "train.py"
EVENT_PREFIX = "EVENT "


def _unavailable(message: str, logs: str = "") -> None:
    if is_ci():
        pytest.fail(f"CI=true: SLURM must run here: {message}\n{logs}", pytrace=False)
    pytest.skip(f"no SLURM: {message}")


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    try:
        how = ensure_installed()
    except Unavailable as e:
        _unavailable(str(e))
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    atexit.register(cluster.stop)  # a KeyboardInterrupt that skips the teardown
    started = time.monotonic()
    try:
        cluster.start()
    except Unavailable as e:
        logs = cluster.log_tail()
        cluster.stop()
        _unavailable(f"it did not start: {e}", logs)
    print(
        f"\nSLURM up in {time.monotonic() - started:.1f} s ({how}; {versions()}); "
        f"SLURM_CONF={cluster.conf}"
    )
    try:
        yield cluster
    finally:
        cluster.cancel_all()
        cluster.stop()
        write_scenarios(versions())


#: (scenario, outcome) of each job test that ran, in order (``test_slurm_jobs.report``).
SCENARIOS: list = []
#: The table's columns: (header, key of the outcome).
COLUMNS = (
    ("exit codes", "exit_codes"),
    ("saved at step", "saved_step"),
    ("resumed at step", "resumed_step"),
    ("back in the queue", "requeued"),
    ("signal to checkpoint", "signal_to_checkpoint_s"),
    ("deadline left at the notice", "deadline_left_s"),
)


def write_scenarios(found: dict) -> None:
    """Under ``make figures`` (``TFH_FIGURES_DIR``), the scenarios that ran as one
    table, through ``benches/_report.write_figure``."""
    if not SCENARIOS or not os.environ.get("TFH_FIGURES_DIR"):
        return
    sys.path.insert(0, str(REPO / "benches"))
    import _report

    def cell(key: str, value) -> str:
        if value is None:
            return _report.DASH
        if isinstance(value, bool):
            return "yes" if value else "no"
        if isinstance(value, list):
            return ", ".join(str(v) for v in value)
        if key.endswith("_s"):
            return f"{value:.3f} s" if isinstance(value, float) else f"{value} s"
        return str(value)

    rows = [
        [scenario, *(cell(key, row.get(key)) for _, key in COLUMNS)] for scenario, row in SCENARIOS
    ]
    table = _report.markdown(["scenario", *(h for h, _ in COLUMNS)], rows)
    slurm = found.get("slurm-wlm", "?")
    _report.write_figure("SLURM scenarios", f"{table}\n\nSLURM {slurm} (Debian's slurm-wlm).")


def parse_events(path: Path) -> list:
    if not path.exists():
        return []
    events = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith(EVENT_PREFIX):
            try:
                events.append(json.loads(line[len(EVENT_PREFIX) :]))
            except ValueError:
                pass
    return events


def read_records(ckpt_dir: Path) -> list:
    """Every preemption-record line under ``ckpt_dir/preemption_records``."""
    lines = []
    folder = ckpt_dir / "preemption_records"
    for path in sorted(folder.glob("*.jsonl")) if folder.exists() else []:
        for line in path.read_text().splitlines():
            try:
                lines.append(json.loads(line))
            except ValueError:
                pass
    return lines
