"""A validation scenario: one value that fixes everything a run depends on.

Oracle: the scenario is plain data.  ``Scenario.from_json(sc.to_json()) == sc`` and the inputs a
scenario generates (``replayssm.scenarios.inputs``) depend only on its fields, never on global
RNG state or the machine.  Every field is checked when the scenario is built; a bad value raises
``ValueError`` naming it as ``scenario.<field>`` and saying what was expected.

Fields (JSON keys):

* ``family`` ``mamba2`` | ``gdn``; ``geometry`` a preset name (``tiny``, ``nano4b``, ``super120b``,
  ``qwen35-4b``, ``gdn-hv64``) or a custom geometry object (``replayssm.geometry`` fields);
* ``mode``: precision-mode id (``s32a16`` ...);
* ``decode`` ``standard`` | ``speculative``; ``window`` T' (1 for standard); ``buffer`` L
  (standard) or the history block B >= T' (speculative);
* ``rows`` batch rows; ``num_slots`` state slots the kernel owns; ``slot_ids`` one slot per row,
  ``-1`` for a padding row; ``origins`` the ring start of each row (speculative only);
* ``distribution`` input regime (see ``inputs.DISTRIBUTIONS``); ``schedule`` name and
  ``schedule_params`` (see ``schedules.SCHEDULES``); ``steps`` (None: the schedule's own length);
* ``seed``; ``initial_state`` ``zeros`` | ``random`` | ``prefill`` (the state of an fp64 prefill of a
  prompt: the prefill -> decode hand-off, ``inputs.make_initial_state``); ``kernel_options``
  passed to the kernel.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replayssm.families import family_names, geometry_from_dict, preset, preset_names
from replayssm.interface import PAD_SLOT, DecodeConfig, Geometry, next_pow2
from replayssm.precision import PrecisionMode, parse_mode
from replayssm.scenarios.inputs import DISTRIBUTIONS
from replayssm.scenarios.schedules import SCHEDULES, check_schedule_params

DECODES = ("standard", "speculative")
INITIAL_STATES = ("zeros", "random", "prefill")
SCHEMA_VERSION = 1


def _fail(name: str, msg: str) -> ValueError:
    return ValueError(f"scenario.{name}: {msg}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class Scenario:
    """Everything one validation run depends on (see the module docstring)."""

    family: str = "mamba2"
    geometry: str | dict = "tiny"
    mode: str = "s32a16"
    decode: str = "speculative"
    window: int = 4
    buffer: int = 12
    rows: int = 3
    num_slots: int = 5
    slot_ids: tuple[int, ...] | None = None
    origins: tuple[int, ...] | None = None
    distribution: str = "mild"
    schedule: str = "random"
    schedule_params: dict = field(default_factory=dict)
    steps: int | None = None
    seed: int = 0
    initial_state: str = "random"
    kernel_options: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Lists from JSON become tuples so scenarios compare and hash by value.
        for name in ("slot_ids", "origins"):
            v = getattr(self, name)
            if isinstance(v, list):
                object.__setattr__(self, name, tuple(v))
        self._validate()

    # ---- validation -------------------------------------------------------------------------------
    def _validate(self) -> None:
        if self.family not in family_names():
            raise _fail("family", f"expected one of {family_names()}, got {self.family!r}")
        if isinstance(self.geometry, str):
            try:
                preset(self.geometry, self.family)
            except ValueError as e:
                raise _fail("geometry", str(e).split(": ", 1)[-1]) from None
        elif isinstance(self.geometry, dict):
            try:
                g = geometry_from_dict(self.geometry)
            except ValueError as e:
                raise _fail("geometry", str(e)) from None
            if g.family != self.family:
                raise _fail("geometry", f"a {g.family!r} geometry does not fit family {self.family!r}")
        else:
            raise _fail("geometry", f"expected a preset name {preset_names()} or a geometry object, "
                                    f"got {type(self.geometry).__name__}")
        if not isinstance(self.mode, str):
            raise _fail("mode", f"expected a precision-mode id string, got {type(self.mode).__name__}")
        try:
            parse_mode(self.mode)
        except ValueError as e:
            raise _fail("mode", str(e)) from None
        if self.decode not in DECODES:
            raise _fail("decode", f"expected one of {DECODES}, got {self.decode!r}")
        for name in ("window", "buffer", "rows", "num_slots"):
            v = getattr(self, name)
            if not _is_int(v):
                raise _fail(name, f"expected an integer, got {type(v).__name__} {v!r}")
            if v < 1:
                raise _fail(name, f"expected an integer >= 1, got {v}")
        if self.decode == "standard" and self.window != 1:
            raise _fail("window", f"standard decode has T' = 1, got {self.window}")
        if self.decode == "speculative" and self.buffer < self.window:
            raise _fail("buffer", f"the history block B must be >= T' = {self.window}, got {self.buffer}")
        if self.slot_ids is not None:
            if not isinstance(self.slot_ids, tuple) or not all(_is_int(s) for s in self.slot_ids):
                raise _fail("slot_ids", f"expected a list of integers, got {self.slot_ids!r}")
            if len(self.slot_ids) != self.rows:
                raise _fail("slot_ids", f"expected {self.rows} entries (one per row), got {len(self.slot_ids)}")
        ids = self.resolved_slot_ids
        for r, s in enumerate(ids):
            if s != PAD_SLOT and not 0 <= s < self.num_slots:
                raise _fail("slot_ids", f"entry {r}: expected a slot in [0, {self.num_slots}) or -1 (padding), "
                                        f"got {s}")
        active = [s for s in ids if s != PAD_SLOT]
        if len(set(active)) != len(active):
            raise _fail("slot_ids", f"an active slot appears twice in {list(ids)}")
        if not active:
            raise _fail("slot_ids", "expected at least one active (non-padding) row")
        if self.origins is not None:
            if not isinstance(self.origins, tuple) or not all(_is_int(o) for o in self.origins):
                raise _fail("origins", f"expected a list of integers, got {self.origins!r}")
            if len(self.origins) != self.rows:
                raise _fail("origins", f"expected {self.rows} entries (one per row), got {len(self.origins)}")
            rows = self.decode_config.ring_rows
            for r, o in enumerate(self.origins):
                if self.decode == "standard" and o != 0:
                    raise _fail("origins", f"entry {r}: standard decode uses a linear buffer, expected 0, got {o}")
                if not 0 <= o < rows:
                    raise _fail("origins", f"entry {r}: expected a ring row in [0, {rows}), got {o}")
        if self.distribution not in DISTRIBUTIONS:
            raise _fail("distribution", f"expected one of {sorted(DISTRIBUTIONS)}, got {self.distribution!r}")
        if self.schedule not in SCHEDULES:
            raise _fail("schedule", f"expected one of {sorted(SCHEDULES)}, got {self.schedule!r}")
        if not isinstance(self.schedule_params, dict):
            raise _fail("schedule_params", f"expected an object, got {type(self.schedule_params).__name__}")
        check_schedule_params(self)
        if self.steps is not None:
            if not _is_int(self.steps):
                raise _fail("steps", f"expected an integer or null, got {type(self.steps).__name__} {self.steps!r}")
            if self.steps < 1:
                raise _fail("steps", f"expected a length >= 1 (or null for the schedule's own), got {self.steps}")
        if not _is_int(self.seed) or self.seed < 0 or self.seed >= 2**63:
            raise _fail("seed", f"expected an integer in [0, 2^63), got {self.seed!r}")
        if self.initial_state not in INITIAL_STATES:
            raise _fail("initial_state", f"expected one of {INITIAL_STATES}, got {self.initial_state!r}")
        if not isinstance(self.kernel_options, dict):
            raise _fail("kernel_options", f"expected an object, got {type(self.kernel_options).__name__}")
        try:
            json.dumps(self.kernel_options)
            json.dumps(self.schedule_params)
        except TypeError as e:
            raise _fail("kernel_options", f"expected JSON-serialisable values ({e})") from None

    # ---- derived values -------------------------------------------------------------------------------
    @property
    def resolved_slot_ids(self) -> tuple[int, ...]:
        """slot_ids, defaulting to rows 0..rows-1 on slots 0..rows-1."""
        return tuple(range(self.rows)) if self.slot_ids is None else tuple(self.slot_ids)

    @property
    def resolved_origins(self) -> tuple[int, ...]:
        return (0,) * self.rows if self.origins is None else tuple(self.origins)

    @property
    def active_rows(self) -> list[int]:
        return [r for r, s in enumerate(self.resolved_slot_ids) if s != PAD_SLOT]

    @property
    def unused_slots(self) -> list[int]:
        used = set(self.resolved_slot_ids)
        return [s for s in range(self.num_slots) if s not in used]

    @property
    def geometry_obj(self) -> Geometry:
        if isinstance(self.geometry, str):
            return preset(self.geometry, self.family)
        return geometry_from_dict(self.geometry)

    @property
    def geometry_name(self) -> str:
        return self.geometry if isinstance(self.geometry, str) else "custom"

    @property
    def precision(self) -> PrecisionMode:
        return parse_mode(self.mode)

    @property
    def decode_config(self) -> DecodeConfig:
        return DecodeConfig(self.decode, self.window, self.buffer)

    @property
    def ring_rows(self) -> int:
        return next_pow2(self.buffer + self.window) if self.decode == "speculative" else self.buffer

    @property
    def label(self) -> str:
        """A short id for test names and reports, e.g. ``mamba2-tiny-s32a16-spec-T4-B12-exhaustive``."""
        dec = f"spec-T{self.window}-B{self.buffer}" if self.decode == "speculative" else f"L{self.buffer}"
        return f"{self.family}-{self.geometry_name}-{self.mode}-{dec}-{self.schedule}-{self.distribution}"

    def replace(self, **changes) -> Scenario:
        return dataclasses.replace(self, **changes)

    # ---- serialisation --------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            d[f.name] = list(v) if isinstance(v, tuple) else (json.loads(json.dumps(v)) if isinstance(v, dict) else v)
        return d

    @classmethod
    def from_dict(cls, d: Any) -> Scenario:
        if not isinstance(d, dict):
            raise ValueError(f"scenario: expected a JSON object, got {type(d).__name__}")
        d = dict(d)
        version = d.pop("schema_version", SCHEMA_VERSION)
        if version != SCHEMA_VERSION:
            raise _fail("schema_version", f"expected {SCHEMA_VERSION}, got {version!r}")
        # A failure artifact (validators/engine/fuzz_artifacts.py) carries the record of the failure it
        # reproduces under "failure"; it is not part of the scenario and is checked there.
        failure = d.pop("failure", None)
        if failure is not None and not isinstance(failure, dict):
            raise _fail("failure", f"expected an object (kernel, check, first_bad_step), got {type(failure).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise _fail(unknown[0], f"unknown field; expected fields {sorted(names)}")
        return cls(**d)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps({"schema_version": SCHEMA_VERSION, **self.to_dict()}, indent=indent, sort_keys=False)

    @classmethod
    def from_json(cls, text: str) -> Scenario:
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"scenario: not valid JSON ({e})") from None
        return cls.from_dict(d)

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.write_text(self.to_json() + "\n")
        return p

    @classmethod
    def load(cls, path: str | Path) -> Scenario:
        """A scenario file: every field must be named (no default is applied silently; files
        written by :meth:`save`, ``--save-scenario`` and the fuzzer name them all)."""
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as e:
            raise ValueError(f"scenario: cannot read {p} ({e.strerror})") from None
        except UnicodeDecodeError:
            raise ValueError(f"scenario: {p} is not a UTF-8 text file (a scenario JSON is expected)") from None
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"scenario: {p} is not valid JSON ({e})") from None
        if isinstance(d, dict):
            missing = [f.name for f in dataclasses.fields(cls) if f.name not in d]
            if missing:
                raise _fail(missing[0], f"missing from {p}: a scenario file names every field that changes the "
                                        f"result; missing {missing} (write one with --save-scenario)")
        return cls.from_dict(d)

    # ---- constructors ---------------------------------------------------------------------------------
    @classmethod
    def build(cls, family: str = "mamba2", *, decode: str = "speculative", batch: int = 3, padding: int | None = None,
              window: int | None = None, buffer: int | None = None, num_slots: int | None = None,
              **fields) -> Scenario:
        """A scenario with the suite's batch layout: ``batch`` rows of which ``padding`` (default 1
        when batch >= 2) are padding rows (every second row from row 1); active row i uses slot
        2i + 1 counted from the top (so slot 0 and the last slot stay unused canaries: a kernel
        indexing with slot -1 is caught); speculative ring origins (5 + 7i) mod ring != 0.
        Defaults: speculative T' = 4, B = 12 (ring 16 = B + T'); standard L = 8."""
        if not _is_int(batch) or batch < 1:
            raise _fail("rows", f"expected a batch of at least 1 row, got {batch!r}")
        if padding is None:
            padding = 1 if batch >= 2 else 0
        if not _is_int(padding) or not 0 <= padding < batch:
            raise _fail("slot_ids", f"expected 0 <= padding rows < batch = {batch}, got {padding!r}")
        if window is None:
            window = 4 if decode == "speculative" else 1
        if buffer is None:
            buffer = 12 if decode == "speculative" else 8
        pad_rows = set(range(1, 2 * padding, 2)) if 2 * padding <= batch else set(range(batch - padding, batch))
        active = [r for r in range(batch) if r not in pad_rows]
        n = len(active)
        if num_slots is None:
            num_slots = 2 * n + 1
        slots = {r: num_slots - 2 - 2 * i for i, r in enumerate(active)} if num_slots >= 2 * n + 1 else \
            {r: i for i, r in enumerate(active)}
        ring = next_pow2(buffer + window) if decode == "speculative" else buffer
        slot_ids = tuple(slots.get(r, PAD_SLOT) for r in range(batch))
        if decode == "speculative":
            rank = {r: i for i, r in enumerate(active)}
            origins = tuple(0 if r in pad_rows else (5 + 7 * rank[r]) % ring for r in range(batch))
        else:
            origins = (0,) * batch
        base = dict(family=family, decode=decode, window=window, buffer=buffer, rows=batch, num_slots=num_slots,
                    slot_ids=slot_ids, origins=origins)
        base.update(fields)
        return cls(**base)

    @classmethod
    def tiny(cls, family: str = "mamba2", decode: str = "speculative", **overrides) -> Scenario:
        """The CPU scenario: ``tiny`` geometry, 3 rows (row 1 padding) on slots (3, -1, 1) of 5
        (0, 2, 4 unused canaries); speculative T' = 4, B = 12 (ring 16 = B + T', origins 5 and 12)
        or standard L = 8.  ``overrides`` go to :meth:`build` (``batch``, ``padding``, any field)."""
        return cls.build(family, decode=decode, **{"geometry": "tiny", **overrides})


__all__ = ["DECODES", "INITIAL_STATES", "SCHEMA_VERSION", "Scenario"]
