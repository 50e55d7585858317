"""The regression corpus: every fixed failure keeps running forever.

Oracle: each file under ``golden/regressions/`` is a failure artifact (validators/engine/fuzz_artifacts.py)
whose record says what happened and its ``status``:

* ``fixed``: the kernel failed this scenario once and was (or the engine was) fixed; the full
  validation (``run_scenario``, as ``replayssm validate --scenario FILE``) must now pass;
* ``mutant``: a broken kernel's reproducer; it must still fail with the recorded check at the
  recorded first step.

tests/jobs/test_regressions.py replays every file in the default pytest run.  Add a fixed failure with
``python -m replayssm.validators.jobs.fuzz.regressions add failures/<family>-<kernel>.json --note "what was
fixed"`` (it refuses a file that does not pass now).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

from replayssm import golden
from replayssm.validators.engine.fuzz_artifacts import artifact_json, load_failure
from replayssm.validators.engine.runner import run_scenario

CORPUS = golden.path("regressions")


def replay(path) -> tuple[bool, str]:
    """(holds, message): whether the corpus entry at ``path`` still behaves as its status says."""

    sc, rec = load_failure(path)
    res = run_scenario(sc, rec.kernel)
    if rec.status == "fixed":
        return res.passed, res.headline()
    if rec.status == "mutant":
        f = res.first_failure
        if f is None:
            return False, f"the mutant passed: {res.headline()}"
        same = (f.check, f.step) == (rec.check, rec.first_bad_step)
        return same, (res.headline() if same else
                      f"recorded [{rec.check}] at step {rec.first_bad_step}, now {f.describe()}")
    raise ValueError(f"failure.status: a corpus entry is 'fixed' or 'mutant', got {rec.status!r} in {path}")


def add(path, note: str, corpus=CORPUS, stem: str | None = None) -> Path:
    """Copy the failure artifact ``path`` into the corpus as ``fixed`` (it must pass now)."""
    sc, rec = load_failure(path)
    rec = dataclasses.replace(rec, status="fixed", note=note)
    corpus = Path(corpus)
    corpus.mkdir(parents=True, exist_ok=True)
    stem = stem or re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{rec.family}-{rec.kernel}-{rec.check}-{sc.mode}-seed{sc.seed}")
    out = corpus / f"{stem}.json"
    out.write_text(artifact_json(sc, rec))
    ok, msg = replay(out)
    if not ok:
        out.unlink()
        raise ValueError(f"path: {path} still fails ({msg}); fix the kernel first, then add it")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="manage the regression corpus (golden/regressions)")
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("add", help="add a fixed failure (must pass now)")
    a.add_argument("file")
    a.add_argument("--note", required=True, help="what failed and what fixed it")
    sub.add_parser("check", help="replay every corpus entry")
    args = p.parse_args(argv)
    if args.cmd == "add":
        print(add(args.file, args.note))
        return 0
    bad = 0
    for f in sorted(CORPUS.glob("*.json")):
        ok, msg = replay(f)
        bad += not ok
        print(("ok   " if ok else "FAIL ") + f.name + ": " + msg)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
