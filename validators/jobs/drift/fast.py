"""The fast path of a drift cell: the numbers of ``Lockstep.step`` + ``CellRun`` with a tenth of the host work.

Oracle: the slow path (:meth:`replayssm.validators.jobs.drift.sweep.CellRun.run_steps` with ``fast=False``,
i.e. :meth:`Lockstep.step` every step).  Expected difference: none -- the cell results, the
checkpoints and the failures are bit for bit the same (tests/jobs/test_drift_fast.py compares them),
except the traceback text when the kernel raises.  How it stays bit-identical while doing less:

* inputs of a whole chunk of steps come from one call (:func:`make_inputs_steps`: the same words,
  exact integer and elementwise IEEE ops, so the same bits), upcast to fp64 once per chunk;
* the fp64 reference is the family's own step (``Family.reference_prepare`` for the whole chunk,
  exact elementwise ops only, then ``Family.reference_advance`` per token: what ``reference_step``
  runs), so every value is rounded as before; the shadow state (one flush's injected error) skips
  the output it never uses.  On a CUDA device (``fused``, ``hoist``): the step's fused form
  (``Family.reference_advance_fused``: the full-state passes in one Triton pass, the same bits) and
  its state-independent elementwise terms for the whole chunk at once (``Family.reference_hoist``:
  the same bits on a GPU, whose elementwise math does not depend on the tensor's shape; not on a
  CPU, so not there by default);
* the flush checkpoint of a Triton kernel is read by its ``launch_checkpoint`` (a device gather, no
  host sync); row index lists live on the device;
* the output error ``||out - ref|| / ||ref||`` per (row, position) is ``metrics.rel_l2_into``
  (``error_metrics``'s ``rel_l2``), written into a per-chunk buffer (the drift drain moves it to the
  host once per chunk);
* the exact output checks (NaN poison left, non-finite outputs) are not a host sync per step:
  an unwritten or non-finite output makes that position's error non-finite, and the chunk's
  errors are looked at once, at the end of each run call; only a flagged step is checked
  element by element, on the output and reference it kept, with Lockstep's messages;
* the fp64 running-error bound (``checks/fp64_bound.py``, what judges drift's outputs on the
  slow path: no literal model) is the Lockstep's own ``RunningBound``, advanced per step on the
  host's schedule (it depends on the inputs, flushes and accepted counts only); the readout
  magnitudes it is scaled by are computed beside the reference (also inside a graph), and the
  ``output`` check runs, with its own code, on the steps whose errors exceed the bound once the
  chunk is looked at (the excess test batched over the chunk, the same elementwise bits).  With
  graphs (and ``static``) the bound's token coefficients are computed at chunk load and its
  recurrence over a piece's steps is one launch inside the piece
  (``replayssm/ops/triton/bound_scan.py``: the same bits as the window's torch expressions), on
  fixed buffers (flush masks filled by the host before a piece runs); eagerly on a GPU it is
  host-launched per step (~265 aten ops per step); eagerly on a CPU the coefficients are computed at
  chunk load token by token (the window's shapes: the same bits) and the recurrence runs on host
  arrays (``checks/fp64_bound_host.py``: the same IEEE operations in the same order, a NumPy call
  on ``[rows, heads]`` costing a fraction of a torch call's dispatch);
* a kernel with a raw launch path (``launch_verify``/``launch_commit``: the Triton Mamba-2
  kernels, the GDN and KDA ReplaySSM kernels) is called through it (no host checks, no sync);
  any other kernel through ``verify``/``commit`` (the interface path, as the slow path does);
* on a CUDA device and a raw-path kernel: the steps between two host events (a flush; a
  committed-state sample; the chunk's end) are captured in a CUDA graph on their second occurrence
  and replayed after (the step's position in the chunk is static, the chunk's inputs are refilled
  in place), so a step costs no host launches.  In speculative decode a piece is mostly one step
  (some row flushes at almost every verify), so there is a graph per chunk step; which rows keep
  which window position is chosen by the device masks of the accepted counts, never by a host
  branch a graph would freeze: each row's state is written in place into the piece's fixed buffer
  at the one token it keeps -- by the fused reference pass itself (``keep``), else copied after it
  (``replayssm/ops/triton/row_copy.py``); the same values as ``torch.where``, which moves them
  exactly but made three state-sized passes per token -- and the flushed rows of the reference
  before a piece's last step are kept for the flush measurement (a speculative replay's
  checkpoint holds the state before its verify).  The flush itself is measured in the piece: the
  checkpoint read there, the flushed rows' errors and the armed rows' local errors written in
  place into per-chunk buffers under device masks (``metrics.row_rel_l2_masked``: each row summed
  in one fixed order whatever the other rows, so the slow path's bits for its selected rows), then
  the flushed rows' shadow re-seeded from the checkpoint and advanced over the step where a row is
  armed after it; the host only books the rows.  The masks a piece reads are computed for a whole
  chunk's walk and copied to the device once.  With the fused reference, the shadow's steps in a
  piece compute only the rows armed to measure a flush that still have the token: no other row's
  shadow is read before a flush re-seeds it.  ``graphs=False`` runs the same code eagerly (the
  flush measured on the host); ``static`` runs the graphs' pieces on their fixed buffers, eagerly
  (what the CPU tests check).

The machinery of running blocks of steps (the device step, graph capture and replay, the fp64 bound over a
block, the deferred output checks) is the engine's (``validators/engine/captured.py``,
``CapturedExecution``); ``FastCell`` allocates the buffers and keeps the drift-only work (the shadow, the
flush and local errors, the state samples, the pieces' flush measurement).

A cell qualifies when its Lockstep runs without the literal model, invariants, state checks,
metrics or digest (the drift configuration), every slot is used, no row is padding, and no step
resets a row; otherwise ``CellRun`` keeps the slow path.
"""

from __future__ import annotations

import numpy as np
import torch

from replayssm.ops.triton.bound_scan import bound_scan
from replayssm.ops.triton.row_copy import can_copy_rows, copy_rows
from replayssm.validators.engine import invariants as inv
from replayssm.validators.engine.captured import CapturedExecution, ChunkReference, raw_checkpoint, raw_path
from replayssm.validators.engine.cursor_table import CursorTable
from replayssm.validators.engine.metrics import row_rel_l2_masked


def qualifies(cell) -> str | None:
    """Why ``cell`` cannot take the fast path, or None."""
    ls, sc = cell.ls, cell.sc
    if ls.literal is not None or ls.invariants_every or ls.state_every or ls.record_metrics or ls.digest is not None:
        return "the Lockstep runs the literal model, invariants, state checks, metrics or a digest"
    if ls.pad_rows or sc.unused_slots:
        return "padding rows or unused slots"
    if any(p.reset_rows for p in cell.plans):
        return "a step resets rows"
    return None


class FastCell(CapturedExecution):
    """Drives a :class:`CellRun` on the fast path (see the module docstring).  ``graphs``: capture
    CUDA graphs (None: when the device is CUDA, the decode standard and the kernel has a raw path).
    ``static``: run the steps between host events on the fixed buffers a graph would capture, but
    eagerly (what tests check on a CPU; implied by ``graphs``)."""

    def __init__(self, cell, graphs: bool | None = None, static: bool = False, fused: bool | None = None,
                 hoist: bool | None = None) -> None:
        why = qualifies(cell)
        if why:
            raise ValueError(f"cell: {cell.spec.id} cannot take the fast path ({why})")
        self.cell = cell
        self.plans = cell.plans
        ls = cell.ls
        super().__init__(ls, cell.chunk, cell.spec.speculative, graphs=graphs, static=static, fused=fused,
                         hoist=hoist, checked=cell.step)
        K, R, T, dev = self.K, self.R, self.T, self.dev
        self.ids_host = ls.ids.tolist()
        # the host's cursor walk over every row at once (the policy's rules as tables: the same answers)
        self.cursors = CursorTable(ls.dec, ls.staged)
        self.act = np.asarray(ls.active, dtype=np.int64)
        self.act_mask = np.zeros(R, dtype=bool)
        self.act_mask[self.act] = True
        self.wp_host = np.zeros(R, dtype=np.int64)  # ls.wp / ls.origin as arrays (synced at each run call)
        self.origin_host = np.zeros(R, dtype=np.int64)
        self.traj_at = None  # first step of the cursor trajectory below (None: to walk)
        self.traj_wp = self.traj_origin = self.traj_flush = None  # [n + 1, R], [n + 1, R], [n, R]
        self.pieces = 0  # pieces run (replayed, captured or eager)
        self.reseeds = 0  # pieces that re-seeded the shadow at a speculative flush (flush_in_graph)
        self.measured = 0  # pieces that measured their flush in the piece (flush_in_graph)
        if self.graphs:
            self.ref_buf = ls.ref.clone()
            self.shadow_buf = cell.shadow.clone()
            self.ref_prev_buf = ls.ref.clone() if self.spec else None  # the reference before a piece's last step
        # A speculative replay's flush: with graphs it runs inside the piece (device masks: the same values).  The
        # checkpoint is read there, the flushed rows' errors (against the reference before the step) and the armed
        # ones' local errors (against the shadow) measured in place into per-chunk buffers (metrics'
        # row_rel_l2_masked: each row's bits whatever the other rows), the flushed rows' shadow re-seeded from the
        # checkpoint and advanced over the step's tokens where a row is armed after it.  The host only books them.
        self.flush_in_graph = self.graphs and self.spec and not cell.ck_after and self.raw_ck
        if self.flush_in_graph:
            self.flush_err = torch.empty((K, R), dtype=torch.float64, device=dev)
            self.local_err = torch.empty((K, R), dtype=torch.float64, device=dev)
            self.local_mask = torch.zeros((K, R), dtype=torch.bool, device=dev)  # flushed and armed before it
        self.arange_T_host = np.arange(T).reshape(T, 1)
        self.traj_armed = self.traj_after = None  # [n, R]: rows armed before each step; after its flushes

    @property
    def steps_done(self) -> int:
        """The steps run (the cell's)."""
        return self.cell.step

    # ---- chunks ----------------------------------------------------------------------------------------------
    def _load_chunk(self, at: int) -> None:
        """Chunk ``at`` into the buffers: its inputs (unless :meth:`_load_inputs` queued them already) and
        the output buffer's poison."""
        if self.inputs_at != at:
            self._load_inputs(at)
        self.out.view(inv._INT_VIEW[self.out.element_size()]).fill_(inv.poison_bits(self.out.dtype))
        self.chunk_at = at

    def _load_inputs(self, at: int) -> None:
        """The input side of chunk ``at`` (:meth:`CapturedExecution._load_block`), the host's cursor walk
        done once its accepted counts are known -- buffers the previous chunk's output checks never read,
        so this is queued on the device behind the previous chunk's steps before the host waits for their
        checks (the host's share of it then overlaps the device's)."""
        cell = self.cell
        plans = cell.plans[at:min(at + self.K, cell.n_steps)]
        n = len(plans)

        def walk() -> None:
            self.cursors.check(self.wp_host[:0], None, self.acc_host[:n])
            if at <= cell.step < at + n:  # the host's cursors are this chunk's: walk them now
                self._walk(at)
        self._load_block(plans, walk)
        self.inputs_at = at

    # ---- device work ----------------------------------------------------------------------------------------
    def _piece_static(self, j0: int, flags: tuple[bool, ...], ks: list[np.ndarray], ss: list[int],
                      reseed: bool = False, measure: bool = False) -> None:
        """Chunk steps ``j0..`` on the static reference and shadow buffers (what a graph captures);
        ``measure``: the last step is a speculative replay's flush, measured here (``flush_in_graph``): the
        checkpoint read, the flushed rows' errors into ``flush_err`` and the armed ones' into ``local_err``;
        ``reseed``: some row is armed after it, so the flushed rows are re-seeded from the checkpoint
        (``flush_mask``) and the shadow advanced over the step's tokens."""
        ref, sh = self.ref_buf, self.shadow_buf
        for i, f in enumerate(flags):
            if self.spec and i == len(flags) - 1:  # a speculative flush measures the state before its step
                self._copy_flushed(self.ref_prev_buf, ref, j0 + i)
            ref, new_sh = self._device_step(j0 + i, ref, sh if f else None, ks[i], ss[i])
            if f:
                sh = new_sh
        if ref is not self.ref_buf:  # a speculative piece kept its rows in ref_buf in place (_keep)
            self.ref_buf.copy_(ref)
        if measure:
            j = j0 + len(flags) - 1
            ck = self.ls.kernel.launch_checkpoint(self.ls.ids)
            row_rel_l2_masked(ck, self.ref_prev_buf, self.flush_mask[j], self.flush_err[j])
            row_rel_l2_masked(ck, sh, self.local_mask[j], self.local_err[j])  # the shadow before the re-seed
            if reseed:
                sh = self._advance(self._reseed(sh, ck, self.flush_mask[j]), j, ks[-1], static=True,
                                   live=1 if self.live_rows else None)
        if (any(flags) or reseed) and sh is not self.shadow_buf:
            self.shadow_buf.copy_(sh)
        if self.bound is not None:  # the piece's bound in one launch (the flush masks were filled for it)
            bound_scan(self.bound_state, self.coef_buf, self.w_buf, self.flush_mask,
                       self.acc if self.ls.dec.speculative else None, self.fp_out, j0, len(flags),
                       constants=self.bound_consts, replay=self.bound.replay)

    def _copy_flushed(self, dst: torch.Tensor, src: torch.Tensor, j: int) -> torch.Tensor:
        """``dst`` holding ``src``'s rows that flush at chunk step ``j`` (``flush_mask[j]``): the only rows the
        host's flush measurements (``_events``) and the re-seed read of the state before the step, the
        checkpoint read and the shadow before the re-seed; a plain copy where ``copy_rows`` cannot take
        them."""
        if src.dtype == dst.dtype and can_copy_rows(dst, src):
            return copy_rows(dst, src, self.flush_mask[j])
        return dst.copy_(src)

    def _reseed(self, sh: torch.Tensor, ck: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The shadow ``sh`` with the flushed ``rows`` (``[R]`` bool) re-seeded from the checkpoint ``ck``
        (upcast to fp64): in place where ``sh`` is the fixed shadow buffer and ``copy_rows`` takes ``ck``'s
        dtype, else ``torch.where`` (the same values)."""
        if sh is self.shadow_buf and can_copy_rows(sh, ck):
            return copy_rows(sh, ck, rows)
        return torch.where(rows.view(self.R, *([1] * (sh.dim() - 1))), ck.to(torch.float64), sh)

    # ---- host bookkeeping (Lockstep.step and CellRun.run_steps, without the device work) ----------------------
    def _walk(self, at: int) -> None:
        """The cursors before every remaining step of chunk ``at`` (its accepted counts in ``acc_host``), from
        ``cell.step`` on (and after its last), and which rows each step flushes: the host's cursor walk, once
        per chunk (or resume), done as the chunk's inputs are queued (the device still busy with the last)."""
        cell = self.cell
        i0 = cell.step - at
        n = min(at + self.K, cell.n_steps) - cell.step
        wp, origin, fl = self.cursors.walk(self.wp_host, self.origin_host, self.acc_host[i0:i0 + n], self.act_mask)
        self.traj_at, self.traj_wp, self.traj_origin, self.traj_flush = cell.step, wp, origin, fl
        self.traj_armed, self.traj_after = self._arming(fl)
        self._fill_masks(i0, fl, self.acc_host[i0:i0 + n])

    def _arming(self, fl: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For the walk's flush masks ``fl [n, R]``: the rows armed before each step and after its flushes
        (what :meth:`_events` will make of ``cell.armed``, ``cell.flushes`` flush by flush)."""
        cell = self.cell
        armed, flushes = cell.armed.copy(), cell.flushes.copy()
        before, after = np.empty_like(fl), np.empty_like(fl)
        for i in range(len(fl)):
            before[i] = armed
            if fl[i].any():
                armed = self._armed_after(fl[i], armed, flushes)
                flushes[fl[i]] += 1
            after[i] = armed
        return before, after

    def _fill_masks(self, j0: int, fl: np.ndarray, acc: np.ndarray) -> None:
        """The device masks of chunk steps ``j0..`` from the walk, in one asynchronous copy from one pinned
        buffer (no host sync): the flush rows (``flush_mask``: the bound and the re-seed read them), the
        flushed rows armed before (``local_mask``: whose local error a piece measures) and the shadow's live
        rows per token (``live``: armed and the token accepted; [1]: after the step's flushes)."""
        n = len(fl)
        parts = [(self.flush_mask[j0:j0 + n], fl)]
        if self.flush_in_graph:
            parts.append((self.local_mask[j0:j0 + n], fl & self.traj_armed))
        if self.live_rows:
            tok = acc[:, None, :] > self.arange_T_host[None]
            parts.append((self.live[0, j0:j0 + n], self.traj_armed[:, None, :] & tok))
            parts.append((self.live[1, j0:j0 + n], self.traj_after[:, None, :] & tok))
        host = self._pinned(torch.from_numpy(np.concatenate([a.ravel() for _, a in parts])))
        o = 0
        for dst, a in parts:
            dst.copy_(host[o:o + a.size].view(a.shape), non_blocking=True)
            o += a.size

    def _book_piece(self, steps: list[int]) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """Host effects of a piece's steps (``Lockstep.step``'s bookkeeping, all rows and steps at once:
        cursors, coverage, phases, tokens, the output errors' pending entries) up to its last step, whose
        (position before, accepted, flush rows) it returns for :meth:`_events`."""
        cell, ls, sc, a = self.cell, self.ls, self.sc, self.act
        n, i0, j0 = len(steps), steps[0] - self.traj_at, steps[0] - self.chunk_at
        wp, origin = self.traj_wp[i0:i0 + n], self.traj_origin[i0:i0 + n]
        fl = self.traj_flush[i0:i0 + n]
        k = self.acc_host[j0:j0 + n].copy()
        for i in range(n):  # the fp64 bound's per-step work (only a piece's last step flushes)
            self._bound_step(j0 + i, np.flatnonzero(fl[i]).tolist())
        ls.book_verifies(wp, origin, fl, k)
        ls.tokens_verified += n * len(a) * sc.window
        ls.tokens_accepted += int(k[:, a].sum())
        ls.step_idx += n
        self.wp_host[:], self.origin_host[:] = self.traj_wp[i0 + n], self.traj_origin[i0 + n]
        ls.wp[:], ls.origin[:] = self.wp_host.tolist(), self.origin_host.tolist()
        pos = cell.pos.copy()
        for i in range(n):
            cell.pending.append(("out", self.rel_v[j0 + i], pos, k[i]))
            if i < n - 1:
                pos = pos + k[i]
        cell.pos[:] = pos  # the last step's accepted tokens are added by _events
        return pos, k[-1], np.flatnonzero(fl[-1]).tolist()

    def _events(self, j: int, flush_rows: list[int], pos_before: np.ndarray, k: np.ndarray,
                ref_before: torch.Tensor, measured: bool = False) -> None:
        """The rest of ``CellRun.run_steps`` for a step: flush and state measurements (``measured``: the
        piece measured the flush and did its shadow work, ``_piece_static``; the host books them)."""
        cell, ls = self.cell, self.ls
        if flush_rows and measured:
            # the rows' errors, measured in place into the chunk's buffers (the drain takes these rows); the
            # shadow of a flushed row armed after it was re-seeded in the piece; any other flushed row's
            # shadow is not read before a later flush re-seeds it (the one that arms it), so it is left
            at = pos_before[flush_rows]
            cell.pending.append(("flush", (self.flush_err[j], flush_rows), cell.flushes[flush_rows] + 1, at.copy()))
            armed = [r for r in flush_rows if cell.armed[r]]
            if armed:
                cell.pending.append(("local", (self.local_err[j], armed), cell.flushes[armed] + 1))
            armed_after = self._armed_after(flush_rows)
            cell.flushes[flush_rows] += 1
            cell.armed = armed_after
            return cell.sample_states(k, self._take)
        ck = None
        if flush_rows and self.raw_ck:
            ck = ls.kernel.launch_checkpoint(ls.ids)
        # the shadow of a step without a flush was advanced by the device step (its flag)
        cell.measure_step(k, flush_rows, pos_before, ref_before,
                          lambda: self._set_shadow(self._advance(cell.shadow, j, k)), shadow_stepped=True,
                          checkpoint=ck, take=self._take, reseed=self._reseed_rows)

    def _reseed_rows(self, ck: torch.Tensor, rows: list[int]) -> None:
        """The shadow's ``rows`` re-seeded from the checkpoint ``ck`` (in place on the fixed buffers)."""
        cell = self.cell
        if self._all_rows(rows, ck):  # every row re-seeded: a plain copy (the same values)
            if self.graphs:
                cell.shadow.copy_(ck)
            else:
                cell.shadow = ck.to(torch.float64)
        else:
            idx = self._idx(rows)
            src = ck.index_select(0, idx).to(torch.float64)
            if self.graphs:
                cell.shadow.index_copy_(0, idx, src)
            else:
                cell.shadow = cell.shadow.index_copy(0, idx, src)

    def _armed_after(self, flush_rows, armed: np.ndarray | None = None, flushes: np.ndarray | None = None
                     ) -> np.ndarray:
        """Which rows are armed (their shadow measures a flush's local error) once ``flush_rows`` (a list or
        a mask) flush, from ``armed`` and ``flushes`` (default: the cell's)."""
        cell = self.cell
        armed = (cell.armed if armed is None else armed).copy()
        flushes = cell.flushes if flushes is None else flushes
        armed[flush_rows] = (flushes[flush_rows] + 1) % cell.cfg.local_every == 0
        return armed

    def _set_shadow(self, new: torch.Tensor) -> None:
        if self.graphs:
            self.cell.shadow.copy_(new)
        else:
            self.cell.shadow = new

    def _due_steps(self, pos: np.ndarray) -> np.ndarray:
        """For positions ``pos [steps, R]``: whether some active row has a committed-state sample due."""
        cell, a = self.cell, self.act
        ns, tg = cell.next_sample[a], cell.targets
        left = ns < len(tg)
        if not left.any():
            return np.zeros(pos.shape[0], dtype=bool)
        return (pos[:, a[left]] >= tg[ns[left]]).any(1)

    # ---- the loop ----------------------------------------------------------------------------------------------
    def _sync_static(self) -> None:
        """Graph mode: the reference and shadow live in fixed buffers (after a resume they were replaced)."""
        ls, cell = self.ls, self.cell
        if ls.ref is not self.ref_buf:
            self.ref_buf.copy_(ls.ref)
            ls.ref = self.ref_buf
        if cell.shadow is not self.shadow_buf:
            self.shadow_buf.copy_(cell.shadow)
            cell.shadow = self.shadow_buf
        if self.bound is not None and self.bound.cur is not self.bound_buf:
            self._keep_bound_static()

    def _piece(self, end: int) -> tuple[list[int], list[bool], bool, bool]:
        """The steps from ``cell.step`` up to the next host event (a flush, a state sample, the chunk's
        end, ``end``), whether each advances the shadow, whether the piece measures its last step's
        flush (``flush_in_graph``) and whether it re-seeds the shadow there (a row armed after it).  The
        device masks it reads (flushes, live rows) were filled for the whole walk (:meth:`_walk`)."""
        cell = self.cell
        stop = min(end, self.chunk_at + self.K, cell.n_steps)
        if self.traj_at is None or not self.traj_at <= cell.step < self.traj_at + len(self.traj_flush) \
                or not np.array_equal(self.traj_armed[cell.step - self.traj_at], cell.armed):
            self._walk(self.chunk_at)  # (also where the rows armed are not the walk's: a cell given new ones)
        i0, m = cell.step - self.traj_at, stop - cell.step
        j0 = cell.step - self.chunk_at
        fls = self.traj_flush[i0:i0 + m]
        # the first step that flushes or makes a committed-state sample due ends the piece (graphs: else 1 step)
        ends = fls.any(1) | self._due_steps(cell.pos + np.cumsum(self.acc_host[j0:j0 + m], 0))
        n = (int(np.argmax(ends)) + 1 if ends.any() else m) if self.graphs else 1
        steps = list(range(cell.step, cell.step + n))
        armed = bool(cell.armed.any())  # armed changes at a flush only: the piece's last step
        flags = [armed and not f for f in fls[:n].any(1).tolist()]
        measure = bool(self.flush_in_graph and fls[n - 1].any())
        reseed = bool(measure and self.traj_after[i0 + n - 1].any())
        return steps, flags, reseed, measure

    def run(self, n: int) -> int:
        """``CellRun.run_steps(n)`` on the fast path."""
        cell = self.cell
        before = int(np.minimum(cell.pos, cell.cfg.tokens).sum())
        end = min(cell.n_steps, cell.step + n)
        if cell.step != self.checked:  # resumed from a checkpoint: reload the chunk
            self.chunk_at, self.inputs_at, self.checked = None, None, cell.step
        if self.graphs:
            self._sync_static()
        self.wp_host[:], self.origin_host[:] = self.ls.wp, self.ls.origin  # a resume may have replaced them
        if self.traj_at is not None and not (
                self.traj_at <= cell.step < self.traj_at + len(self.traj_flush)
                and np.array_equal(self.traj_wp[cell.step - self.traj_at], self.wp_host)
                and np.array_equal(self.traj_origin[cell.step - self.traj_at], self.origin_host)):
            self.traj_at = None  # the walk no longer describes these cursors
        self.cursors.check(self.wp_host, self.origin_host)  # then the closed tables keep them valid
        while cell.step < end and cell.exception is None:
            at = cell.step - cell.step % self.K
            if self.chunk_at != at:
                self._check_outputs()
                self._load_chunk(at)
                self.checked = cell.step
            steps, flags, reseed, measure = self._piece(end)
            self.pieces += 1
            j0 = steps[0] - at
            ks = [self.acc_host[s - at].copy() for s in steps]
            ss = [cell.plans[s].step for s in steps]
            # the reference before the piece's last step (a speculative replay's flush checkpoint holds it)
            ref_before = self.ref_prev_buf if self.graphs and self.spec else self.ls.ref
            try:
                if self.graphs:
                    self._run_graphed(j0, tuple(flags), ks, ss, reseed, measure)
                    self.reseeds += reseed
                    self.measured += measure
                else:
                    new_ref, new_sh = self._device_step(j0, self.ls.ref, cell.shadow if flags[0] else None,
                                                        ks[0], ss[0])
                    self.ls.ref = new_ref
                    if flags[0]:
                        cell.shadow = new_sh
            except Exception as e:  # noqa: BLE001 - a kernel error ends the cell and is reported
                cell.stop(e)
                break
            pos_before, k, flush_rows = self._book_piece(steps)
            self._events(steps[-1] - at, flush_rows, pos_before, k, ref_before, measure)
            cell.step += len(steps)
            if cell.step % cell.chunk == 0:
                if cell.step < cell.n_steps:  # the next chunk's inputs queued before the host waits for this one's
                    self._load_inputs(cell.step)
                self._check_outputs()
                cell._drain()
        self._check_outputs()
        if cell.done:
            cell._drain()
        return int(np.minimum(cell.pos, cell.cfg.tokens).sum()) - before


__all__ = ["ChunkReference", "FastCell", "qualifies", "raw_checkpoint", "raw_path"]
