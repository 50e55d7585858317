"""The Triton ReplaySSM kernel class of a delta-rule family (Gated DeltaNet, KDA: ``triton-replay``), its host
side: the record storage (d, normalised k, the log gate g: ``[slots, rows, HV]``, or ``[slots, rows, HV, K]``
with a per-channel gate), the options and launch geometry of the single kernels and the two-launch path, the
verify / commit entry points, the inspection (``committed_state`` folds the records in fp64 through the family's
literal math), snapshot and restore.  A family's class sets its launches (its kernels), its literal math and its
two-launch coefficient layout.

Storage: checkpoint ``[slots, HV, V, K]`` in the state dtype (fp8 with fp32 scales ``[slots, HV, V]``); records
in the activation dtype, g fp32; rows = L (standard) or next_pow2(B + T') (speculative ring).  ``snapshot()``
returns exactly these, the literal model's layout.

Oracle: the family's ``literal-replay`` and its fp64 recurrence.  Expected error: within a small factor of the
literal model's at the same precision mode (tests/test_gdn_triton.py, tests/test_kda_triton.py); the inspection
is exact (fp64).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
import triton

from replayssm.interface import KernelSnapshot, next_pow2
from replayssm.ops.committed import committed_rows_fp64
from replayssm.ops.delta_rule.triton_base import TritonDeltaRuleBase
from replayssm.ops.split_options import int_choice, prepass_option
from replayssm.ops.triton.pdl import pdl_active, pdl_option


class DeltaRuleReplay(TritonDeltaRuleBase):
    """The delta-rule ReplaySSM kernel's host side (not registered itself): a family's kernel class puts its
    Triton base (``family``, ``PER_CHANNEL_GATE``) before this and sets ``math_cls`` and the launches."""

    kind = "replay"
    SPEC_ONE_WARP = False  # whether the speculative verify's programs default to one warp
    PDL_DEFAULT = False  # the pdl option's default in standard decode
    math_cls: ClassVar[type]

    def __init__(self, config) -> None:
        # speculative verify: 16 value rows per one-warp program measured fastest on an H200 (the
        # single kernel, below 16 rows: one warp ahead of two at batch 8; unrecorded)
        self.DEFAULT_BLOCK_V = 16 if config.decode.speculative else 8
        if config.decode.speculative and self.SPEC_ONE_WARP:
            self.DEFAULT_NUM_WARPS = 1
        super().__init__(config)
        g, rows, S = self.geometry, self.decode.ring_rows, self.num_slots
        act = self.mode.act_dtype
        gate = (g.num_v_heads, g.head_k_dim) if self.PER_CHANNEL_GATE else (g.num_v_heads,)
        self.records = {
            "d": torch.zeros((S, rows, g.num_v_heads, g.head_v_dim), dtype=act, device=self.device),
            "k": torch.zeros((S, rows, g.num_k_heads, g.head_k_dim), dtype=act, device=self.device),
            "g": torch.zeros((S, rows, *gate), dtype=torch.float32, device=self.device),
        }
        # the two-launch path (replay_split.py): coefficient pre-pass + checkpoint stream; by default from
        # 16 rows up on the GPU (below, the single kernel's one launch is faster: docs/benchmarks.md) and
        # always under the interpreter (so that the CPU tests run it by default)
        opts, d = config.options, self.decode
        self.prepass = prepass_option(opts)
        self.coef_warps = int_choice(opts, "coef_warps", (1, 2, 4, 8), 1)
        self.jb = next_pow2(d.buffer) if d.speculative else next_pow2(max(d.buffer - 1, 1))
        self.tp = next_pow2(d.window)
        self.coef_layout = self.split_coef_layout()
        self._scratch: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._window_vectors: dict[int, torch.Tensor] = {}
        self.fold_unroll = int_choice(opts, "fold_unroll", (1, 2, 4, 8), 4)
        self.tiles_per_program = (int_choice(opts, "tiles", (1, 2, 4, 8, 16, 32), 1) if "tiles" in opts else None)
        self.kchunks = int(opts.get("kchunks", 1))
        # readout="split" (speculative): keys per chunk of the tensor-core stream (replay_split_tc.py)
        self.key_chunk = int_choice(opts, "key_chunk", (16, 32, 64, 128), 32)
        # pdl: the pair's launches overlap (programmatic dependent launch, ops/triton/pdl.py; sm_90+, compiled).
        # Default on in standard decode, where the pair with it measured 2-4 % faster at batch 8-128 on an H200
        # and equal at 512 (and from 8 rows faster than the single kernel: 13.3 us, rec:16dd127585ac80f4, against
        # 13.7); off in the speculative verify (equal from 128 rows, slower at 8).  KDA's
        # launches take no PDL (its class sets PDL_DEFAULT False).
        self.pdl_active = pdl_active(pdl_option(opts, self.PDL_DEFAULT and not config.decode.speculative),
                                     self.device, self.interpret)
        if self.readout in ("dot", "split") and (self.kchunks != 1 or self.prepass is False):
            raise ValueError(f"options['readout']: {self.readout!r} is the pre-pass path's stream readout (needs "
                             f"kchunks=1 and prepass not False)")
        if self.kchunks < 1 or self.kchunks & (self.kchunks - 1) or (self.kchunks > 1 and self.BK // self.kchunks < 4):
            raise ValueError(f"options['kchunks']: expected a power of two with head_k_dim / kchunks >= 4, got "
                             f"{self.kchunks}")

    def use_split(self, rows: int) -> bool:
        """Whether a verify of ``rows`` rows takes the two-launch path."""
        if self.readout in ("dot", "split"):
            return True  # the dot and split readouts are the stream's
        if self.readout != "reduce":
            return False
        if self.mode.dot != "ieee":
            return True  # only the pre-pass path reads out with tensor-core dots
        if self.prepass is not None:
            return self.prepass
        return self.interpret or rows >= (8 if self.pdl_active else 16)

    def split_shape(self, rows: int) -> tuple[int, int, int]:
        """(block_v, value blocks, num_warps) of the stream kernel: the options, else one warp per 8
        value rows (fastest on an H200 with the tiles default below, docs/benchmarks.md)."""
        if self.interpret or self.block_v is not None:
            return self.launch_shape(rows)
        if self.readout == "split":  # 16-row tensor-core tiles per warp
            return 64, triton.cdiv(self.V, 64), self.num_warps or 4
        return 8, triton.cdiv(self.V, 8), self.num_warps or 1

    def decode_tiles(self, rows: int, nvb: int) -> int:
        """Value blocks per program of the one-launch standard decode (``replay_decode.py``: the history's
        coefficients once per program): the ``tiles`` option, else one.  More blocks per program measured
        slower on an H200 (qwen35-4b, us per step, 1 / 4 / 16 blocks: batch 8 13.7 / 14.2 / 36.0,
        batch 128 152 / 110 / 103 against the pair's 89, batch 512 697 / 448 / 395 against 340): a scalar
        gate's coefficients are cheap, so fewer programs only lose parallelism (KDA's per-channel ones
        are not: its one launch takes a whole value head from 128 rows)."""
        if self.tiles_per_program is not None:
            return max(1, min(self.tiles_per_program, nvb))
        return 1

    def split_tiles(self, rows: int, nvb: int) -> int:
        """Blocks of value rows per stream program: the option, else a whole value head from 128 rows
        up (measured fastest at batch 128 and 512 on an H200) and one block below (more programs)."""
        if self.tiles_per_program is not None:
            return max(1, min(self.tiles_per_program, nvb))
        return nvb if rows >= 128 and not self.interpret else 1

    def scratch(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Pre-pass outputs for a launch of ``rows`` rows (kept per row count, so a captured CUDA
        graph replays against the same buffers)."""
        if rows not in self._scratch:
            self._scratch[rows] = (
                torch.zeros((rows, self.HV, self.coef_layout["NCOEF"]), dtype=torch.float32, device=self.device),
                torch.zeros((rows, 4), dtype=torch.int64, device=self.device))
        return self._scratch[rows]

    def window_vectors(self, rows: int) -> torch.Tensor:
        """The pre-pass's normalised window vectors ``[rows, H, 2 T', BK]`` fp32 (k_i, then q_i scaled,
        per window token), read by every stream program of the key head (kept per row count, like
        :meth:`scratch`)."""
        if rows not in self._window_vectors:
            self._window_vectors[rows] = torch.zeros((rows, self.H, 2 * self.tp, self.BK), dtype=torch.float32,
                                                     device=self.device)
        return self._window_vectors[rows]

    # ---- steps -----------------------------------------------------------------------------------------
    # the launches (the family's kernels for its record layout), set by the family's class
    launch_split: ClassVar[Callable]
    launch_replay_spec: ClassVar[Callable]
    launch_replay_spec_commit: ClassVar[Callable]
    launch_replay_decode: ClassVar[Callable]

    def split_coef_layout(self) -> dict[str, int]:
        """Offsets of the two-launch path's per-(row, value head) coefficients (the family's layout)."""
        raise NotImplementedError

    def launch_verify(self, slot_ids, inputs, out) -> None:
        """Raw verify, no host checks and no host sync (what the drift fast path drives and a CUDA
        graph captures): outputs of every window position, records written, the checkpoint folded on
        a flush; standard decode advances the cursor in this launch, speculative decode in
        :meth:`launch_commit`."""
        R = slot_ids.shape[0]
        if R == 0:
            return
        if self.use_split(R):
            self.launch_split(self, slot_ids, inputs, out)
        elif self.decode.speculative:
            self.launch_replay_spec(self, slot_ids, inputs, out)
        else:
            self.launch_replay_decode(self, slot_ids, inputs, out)

    def launch_commit(self, slot_ids, accepted) -> None:
        """Raw commit(k) on the device (standard decode: the verify moved the cursor; the pending
        flag the interface's checks keep is cleared when they are on)."""
        if slot_ids.shape[0] == 0:
            return
        if self.decode.speculative:
            self.launch_replay_spec_commit(self, slot_ids, accepted)
        elif self.checks:
            self._close_step(slot_ids)

    def launch_checkpoint(self, slot_ids) -> torch.Tensor:
        """Raw :meth:`checkpoint_state` of slots that are not padding: the same fp64 values, gathered
        on the device without host checks (no host sync; the drift fast path's flush measurement)."""
        return self._checkpoints64(slot_ids)

    def verify_padded(self, slot_ids, inputs, out=None):
        if self.checks:
            ids = self.check_verify_args(slot_ids, inputs, out, self._host(self.write_pos), self._host(self.ready))
            self._check_ready(ids)
        out = self._alloc_out(slot_ids.shape[0], out)
        self.launch_verify(slot_ids, inputs, out)
        return out

    def commit(self, slot_ids, accepted) -> None:
        if self.checks:
            ids, ks = self.check_commit_args(slot_ids, accepted, window_lens=self.window_bound())
            self._check_pending(ids)
        self.launch_commit(slot_ids, accepted)

    # ---- inspection ----------------------------------------------------------------------------------
    def _history(self, slot: int, n: int, origin: int) -> dict[str, torch.Tensor]:
        rows = (origin + torch.arange(n, device=self.device)) % self.decode.ring_rows
        return {k: v[slot].index_select(0, rows) for k, v in self.records.items()}

    def committed_state(self, slot_ids) -> torch.Tensor:
        ids = self._check_slot_ids(slot_ids)
        return committed_rows_fp64(ids, self._host(self.write_pos), self._host(self.origin), self.decode.ring_rows,
                                   self.records, self._checkpoints64,
                                   lambda s0, hist: self.math_cls().fold_rows(s0, hist, None, None), self.state_shape,
                                   self.device)

    def snapshot(self) -> KernelSnapshot:
        return KernelSnapshot(
            checkpoint=self.states[:, 0].clone(),
            checkpoint_scale=self.scales[:, 0].clone() if self.scaled else None,
            records={k: v.clone() for k, v in self.records.items()},
            write_pos=self.write_pos.cpu().long(),
            origin=self.origin.cpu().long(),
            is_flush=torch.tensor([self.decode.is_flush(w) for w in self._host(self.write_pos)], dtype=torch.bool),
            extra=self._flags(),
        )

    def restore(self, snapshot: KernelSnapshot) -> None:
        ck = snapshot.checkpoint
        if tuple(ck.shape) != (self.num_slots, *self.state_shape) or ck.dtype != self.states.dtype:
            raise ValueError(f"snapshot.checkpoint: expected {self.states.dtype} "
                             f"{(self.num_slots, *self.state_shape)}, got {ck.dtype} {tuple(ck.shape)}")
        if set(snapshot.records) != set(self.records):
            raise ValueError(f"snapshot.records: expected keys {sorted(self.records)}, got {sorted(snapshot.records)}")
        for k, v in self.records.items():
            if tuple(snapshot.records[k].shape) != tuple(v.shape) or snapshot.records[k].dtype != v.dtype:
                raise ValueError(f"snapshot.records[{k!r}]: expected {v.dtype} {tuple(v.shape)}, got "
                                 f"{snapshot.records[k].dtype} {tuple(snapshot.records[k].shape)}")
        if self.scaled and snapshot.checkpoint_scale is None:
            raise ValueError("snapshot.checkpoint_scale: expected the fp32 per-row scales of an fp8 state")
        self._restore_flags(snapshot)
        self.states[:, 0].copy_(ck)
        if self.scaled:
            self.scales[:, 0].copy_(snapshot.checkpoint_scale)
        for k, v in self.records.items():
            v.copy_(snapshot.records[k])
        self.write_pos.copy_(snapshot.write_pos)
        self.origin.copy_(snapshot.origin)
        self.is_flush.copy_(snapshot.is_flush)



__all__ = ["DeltaRuleReplay"]
