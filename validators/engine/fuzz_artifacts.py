"""Failure artifacts: a shrunk failing scenario saved as JSON, replayable by the CLI.

Oracle: the file is the scenario's own JSON (``Scenario.to_json``) plus one ``failure`` object
recording what failed: the kernel and family, the first failing check, step, row and window
position, and the engine's message.  ``replayssm validate --scenario FILE`` (without
``--kernel``) reads the kernel from that record and replays the run exactly: the scenario fixes
every input bit and the whole acceptance plan (``explicit`` schedule).  A kernel defined outside
the replayssm package is recorded with the module that registered it (``module``: the file of a
module loaded by ``--import FILE.py``, else the dotted module name).  That field is a hint for the
user, never acted on: a data file runs no code, so replaying such an artifact takes an explicit
``replayssm --import MODULE validate --scenario FILE``, the command ``validate`` prints when the
kernel is not registered.

A corrupt or hand-edited file raises ``ValueError`` naming the field (``failure.kernel``,
``failure.first_bad_step``, ``scenario.schedule_params: accepted[2][0]`` ...).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from replayssm.registry import get
from replayssm.scenarios.scenario import Scenario

ARTIFACT_KIND = "replayssm-failure"
_REQUIRED = {"kind": str, "kernel": str, "family": str, "check": str, "first_bad_step": int}
_OPTIONAL = {"row": int, "position": int, "slot": int, "message": str, "found_by": str, "status": str,
             "note": str, "module": str}
STATUSES = ("open", "fixed", "mutant")


@dataclass(frozen=True)
class FailureRecord:
    """What failed: ``kernel`` (registered name) of ``family`` failed ``check`` first at
    ``first_bad_step`` (row, window position).  ``status``: ``open`` (a live bug), ``fixed`` (kept
    in the regression corpus: must now pass), ``mutant`` (a gallery mutant: must keep failing)."""

    kernel: str
    family: str
    check: str
    first_bad_step: int
    row: int | None = None
    position: int | None = None
    slot: int | None = None
    message: str = ""
    found_by: str = "replayssm fuzzer (Hypothesis, shrunk)"
    status: str = "open"
    note: str = ""
    module: str | None = None  # what the user must --import to replay (None: a replayssm kernel); never imported
    kind: str = ARTIFACT_KIND

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None and v != ""}

    @classmethod
    def from_dict(cls, d) -> FailureRecord:
        if not isinstance(d, dict):
            raise ValueError(f"failure: expected an object, got {type(d).__name__}")
        known = set(_REQUIRED) | set(_OPTIONAL)
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"failure.{unknown[0]}: unknown field; expected fields {sorted(known)}")
        for name in _REQUIRED:
            if name not in d:
                raise ValueError(f"failure.{name}: missing; a failure record needs {sorted(_REQUIRED)}")
        for name, typ in {**_REQUIRED, **_OPTIONAL}.items():
            v = d.get(name)
            if v is None and name in _OPTIONAL:
                continue
            if not isinstance(v, typ) or isinstance(v, bool):
                raise ValueError(f"failure.{name}: expected {typ.__name__}, got {type(v).__name__} {v!r}")
        if d["kind"] != ARTIFACT_KIND:
            raise ValueError(f"failure.kind: expected {ARTIFACT_KIND!r}, got {d['kind']!r}")
        if d["first_bad_step"] < 0:
            raise ValueError(f"failure.first_bad_step: expected a step >= 0, got {d['first_bad_step']}")
        if d.get("status", "open") not in STATUSES:
            raise ValueError(f"failure.status: expected one of {STATUSES}, got {d['status']!r}")
        return cls(**d)


def module_to_import(cls) -> str | None:
    """What ``--import`` loads ``cls``: None for a replayssm kernel, the file of a module loaded
    from a file (``--import FILE.py``, a script), else the dotted module name."""
    name = cls.__module__
    if name == "replayssm" or name.startswith("replayssm."):
        return None
    path = getattr(sys.modules.get(name), "__file__", None)
    if path and (name == "__main__" or name.startswith("replayssm_user_")):
        return str(Path(path).resolve())
    return name


def record_of(result, kernel_name: str, **extra) -> FailureRecord:
    """The failure record of a failed :class:`ValidationResult` (with the module to import when the
    kernel is registered from outside replayssm); of a marginal one, its first marginal error."""
    f = result.first_failure
    if f is None and getattr(result, "marginals", None):  # a marginal (judged --strict, or kept by the fuzzer)
        f = min(result.marginals, key=lambda x: x.sort_key)
        extra.setdefault("note", f"marginal: {result.margin_line()}")
    if f is None:
        raise ValueError("result: it has no failure to record")
    if "module" not in extra:
        try:
            extra["module"] = module_to_import(get(kernel_name, result.family))
        except ValueError:
            extra["module"] = None
    return FailureRecord(kernel=kernel_name, family=result.family, check=f.check, first_bad_step=int(f.step),
                         row=f.row, position=f.position, slot=f.slot, message=f.message[:400], **extra)


def artifact_json(sc: Scenario, record: FailureRecord) -> str:
    d = json.loads(sc.to_json())
    d["failure"] = record.to_dict()
    return json.dumps(d, indent=2) + "\n"


def save_failure(folder, sc: Scenario, record: FailureRecord, stem: str | None = None) -> Path:
    """Write ``<folder>/<stem>.json`` (default stem ``<family>-<kernel>``); returns the path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stem = stem or re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{record.family}-{record.kernel}")
    path = folder / f"{stem}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(artifact_json(sc, record))
    tmp.replace(path)
    return path


def parse_failure(text: str, source: str = "failure artifact") -> tuple[Scenario, FailureRecord]:
    """(Scenario, FailureRecord) from artifact JSON text; ValueError naming the bad field."""
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{source}: not valid JSON ({e})") from None
    if not isinstance(d, dict):
        raise ValueError(f"{source}: expected a JSON object, got {type(d).__name__}")
    if "failure" not in d:
        raise ValueError(f"failure: missing; {source} is a plain scenario, not a failure artifact")
    record = FailureRecord.from_dict(d["failure"])
    sc = Scenario.from_dict(d)
    if sc.family != record.family:
        raise ValueError(f"failure.family: the record says {record.family!r}, the scenario is {sc.family!r}")
    return sc, record


def load_failure(path) -> tuple[Scenario, FailureRecord]:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ValueError(f"scenario: cannot read {p} ({e.strerror})") from None
    return parse_failure(text, str(p))


def module_of_file(path) -> str | None:
    """The module a failure artifact names (``failure.module``: shown to the user, never imported), or None."""
    p = Path(path)
    try:
        d = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(d, dict) or not isinstance(d.get("failure"), dict):
        return None
    return parse_failure(json.dumps(d), str(p))[1].module


def kernel_of_file(path) -> str | None:
    """The kernel named by a failure artifact's record, or None for a plain scenario file.
    A malformed record raises ValueError naming its field."""
    p = Path(path)
    try:
        d = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return None  # Scenario.load reports these with the right message
    if not isinstance(d, dict) or "failure" not in d:
        return None
    return parse_failure(json.dumps(d), str(p))[1].kernel


__all__ = ["ARTIFACT_KIND", "STATUSES", "FailureRecord", "artifact_json", "kernel_of_file", "load_failure",
           "module_of_file", "module_to_import", "parse_failure", "record_of", "save_failure"]
