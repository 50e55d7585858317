"""The structured result of a validation run: JSON for machines, Markdown for people.

Oracle: a record of what the runner saw, nothing computed here.  ``first_failure`` is the
failure with the smallest (step, row, window position); a kernel that raised mid-run keeps the
metrics of the steps before and records the step and the exception.

Verdicts (docs/validation.md, "Verdicts"): ``fail`` when a check failed (or the kernel raised);
``marginal`` when nothing failed but a banded check's error exceeded the tolerance rule's bound by
at most the marginal band (``marginals``); else ``pass``.  ``margin`` is the worst ratio of error to
bound over the banded checks, with the check and the step (and row, window position) it came from.
``passed`` is "not failed"; :meth:`ValidationResult.ok` with ``strict`` also refuses a marginal.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from replayssm.validators.engine.checks import CHECKS as CHECK_REGISTRY

# Check names and what each catches, in run order (the registry of validators/engine/checks/).
CHECKS = {name: c.catches for name, c in CHECK_REGISTRY.items()}


@dataclass
class Failure:
    step: int
    check: str
    message: str
    row: int | None = None
    position: int | None = None
    slot: int | None = None
    value: float | None = None
    bound: float | None = None

    @property
    def ratio(self) -> float | None:
        """``value / bound`` where both are reported and finite (None otherwise)."""
        if self.value is None or self.bound is None or not (math.isfinite(self.value) and math.isfinite(self.bound)):
            return None
        return self.value / self.bound if self.bound > 0 else (math.inf if self.value > 0 else None)

    @property
    def sort_key(self):
        return (self.step, -1 if self.row is None else self.row, -1 if self.position is None else self.position)

    def describe(self) -> str:
        where = [f"step {self.step}"]
        if self.row is not None:
            where.append(f"row {self.row}")
        if self.slot is not None:
            where.append(f"slot {self.slot}")
        if self.position is not None:
            where.append(f"window position {self.position}")
        return f"{', '.join(where)}: [{self.check}] {self.message}"


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


@dataclass
class ValidationResult:
    kernel: str
    family: str
    mode: str
    scenario: dict
    literal: str | None = None
    passed: bool = True
    steps_planned: int = 0
    steps_run: int = 0
    tokens_accepted: int = 0
    tokens_verified: int = 0
    wall_s: float = 0.0
    failures: list[Failure] = field(default_factory=list)
    failure_counts: dict[str, int] = field(default_factory=dict)
    exception: dict | None = None
    metrics: dict[str, list] = field(default_factory=dict)
    summary: dict[str, float] = field(default_factory=dict)
    coverage: dict = field(default_factory=dict)
    checks: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    device: str = "cpu"
    conventions: str = ""  # the recurrence's conventions the kernel was measured against (replayssm/conventions.py)
    verdict: str = "pass"  # pass | marginal | fail (VERDICTS)
    margin: dict | None = None  # worst error / bound of the banded checks: ratio, check, step (row, position)
    marginals: list[Failure] = field(default_factory=list)
    marginal_counts: dict[str, int] = field(default_factory=dict)
    marginal_factor: float | None = None  # the band the run was judged with

    # ---- derived -----------------------------------------------------------------------------------
    @property
    def first_failure(self) -> Failure | None:
        return min(self.failures, key=lambda f: f.sort_key) if self.failures else None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_accepted / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def rate(self) -> str:
        """``tokens_per_s`` for a reader: three significant digits below 100 (a run of a few tokens
        that spent its time in compiles reads 0.31, not 0), thousands separated above."""
        r = self.tokens_per_s
        return f"{r:,.0f}" if r >= 100 else f"{r:.3g}"

    @property
    def label(self) -> str:
        return f"{self.kernel} [{self.family}, {self.mode}]"

    def ok(self, strict: bool = False) -> bool:
        """Not failed; with ``strict`` (``--strict``) a marginal is a failure too."""
        return self.verdict == "pass" or (self.verdict == "marginal" and not strict)

    def margin_line(self) -> str:
        """The margin for a reader: worst ratio of error to bound, which check, where."""
        m = self.margin
        if not m:
            return "margin: no banded check measured an error against the bound"
        where = [f"step {m['step']}"] + [f"{k} {m[k]}" for k in ("row", "position") if m.get(k) is not None]
        band = "" if self.marginal_factor is None else f"; marginal band up to {self.marginal_factor:g} x"
        return f"margin: worst {m['ratio']:.3f} x the bound, [{m['check']}] at {', '.join(where)}{band}"

    def headline(self) -> str:
        if self.verdict == "marginal":
            m = self.margin or {}
            return (f"MARGINAL {self.label}: error {m.get('ratio', float('nan')):.3f} x the bound at "
                    f"[{m.get('check')}] step {m.get('step')}, within the marginal band "
                    f"({sum(self.marginal_counts.values())} marginal error(s), no failure; --strict fails it)")
        if self.passed:
            return (f"PASS {self.label}: {self.steps_run} steps, {self.tokens_accepted} tokens, "
                    f"{self.rate} tokens/s")
        f = self.first_failure
        first = f.describe() if f is not None else "no failure recorded"
        return f"FAIL {self.label}: first failure at {first}"

    # ---- serialisation -----------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = asdict(self)
        d["first_failure"] = None if self.first_failure is None else asdict(self.first_failure)
        d["tokens_per_s"] = self.tokens_per_s
        return _clean(d)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def to_markdown(self, max_failures: int = 20) -> str:
        s = self.scenario
        geo = s.get("geometry") if isinstance(s.get("geometry"), str) else "custom"
        lines = [
            f"# {self.verdict.upper()}: {self.label}",
            "",
            f"- scenario: family `{s.get('family')}`, geometry `{geo}`, "
            f"decode `{s.get('decode')}` (T' = {s.get('window')}, buffer = {s.get('buffer')}), rows {s.get('rows')}, "
            f"slots {s.get('num_slots')}, schedule `{s.get('schedule')}`, distribution `{s.get('distribution')}`, "
            f"seed {s.get('seed')}",
            f"- literal model compared (tolerance rule): `{self.literal}`",
            f"- conventions of the recurrence (declared by the kernel, followed by the reference): "
            f"{self.conventions or 'the defaults'}",
            f"- steps {self.steps_run}/{self.steps_planned}, tokens accepted {self.tokens_accepted}, "
            f"verified {self.tokens_verified}, {self.wall_s:.2f} s, **{self.rate} tokens/s** "
            f"on {self.device}",
        ]
        lines.append(f"- {self.margin_line()}")
        if self.first_failure is not None:
            lines += ["", f"**First failure:** {self.first_failure.describe()}"]
        if self.marginals:
            lines += ["", f"Marginal errors (above the bound, within the band; first "
                          f"{min(max_failures, len(self.marginals))} of {sum(self.marginal_counts.values())}):", ""]
            lines += [f"- {f.describe()}" for f in self.marginals[:max_failures]]
        if self.exception:
            e = self.exception
            lines += ["", f"**Exception at step {e['step']}:** `{e['type']}: {e['message']}`"]
        if self.failure_counts:
            lines += ["", "| check | failures | meaning |", "|---|---|---|"]
            for c, n in sorted(self.failure_counts.items(), key=lambda kv: list(CHECKS).index(kv[0])
                               if kv[0] in CHECKS else 99):
                lines.append(f"| {c} | {n} | {CHECKS.get(c, '')} |")
        if self.summary:
            lines += ["", "| metric | value |", "|---|---|"]
            for k, v in self.summary.items():
                lines.append(f"| {k} | {v:.3e} |" if isinstance(v, float) else f"| {k} | {v} |")
        if self.coverage:
            lines += ["", "Coverage: " + ", ".join(f"{k} {v}" for k, v in self.coverage.items())]
        if self.failures:
            lines += ["", f"Failures (first {min(max_failures, len(self.failures))} of "
                          f"{sum(self.failure_counts.values())}):", ""]
            for f in sorted(self.failures, key=lambda f: f.sort_key)[:max_failures]:
                lines.append(f"- {f.describe()}")
        if self.notes:
            lines += ["", "Notes:", ""] + [f"- {n}" for n in self.notes]
        lines += ["", "Checks run: " + ", ".join(self.checks)]
        return "\n".join(lines) + "\n"

    def save(self, folder: str | Path, stem: str | None = None) -> tuple[Path, Path]:
        """Write ``<stem>.json`` and ``<stem>.md`` into ``folder``; returns both paths."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        stem = stem or f"{self.family}-{self.kernel}-{self.mode}-{self.scenario.get('schedule', 'run')}"
        pj, pm = folder / f"{stem}.json", folder / f"{stem}.md"
        pj.write_text(self.to_json() + "\n")
        pm.write_text(self.to_markdown())
        return pj, pm

    @classmethod
    def from_dict(cls, d: dict) -> ValidationResult:
        d = dict(d)
        d.pop("first_failure", None)
        d.pop("tokens_per_s", None)
        d["failures"] = [Failure(**f) for f in d.get("failures", [])]
        d["marginals"] = [Failure(**f) for f in d.get("marginals", [])]
        d.setdefault("verdict", "pass" if d.get("passed", True) else "fail")
        return cls(**d)


VERDICTS = ("pass", "marginal", "fail")

__all__ = ["CHECKS", "VERDICTS", "Failure", "ValidationResult"]
