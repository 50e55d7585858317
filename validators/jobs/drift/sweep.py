"""Drift runs: long lock-step runs of kernels x precision modes x scenarios against fp64.

Oracle: :class:`replayssm.validators.engine.runner.Lockstep` (the fp64, non-speculative, token-by-token
reference of docs/validation.md on the accepted stream).  On top of it a drift cell records, per row:

* ``output``: ``||out - ref||_2 / ||ref||_2`` of every accepted token, at its position in the
  row's accepted stream (speculative runs: window positions ``s < k``);
* ``draft``: the same for rejected draft positions (speculative runs);
* ``state``: the relative error of the checkpoint at every flush (against the reference at the
  folded token count) and of the committed state at log-spaced positions;
* ``flush``: the checkpoint error against the flush count, and ``flush_local``: the error one
  flush injects -- the checkpoint against the fp64 fold of the kernel's *own* previous checkpoint
  over the same tokens (a "shadow" fp64 state re-seeded at every ``local_every``-th flush);
* per-row geometric-mean output error over ``blocks`` equal blocks of positions (for the
  speculative vs standard test).

Curves are streamed into log-binned accumulators (:class:`BinnedCurve`), so a cell of 10^6
tokens keeps kilobytes.  A cell is a pure function of its definition: the same cell gives the
same bits in any process, shard or order (one intra-op thread per process on CPU).

Interruption: each cell checkpoints (kernel snapshot, reference state, shadow, accumulators) at
chunk boundaries, atomically, in a format that cannot execute code with a SHA-256 digest
(:mod:`replayssm.validators.engine.checkpoint_file`); a killed run resumes to bit-identical cell results, and
a checkpoint that is foreign (an older pickle included), truncated or fails its digest is moved to
``<out>/quarantine/`` with one line on stderr and its cell recomputed.  Sharding:
``shard = (i, n)`` takes shard i of n cells balanced by estimated cost (:mod:`replayssm.validators.jobs.scaleout`,
which also holds claim mode and the Ray backend); ``workers`` processes (one per
visible GPU by default on CUDA) share the shard's cells.  Reports are built from the union of
cell files (:mod:`replayssm.validators.jobs.drift.report`), so a merged sharded run equals an
unsharded one.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import queue
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

from replayssm import __version__, adapters
from replayssm.families import family_names, preset
from replayssm.guard import out_path
from replayssm.interface import DecodeConfig
from replayssm.precision import parse_mode
from replayssm.registry import get, kernels
from replayssm.scenarios.inputs import DISTRIBUTIONS
from replayssm.scenarios.scenario import Scenario
from replayssm.scenarios.schedules import plan
from replayssm.validators.engine import checkpoint_file
from replayssm.validators.engine.metrics import row_rel_l2
from replayssm.validators.engine.runner import Lockstep, reference_step
from replayssm.validators.jobs.drift.analysis import BinnedCurve
from replayssm.validators.jobs.drift.fast import FastCell, qualifies
from replayssm.validators.jobs.scaleout.shards import shard_of

CONFIG_SCHEMA = 1
CELL_SCHEMA = 2  # 2: provenance (cell config digest, kernel code digest, versions, device) and history
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
    import sys
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
    import sys
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

def atomic_write(path: str | Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and ``os.replace``:
    after a kill, ``path`` is either the old file or the complete new one."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}")
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(tmp, mode) as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, p)


# ---- one cell ----------------------------------------------------------------------------------------------

def _plan_for(spec: CellSpec, cfg: SweepConfig):
    """The step plan reaching ``cfg.tokens`` accepted tokens on every row, and its length."""
    T = cfg.window if spec.speculative else 1
    if not spec.speculative or spec.schedule == "spec-always-1":
        n = cfg.tokens
    elif spec.schedule == "spec-always-T":
        n = math.ceil(cfg.tokens / T)
    else:
        n = math.ceil(cfg.tokens / ((T + 1) / 2) * 1.15) + 64
    while True:
        plans = plan(spec.scenario(cfg, n))
        acc = np.cumsum(np.array([p.accepted for p in plans], dtype=np.int64), axis=0)
        done = np.nonzero(acc.min(axis=1) >= cfg.tokens)[0]
        if done.size:
            m = int(done[0]) + 1
            return plans[:m], m
        n *= 2


class CellRun:
    """One drift cell: a :class:`Lockstep` plus the drift accumulators (see the module docstring)."""

    def __init__(self, spec: CellSpec, cfg: SweepConfig, device="cpu", chunk: int = 64, fast: bool = True,
                 graphs: bool | None = None, fused: bool | None = None) -> None:
        """``fast``: step through :class:`replayssm.validators.jobs.drift.fast.FastCell` (same results, a
        tenth of the host work; CUDA graphs per ``graphs``, the fused fp64 reference per ``fused``,
        both by default on a GPU) when the cell qualifies."""
        self.spec, self.cfg = spec, cfg
        self.device = torch.device(device)
        self.chunk = chunk
        self.plans, self.n_steps = _plan_for(spec, cfg)
        self.sc = spec.scenario(cfg, self.n_steps)
        self.ls = Lockstep(self.sc, spec.kernel, device=self.device, literal_every=0, invariants_every=0,
                           state_every=0, record_metrics=False, digest=False, steps=self.plans)
        self.ls.start()
        # Whether a flush's stored state already holds the step's accepted tokens (see run_steps).
        self.ck_after = not spec.speculative or not self.ls.replay_kind
        N, R, nb = cfg.tokens, cfg.rows, cfg.nbins
        self.curves = {"output": BinnedCurve.new(N, nb), "state": BinnedCurve.new(N, nb),
                       "flush": BinnedCurve.new(N, nb), "flush_local": BinnedCurve.new(N, nb)}
        if spec.speculative:
            self.curves["draft"] = BinnedCurve.new(N, nb)
        self.block_sum = np.zeros((R, cfg.blocks))
        self.block_cnt = np.zeros((R, cfg.blocks), dtype=np.int64)
        self.pos = np.zeros(R, dtype=np.int64)
        self.flushes = np.zeros(R, dtype=np.int64)
        self.targets = np.unique(np.round(np.geomspace(1, N, cfg.state_samples)).astype(np.int64))
        self.next_sample = np.zeros(R, dtype=np.int64)
        self.shadow = self.ls.kernel.checkpoint_state(self.ls.ids).to(torch.float64)
        self.armed = np.ones(R, dtype=bool)
        self.pending: list[tuple] = []
        self.step = 0
        self.exception: str | None = None
        self.truncated = False
        self.fast = FastCell(self, graphs, fused=fused) if fast and qualifies(self) is None else None

    # ---- checkpoint ------------------------------------------------------------------------------------------
    @property
    def can_checkpoint(self) -> bool:
        return bool(getattr(self.ls.kernel, "supports_restore", False))

    def state_dict(self) -> dict:
        self._drain()
        return {"cell": self.spec.id, "config": self.cfg.digest, "step": self.step, "lockstep": self.ls.state_dict(),
                "curves": {k: v.to_dict() for k, v in self.curves.items()},
                "block_sum": self.block_sum.copy(), "block_cnt": self.block_cnt.copy(), "pos": self.pos.copy(),
                "flushes": self.flushes.copy(), "next_sample": self.next_sample.copy(),
                "shadow": self.shadow.detach().cpu(), "armed": self.armed.copy()}

    def load_state_dict(self, d: dict) -> None:
        if d["cell"] != self.spec.id or d["config"] != self.cfg.digest:
            raise ValueError(f"checkpoint: taken from cell {d['cell']} of sweep {d['config']}, "
                             f"not {self.spec.id} of {self.cfg.digest}")
        self.ls.load_state_dict(d["lockstep"])
        self.step = int(d["step"])
        self.curves = {k: BinnedCurve.from_dict(v) for k, v in d["curves"].items()}
        self.block_sum, self.block_cnt = d["block_sum"].copy(), d["block_cnt"].copy()
        self.pos, self.flushes = d["pos"].copy(), d["flushes"].copy()
        self.next_sample, self.armed = d["next_sample"].copy(), d["armed"].copy()
        self.shadow = d["shadow"].to(self.device)

    # ---- stepping --------------------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.step >= self.n_steps or self.exception is not None

    def _advance_shadow(self, inputs: dict, accepted: np.ndarray) -> None:
        """Step the fp64 shadow over each row's accepted tokens of this step."""
        st, new = self.shadow, self.shadow
        kt = torch.as_tensor(accepted, device=self.device)
        for t in range(int(accepted.max())):
            tok = {n: v[:, t].to(torch.float64) for n, v in inputs.items()}
            _, st = reference_step(self.ls.resolved.family, st, tok, self.ls.ref_params)
            sel = (kt == t + 1).view(-1, *([1] * (st.dim() - 1)))
            new = torch.where(sel, st, new)
        self.shadow = new

    def run_steps(self, n: int) -> int:
        """Run up to ``n`` steps (stopping at chunk boundaries); returns accepted tokens counted."""
        if self.fast is not None:
            return self.fast.run(n)
        before = int(np.minimum(self.pos, self.cfg.tokens).sum())
        ls, dec = self.ls, self.ls.dec
        end = min(self.n_steps, self.step + n)
        while self.step < end and self.exception is None:
            pos_before = self.pos.copy()
            flush_rows = [r for r in ls.active if dec.is_flush(ls.wp[r])]
            ref_before = ls.ref
            try:
                ls.step()
            except Exception as e:  # noqa: BLE001 - a kernel error ends the cell and is reported
                self.exception = f"step {self.step}: {type(e).__name__}: {e}"
                self.pending.append(("exception", traceback.format_exc()[-2000:]))
                break
            last = ls.last_step
            k = np.array(last["plan"].accepted, dtype=np.int64)
            self.pending.append(("out", last["rel_l2"], pos_before, k))
            if flush_rows:
                ck = ls.kernel.checkpoint_state(ls.ids)
                # The stored state holds this step's accepted tokens (standard decode; any baseline,
                # whose state is the committed one) or the committed prefix before the window
                # (speculative replay).
                after = self.ck_after
                folded = ls.ref if after else ref_before
                idx = torch.tensor(flush_rows, device=self.device)
                fidx = self.flushes[flush_rows] + 1
                at = pos_before[flush_rows] + (k[flush_rows] if after else 0)
                self.pending.append(("flush", row_rel_l2(ck.index_select(0, idx), folded.index_select(0, idx)),
                                     fidx.copy(), at.copy()))
                if after and self.armed.any():  # no row armed: no shadow is read before it is re-seeded
                    self._advance_shadow(last["inputs"], k)
                armed = [r for r in flush_rows if self.armed[r]]
                if armed:
                    ai = torch.tensor(armed, device=self.device)
                    self.pending.append(("local", row_rel_l2(ck.index_select(0, ai), self.shadow.index_select(0, ai)),
                                         self.flushes[armed] + 1))
                self.flushes[flush_rows] += 1
                rows_t = torch.tensor(flush_rows, device=self.device)
                self.shadow = self.shadow.index_copy(0, rows_t, ck.index_select(0, rows_t).to(torch.float64))
                for r in flush_rows:
                    self.armed[r] = self.flushes[r] % self.cfg.local_every == 0
                if not after and self.armed.any():
                    self._advance_shadow(last["inputs"], k)
            elif self.armed.any():
                self._advance_shadow(last["inputs"], k)
            self.pos += k
            due = [r for r in ls.active if self.next_sample[r] < len(self.targets)
                   and self.pos[r] >= self.targets[self.next_sample[r]]]
            if due:
                cs = ls.kernel.committed_state(ls.ids)
                di = torch.tensor(due, device=self.device)
                self.pending.append(("state", row_rel_l2(cs.index_select(0, di), ls.ref.index_select(0, di)),
                                     self.pos[due].copy()))
                for r in due:
                    while self.next_sample[r] < len(self.targets) and self.pos[r] >= self.targets[self.next_sample[r]]:
                        self.next_sample[r] += 1
            self.step += 1
            if self.step % self.chunk == 0:
                self._drain()
        if self.done:
            self._drain()
        return int(np.minimum(self.pos, self.cfg.tokens).sum()) - before

    def _drain(self) -> None:
        """Move pending device values to the host accumulators, in step order."""
        N, nb = self.cfg.tokens, self.cfg.blocks
        outs = [item for item in self.pending if item[0] == "out"]
        if outs:
            # Every step's output errors at once (one transfer); each step stays its own group of the
            # curves' sums and the block sums are added in step order, so the bits are those of a
            # step-by-step accumulation.  No other pending item touches these accumulators.
            rel = torch.stack([item[1] for item in outs]).to("cpu", torch.float64).numpy()  # [M, R, T]
            M, R, T = rel.shape
            p = np.stack([item[2] for item in outs])[:, :, None] + np.arange(1, T + 1)[None, None, :]
            acc = np.arange(T)[None, None, :] < np.stack([item[3] for item in outs])[:, :, None]
            grp = np.broadcast_to(np.arange(M)[:, None, None], (M, R, T))
            sel = acc & (p <= N)
            self.curves["output"].add_each(p[sel], rel[sel], grp[sel])
            rows = np.nonzero(sel)[1]
            blk = (p[sel] - 1) * nb // N
            np.add.at(self.block_sum, (rows, blk), np.log(np.maximum(rel[sel], _TINY)))
            np.add.at(self.block_cnt, (rows, blk), 1)
            if "draft" in self.curves:
                d = ~acc & (p <= N)
                self.curves["draft"].add_each(p[d], rel[d], grp[d])
        # the flush, local and state errors in one transfer too (a device read per item waited for the device
        # once per item), then added in step order
        # (an item's value may be ``(errors [R], rows)``: a buffer the fast path measured every flushed row into,
        # in place, and the rows to take from it)
        errs = [item[1] for item in self.pending if item[0] in ("flush", "local", "state")]
        vals = [e[0] if isinstance(e, tuple) else e for e in errs]
        flat = torch.cat([e.detach().reshape(-1).to(torch.float64) for e in vals]).cpu().numpy() if errs else None
        parts = np.split(flat, np.cumsum([e.numel() for e in vals])[:-1]) if errs else []
        host = iter([p[e[1]] if isinstance(e, tuple) else p for p, e in zip(parts, errs)])
        # each item one group of its curve's add_groups (add() item by item, bit for bit, in one pass per curve:
        # an add per item measured ~140 us of host time per speculative step on a GPU)
        adds: dict[str, list[tuple]] = {"flush": [], "flush_local": [], "state": []}
        for item in self.pending:
            kind = item[0]
            if kind == "flush":
                err = next(host)
                adds["flush"].append((item[2], err))
                adds["state"].append((np.maximum(item[3], 1), err))
            elif kind == "local":
                adds["flush_local"].append((item[2], next(host)))
            elif kind == "state":
                adds["state"].append((item[2], next(host)))
            elif kind == "exception":
                self.exception = (self.exception or "") + "\n" + item[1]
        for name, items in adds.items():
            self.curves[name].add_groups(items)
        self.pending = []

    # ---- result ----------------------------------------------------------------------------------------------
    def result(self) -> dict:
        self._drain()
        ls = self.ls
        with np.errstate(divide="ignore", invalid="ignore"):
            gm = np.exp(self.block_sum / self.block_cnt)
        blocks = [[float(x) if c and math.isfinite(x) else None for x, c in zip(row, cnt)]
                  for row, cnt in zip(gm, self.block_cnt)]
        g = self.ls.resolved.geometry
        return {
            "schema": CELL_SCHEMA, "id": self.spec.id, "config": self.cfg.digest, **self.spec.to_dict(),
            "scenario": self.sc.to_dict(), "geometry_name": dict(self.cfg.geometry)[self.spec.family],
            "geometry": g.to_dict(), "state_elements": int(np.prod(g.state_shape)),
            "kernel_kind": get(self.spec.kernel, self.spec.family).kind,
            "decode": self.spec.decode_config(self.cfg).to_dict(),
            "rows": self.cfg.rows, "tokens": self.cfg.tokens,
            "tokens_run": int(np.minimum(self.pos, self.cfg.tokens).min()),
            "truncated": self.truncated, "steps": self.step, "steps_planned": self.n_steps,
            "tokens_accepted": int(ls.tokens_accepted), "tokens_verified": int(ls.tokens_verified),
            "flushes": self.flushes.tolist(), "curves": {k: v.to_dict() for k, v in self.curves.items()},
            "blocks": blocks, "failure_counts": dict(ls.failure_counts),
            "failures": [vars(f) for f in ls.failures[:5]], "exception": self.exception,
        }


# ---- provenance ------------------------------------------------------------------------------------------

def kernel_code_digest(cls) -> str:
    """sha256 (16 hex digits) of the source of the module defining ``cls`` and of the modules of
    its bases in the replayssm package: a fixed kernel gets a new digest, so its old cells rerun."""
    h = hashlib.sha256()
    seen = []
    for k in cls.__mro__:
        name = k.__module__
        if name in seen or not (k is cls or name == "replayssm" or name.startswith("replayssm.")):
            continue
        path = getattr(sys.modules.get(name), "__file__", None)
        if not path:
            continue
        seen.append(name)
        h.update(name.encode() + b"\0" + Path(path).read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


def device_name(device) -> str:
    d = torch.device(device)
    return torch.cuda.get_device_name(d) if d.type == "cuda" else d.type


def cell_config(spec: CellSpec, cfg: SweepConfig) -> dict:
    """What one cell's numbers depend on in the sweep configuration (its own slice of it)."""
    return {**spec.to_dict(), "geometry": dict(cfg.geometry)[spec.family],
            **{k: getattr(cfg, k) for k in ("rows", "tokens", "buffer", "window", "history", "seed", "state_samples",
                                            "local_every", "nbins", "blocks")}}


def cell_provenance(spec: CellSpec, cfg: SweepConfig, device="cpu") -> dict:
    """The record a cell result must match exactly to be reused: a digest of the cell's
    configuration, the kernel's name and code digest, the versions and the device."""
    conf = json.dumps(cell_config(spec, cfg), sort_keys=True).encode()
    return {"cell_config": hashlib.sha256(conf).hexdigest()[:16], "kernel": spec.kernel,
            "kernel_code": kernel_code_digest(get(spec.kernel, spec.family)),
            "versions": {"replayssm": __version__, "torch": torch.__version__, "triton": _version("triton")},
            "device": device_name(device)}


def cell_status(res: dict) -> str:
    """``complete``, ``raised`` (the kernel raised) or ``stopped`` (cut short before every row
    reached its tokens, e.g. by ``--deadline``)."""
    if res.get("exception"):
        return "raised"
    if res.get("truncated") or res.get("tokens_run", res.get("tokens")) < res.get("tokens", 0):
        return "stopped"
    return "complete"


def stop_reason(res: dict) -> str | None:
    """``None`` for a complete cell, else why it stopped (one line)."""
    st = cell_status(res)
    if st == "raised":
        return "the kernel raised: " + res["exception"].strip().splitlines()[0]
    if st == "stopped":
        return "the --deadline passed" if res.get("truncated") else "stopped early"
    return None


def _read_json(p: Path) -> dict | None:
    try:
        d = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def reusable(res: dict | None, prov: dict, cfg: SweepConfig) -> bool:
    """A cell result is reused only when complete and its provenance matches exactly."""
    return (res is not None and res.get("schema") == CELL_SCHEMA and res.get("config") == cfg.digest
            and res.get("provenance") == prov and cell_status(res) == "complete")


def _history(old: dict | None, prov: dict) -> list:
    """The earlier runs of a cell kept when it reruns: failures, and results of other provenance."""
    if old is None:
        return []
    hist = list(old.get("history") or [])
    st = cell_status(old) if "tokens" in old else "unreadable"
    if st == "raised" or old.get("provenance") != prov:
        hist.append({"status": st, "tokens_run": old.get("tokens_run"), "exception": old.get("exception"),
                     "provenance": old.get("provenance")})
    return hist


# ---- running cells ------------------------------------------------------------------------------------------

def cell_path(out: Path, cell_id: str) -> Path:
    return out_path(Path(out) / "cells", f"{cell_id}.json", "cell id")


def ckpt_path(out: Path, cell_id: str) -> Path:
    return out_path(Path(out) / "checkpoints", f"{cell_id}{checkpoint_file.SUFFIX}", "cell id")


def quarantine_path(out: Path) -> Path:
    """Where checkpoints that cannot be used are set aside (never loaded, never deleted)."""
    return out / "quarantine"


def _set_aside(out: Path, path: Path, spec: CellSpec, why: str) -> None:
    """Move an unusable checkpoint of ``spec`` into ``quarantine/`` with one line on stderr."""
    dest = checkpoint_file.set_aside(path, quarantine_path(out))
    print(f"replayssm: drift: checkpoint {path} set aside as {dest}: {' '.join(why.split())}; "
          f"cell {spec.id} recomputed from its start", file=sys.stderr, flush=True)


def _resume(run: CellRun, spec: CellSpec, cfg: SweepConfig, out: Path, prov: dict, device, chunk: int,
            fast: bool) -> CellRun:
    """``run`` resumed from the cell's checkpoint when one of this provenance is there and usable;
    a checkpoint that is foreign (an older pickled ``.pt`` included), truncated, corrupted, fails its
    digest or does not fit the cell is set aside (:func:`_set_aside`) and a fresh run returned."""
    legacy = out / "checkpoints" / f"{spec.id}.pt"
    if legacy.exists():
        _set_aside(out, legacy, spec, "an older checkpoint format (a pickle, never loaded)")
    cp = ckpt_path(out, spec.id)
    if not (cp.exists() and run.can_checkpoint):
        return run
    try:
        ck = checkpoint_file.read(cp)
        if not isinstance(ck, dict):
            raise checkpoint_file.CheckpointError("corrupted: not a cell checkpoint")
    except checkpoint_file.CheckpointError as e:
        _set_aside(out, cp, spec, str(e))
        return run
    if ck.pop("provenance", None) != prov:  # a checkpoint of other code or versions is not resumed
        return run
    try:
        run.load_state_dict(ck)
    except Exception as e:  # noqa: BLE001 - any misfit (its digest held: written by other code) sets it aside
        _set_aside(out, cp, spec, f"does not fit the cell ({type(e).__name__}: {e})")
        return CellRun(spec, cfg, device, chunk, fast=fast)
    return run


def default_chunk(device, rows: int, speculative: bool = False) -> int:
    """Steps per chunk (inputs generated, errors drained to the host, outputs checked once per chunk):
    64 on a CPU; on a GPU at least 2,048 row-steps per chunk in standard decode (a power of two times
    64, so graph pieces repeat from chunk to chunk), since each chunk boundary waits for the device;
    64 in a speculative schedule, whose pieces are mostly one step (up to four graphs per chunk
    step: with 256 steps a cell was still capturing after 8 s on an H200, KDA 3,177 validated
    tokens/s against 6,743 with 64) and whose steps take
    milliseconds, beside which a chunk boundary's wait is small."""
    if torch.device(device).type != "cuda" or speculative:
        return 64
    k = 64
    while k * rows < 2048:
        k *= 2
    return k


def run_cell(spec: CellSpec, cfg: SweepConfig, out: Path, device="cpu", checkpoint_every_s: float = 30.0,
             chunk: int | None = None, on_progress=None, deadline: float | None = None, fast: bool = True) -> dict:
    """Run (or resume) one cell; writes its result file and returns it (``fast``: see
    :class:`CellRun`; False steps through Lockstep.step, the same results).  ``deadline`` (a
    ``time.time()`` value): stop at the first chunk boundary after it; the result says
    ``truncated`` and how many tokens every row reached (``tokens_run``).  ``on_progress(n, resumed=False)``
    gets the tokens of each stretch run, and once, with ``resumed=True``, those a resumed checkpoint held."""
    out = Path(out)
    chunk = default_chunk(device, cfg.rows, spec.speculative) if chunk is None else chunk
    cp = ckpt_path(out, spec.id)
    prov = cell_provenance(spec, cfg, device)
    history = _history(_read_json(cell_path(out, spec.id)), prov)
    run = _resume(CellRun(spec, cfg, device, chunk, fast=fast), spec, cfg, out, prov, device, chunk, fast)
    if run.step and on_progress:  # the tokens an earlier run validated: the progress bar's, not this run's rate
        on_progress(int(np.minimum(run.pos, cfg.tokens).sum()), True)
    last = time.monotonic()
    while not run.done and run.exception is None:
        if deadline is not None and time.time() >= deadline:
            run.truncated = True
            break
        got = run.run_steps(chunk)
        if on_progress:
            on_progress(got)
        if run.can_checkpoint and not run.done and time.monotonic() - last >= checkpoint_every_s:
            checkpoint_file.write({**run.state_dict(), "provenance": prov}, cp)
            last = time.monotonic()
    if run.truncated and run.can_checkpoint and run.exception is None:
        checkpoint_file.write({**run.state_dict(), "provenance": prov}, cp)  # a cut-short cell resumes from here
    res = {**run.result(), "provenance": prov, "history": history}
    atomic_write(cell_path(out, spec.id), json.dumps(res, sort_keys=True, allow_nan=False) + "\n")
    if cp.exists() and not (run.truncated and run.exception is None):
        cp.unlink()
    return res


def _worker(wid: int, device: str, cfg_dict: dict, out: str, tasks, events, ckpt_s: float, chunk: int | None,
            mods: list, parent: int, deadline: float | None, fast: bool = True) -> None:
    torch.set_num_threads(1)
    if torch.device(device).index is not None:  # "cuda" (no index): the process's current device
        torch.cuda.set_device(torch.device(device))
    import_kernel_modules(mods)
    cfg = SweepConfig.from_dict(cfg_dict)
    by_id = {c.id: c for c in cfg.cells()[0]}

    def progress(n: int, resumed: bool = False) -> None:
        if os.getppid() != parent:  # the parent was killed: stop at this chunk boundary
            raise SystemExit(3)
        events.put(("resumed" if resumed else "tok", n))

    while True:
        cid = tasks.get()
        if cid is None:
            break
        oom = None
        try:
            if deadline is None or time.time() < deadline:
                run_cell(by_id[cid], cfg, Path(out), device, ckpt_s, chunk, progress, deadline, fast)
            events.put(("done", cid))
        except torch.OutOfMemoryError as e:  # the device's memory, not the cell: the parent names the remedy
            oom = _first_line(e)
        except Exception:  # noqa: BLE001 - reported to the parent, which fails the run
            events.put(("error", cid, traceback.format_exc()))
        if oom is not None:  # outside the handler: the traceback's frames, which held the cell's tensors, are gone
            _release_device_memory(device)
            events.put(("oom", cid, oom))
    events.put(("exit", wid))


def dispatch_order(cells: list[CellSpec]) -> list[CellSpec]:
    """The order worker processes take ``cells`` in: the speculative schedules' first, each group in the
    configuration's order.  On a GPU a speculative cell takes about 2.5x a standard one's time (alone on
    an H100, 8 rows: 18,090-18,966 against 45,246-48,696 validated tokens/s, rec:8c86bd2733d4d900,
    rec:670d3bcc7ed69522, rec:ef02ae3dceb5fa92, rec:87ef5234ff23deec of docs/reports/ledger.jsonl); taken
    last, they left the full report's final minutes to a few processes (its third call, of the same
    commit: 11 cells, 20,211 tokens/s against 34,130 in the first; the whole report rec:bc468fe524d00830).
    No cell's numbers depend on the order."""
    return sorted(cells, key=lambda c: not c.speculative)


def default_devices() -> list[str]:
    if torch.cuda.is_available():
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return ["cpu"]


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def _release_device_memory(device: str) -> None:
    """After a cell ran out of device memory (called once its exception, whose frames held the cell's
    tensors, is gone): hand the cached blocks back so that the next cell, or another process sharing
    the card, can have them."""
    if str(device).startswith("cuda") and torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass
class SweepOutcome:
    """What a sweep ran: its shard's cells, those with a result now, the wall time and tokens, and
    the cells that ran out of device memory (id -> the error's first line; no result, not run)."""
    cells: list[str]
    ran: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    tokens: int = 0
    out_of_memory: dict[str, str] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


def prepare_out(cfg: SweepConfig, out: Path) -> None:
    """Create ``out`` with its ``config.json``, or check an existing one holds the same sweep."""
    cp = out / "config.json"
    text = json.dumps(cfg.to_dict(), sort_keys=True, indent=1) + "\n"
    if not cp.exists() and any(p.is_file() for d in ("cells", "checkpoints") for p in (out / d).glob("*")):
        raise ValueError(f"out: {out} holds drift cells but no config.json, so their configuration cannot be "
                         f"proven; use another --out or delete it")
    out.mkdir(parents=True, exist_ok=True)
    if cp.exists():
        try:
            old = SweepConfig.from_dict(json.loads(cp.read_text()))
        except (ValueError, json.JSONDecodeError) as e:
            raise ValueError(f"out: {cp} is not a drift sweep config ({e}); use another --out") from None
        if old.digest != cfg.digest:
            raise ValueError(f"out: {out} holds a different sweep (config {old.digest}, this one {cfg.digest}); "
                             f"use another --out or delete it")
        return
    atomic_write(cp, text)


def run_sweep(cfg: SweepConfig, out: str | Path, *, shard: tuple[int, int] = (0, 1), workers: int = 1,
              devices: list[str] | None = None, progress: bool = True, checkpoint_every_s: float = 30.0,
              chunk: int | None = None, deadline_s: float | None = None, fast: bool = True) -> SweepOutcome:
    """Run this shard's cells of the sweep that have no result file yet (resuming checkpoints).

    ``workers`` processes share the cells (1: in this process); worker ``w`` uses
    ``devices[w % len(devices)]`` (default: every visible GPU, else the CPU).  ``deadline_s``:
    a wall-clock budget; running cells stop at it (``truncated``), cells not started by then
    are not run (a time-boxed GPU run; such a report is not comparable bit for bit).  A cell that
    runs out of device memory (``torch.OutOfMemoryError``, e.g. too many worker processes sharing a
    card) gets no result and is listed in ``SweepOutcome.out_of_memory``; the others go on.  Any other
    error of a cell fails the sweep (``RuntimeError``) once the workers are done."""
    out = Path(out)
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers: expected a positive integer, got {workers!r}")
    devices = devices or default_devices()
    prepare_out(cfg, out)
    cells = shard_cells(cfg.cells()[0], shard, cfg)
    todo = [c for c in cells
            if not reusable(_read_json(cell_path(out, c.id)), cell_provenance(c, cfg, devices[0]), cfg)]
    per_cell = cfg.rows * cfg.tokens
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=per_cell * len(cells), initial=per_cell * (len(cells) - len(todo)), unit="tok",
                   unit_scale=True, desc=f"drift {shard[0]}/{shard[1]}", dynamic_ncols=True, smoothing=0.05)
    t0 = time.perf_counter()
    counted = 0

    def tick(n: int, resumed: bool = False) -> None:
        """``n`` tokens validated (``resumed``: by an earlier run, whose checkpoint a cell resumed: they
        move the bar but are not this run's tokens, so not in its rate)."""
        nonlocal counted
        if not resumed:
            counted += n
        if bar is not None:
            bar.update(n)

    errors, oom = [], {}
    deadline = None if deadline_s is None else time.time() + deadline_s
    threads = torch.get_num_threads()
    try:
        if workers == 1 or len(todo) <= 1:
            torch.set_num_threads(1)
            for c in todo:
                if deadline is None or time.time() < deadline:
                    try:
                        run_cell(c, cfg, out, devices[0], checkpoint_every_s, chunk, tick, deadline, fast)
                    except torch.OutOfMemoryError as e:  # the next cells may fit: go on, report it at the end
                        oom[c.id] = _first_line(e)
                    if c.id in oom:
                        _release_device_memory(devices[0])
        else:
            import multiprocessing as mp
            ctx = mp.get_context("spawn")
            tasks, events = ctx.Queue(), ctx.Queue()
            for c in dispatch_order(todo):
                tasks.put(c.id)
            nw = min(workers, len(todo))
            for _ in range(nw):
                tasks.put(None)
            mods = kernel_modules(cfg)
            procs = [ctx.Process(target=_worker, args=(w, devices[w % len(devices)], cfg.to_dict(), str(out), tasks,
                                                       events, checkpoint_every_s, chunk, mods, os.getpid(),
                                                       deadline, fast),
                                 daemon=True)
                     for w in range(nw)]
            for p in procs:
                p.start()
            alive = nw
            while alive:
                try:
                    ev = events.get(timeout=1.0)
                except queue.Empty:
                    dead = [p for p in procs if p.exitcode not in (None, 0)]
                    if dead:
                        errors.append(f"a worker process died (exit code {dead[0].exitcode})")
                        break
                    continue
                if ev[0] in ("tok", "resumed"):
                    tick(ev[1], ev[0] == "resumed")
                elif ev[0] == "error":
                    errors.append(f"cell {ev[1]}:\n{ev[2]}")
                elif ev[0] == "oom":
                    oom[ev[1]] = ev[2]
                elif ev[0] == "exit":
                    alive -= 1
            for p in procs:
                p.join(timeout=5)
                if p.is_alive():
                    p.terminate()
    finally:
        torch.set_num_threads(threads)
        if bar is not None:
            bar.close()
    if errors:
        raise RuntimeError("drift: " + "\n".join(errors))
    wall = time.perf_counter() - t0
    ran = [c.id for c in todo if cell_path(out, c.id).exists()]
    return SweepOutcome([c.id for c in cells], ran, wall, counted, oom)


def load_cells(dirs: list[str | Path], cfg: SweepConfig | None = None) -> tuple[SweepConfig, list[dict]]:
    """The sweep config and every cell result of ``dirs`` (shard outputs of one sweep).  Raises
    ValueError when the configs differ, a cell is missing, or two shards disagree on a cell."""
    cfgs, cells = [], {}
    for d in dirs:
        d = Path(d)
        cp = d / "config.json"
        if not cp.exists():
            raise ValueError(f"merge: {d} has no config.json (not a drift output folder)")
        cfgs.append(SweepConfig.from_dict(json.loads(cp.read_text())))
        for f in sorted((d / "cells").glob("*.json")):
            text = f.read_text()
            res = json.loads(text)
            if res["id"] in cells and cells[res["id"]][0] != text:
                raise ValueError(f"merge: cell {res['id']} differs between shards")
            cells[res["id"]] = (text, res)
    cfg = cfg or cfgs[0]
    for c in cfgs:
        if c.digest != cfg.digest:
            raise ValueError(f"merge: the folders hold different sweeps ({c.digest} vs {cfg.digest})")
    want = [c.id for c in cfg.cells()[0]]
    missing = [w for w in want if w not in cells]
    if missing:
        raise ValueError(f"merge: {len(missing)} cell(s) have no result yet, e.g. {missing[:3]} "
                         f"(run the missing shards, or resume them)")
    return cfg, [cells[w][1] for w in want]


__all__ = ["CellRun", "CellSpec", "DEFAULT_MODES", "SCHEDULES", "SweepConfig", "SweepOutcome", "atomic_write",
           "cell_config", "cell_provenance", "cell_status", "default_chunk", "default_devices", "device_name",
           "dispatch_order",
           "import_kernel_modules", "kernel_code_digest", "kernel_modules", "load_cells", "parse_shard", "prepare_out",
           "quarantine_path",
           "registered", "reusable", "run_cell", "run_sweep", "shard_cells", "stop_reason"]
