"""Measurement records (schema ``replayssm.record/1``, ``record.schema.json``): how every job
reports what it measured and judged, and what ``replayssm results`` reads.

- :class:`Recorder` (``Recorder(job, device=...)``) fills provenance once; ``.record(case,
  metrics=..., verdict=..., config=..., family=, kernel=, mode=, geometry=, reason=)`` returns one
  schema-valid record (config digest, created, id filled in).
- :func:`add_record_argument` (``--record FILE``), :func:`append` (JSON lines, ``O_APPEND``, one
  write per line, fsync), :func:`load`; the CLI checks the path before any work with
  :func:`replayssm.guard.check_record_path` (exit 3 naming ``--record``).
- :func:`validate` / :func:`errors` (the schema and the id rule), :func:`digest`, :func:`canonical`.
- :func:`git_state` (``(commit, dirty)``), :func:`describe_commit`, :func:`device_info`, :func:`versions`:
  the one provenance implementation.
"""

from replayssm.records.ledger import add_record_argument, append, load
from replayssm.records.provenance import UNKNOWN, describe_commit, device_info, git_state, versions
from replayssm.records.record import (
    JOBS,
    SCHEMA_ID,
    VERDICTS,
    Recorder,
    RecordError,
    canonical,
    clean,
    digest,
    errors,
    now_utc,
    record_id,
    schema,
    validate,
)

__all__ = ["JOBS", "SCHEMA_ID", "UNKNOWN", "VERDICTS", "RecordError", "Recorder", "add_record_argument", "append",
           "canonical", "clean", "describe_commit", "device_info", "digest", "errors", "git_state",
           "load", "now_utc", "record_id", "schema", "validate", "versions"]
