"""Drift budgets: ``golden/tolerances.toml``, its loader, the budget check and the derivation.

Oracle: the file itself.  Each entry ``[<family>.<mode>]`` holds

* ``output_error``: the largest allowed *peak binned RMS* relative output error of a drift run
  (per row and accepted token ``||out - ref||_2 / ||ref||_2``, RMS over each log-spaced token bin,
  the maximum over bins);
* ``state_error``: the same for the relative state error, sampled at every flush (checkpoint) and
  at log-spaced steps (committed state);
* ``growth``: the growth laws a curve may follow (``bounded``, ``sqrt``, ``linear``; exponential
  growth cannot be budgeted);
* ``horizon``: the tokens per sequence the numbers hold for.  A longer run gets the budget
  scaled by the fastest allowed law: x1 (bounded), x sqrt(T / horizon) (sqrt), x T / horizon
  (linear);
* ``provenance``: ``derived`` (how), ``hardware``, ``date``, ``commit``.

A drift cell fails its budget when an error is non-finite, a peak exceeds its (scaled) budget,
or the evidence for a disallowed law is decisive (Akaike weight >= ``DECISIVE``; a weaker
preference is reported as a warning, since neighbouring laws fit short noisy curves alike).
Missing or malformed fields raise ``ValueError`` naming file, entry and field, before any work.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

from replayssm import golden
from replayssm.families import family_names
from replayssm.precision import parse_mode

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

SCHEMA = 1
BUDGET_LAWS = ("bounded", "sqrt", "linear")
PROVENANCE_FIELDS = ("derived", "hardware", "date", "commit")
ENTRY_FIELDS = ("output_error", "state_error", "growth", "horizon", "provenance")
DECISIVE = 0.95
DEFAULT_PATH = golden.path("tolerances.toml")
MODEL_TABLE = "model"


@dataclass(frozen=True)
class Budget:
    family: str
    mode: str
    output_error: float
    state_error: float
    growth: tuple[str, ...]
    horizon: int
    provenance: dict

    def scale(self, tokens: float) -> float:
        """Budget multiplier for a run of ``tokens`` tokens per sequence."""
        r = max(float(tokens) / self.horizon, 1.0)
        if "linear" in self.growth:
            return r
        if "sqrt" in self.growth:
            return math.sqrt(r)
        return 1.0

    def to_dict(self) -> dict:
        return {"family": self.family, "mode": self.mode, "output_error": self.output_error,
                "state_error": self.state_error, "growth": list(self.growth), "horizon": self.horizon,
                "provenance": dict(self.provenance)}


class Budgets(dict):
    """``(family, mode_id) -> Budget``, with the file it came from."""

    path: Path | None = None

    def get_budget(self, family: str, mode: str) -> Budget:
        key = (family, parse_mode(mode).id)
        if key not in self:
            have = sorted(m for f, m in self if f == family)
            raise ValueError(f"budgets: no entry [{family}.{key[1]}] in {self.path}; entries for {family}: "
                             f"{have}. Add one (replayssm drift --write-budgets) or drop the mode")
        return self[key]


def _bad(path, where: str, msg: str) -> ValueError:
    return ValueError(f"{path}: [{where}] {msg}")


def _positive(path, where, name, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v > 0 and math.isfinite(v)):
        raise _bad(path, where, f"{name}: expected a positive finite number, got {v!r}")
    return float(v)


def parse_budgets(data: dict, path: str | Path = "<budgets>") -> Budgets:
    """Validate a parsed TOML document (see the module docstring for the fields)."""
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a TOML table at the top level")
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: schema: expected {SCHEMA}, got {data.get('schema')!r}")
    out = Budgets()
    out.path = Path(path)
    for family, modes in data.items():
        if family in ("schema", MODEL_TABLE):  # [model.*]: the model level's budgets (validators/jobs/model/job.py)
            continue
        if family not in family_names():
            raise ValueError(f"{path}: unknown family table [{family}]; expected one of {family_names()}")
        if not isinstance(modes, dict):
            raise ValueError(f"{path}: [{family}] expected a table of precision modes")
        for mode, e in modes.items():
            where = f"{family}.{mode}"
            try:
                mid = parse_mode(mode).id
            except ValueError as err:
                raise _bad(path, where, str(err)) from None
            if not isinstance(e, dict):
                raise _bad(path, where, "expected a table")
            missing = [f for f in ENTRY_FIELDS if f not in e]
            if missing:
                raise _bad(path, where, f"missing field(s) {missing}; every entry needs {list(ENTRY_FIELDS)}")
            unknown = sorted(set(e) - set(ENTRY_FIELDS))
            if unknown:
                raise _bad(path, where, f"unknown field(s) {unknown}; expected {list(ENTRY_FIELDS)}")
            growth = e["growth"]
            if (not isinstance(growth, list) or not growth
                    or not all(isinstance(g, str) and g in BUDGET_LAWS for g in growth)):
                raise _bad(path, where, f"growth: expected a non-empty list drawn from {BUDGET_LAWS}, got {growth!r}")
            h = e["horizon"]
            if isinstance(h, bool) or not isinstance(h, int) or h < 1:
                raise _bad(path, where, f"horizon: expected a positive integer (tokens), got {h!r}")
            prov = e["provenance"]
            if not isinstance(prov, dict):
                raise _bad(path, where, "provenance: expected a table with " + ", ".join(PROVENANCE_FIELDS))
            pmissing = [f for f in PROVENANCE_FIELDS if not (isinstance(prov.get(f), str) and prov[f].strip())]
            if pmissing:
                raise _bad(path, where, f"provenance: missing or empty field(s) {pmissing}; "
                                        f"expected non-empty strings {list(PROVENANCE_FIELDS)}")
            if (family, mid) in out:
                raise _bad(path, where, f"duplicate entry for mode {mid}")
            out[(family, mid)] = Budget(family, mid, _positive(path, where, "output_error", e["output_error"]),
                                        _positive(path, where, "state_error", e["state_error"]),
                                        tuple(growth), h, dict(prov))
    return out


def load_budgets(path: str | Path | None = None) -> Budgets:
    """Read and validate a budget file (default ``golden/tolerances.toml``)."""
    p = Path(path) if path is not None else DEFAULT_PATH
    try:
        text = p.read_text()
    except OSError as e:
        raise ValueError(f"budgets: cannot read {p} ({e.strerror})") from None
    except UnicodeDecodeError:
        raise ValueError(f"budgets: {p} is not a UTF-8 text file (a TOML budget file is expected)") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{p}: not valid TOML ({e})") from None
    return parse_budgets(data, p)


def check_cell(budget: Budget, tokens: float, output_peak: float, state_peak: float,
               output_weights: dict | None, state_weights: dict | None) -> dict:
    """Judge one drift cell against its budget.  Weights are the Akaike weights per law of the
    output and state curves (None when no fit was possible).  Returns ``{"pass", "failures",
    "warnings", "scale", "output_budget", "state_budget"}``."""
    scale = budget.scale(tokens)
    ob, sb = budget.output_error * scale, budget.state_error * scale
    failures, warnings = [], []
    for what, peak, lim in (("output", output_peak, ob), ("state", state_peak, sb)):
        if peak is None:
            continue
        if not math.isfinite(peak):
            failures.append(f"{what} error is non-finite")
        elif peak > lim:
            failures.append(f"{what} error {peak:.3g} exceeds its budget {lim:.3g} "
                            f"({budget.family}.{budget.mode}{f', scaled x{scale:.3g}' if scale != 1 else ''})")
    for what, w in (("output", output_weights), ("state", state_weights)):
        if not w:
            continue
        outside = {law: v for law, v in w.items() if law not in budget.growth and v is not None}
        total = sum(outside.values())
        if total >= DECISIVE:
            law = max(outside, key=outside.get)
            failures.append(f"{what} error grows as {law} (weight {total:.2f}); allowed: {list(budget.growth)}")
        elif total > 0.5:
            law = max(outside, key=outside.get)
            warnings.append(f"{what} error leans to {law} growth (weight {total:.2f} < {DECISIVE}); "
                            f"allowed: {list(budget.growth)}")
    return {"pass": not failures, "failures": failures, "warnings": warnings, "scale": scale,
            "output_budget": ob, "state_budget": sb}


def format_budgets(budgets: list[Budget], header: str = "") -> str:
    """TOML text for ``budgets`` (stable order), loadable by :func:`load_budgets`."""
    lines = []
    if header:
        lines += [f"# {ln}" if ln else "#" for ln in header.splitlines()]
    lines += [f"schema = {SCHEMA}", ""]
    for b in sorted(budgets, key=lambda b: (family_names().index(b.family), b.mode)):
        lines.append(f'[{b.family}."{b.mode}"]')
        lines.append(f"output_error = {b.output_error:.3e}")
        lines.append(f"state_error = {b.state_error:.3e}")
        lines.append("growth = [" + ", ".join(f'"{g}"' for g in b.growth) + "]")
        lines.append(f"horizon = {b.horizon}")
        prov = ", ".join(f'{k} = "{_escape(b.provenance[k])}"' for k in PROVENANCE_FIELDS)
        lines.append(f"provenance = {{ {prov} }}")
        lines.append("")
    return "\n".join(lines)


def _escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')


__all__ = ["BUDGET_LAWS", "Budget", "Budgets", "DECISIVE", "DEFAULT_PATH", "SCHEMA", "check_cell",
           "format_budgets", "load_budgets", "parse_budgets"]
