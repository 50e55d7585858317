"""The literal ReplaySSM and baseline bookkeeping, shared by both families' ``naive.py``.

Oracle: docs/recurrences.md sections 2-4 read line by line.  Cursors live on the host as plain ints; every
rounding the precision mode names happens exactly where the mode says: the checkpoint is stored
in the state dtype (fp8/int8 with a per-row fp32 scale, stochastic rounding when asked), buffer
records in the activation dtype (decay records in the compute dtype: fp32, fp64 for s64a64),
outputs in the activation dtype; all arithmetic is fp32 (fp64 for the reference mode).
At ``s64a64`` these models equal the fp64 token-by-token recurrence to ~1e-12
(tests/core/test_literal_models.py).

A family plugs in through a :class:`FamilyMath` object (see ``ops/mamba2/naive.py``).

Row batching (issue 18): the rows of one call with equal (write_pos, T'_r) run as one batched
call of the family's ``window_rows`` / ``fold_rows`` twin when it has one; the per-row loops
(``_verify_rows``, ``_committed_rows``) are the reference it equals bit for bit on the CPU
(tests/core/test_literal_rows.py) and run variants, mutants and ``vectorised = False``.  On a GPU the
batched call is the same arithmetic in the same order per element; a reduction's blocking may
differ from the per-row call's, so there it equals the loop to fp32 rounding (the literal model is
the tolerance rule's measure of a mode's error, not a bit pattern any kernel must match; the
per-row loop on a GPU is a launch-bound Python loop over rows and heads at every step).

Serving-engine behaviour (issue 14): both models accept k = 0 as a no-op commit
(``zero_accept = "noop"``, speculative decode) and ragged windows (``window_lens``: row r
verifies only its first T'_r positions, writes only their outputs and records), the packed
layout (``query_start_loc``: unpacked into the padded layout with window lengths, outputs packed
back; spare tokens untouched) and standard steps on a speculative object (``supports_mixed_decode``:
a one-token verify is a window of length 1 in the same ring).  The replay model's bookkeeping is
the policy named by its class attribute ``implements`` (the `spec` policy by default):
:class:`LiteralFlushWhenFullKernel`, :class:`LiteralFoldEveryCommitKernel`,
:class:`LiteralHostCursorsKernel` and :class:`LiteralFoldAtCommitKernel` are the literal models
of the other policies of
``replayssm.interface.POLICIES``.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import torch

from replayssm.conventions import conv_kwargs
from replayssm.interface import PAD_SLOT, DecodeConfig, KernelConfig, KernelSnapshot, KernelUnderTest
from replayssm.ops.committed import committed_rows_fp64
from replayssm.precision import PrecisionMode
from replayssm.rounding import dequantize_state, philox_generator, quantize_state


@dataclass
class WindowResult:
    """What a family computes for one row's verify window (all in the compute dtype)."""

    outputs: torch.Tensor  # [T', *out_shape]
    records: dict[str, torch.Tensor]  # name -> [T', *record_shape], before rounding to storage
    state_before: torch.Tensor  # state after the committed history (before the window)
    state_after_first: torch.Tensor  # state after window position 0


class FamilyMath(abc.ABC):
    """The family-specific arithmetic of a ReplaySSM kernel.

    Optional: ``error_coefficients(tok, params, heads) -> {rho, c[, p, q][, dL]}``, the family's
    running-error model of one token, state-free (``validators/engine/checks/fp64_bound.py`` reads it as
    ``rho M + c`` for the new state's norm bound, ``p (q + rho M)`` for the rounded records' size);
    a family without it keeps the literal model on every step of a validation."""

    @abc.abstractmethod
    def record_layout(self, geometry) -> dict[str, tuple[tuple[int, ...], str]]:
        """name -> (per-token shape, 'act' | 'decay'); 'decay' records are kept in compute dtype."""

    @abc.abstractmethod
    def fold(self, s0: torch.Tensor, hist: dict[str, torch.Tensor], params: dict[str, torch.Tensor],
             mode: PrecisionMode) -> torch.Tensor:
        """The state after folding the history records into checkpoint ``s0``."""

    @abc.abstractmethod
    def window(self, s0: torch.Tensor, hist: dict[str, torch.Tensor], win: dict[str, torch.Tensor],
               params: dict[str, torch.Tensor], mode: PrecisionMode, options: dict) -> WindowResult:
        """Outputs and records for the window tokens ``win`` (each ``[T', ...]``)."""

    @abc.abstractmethod
    def step(self, s: torch.Tensor, tok: dict[str, torch.Tensor], params: dict[str, torch.Tensor]
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """One baseline recurrence step (docs/recurrences.md section 1): (output, new state), in the dtype of ``s``."""

    # A family whose math has a row-batched twin sets this and defines ``fold_rows(s0, hist, params,
    # mode)`` and ``window_rows(s0, hist, win, params, mode, options, need_before=True, conv=...)``:
    # the same arithmetic as :meth:`fold` / :meth:`window` on a leading row axis (rows of one call
    # with equal history and window lengths; ``state_before`` None when not ``need_before``), bit
    # for bit (tests/core/test_literal_rows.py).  A subclass that overrides a per-row method (a variant,
    # a mutant) runs per row (:meth:`rows_batchable`).
    batches_rows: bool = False

    def rows_batchable(self) -> bool:
        """Whether the row-batched twin computes what this object's per-row methods compute: the
        class that declared ``batches_rows`` defines the twin and owns every per-row method it mirrors."""
        owner = next((c for c in type(self).__mro__ if c.__dict__.get("batches_rows")), None)
        return (owner is not None and all(m in owner.__dict__ for m in ("fold_rows", "window_rows"))
                and all(getattr(type(self), m, None) is getattr(owner, m, None)
                        for m in ("record_layout", "fold", "window", "decays", "solve", "gates")))


class _LiteralBase(KernelUnderTest):
    """Storage and checks common to the literal replay and baseline models."""

    math: FamilyMath
    zero_accept = "noop"
    supports_ragged_windows = True
    supports_packed_layout = True
    supports_mixed_decode = True
    supports_strided_views = True  # every read and write goes through torch indexing, any strides
    # The bookkeeping policy this model's code implements (what it declares is ``bookkeeping``;
    # the two differ only in tests that check a wrong declaration is caught).
    implements: str = "spec"

    def __init__(self, config: KernelConfig) -> None:
        super().__init__(config)
        if self.decode.policy != self.implements:
            self.decode = self.decode.with_policy(self.implements)
        m, dev, S = self.mode, self.device, self.num_slots
        self.ct = m.compute_dtype
        self.params = {k: v.to(device=dev, dtype=torch.float32).to(self.ct) for k, v in config.params.items()}
        self.ckpt = torch.zeros((S, *self.state_shape), dtype=m.state_dtype, device=dev)
        self.ckpt_scale = (torch.ones((S, *self.state_shape[:-1]), dtype=torch.float32, device=dev)
                           if m.scaled_state else None)
        self.write_pos = [0] * S
        self.origin = [0] * S
        self.ready = [False] * S
        self.pending = [False] * S
        self.flushed = [False] * S
        self.win_len = [self.decode.window] * S  # window length of each slot's last verify
        self.calls = 0

    # ---- storage helpers -------------------------------------------------------------------------------
    def _generator(self, slot: int) -> torch.Generator | None:
        if self.mode.rounding != "stochastic":
            return None
        return philox_generator(self.mode.seed, slot, self.calls)

    def _store_state(self, slot: int, s: torch.Tensor, target: torch.Tensor, target_scale) -> None:
        stored, scale = quantize_state(s, self.mode, self._generator(slot))
        target.copy_(stored)
        if target_scale is not None:
            target_scale.copy_(scale)

    def _load_checkpoint(self, slot: int) -> torch.Tensor:
        scale = None if self.ckpt_scale is None else self.ckpt_scale[slot]
        return dequantize_state(self.ckpt[slot], scale, self.ct)

    def _row_inputs(self, inputs: dict[str, torch.Tensor], r: int) -> dict[str, torch.Tensor]:
        return {k: v[r].to(self.ct) for k, v in inputs.items()}

    def reset(self, slot_ids, initial_state=None, origin=None) -> None:
        ids = self.check_reset_args(slot_ids, initial_state, origin)
        origins = origin.tolist() if origin is not None else [0] * len(ids)
        for r, s in enumerate(ids):
            if s == PAD_SLOT:
                continue
            init = (initial_state[r].to(self.ct) if initial_state is not None
                    else torch.zeros(self.state_shape, dtype=self.ct, device=self.device))
            scale = None if self.ckpt_scale is None else self.ckpt_scale[s]
            self._store_state(s, init, self.ckpt[s], scale)
            self.write_pos[s], self.origin[s] = 0, int(origins[r])
            self.ready[s], self.pending[s], self.flushed[s] = True, False, False
            self._reset_slot(s)

    def _reset_slot(self, slot: int) -> None:
        """Hook for per-slot storage a subclass keeps."""

    def checkpoint_state(self, slot_ids) -> torch.Tensor:
        ids = self._check_slot_ids(slot_ids)
        out = torch.full((len(ids), *self.state_shape), float("nan"), dtype=torch.float64, device=self.device)
        for r, s in enumerate(ids):
            if s != PAD_SLOT:
                out[r] = self._load_checkpoint(s).to(torch.float64)
        return out

    supports_restore = True

    def _host_flags(self) -> dict[str, torch.Tensor]:
        return {"ready": torch.tensor(self.ready), "pending": torch.tensor(self.pending),
                "flushed": torch.tensor(self.flushed), "calls": torch.tensor([self.calls], dtype=torch.int64)}

    def _restore_common(self, snap: KernelSnapshot) -> None:
        if tuple(snap.checkpoint.shape) != tuple(self.ckpt.shape) or snap.checkpoint.dtype != self.ckpt.dtype:
            raise ValueError(f"snapshot.checkpoint: expected {self.ckpt.dtype} {tuple(self.ckpt.shape)}, got "
                             f"{snap.checkpoint.dtype} {tuple(snap.checkpoint.shape)}")
        self.ckpt.copy_(snap.checkpoint.to(self.device))
        if self.ckpt_scale is not None:
            self.ckpt_scale.copy_(snap.checkpoint_scale.to(self.device))
        self.write_pos = [int(v) for v in snap.write_pos.tolist()]
        self.origin = [int(v) for v in snap.origin.tolist()]
        self.ready = [bool(v) for v in snap.extra["ready"].tolist()]
        self.pending = [bool(v) for v in snap.extra["pending"].tolist()]
        self.flushed = [bool(v) for v in snap.extra["flushed"].tolist()]
        self.calls = int(snap.extra["calls"][0])

    def _row_window(self, inputs: dict[str, torch.Tensor], r: int, n: int) -> dict[str, torch.Tensor]:
        """Row r's first ``n`` window positions (its T'_r), in the compute dtype."""
        return {k: v[r, :n].to(self.ct) for k, v in inputs.items()}

    def _alloc_out(self, R: int, out, window: int | None = None):
        if out is None:
            out = torch.full((R, self.decode.window if window is None else window, *self.out_shape), float("nan"),
                             dtype=self.mode.act_dtype, device=self.device)
        return out

    def _load_cursors(self, ids: list[int], table) -> None:
        """Host-owned cursors: take each active slot's (write_pos, origin) from the caller's table."""
        if table is not None:
            for s in ids:
                if s != PAD_SLOT:
                    self.write_pos[s], self.origin[s] = table[s]

    def verify(self, slot_ids, inputs, out=None, window_lens=None, query_start_loc=None, cursors=None):
        """The padded layout (``_verify``), or the packed one: row r's tokens
        ``query_start_loc[r]..[r+1]-1`` unpacked into the padded layout with that window length,
        its outputs packed back into ``out`` (tokens past ``query_start_loc[R]`` untouched)."""
        ids = self._check_slot_ids(slot_ids)
        table = self.check_cursors(ids, cursors)
        if query_start_loc is None:
            self.check_verify_args(slot_ids, inputs, out, window_lens=window_lens)
            self._load_cursors(ids, table)
            return self._verify(slot_ids, inputs, out, window_lens)
        self.check_verify_args(slot_ids, inputs, out, window_lens=window_lens, query_start_loc=query_start_loc)
        n_tok = int(next(iter(inputs.values())).shape[0])
        lens = self.check_query_start_loc(ids, query_start_loc, n_tok)
        qs = [int(v) for v in query_start_loc.tolist()]
        R, T = len(ids), self.decode.window
        padded = {}
        for k, v in inputs.items():
            padded[k] = torch.zeros((R, T, *v.shape[1:]), dtype=v.dtype, device=v.device)
            for r, n in enumerate(lens):
                padded[k][r, :n] = v[qs[r]:qs[r] + n]
        self._load_cursors(ids, table)
        res = self._verify(slot_ids, padded, None, torch.tensor(lens, dtype=torch.int64, device=self.device))
        if out is None:
            out = torch.full((n_tok, *self.out_shape), float("nan"), dtype=self.mode.act_dtype, device=self.device)
        for r, n in enumerate(lens):
            out[qs[r]:qs[r] + n] = res[r, :n]
        return out


class LiteralReplayKernel(_LiteralBase):
    """Literal ReplaySSM: checkpoint + buffer (standard) or ring (speculative) of input records."""

    kind = "replay"

    def __init__(self, config: KernelConfig) -> None:
        super().__init__(config)
        rows = self.decode.ring_rows
        self.layout = self.math.record_layout(self.geometry)
        self.records = {
            name: torch.zeros((self.num_slots, rows, *shape),
                              dtype=self.mode.act_dtype if role == "act" else self.ct, device=self.device)
            for name, (shape, role) in self.layout.items()
        }

    def _row_of(self, slot: int, p: int) -> int:
        return (self.origin[slot] + p) % self.decode.ring_rows

    def _history(self, slot: int, n: int) -> dict[str, torch.Tensor]:
        rows = [self._row_of(slot, p) for p in range(n)]
        idx = torch.tensor(rows, dtype=torch.long, device=self.device)
        return {k: v[slot].index_select(0, idx).to(self.ct) for k, v in self.records.items()}

    # Row batching (issue 18): the rows of one call that share (write_pos, T'_r) run as one batched
    # call of the family's ``window_rows`` / ``fold_rows`` when it has them; the per-row loops
    # (``_verify_rows``, ``_committed_rows``) are the readable reference they equal bit for bit on the
    # CPU (tests/core/test_literal_rows.py) and run everything else (variants, ``vectorised = False``).
    vectorised: bool = True

    def _batches_rows(self) -> bool:
        hooks = ("_row_of", "_history", "_load_checkpoint", "_row_window")  # a mutant may override one
        return (self.vectorised and self.math.rows_batchable()
                and all(getattr(type(self), h) is getattr(LiteralReplayKernel, h) for h in hooks))

    def _groups(self, ids: list[int], key) -> dict:
        """Active rows grouped by ``key(r, slot)``: key -> (row indices, slot indices) as tensors."""
        groups: dict = {}
        for r, s in enumerate(ids):
            if s != PAD_SLOT:
                groups.setdefault(key(r, s), ([], []))
                groups[key(r, s)][0].append(r)
                groups[key(r, s)][1].append(s)
        dev = self.device
        return {k: (torch.tensor(rs, dtype=torch.long, device=dev), torch.tensor(ss, dtype=torch.long, device=dev))
                for k, (rs, ss) in groups.items()}

    def _load_checkpoints(self, slots: torch.Tensor) -> torch.Tensor:
        scale = None if self.ckpt_scale is None else self.ckpt_scale[slots]
        return dequantize_state(self.ckpt[slots], scale, self.ct)

    def _ring_rows(self, slots: torch.Tensor, start: int, n: int) -> torch.Tensor:
        """``[len(slots), n]`` ring rows of positions start..start+n-1 of each slot."""
        ring = self.decode.ring_rows
        return torch.tensor([[(self.origin[s] + p) % ring for p in range(start, start + n)] for s in slots.tolist()],
                            dtype=torch.long, device=self.device).reshape(len(slots), n)

    def _histories(self, slots: torch.Tensor, n: int) -> dict[str, torch.Tensor]:
        rows = self._ring_rows(slots, 0, n)
        return {k: v[slots[:, None], rows].to(self.ct) for k, v in self.records.items()}

    def _verify(self, slot_ids, inputs, out=None, window_lens=None):
        ids = self.check_verify_args(slot_ids, inputs, out, self.write_pos, self.ready, window_lens)
        T = self.call_window(inputs)
        lens = self.check_window_lens(ids, window_lens, T)
        out = self._alloc_out(len(ids), out, T)
        self.calls += 1
        (self._verify_batched if self._batches_rows() else self._verify_rows)(ids, inputs, out, lens)
        return out

    def _verify_rows(self, ids, inputs, out, lens) -> None:
        """The reference: one row at a time."""
        for r, s in enumerate(ids):
            if s == PAD_SLOT:
                continue
            wp, n = self.write_pos[s], lens[r]
            flush = self.decode.is_flush(wp)
            res = self.math.window(self._load_checkpoint(s), self._history(s, wp), self._row_window(inputs, r, n),
                                   self.params, self.mode, self.config.options, **conv_kwargs(self.config.conventions))
            out[r, :n].copy_(res.outputs.to(self.mode.act_dtype))
            # A flush that folds window position 0 (standard decode under the `spec` policy) keeps no record of it.
            if not (flush and self.decode.flush_folds_first):
                for t in range(n):
                    row = self._row_of(s, wp + t)
                    for name, rec in self.records.items():
                        rec[s, row].copy_(res.records[name][t].to(rec.dtype))
            if flush:
                folded = res.state_after_first if self.decode.flush_folds_first else res.state_before
                scale = None if self.ckpt_scale is None else self.ckpt_scale[s]
                self._store_state(s, folded, self.ckpt[s], scale)
            self.flushed[s], self.pending[s], self.win_len[s] = flush, True, n

    def _verify_batched(self, ids, inputs, out, lens) -> None:
        """:meth:`_verify_rows`, the rows of equal (write_pos, T'_r) as one batched call."""
        conv = conv_kwargs(self.config.conventions)
        for (wp, n), (rs, ss) in self._groups(ids, lambda r, s: (self.write_pos[s], lens[r])).items():
            flush = self.decode.is_flush(wp)
            res = self.math.window_rows(self._load_checkpoints(ss), self._histories(ss, wp),
                                        {k: v[rs, :n].to(self.ct) for k, v in inputs.items()},
                                        self.params, self.mode, self.config.options,
                                        need_before=flush and not self.decode.flush_folds_first, **conv)
            out[rs, :n] = res.outputs.to(self.mode.act_dtype)
            if not (flush and self.decode.flush_folds_first):
                rows = self._ring_rows(ss, wp, n)
                for name, rec in self.records.items():
                    rec[ss[:, None], rows] = res.records[name].to(rec.dtype)
            for i, s in enumerate(ss.tolist()):
                if flush:
                    folded = res.state_after_first[i] if self.decode.flush_folds_first else res.state_before[i]
                    scale = None if self.ckpt_scale is None else self.ckpt_scale[s]
                    self._store_state(s, folded, self.ckpt[s], scale)
                self.flushed[s], self.pending[s], self.win_len[s] = flush, True, n

    def _commit_rows(self, slot_ids, accepted) -> list[tuple[int, int]]:
        """The checked (slot, k) of every active row of a commit, before anything changes."""
        ids, ks = self.check_commit_args(slot_ids, accepted, self.pending, self.win_len)
        if not self.decode.speculative and any(k != 1 for s, k in zip(ids, ks) if s != PAD_SLOT):
            raise ValueError("accepted: standard decode commits exactly 1 token per row")
        return [(s, k) for s, k in zip(ids, ks) if s != PAD_SLOT]

    def commit(self, slot_ids, accepted) -> None:
        for s, k in self._commit_rows(slot_ids, accepted):
            self.write_pos[s], self.origin[s] = self.decode.commit_cursor(
                self.write_pos[s], self.origin[s], self.flushed[s], k)
            self.pending[s] = False

    def committed_state(self, slot_ids, cursors=None) -> torch.Tensor:
        ids = self._check_slot_ids(slot_ids)
        self._load_cursors(ids, self.check_cursors(ids, cursors))
        return self._committed_by_own_cursors(slot_ids)

    supports_materialize = True

    def materialize(self, slot_ids, upto, dst_slot_ids) -> None:
        """The fold of the checkpoint and the first ``upto[r]`` history records, stored as slot
        ``dst_slot_ids[r]``'s checkpoint (a fresh sequence: write_pos 0, origin 0)."""
        if not self.supports_materialize:  # a subclass that keeps no cursors of its own
            return super().materialize(slot_ids, upto, dst_slot_ids)
        for s, n, d in self.check_materialize_args(slot_ids, upto, dst_slot_ids, self.write_pos, self.ready):
            st = self.math.fold(self._load_checkpoint(s), self._history(s, n), self.params, self.mode)
            scale = None if self.ckpt_scale is None else self.ckpt_scale[d]
            self._store_state(d, st, self.ckpt[d], scale)
            self.write_pos[d], self.origin[d] = 0, 0
            self.ready[d], self.pending[d], self.flushed[d] = True, False, False
            self._reset_slot(d)

    def _committed_by_own_cursors(self, slot_ids) -> torch.Tensor:
        """The fold of each row's checkpoint and committed history by the cursors held now."""
        ids = self._check_slot_ids(slot_ids)
        if not self._batches_rows():
            out = torch.full((len(ids), *self.state_shape), float("nan"), dtype=torch.float64, device=self.device)
            return self._committed_rows(ids, out)
        return committed_rows_fp64(ids, self.write_pos, self.origin, self.decode.ring_rows, self.records,
                                   self._load_checkpoints,
                                   lambda s0, hist: self.math.fold_rows(s0, hist, self.params, self.mode),
                                   self.state_shape, self.device, dtype=self.ct)

    def _committed_rows(self, ids, out) -> torch.Tensor:
        """The reference of :meth:`_committed_by_own_cursors`: one row at a time."""
        for r, s in enumerate(ids):
            if s != PAD_SLOT:
                st = self.math.fold(self._load_checkpoint(s), self._history(s, self.write_pos[s]),
                                    self.params, self.mode)
                out[r] = st.to(torch.float64)
        return out

    def snapshot(self) -> KernelSnapshot:
        return KernelSnapshot(
            checkpoint=self.ckpt.detach().clone(),
            checkpoint_scale=None if self.ckpt_scale is None else self.ckpt_scale.detach().clone(),
            records={k: v.detach().clone() for k, v in self.records.items()},
            write_pos=torch.tensor(self.write_pos, dtype=torch.int64),
            origin=torch.tensor(self.origin, dtype=torch.int64),
            is_flush=torch.tensor([self.decode.is_flush(w) for w in self.write_pos], dtype=torch.bool),
            extra=self._host_flags(),
        )

    def restore(self, snapshot: KernelSnapshot) -> None:
        self._restore_common(snapshot)
        if set(snapshot.records) != set(self.records):
            raise ValueError(f"snapshot.records: expected keys {sorted(self.records)}, got {sorted(snapshot.records)}")
        for k, v in self.records.items():
            v.copy_(snapshot.records[k].to(self.device))


class LiteralFlushWhenFullKernel(LiteralReplayKernel):
    """Literal ReplaySSM under ``flush-when-full``: standard decode runs the speculative rule with
    T' = 1: a ring of next_pow2(L + 1) rows; the verify at write_pos = L (history full) folds the
    history only into the checkpoint and writes its token's record; then write_pos = 1 and the
    origin moves by L.  Speculative decode is the `spec` policy's rule."""

    implements = "flush-when-full"
    bookkeeping = "flush-when-full"
    description = "literal ReplaySSM, flush-when-full bookkeeping (standard decode as the speculative rule, T' = 1)"


class LiteralFoldEveryCommitKernel(LiteralReplayKernel):
    """Literal ReplaySSM under ``fold-every-commit``: no history is kept across steps; verify
    writes the window's records at rows 0..T'_r-1 and never flushes; commit(k) folds the first k
    records into the checkpoint (k = 0: nothing) and write_pos stays 0."""

    implements = "fold-every-commit"
    bookkeeping = "fold-every-commit"
    description = "literal ReplaySSM, fold-every-commit bookkeeping (commit folds the accepted prefix, no history)"

    def commit(self, slot_ids, accepted) -> None:
        for s, k in self._commit_rows(slot_ids, accepted):
            if k:
                folded = self.math.fold(self._load_checkpoint(s), self._history(s, k), self.params, self.mode)
                scale = None if self.ckpt_scale is None else self.ckpt_scale[s]
                self._store_state(s, folded, self.ckpt[s], scale)
            self.write_pos[s], self.origin[s] = 0, 0
            self.pending[s] = False


class LiteralHostCursorsKernel(LiteralReplayKernel):
    """Literal ReplaySSM under ``host-cursors``: the `spec` policy's rule with no cursors of its own: every
    verify and committed_state reads (write_pos, origin) of its slots from the caller's table
    (``cursors=``), commit moves nothing but the records' fate (the caller advances the table)."""

    implements = "host-cursors"
    bookkeeping = "host-cursors"
    supports_materialize = False  # its cursors are the caller's, passed to verify only
    description = "literal ReplaySSM, host-owned cursors (the caller passes its cursor table)"

    def commit(self, slot_ids, accepted) -> None:
        for s, _k in self._commit_rows(slot_ids, accepted):
            self.pending[s] = False


class LiteralFoldAtCommitKernel(LiteralReplayKernel):
    """Literal ReplaySSM under ``fold-at-commit``: verify never flushes (it reads the checkpoint
    and the committed history and writes its window's records after them in the ring); commit(k)
    holds write_pos + k records and, when write_pos + k + 2 T' > B + T', folds all of them into
    the checkpoint, moves the origin past them and sets write_pos = 0."""

    implements = "fold-at-commit"
    bookkeeping = "fold-at-commit"
    description = "literal ReplaySSM, fold-at-commit bookkeeping (commit folds the history when it is full)"

    def commit(self, slot_ids, accepted) -> None:
        for s, k in self._commit_rows(slot_ids, accepted):
            held = self.write_pos[s] + k
            if held + 2 * self.decode.window > self.decode.buffer + self.decode.window:
                folded = self.math.fold(self._load_checkpoint(s), self._history(s, held), self.params, self.mode)
                scale = None if self.ckpt_scale is None else self.ckpt_scale[s]
                self._store_state(s, folded, self.ckpt[s], scale)
                self.write_pos[s], self.origin[s] = 0, (self.origin[s] + held) % self.decode.ring_rows
            else:
                self.write_pos[s] = held
            self.pending[s] = False


class LiteralBaselineKernel(_LiteralBase):
    """Literal baseline: the state is read and written every token.

    Standard decode (T' = 1): verify steps the stored state and writes it back; commit(1) only
    closes the step.  Speculative: verify stores one state per window position in a scratch
    area; commit(k) copies state k-1 into the slot (docs/recurrences.md section 3, "baseline speculative path")."""

    kind = "baseline"

    @classmethod
    def unsupported_reason(cls, mode, decode, options):
        if mode.dot != "ieee":
            return ("the literal baseline reads out with the recurrence of docs/recurrences.md section 1 in ieee "
                    "arithmetic")
        return None

    def __init__(self, config: KernelConfig) -> None:
        super().__init__(config)
        T = self.decode.window
        self.draft = torch.zeros((self.num_slots, T, *self.state_shape), dtype=self.mode.state_dtype,
                                 device=self.device)
        self.draft_scale = (torch.ones((self.num_slots, T, *self.state_shape[:-1]), dtype=torch.float32,
                                       device=self.device) if self.mode.scaled_state else None)

    def _verify(self, slot_ids, inputs, out=None, window_lens=None):
        ids = self.check_verify_args(slot_ids, inputs, out, self.write_pos, self.ready, window_lens)
        T = self.call_window(inputs)
        lens = self.check_window_lens(ids, window_lens, T)
        out = self._alloc_out(len(ids), out, T)
        self.calls += 1
        for r, s in enumerate(ids):
            if s == PAD_SLOT:
                continue
            st = self._load_checkpoint(s)
            row = self._row_inputs(inputs, r)
            self.win_len[s] = lens[r]
            for t in range(lens[r]):
                y, st = self.math.step(st, {k: v[t] for k, v in row.items()}, self.params,
                                       **conv_kwargs(self.config.conventions))
                out[r, t].copy_(y.to(self.mode.act_dtype))
                if self.decode.speculative:
                    scale = None if self.draft_scale is None else self.draft_scale[s, t]
                    self._store_state(s, st, self.draft[s, t], scale)
                else:
                    scale = None if self.ckpt_scale is None else self.ckpt_scale[s]
                    self._store_state(s, st, self.ckpt[s], scale)
            self.pending[s] = True
        return out

    def commit(self, slot_ids, accepted) -> None:
        ids, ks = self.check_commit_args(slot_ids, accepted, self.pending, self.win_len)
        for s, k in zip(ids, ks):
            if s == PAD_SLOT:
                continue
            if self.decode.speculative and k >= 1:
                self.ckpt[s].copy_(self.draft[s, k - 1])
                if self.ckpt_scale is not None:
                    self.ckpt_scale[s].copy_(self.draft_scale[s, k - 1])
            self.pending[s] = False

    def committed_state(self, slot_ids, cursors=None) -> torch.Tensor:
        self.check_cursors(self._check_slot_ids(slot_ids), cursors)
        return self.checkpoint_state(slot_ids)

    def snapshot(self) -> KernelSnapshot:
        S = self.num_slots
        return KernelSnapshot(
            checkpoint=self.ckpt.detach().clone(),
            checkpoint_scale=None if self.ckpt_scale is None else self.ckpt_scale.detach().clone(),
            records={},
            write_pos=torch.zeros(S, dtype=torch.int64),
            origin=torch.zeros(S, dtype=torch.int64),
            # The baseline rewrites its state at every standard step: each one is a "flush".
            is_flush=torch.full((S,), not self.decode.speculative, dtype=torch.bool),
            extra={"draft_states": self.draft.detach().clone(),
                   **({} if self.draft_scale is None else {"draft_scales": self.draft_scale.detach().clone()}),
                   **self._host_flags()},
        )

    def restore(self, snapshot: KernelSnapshot) -> None:
        self._restore_common(snapshot)
        self.draft.copy_(snapshot.extra["draft_states"].to(self.device))
        if self.draft_scale is not None:
            self.draft_scale.copy_(snapshot.extra["draft_scales"].to(self.device))


__all__ = ["DecodeConfig", "FamilyMath", "LiteralBaselineKernel", "LiteralFlushWhenFullKernel",
           "LiteralFoldAtCommitKernel", "LiteralFoldEveryCommitKernel", "LiteralHostCursorsKernel",
           "LiteralReplayKernel", "WindowResult"]
