"""What a drift sweep runs: its configuration (:class:`SweepConfig`), its cells (:class:`CellSpec`,
each a kernel x mode x schedule with its scenario and decode configuration), the kernel modules a
worker imports, and static shards of the cell list.

Oracle: none of its own (definitions); a bad configuration is refused naming the field.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, dataclass, field

from replayssm import adapters
from replayssm.families import family_names, preset
from replayssm.interface import DecodeConfig
from replayssm.precision import parse_mode
from replayssm.registry import get, kernels
from replayssm.scenarios.inputs import DISTRIBUTIONS
from replayssm.scenarios.scenario import Scenario
from replayssm.validators.jobs.scaleout.shards import shard_of

CONFIG_SCHEMA = 1
# Drift schedule -> (decode, scenario schedule).
SCHEDULES = {
    "standard": ("standard", "always-1"),
    "spec-random": ("speculative", "per-row"),
    "spec-always-1": ("speculative", "always-1"),
    "spec-always-T": ("speculative", "always-T"),
}
DEFAULT_MODES = ("s32a32", "s32a16", "s16a16", "sfp16a16", "sfp16a16-sr", "sfp8a16")
_TINY = 1e-300


# ---- kernels ------------------------------------------------------------------------------------------

def registered() -> dict:
    """Every registered kernel: the built-ins, every mutant (``validators/engine/mutants/``, registered on
    import with the runner), and whatever was imported."""
    return kernels()


def kernel_modules(cfg: SweepConfig) -> list[tuple[str, str | None]]:
    """(module name, file) of every kernel class the sweep uses: worker processes import them
    first, so kernels registered by ``--import`` or by a test module exist there too."""
    out = []
    for c in cfg.cells()[0]:
        mod = get(c.kernel, c.family).__module__
        entry = (mod, getattr(sys.modules.get(mod), "__file__", None))
        if entry not in out:
            out.append(entry)
    return out


def import_kernel_modules(mods: list[tuple[str, str | None]]) -> None:
    import importlib
    import importlib.util
    for name, path in mods:
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except ImportError:
            if not path:
                raise
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
    adapters.load()  # adapter kernels register on load, not on import


# ---- the sweep ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SweepConfig:
    """What a drift sweep runs.  ``geometry`` maps family -> preset name.  ``tokens`` is the
    accepted tokens per row (sequence); ``buffer`` is L of standard decode, ``history`` the block B
    of speculative decode (B >= ``window`` = T')."""

    families: tuple[str, ...] = field(default_factory=family_names)
    kernels: tuple[str, ...] = ("literal-replay",)
    modes: tuple[str, ...] = DEFAULT_MODES
    distributions: tuple[str, ...] = ("long-memory",)
    schedules: tuple[str, ...] = tuple(SCHEDULES)
    geometry: tuple[tuple[str, str], ...] = field(default_factory=lambda: tuple((f, "tiny") for f in family_names()))
    rows: int = 2
    tokens: int = 4096
    buffer: int = 16
    window: int = 4
    history: int = 12
    seed: int = 0
    state_samples: int = 48
    local_every: int = 1
    nbins: int = 48
    blocks: int = 128

    def __post_init__(self) -> None:
        for name in ("families", "kernels", "modes", "distributions", "schedules", "geometry"):
            v = getattr(self, name)
            if isinstance(v, list):
                object.__setattr__(self, name, tuple(tuple(x) if isinstance(x, list) else x for x in v))
        if isinstance(self.geometry, dict):
            object.__setattr__(self, "geometry", tuple(sorted(self.geometry.items())))
        self.validate()

    def validate(self) -> None:
        def bad(name, msg):
            return ValueError(f"{name}: {msg}")

        for name in ("families", "kernels", "modes", "distributions", "schedules"):
            v = getattr(self, name)
            if not v or not all(isinstance(x, str) for x in v):
                raise bad(name, f"expected a non-empty list of names, got {v!r}")
            if len(set(v)) != len(v):
                raise bad(name, f"expected distinct names, got {list(v)}")
        for f in self.families:
            if f not in family_names():
                raise bad("families", f"unknown family {f!r}; expected a subset of {family_names()}")
        for m in self.modes:
            try:
                parse_mode(m)
            except ValueError as e:
                raise bad("modes", str(e)) from None
        ids = [parse_mode(m).id for m in self.modes]
        if len(set(ids)) != len(ids):
            raise bad("modes", f"two ids name the same mode: {list(self.modes)}")
        for d in self.distributions:
            if d not in DISTRIBUTIONS:
                raise bad("scenarios", f"unknown scenario {d!r}; expected a subset of {sorted(DISTRIBUTIONS)}")
        for s in self.schedules:
            if s not in SCHEDULES:
                raise bad("schedules", f"unknown schedule {s!r}; expected a subset of {sorted(SCHEDULES)}")
        geo = dict(self.geometry)
        for f in self.families:
            if f not in geo:
                raise bad("geometry", f"no geometry for family {f!r}; give e.g. {f}=tiny")
            try:
                preset(geo[f], f)
            except ValueError as e:
                raise bad("geometry", str(e).split(": ", 1)[-1]) from None
        reg = registered()
        for k in self.kernels:
            found = [f for f in self.families if (f, k) in reg]
            if not found:
                have = sorted({n for (f, n) in reg if f in self.families})
                raise bad("kernels", f"no kernel {k!r} is registered for {list(self.families)}; expected one of {have}")
        min_tokens = self.blocks if _is_count(self.blocks) else 64  # one token per error block at least
        for name, lo in (("rows", 1), ("tokens", min_tokens), ("buffer", 1), ("window", 2), ("history", 2),
                         ("state_samples", 2), ("local_every", 1), ("nbins", 8), ("blocks", 2)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise bad(name, f"expected an integer >= {lo}, got {v!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise bad("seed", f"expected an integer >= 0, got {self.seed!r}")
        if self.history < self.window:
            raise bad("history", f"the speculative history block B must be >= T' = {self.window}, got {self.history}")
        if self.blocks > self.tokens:
            raise bad("tokens", f"expected at least {self.blocks} tokens (one per error block of the report), "
                                f"got {self.tokens}")

    # ---- cells ----------------------------------------------------------------------------------------
    def cells(self) -> tuple[list[CellSpec], list[dict]]:
        """The sorted cells of the sweep, and the combinations skipped with the reason."""
        cells, skipped = [], []
        reg = registered()
        for f in self.families:
            for k in self.kernels:
                if (f, k) not in reg:
                    skipped.append({"family": f, "kernel": k, "reason": f"kernel {k!r} is not registered for {f}"})
                    continue
                cls = get(k, f)
                for m in self.modes:
                    mode = parse_mode(m)
                    for d in self.distributions:
                        for s in self.schedules:
                            spec = CellSpec(f, k, mode.id, d, s)
                            why = cls.unsupported_reason(mode, spec.decode_config(self), {})
                            if why:
                                skipped.append({"id": spec.id, "family": f, "kernel": k, "mode": mode.id,
                                                "schedule": s, "reason": why})
                            else:
                                cells.append(spec)
        return sorted(cells, key=lambda c: c.id), skipped

    def to_dict(self) -> dict:
        d = asdict(self)
        d["geometry"] = dict(self.geometry)
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        return {"schema": CONFIG_SCHEMA, **d}

    @classmethod
    def from_dict(cls, d: dict) -> SweepConfig:
        d = dict(d)
        if d.pop("schema", None) != CONFIG_SCHEMA:
            raise ValueError(f"config: expected schema {CONFIG_SCHEMA}")
        names = set(cls.__dataclass_fields__)
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"config: unknown field(s) {sorted(unknown)}")
        return cls(**d)

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 2


@dataclass(frozen=True)
class CellSpec:
    family: str
    kernel: str
    mode: str
    distribution: str
    schedule: str

    @property
    def id(self) -> str:
        return f"{self.family}.{self.kernel}.{self.mode}.{self.distribution}.{self.schedule}"

    @property
    def speculative(self) -> bool:
        return SCHEDULES[self.schedule][0] == "speculative"

    def decode_config(self, cfg: SweepConfig) -> DecodeConfig:
        if self.speculative:
            return DecodeConfig("speculative", cfg.window, cfg.history)
        return DecodeConfig("standard", 1, cfg.buffer)

    def scenario(self, cfg: SweepConfig, steps: int) -> Scenario:
        decode, sched = SCHEDULES[self.schedule]
        dc = self.decode_config(cfg)
        origins = None
        if self.speculative:
            origins = tuple((5 * r + 3) % dc.ring_rows for r in range(cfg.rows))
        return Scenario(family=self.family, geometry=dict(cfg.geometry)[self.family], mode=self.mode, decode=decode,
                        window=dc.window, buffer=dc.buffer, rows=cfg.rows, num_slots=cfg.rows, slot_ids=None,
                        origins=origins, distribution=self.distribution, schedule=sched, steps=steps,
                        seed=cfg.seed, initial_state="random")

    def to_dict(self) -> dict:
        return {"id": self.id, **asdict(self)}


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/n"`` with 0 <= i < n."""
    try:
        i, n = (int(x) for x in str(text).split("/"))
    except ValueError:
        raise ValueError(f"shard: expected i/n (e.g. 0/4), got {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"shard: expected 0 <= i < n, got {text!r}")
    return i, n


def shard_cells(cells: list[CellSpec], shard: tuple[int, int], cfg: SweepConfig | None = None) -> list[CellSpec]:
    """Shard ``i`` of ``n``: with ``cfg``, balanced by estimated cell cost (longest processing time
    first, :func:`replayssm.validators.jobs.scaleout.shards.balanced_shards`); without, every n-th cell."""
    i, n = shard
    if cfg is not None:
        return shard_of(cells, shard, cfg)
    return [c for j, c in enumerate(cells) if j % n == i]


# ---- atomic files ----------------------------------------------------------------------------------------

