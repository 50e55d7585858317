"""Records as JSON lines: append (``--record FILE``), load, and the check a job makes before any
work that its ``--record`` path can be written.

Appending is safe for concurrent writers on a local file system: the file is opened with
``O_APPEND``, each record is one ``write`` of one line, and the file is fsynced before return, so
a reader sees whole lines (never half of one).  A job checks its ``--record`` path before any work
with :func:`replayssm.guard.check_record_path`.  Every record is validated before the first write:
a bad record refuses the whole call and the file is left unchanged.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from replayssm.records.record import RecordError, canonical, errors, validate

RECORD_HELP = ("append this job's results to FILE as JSON lines, one record per case (schema "
               "replayssm.record/1, replayssm/records/record.schema.json; `replayssm results` reads them); "
               "checked writable before any work")


def add_record_argument(parser) -> None:
    """The ``--record FILE`` option every job takes."""
    parser.add_argument("--record", metavar="FILE", default=None, help=RECORD_HELP)


def append(path: str | os.PathLike, records) -> int:
    """Append ``records`` (dicts) to ``path`` as JSON lines; returns how many were written."""
    records = [validate(r) for r in records]
    if not records:
        return 0
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        for r in records:
            data = (canonical(r) + "\n").encode()
            written = os.write(fd, data)
            while written < len(data):  # a short write (a signal, a full disk): finish the line
                written += os.write(fd, data[written:])
        os.fsync(fd)
    finally:
        os.close(fd)
    return len(records)


def load(path: str | os.PathLike, *, strict: bool = True) -> list[dict]:
    """The records of one JSON-lines file, in file order.  ``strict``: a line that is not JSON or
    not a valid record raises :class:`RecordError` naming the file and line; otherwise it is skipped."""
    out = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                if strict:
                    raise RecordError(f"{path}:{n}: not JSON ({e.msg})") from None
                continue
            bad = errors(rec)
            if bad:
                if strict:
                    raise RecordError(f"{path}:{n}: " + "; ".join(bad))
                continue
            out.append(rec)
    return out


__all__ = ["RECORD_HELP", "add_record_argument", "append", "load"]
