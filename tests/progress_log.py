"""The progress log of a test run: with ``REPLAYSSM_TEST_LOG=PATH``, one JSON line per test phase
appended to PATH as it ends (the node id, phase, outcome, seconds, and the last lines of a failure),
flushed at once, so a GPU run cut by its time limit still tells how long each finished test took and
why one failed (the gpu-merge-tier and flashinfer profiles).  Under pytest-xdist the
controller writes it (tests/conftest.py calls :func:`write` from ``pytest_runtest_logreport``).
"""

from __future__ import annotations

import json
import os

ENV = "REPLAYSSM_TEST_LOG"


def write(report) -> None:
    """Append ``report``'s line to the log named by :data:`ENV` (nothing without it, nothing for a
    passing setup or teardown, nothing in an xdist worker)."""
    path = os.environ.get(ENV)
    if not path or os.environ.get("PYTEST_XDIST_WORKER") or (report.when != "call" and report.outcome == "passed"):
        return
    line = {"test": report.nodeid, "when": report.when, "outcome": report.outcome,
            "seconds": round(report.duration, 3)}
    if report.failed:
        line["reason"] = "\n".join(str(report.longrepr).splitlines()[-12:])
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")
