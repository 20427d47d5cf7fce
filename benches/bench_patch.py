"""``tf_failure_handling.patch()`` and ``unpatch()``: what they add to a script's start.

``patch()`` is meant for the top of a training script. It searches TensorFlow's API
modules (and ``tensorflow.python.distribute``'s) for every name of TF's four classes.
Measured once TensorFlow is imported (importing TF, several seconds, is the script's
anyway): the first ``patch()`` of the process (it also imports this package's
coordinator module), then the median of ``--repeats`` ``patch()`` / ``unpatch()``
pairs. tf_keras is not imported, so ``patch()`` also installs its import hook.

    python benches/bench_patch.py [--repeats 50]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import _report

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=50)
    args = p.parse_args(argv)

    start = time.perf_counter()
    import tensorflow  # noqa: F401 - timed: what a script pays anyway

    import_tf = time.perf_counter() - start
    import tf_failure_handling as tfh
    from tf_failure_handling import _patch

    assert "tf_keras" not in sys.modules
    start = time.perf_counter()
    tfh.patch()
    first = time.perf_counter() - start
    modules = len(_patch._namespaces())
    start = time.perf_counter()
    tfh.unpatch()
    first_unpatch = time.perf_counter() - start

    patches, unpatches = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        tfh.patch()
        middle = time.perf_counter()
        tfh.unpatch()
        end = time.perf_counter()
        patches.append(middle - start)
        unpatches.append(end - middle)

    print(f"import tensorflow: {import_tf:.2f} s; modules searched: {modules}")
    _report.print_readme_table(
        "patch()",
        ["call", "time"],
        [
            ["`patch()`, first in the process", _report.duration(first)],
            ["`patch()`, median", _report.duration(_report.median(patches))],
            [
                "`unpatch()`, first / median",
                f"{_report.duration(first_unpatch)} / "
                f"{_report.duration(_report.median(unpatches))}",
            ],
        ],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
