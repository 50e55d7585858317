"""One drift cell's run: the kernel beside the fp64 reference (through the engine's Lockstep or
drift's fast path), streamed into log-binned curves, checkpointed and resumed bit-identically.

Oracle and expected error: those of :mod:`replayssm.validators.jobs.drift.sweep` (the fp64
non-speculative reference on the accepted stream).
"""

from __future__ import annotations

import math
import traceback
from functools import partial

import numpy as np
import torch

from replayssm.registry import get
from replayssm.scenarios.schedules import plan
from replayssm.validators.engine.metrics import row_rel_l2
from replayssm.validators.engine.runner import Lockstep, reference_step
from replayssm.validators.jobs.drift.analysis import BinnedCurve
from replayssm.validators.jobs.drift.cells import _TINY, CellSpec, SweepConfig
from replayssm.validators.jobs.drift.fast import FastCell, qualifies
from replayssm.validators.jobs.drift.provenance import CELL_SCHEMA


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

    def stop(self, e: BaseException) -> None:
        """End the cell at a kernel error ``e`` of this step (either execution; call it in the ``except``
        block): its line, and its traceback's tail among the pending items."""
        self.exception = f"step {self.step}: {type(e).__name__}: {e}"
        self.pending.append(("exception", traceback.format_exc()[-2000:]))

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
                self.stop(e)
                break
            last = ls.last_step
            k = np.array(last["plan"].accepted, dtype=np.int64)
            self.pending.append(("out", last["rel_l2"], pos_before, k))
            self.measure_step(k, flush_rows, pos_before, ref_before, partial(self._advance_shadow, last["inputs"], k),
                              shadow_stepped=False)
            self.step += 1
            if self.step % self.chunk == 0:
                self._drain()
        if self.done:
            self._drain()
        return int(np.minimum(self.pos, self.cfg.tokens).sum()) - before

    # ---- the drift measurements of a step (both executions) ------------------------------------------------------
    def measure_step(self, k: np.ndarray, flush_rows: list[int], pos_before: np.ndarray, ref_before: torch.Tensor,
                     advance, *, shadow_stepped: bool, checkpoint: torch.Tensor | None = None, take=None,
                     reseed=None) -> None:
        """After a step that accepted ``k`` (positions ``pos_before`` before it) and flushed ``flush_rows``
        (the reference before it: ``ref_before``; after it: ``ls.ref``): the flush's error against the folded
        reference and, on the armed rows, its local error against the shadow, then the flushed rows' shadow
        re-seeded from the checkpoint; the shadow advanced over the step (``advance()``) where a row is armed
        (``shadow_stepped``: the execution advanced it already on a step without a flush); the positions
        moved and the committed-state samples then due.  ``checkpoint``: the flush's stored state (None: read
        by ``checkpoint_state``); ``take(t, rows)``: ``t``'s rows (None: an index_select); ``reseed(ck,
        rows)``: re-seed the shadow's ``rows`` from ``ck`` (None: an index_copy)."""
        take = take or _take
        if flush_rows:
            ls = self.ls
            ck = ls.kernel.checkpoint_state(ls.ids) if checkpoint is None else checkpoint
            # The stored state holds this step's accepted tokens (standard decode; any baseline, whose state
            # is the committed one) or the committed prefix before the window (speculative replay).
            after = self.ck_after
            folded = ls.ref if after else ref_before
            fidx = self.flushes[flush_rows] + 1
            at = pos_before[flush_rows] + (k[flush_rows] if after else 0)
            self.pending.append(("flush", row_rel_l2(take(ck, flush_rows), take(folded, flush_rows)), fidx.copy(),
                                 at.copy()))
            if after and self.armed.any():  # no row armed: no shadow is read before it is re-seeded
                advance()
            armed = [r for r in flush_rows if self.armed[r]]
            if armed:
                self.pending.append(("local", row_rel_l2(take(ck, armed), take(self.shadow, armed)),
                                     self.flushes[armed] + 1))
            self.flushes[flush_rows] += 1
            if reseed is None:
                rows_t = torch.tensor(flush_rows, device=self.device)
                self.shadow = self.shadow.index_copy(0, rows_t, ck.index_select(0, rows_t).to(torch.float64))
            else:
                reseed(ck, flush_rows)
            for r in flush_rows:
                self.armed[r] = self.flushes[r] % self.cfg.local_every == 0
            if not after and self.armed.any():
                advance()
        elif not shadow_stepped and self.armed.any():
            advance()
        self.sample_states(k, take)

    def sample_states(self, k: np.ndarray, take=None) -> None:
        """The step's accepted counts ``k`` into ``pos``, and the committed-state samples then due
        (``take``: as :meth:`measure_step`'s)."""
        ls = self.ls
        self.pos += k
        a = np.asarray(ls.active, dtype=np.int64)
        ns, tg = self.next_sample[a], self.targets
        left = ns < len(tg)
        due_mask = np.zeros(len(a), dtype=bool)
        due_mask[left] = self.pos[a][left] >= tg[ns[left]]
        due = a[due_mask].tolist()
        if due:
            cs = ls.kernel.committed_state(ls.ids)
            self.pending.append(("state", row_rel_l2((take or _take)(cs, due), (take or _take)(ls.ref, due)),
                                 self.pos[due].copy()))
            for r in due:
                while self.next_sample[r] < len(self.targets) and self.pos[r] >= self.targets[self.next_sample[r]]:
                    self.next_sample[r] += 1

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
        # an add per item was a measurable share of a speculative step's host time on a GPU)
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


def _take(t: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """``t``'s rows ``rows`` (an index_select)."""
    return t.index_select(0, torch.tensor(rows, device=t.device))


# ---- provenance ------------------------------------------------------------------------------------------

def default_chunk(device, rows: int, speculative: bool = False) -> int:
    """Steps per chunk (inputs generated, errors drained to the host, outputs checked once per chunk):
    64 on a CPU; on a GPU at least 2,048 row-steps per chunk in standard decode (a power of two times
    64, so graph pieces repeat from chunk to chunk), since each chunk boundary waits for the device;
    64 in a speculative schedule, whose pieces are mostly one step (up to four graphs per chunk
    step: with 256 steps a cell spent its first seconds capturing on an H200, and KDA ran slower than
    with 64; unrecorded) and whose steps take
    milliseconds, beside which a chunk boundary's wait is small."""
    if torch.device(device).type != "cuda" or speculative:
        return 64
    k = 64
    while k * rows < 2048:
        k *= 2
    return k


