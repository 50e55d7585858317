"""One record of the schema ``replayssm.record/1`` (``record.schema.json``, package data): a
measurement or verdict of one case, on one device, at one commit.

:class:`Recorder` fills the provenance once per job (commit and dirty flag, device, versions,
source); :meth:`Recorder.record` builds one record per case with its config digest, creation time
and id.  :func:`validate` checks a record against the schema (jsonschema, Draft 2020-12) and the
id rule.  Oracle: the schema file; the id is the first 16 hex digits of the SHA-256 of the
record's canonical JSON (sorted keys, no spaces) without ``id``.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import json
import math
from importlib import resources

from replayssm.records.provenance import device_info, git_state, versions

SCHEMA_ID = "replayssm.record/1"
JOBS = ("validate", "fuzz", "drift", "bench", "golden", "gallery", "findings", "mixer", "model", "profile",
        "calibration", "sanitize")
VERDICTS = ("pass", "fail", "marginal", "none")


class RecordError(ValueError):
    """A record that does not satisfy the schema or the id rule."""


@functools.lru_cache(maxsize=1)
def schema() -> dict:
    """The JSON Schema of a record (``replayssm/records/record.schema.json``)."""
    return json.loads(resources.files("replayssm.records").joinpath("record.schema.json").read_text())


def clean(value):
    """``value`` as JSON can carry it: non-finite floats become the strings ``nan``, ``inf``,
    ``-inf`` (JSON has no such numbers; the metric keeps what was measured), tuples lists, numpy
    and torch scalars Python numbers."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if callable(getattr(value, "tolist", None)):  # numpy / torch scalars and arrays
        value = value.tolist()
        if isinstance(value, list):
            return clean(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return str(value)


def canonical(obj) -> str:
    """Canonical JSON: sorted keys, no spaces, no NaN (:func:`clean` first)."""
    return json.dumps(clean(obj), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def digest(obj) -> str:
    """First 16 hex digits of the SHA-256 of ``obj``'s canonical JSON."""
    return hashlib.sha256(canonical(obj).encode()).hexdigest()[:16]


def record_id(record: dict) -> str:
    """The id a record must carry: :func:`digest` of the record without ``id``."""
    return digest({k: v for k, v in record.items() if k != "id"})


def now_utc() -> str:
    """The current UTC time, ISO 8601 with seconds and ``Z`` (RFC 3339 date-time)."""
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


class Recorder:
    """The provenance of one job, filled once: ``Recorder("validate", device="cuda:0")``.

    ``commit``/``dirty``/``device``/``versions`` may be given (a converter of old files, a test);
    by default they come from :func:`git_state`, :func:`device_info` and :func:`versions` at the
    first :meth:`record` call (after the job ran, so ``dirty`` covers every module it imported).
    """

    def __init__(self, job: str, *, device: str = "cpu", device_count: int = 1, source: str | None = None,
                 commit: str | None = None, dirty: bool | None = None, device_info_: dict | None = None,
                 versions_: dict | None = None):
        if job not in JOBS:
            raise ValueError(f"job: expected one of {', '.join(JOBS)}, got {job!r}")
        self.job, self.source = job, source
        self._device, self._count = device, device_count
        self._commit, self._dirty = commit, dirty
        self._device_info, self._versions = device_info_, versions_

    def provenance(self) -> dict:
        if self._commit is None or self._dirty is None:
            c, d = git_state()
            self._commit = c if self._commit is None else self._commit
            self._dirty = d if self._dirty is None else self._dirty
        if self._device_info is None:
            self._device_info = device_info(self._device, self._count)
        if self._versions is None:
            self._versions = versions()
        return {"commit": self._commit, "dirty": self._dirty, "device": dict(self._device_info),
                "versions": dict(self._versions)}

    def record(self, case: str, *, metrics: dict, verdict: str, config: dict | None = None,
               family: str | None = None, kernel: str | None = None, mode: str | None = None,
               geometry: str | None = None, reason: str | None = None, created: str | None = None) -> dict:
        """One schema-valid record of ``case`` (raises :class:`RecordError` when it is not)."""
        config = clean(config or {})
        rec = {"schema": SCHEMA_ID, "job": self.job, "case": case, "family": family, "kernel": kernel,
               "mode": mode, "geometry": geometry, "config": config, "config_digest": digest(config),
               **self.provenance(), "metrics": clean(metrics), "verdict": verdict, "reason": reason,
               "created": created or now_utc(), "source": self.source}
        rec["id"] = record_id(rec)
        validate(rec)
        return rec


@functools.lru_cache(maxsize=1)
def _validator():
    import jsonschema
    return jsonschema.Draft202012Validator(schema())


def errors(record) -> list[str]:
    """Every way ``record`` breaks the schema or the id rule (empty: valid)."""
    out = [f"{'/'.join(map(str, e.absolute_path)) or '(record)'}: {e.message}"
           for e in sorted(_validator().iter_errors(record), key=lambda e: list(map(str, e.absolute_path)))]
    if out or not isinstance(record, dict):
        return out
    try:
        datetime.datetime.fromisoformat(record["created"].replace("Z", "+00:00"))
    except ValueError:
        out.append(f"created: {record['created']!r} is not an ISO 8601 date-time")
    try:
        want = record_id(record)
    except ValueError as e:  # a NaN that slipped past the schema
        return [*out, f"(record): not canonical JSON: {e}"]
    if record["id"] != want:
        out.append(f"id: {record['id']} is not the digest of the record ({want})")
    return out


def validate(record) -> dict:
    """``record`` when it satisfies the schema and the id rule, else :class:`RecordError` listing why."""
    bad = errors(record)
    if bad:
        case = record.get("case", "?") if isinstance(record, dict) else "?"
        raise RecordError(f"record {case}: " + "; ".join(bad))
    return record


__all__ = ["JOBS", "SCHEMA_ID", "VERDICTS", "RecordError", "Recorder", "canonical", "clean", "digest", "errors",
           "now_utc", "record_id", "schema", "validate"]
