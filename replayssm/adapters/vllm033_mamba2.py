"""Adapters for the vLLM 0.33.0 release's ReplaySSM Mamba-2 (Nemotron-H) decode paths.

Oracle: the validation engine (fp64 recurrence on the accepted stream, the literal models at the
same precision mode, exact invariants: cursors by the declared policy, checkpoint unchanged on a
non-flush verify, committed ring rows kept, padding untouched).  Expected: the literal model's
error within its small factor at every declared mode; anything else is a finding.

Loaded by :mod:`replayssm.adapters.vllm033` from the release's files (never copied); the fork's
adapters (``vllm-*``, :mod:`replayssm.adapters.vllm`) are another source.  What the release runs
is set by its ``validate_mamba_cached_kernel``: standard decode through the Triton output-only
kernel or FlashInfer ``checkpointing_ssu``; speculative (MTP) through FlashInfer only, buffer
``1 + num_spec <= B <= 16``, no prefix caching.

* ``vllm033-replay`` -- standard decode through the released Triton
  ``selective_state_update_replayssm_output_only``, called as ``mamba_mixer2.py`` calls it (tied
  ``A [H, P, N]`` / ``dt [.., H, P]`` / ``dt_bias`` / ``D`` stride-0 views, a ``bc_pre`` fp32 scratch,
  per-row ``write_pos`` / ``is_flush``, ``state_batch_indices``, null block 0).  The release's
  per-row cursors come from its attention-metadata builder (not among the release files here): the
  adapter keeps one cursor per block by the spec rule (linear buffer of L records, flush at L - 1)
  and gathers it per row, as the fork's ``vllm-replay`` does (``vllm_mamba2.py``).  Declares: fp32 /
  bf16 / fp16 states and activations, round to nearest, ieee readouts (its ``tl.dot`` is
  ``tf32x3``, fp32-exact); refuses speculative decode (the release runs MTP through FlashInfer only:
  ``vllm033-dispatch``) and stochastic rounding (its ``enable_stochastic_rounding`` is for fp16
  states with a Philox seed drawn inside the wrapper: not reproducible, not bridged).
* ``vllm033-dispatch`` -- ``ssu_dispatch.selective_state_update_replayssm_flashinfer`` with
  FlashInfer's ``checkpointing_ssu`` and ``ssu_dispatch``'s device-side ring trackers, as
  ``mamba_mixer2.py`` drives them: ``reset_replayssm_ring_trackers`` at reset; speculative: the
  delayed ``commit_replayssm_ring_trackers`` (the previous window's accepted count, this window's
  ``query_start_loc``, ``logical_window = B``, ``ring_buffer_len = x_cache.size(2)``) before each
  verify, the kernel with ``update_trackers=False``; standard: the kernel, then
  ``update_replayssm_ring_trackers`` (vLLM calls it inside the wrapper with
  ``update_trackers=True``; the adapter calls the same function at commit, so the cursors move at
  commit as the interface says).  GPU only (FlashInfer is CUDA JIT): refused on a CPU.
* ``vllm033-trackers`` -- the same ``ssu_dispatch`` wrapper and trackers, with a stand-in for
  ``checkpointing_ssu`` (:func:`checkpointing_ssu_literal`: FlashInfer's documented semantics on
  vLLM's tensors, computed by the family's literal model at the run's mode): it validates the
  release's bookkeeping alone (which rows are replayed, where the window goes, when the ring
  checkpoints), on a CPU through the Triton interpreter, not FlashInfer's arithmetic.

Bookkeeping: ``flush-when-full`` (speculative: spec 3-4, flush when ``pnat + 2T' > B + T'``, the
history folded, the origin moved by ``pnat`` at commit; standard: the same rule with T' = 1).
vLLM's trackers decide the checkpoint with ``pnat + T' > logical_window`` and the kernel with
``pnat + T' > RING - T'`` (RING = ``x_cache.size(2)``): the two agree only for a ring of exactly
``B + T'`` rows (``mamba_utils.append_replayssm_ring``), so B + T' must be a power of two for the
spec's ring of next_pow2(B + T') rows to be it; any padding of the ring inflates the kernel's window
past the trackers' (vLLM's own warning): ``vllm033-trackers-padded-ring`` is that mutant.

Conventions bridged (besides null block 0 and the poisoned output scratch, ``_base.py``): vLLM's
padding rows point at the null block (``pad_slot_id = NULL_BLOCK_ID = 0``); the accepted count
includes the bonus token (our k as is); a full MTP batch is passed as ``[R, T', ...]`` views with
``cu_seqlens=None`` (the mixer's own choice when every row has 1 + num_spec tokens), so ragged and
packed calls are not declared.  The trackers' ``prev_query_len`` is the delayed-commit state: after
our ``commit(k)`` the cursors a snapshot reports are ``commit_replayssm_ring_trackers`` run on
copies of the trackers (the same kernel, the next query of T' tokens), so the cursor checks see
vLLM's arithmetic, not ours.
"""

from __future__ import annotations

import contextlib

import torch

from replayssm.adapters._base import SlotAdapter, broadcast_last, float_mode_reason, tie_hdim
from replayssm.adapters._vllm_source import launch_guard
from replayssm.adapters.vllm_mamba2 import _VllmMamba2ReplayStandard
from replayssm.interface import KernelSnapshot
from replayssm.ops.mamba2.literal import Mamba2Math
from replayssm.rounding import quantize_state


class Vllm033Replay(_VllmMamba2ReplayStandard):
    """``vllm033-replay``: the released Triton output-only kernel, standard decode."""

    name = "vllm033-replay"
    description = ("vLLM 0.33.0 release: Triton selective_state_update_replayssm_output_only (Mamba-2 "
                   "standard decode, linear buffer of L records)")
    route_fn = "selective_state_update_replayssm_output_only"
    decodes = ("standard",)

    @classmethod
    def unsupported_reason(cls, mode, decode, options):
        if decode.speculative:
            return ("the release's Triton output-only kernel is standard decode only (vLLM 0.33.0 runs MTP "
                    "through FlashInfer: vllm033-dispatch)")
        return float_mode_reason(mode, "vLLM 0.33.0's output-only kernel (its fp16 stochastic rounding is not "
                                       "bridged)") or (
            None if mode.dot == "ieee" else "the output-only kernel reads out with tf32x3 dots (fp32): ieee modes only")


def checkpointing_ssu_literal(params64: dict, mode, state, x_cache, B_cache, dt_cache, ring_start,
                              prev_num_accepted_tokens, x, dt, A, B, C, out, D=None, z=None, dt_bias=None,
                              dt_softplus=True, state_batch_indices=None, pad_slot_id=-1, **_unused):
    """FlashInfer ``checkpointing_ssu``'s documented semantics (``flashinfer.mamba``, 0.7.2.post1), on
    the tensors ``ssu_dispatch`` hands it, computed by the family's literal model at ``mode`` (fp64
    sums, readout operands rounded as the mode says): per row r of slot b =
    ``state_batch_indices[r]`` (``pad_slot_id`` rows skipped), with RING = ``x_cache.size(2)``,
    p = ``prev_num_accepted_tokens[b]``, s = ``ring_start[b]``: the window's outputs from the
    checkpoint + ring rows ``(s + j) % RING`` (j < p) + the window; the window's records (x, B in
    the activation dtype, the processed Δ in fp32) at ``(s + p + i) % RING``; when
    ``p + T' > RING - T'`` the checkpoint becomes the fold of those p rows (the history only).
    It never moves the trackers (``ssu_dispatch`` does).  ``x`` is ``[R, T', H, P]``."""
    math, RING = Mamba2Math(), x_cache.shape[2]
    R, T = x.shape[0], x.shape[1]
    for r in range(R):
        b = int(state_batch_indices[r])
        if b == pad_slot_id:
            continue
        p, s = int(prev_num_accepted_tokens[b]), int(ring_start[b])
        rows = torch.tensor([(s + j) % RING for j in range(p)], dtype=torch.long, device=x.device)
        hist = {"x": x_cache[b].index_select(1, rows).permute(1, 0, 2).double(),
                "B": B_cache[b].index_select(1, rows).permute(1, 0, 2).double(),
                "dt": dt_cache[b].index_select(1, rows).permute(1, 0).double()}
        win = {"x": x[r].double(), "dt": dt[r][..., 0].double(), "B": B[r].double(), "C": C[r].double()}
        if z is not None:
            win["z"] = z[r].double()
        s0 = state[b].double()
        res = math.window(s0, hist, win, params64, mode, {"route": "output_only"})
        out[r] = res.outputs.to(out.dtype)
        for i in range(T):
            row = (s + p + i) % RING
            x_cache[b, :, row] = x[r, i].to(x_cache.dtype)
            B_cache[b, :, row] = B[r, i].to(B_cache.dtype)
            dt_cache[b, :, row] = res.records["dt"][i].to(dt_cache.dtype)
        if p + T > RING - T:
            state[b] = quantize_state(res.state_before[None], mode)[0][0].to(state.dtype)
    return out


class Vllm033Dispatch(SlotAdapter):
    """``vllm033-dispatch``: ``ssu_dispatch``'s FlashInfer ReplaySSM path and its ring trackers."""

    name = "vllm033-dispatch"
    family = "mamba2"
    kind = "replay"
    bookkeeping = "flush-when-full"
    description = ("vLLM 0.33.0 release: ssu_dispatch selective_state_update_replayssm_flashinfer (FlashInfer "
                   "checkpointing_ssu, GPU) driven by its device-side ring trackers (reset / update / delayed "
                   "commit with prev_query_len)")
    ring_pad = 0  # extra ring rows (the padded-ring mutant sets T')
    gpu_only = True  # FlashInfer's CUDA JIT kernel: no CPU path at all (the trackers alone run on the CPU)

    @classmethod
    def interpreter_refusal(cls, mode):
        """On the CPU the GPU-only kernel is refused first: no mode helps (the interpreter's traps come second)."""
        if cls.gpu_only:
            return cls.device_refusal("cpu")
        return super().interpreter_refusal(mode)

    @classmethod
    def device_refusal(cls, device) -> str:
        return (f"device: {cls.name} runs FlashInfer's checkpointing_ssu (CUDA JIT, GPU only), got {device}; on a "
                f"CPU, vllm033-trackers validates the same trackers")

    @classmethod
    def ring_reason(cls, decode):
        what = "vLLM 0.33.0's ReplaySSM ring"
        if decode.ring_rows != decode.buffer + decode.window:
            return (f"{what} is logical_window + 1 + num_spec = B + T' rows, indexed modulo B + T': B + T' must be "
                    f"a power of two (got {decode.buffer + decode.window})")
        if decode.speculative and not decode.window <= decode.buffer <= 16:
            return (f"vLLM 0.33.0 runs MTP with 1 + num_spec <= B <= 16 (validate_mamba_cached_kernel), "
                    f"got B = {decode.buffer}")
        if decode.buffer > 16:
            return f"FlashInfer's checkpointing_ssu replays at most 16 cached tokens: B <= 16 (got {decode.buffer})"
        return None

    @classmethod
    def unsupported_geometry(cls, geometry, decode=None):
        if getattr(geometry, "has_z", False):
            return ("ssu_dispatch's ReplaySSM wrapper takes no z (Nemotron-H gates in the mixer's norm): "
                    "has_z=False only")
        return None

    @classmethod
    def unsupported_reason(cls, mode, decode, options):
        what = "FlashInfer's checkpointing_ssu (through vLLM 0.33.0's ssu_dispatch)"
        if mode.state not in ("fp32", "bf16", "fp16"):
            return f"{what}: vLLM 0.33.0 keeps fp32, bf16 or fp16 Mamba-2 states, not {mode.state}"
        if mode.act not in ("bf16", "fp16"):
            return f"{what} takes 2-byte activations (bf16 or fp16: MMA operands), not {mode.act}"
        if mode.dot != "ieee":
            return f"{what}'s products are MMAs on 16-bit operands (exact products): ieee modes only, not {mode.dot}"
        if mode.rounding != "nearest":
            return (f"{what}: stochastic rounding draws its Philox seed inside ssu_dispatch (not reproducible; "
                    f"not bridged)")
        return cls.ring_reason(decode)

    def __init__(self, config):
        super().__init__(config)
        self.check_device()
        self.ssu = self.modules["ssu_dispatch"]
        g, m, S, d = self.geometry, self.mode, self.num_slots + 1, self.decode
        p = {k: v.to(self.device, torch.float32) for k, v in config.params.items()}
        self.params64 = {k: v.double() for k, v in p.items()}
        tied = tie_hdim(p, g)
        self.A3, self.bias2, self.D2 = tied["A"], tied["dt_bias"], tied["D"]
        self.T = d.window if d.speculative else 1
        ring = d.ring_rows + self.ring_pad
        kw = dict(device=self.device)
        self.state = torch.zeros((S, *self.state_shape), dtype=m.state_dtype, **kw)
        self.x_cache = torch.zeros((S, g.nheads, ring, g.headdim), dtype=m.act_dtype, **kw)
        self.dt_cache = torch.zeros((S, g.nheads, ring), dtype=torch.float32, **kw)
        self.B_cache = torch.zeros((S, g.ngroups, ring, g.dstate), dtype=m.act_dtype, **kw)
        self.ring_start = torch.zeros(S, dtype=torch.int32, **kw)
        self.pnat = torch.zeros(S, dtype=torch.int32, **kw)
        self.pql = torch.zeros(S, dtype=torch.int32, **kw)
        self.accepted = torch.zeros(S, dtype=torch.int32, **kw)  # per block: the count the next commit hands over
        self.handed = [False] * self.num_slots  # per slot: a commit whose count the trackers have not taken yet

    def check_device(self):
        if self.device.type != "cuda":
            raise ValueError(self.device_refusal(self.device))

    def kernel(self):
        """What ``ssu_dispatch._flashinfer_replayssm_kernel`` is during a call (vLLM sets it at start-up)."""
        from flashinfer.mamba.checkpointing_ssu import checkpointing_ssu
        return checkpointing_ssu

    @contextlib.contextmanager
    def _launch(self):
        saved = self.ssu._flashinfer_replayssm_kernel
        self.ssu._flashinfer_replayssm_kernel = self.kernel()
        try:
            with launch_guard(self.device, list(self.modules.values())):
                yield
        finally:
            self.ssu._flashinfer_replayssm_kernel = saved

    # ---- trackers --------------------------------------------------------------------------------------
    def _commit_trackers(self, trackers, blk, qsl):
        acc = self.accepted.index_select(0, blk.long()).contiguous()
        with launch_guard(self.device, list(self.modules.values())):
            self.ssu.commit_replayssm_ring_trackers(*trackers, blk, acc, qsl, logical_window=self.decode.buffer,
                                                    ring_buffer_len=self.x_cache.size(2))

    def _cursors(self):
        """(write_pos, origin) per block as they stand after the last commit: speculative, the delayed
        commit run on copies (the next query: T' tokens per slot)."""
        if not self.decode.speculative:
            return self.pnat, self.ring_start
        trackers = (self.ring_start.clone(), self.pnat.clone(), self.pql.clone())
        blk = torch.tensor([s + 1 for s in range(self.num_slots) if self.handed[s]], dtype=torch.int32,
                           device=self.device)
        qsl = torch.arange(0, self.T * (blk.numel() + 1), self.T, dtype=torch.int32, device=self.device)
        self._commit_trackers(trackers, blk, qsl)
        return trackers[1], trackers[0]

    # ---- the step calls ----------------------------------------------------------------------------------
    def reset(self, slot_ids, initial_state=None, origin=None):
        ids = self.check_reset_args(slot_ids, initial_state, origin)
        rows = self.active_rows(slot_ids)
        blk = self.blocks(slot_ids)
        with launch_guard(self.device, list(self.modules.values())):
            self.ssu.reset_replayssm_ring_trackers(self.ring_start, self.pnat, self.pql, blk)
        b = blk.index_select(0, rows).long()
        self.state[b] = 0 if initial_state is None else initial_state.index_select(0, rows).to(self.state.dtype)
        self.accepted[b] = 0
        for s in ids:
            if s >= 0:
                self.handed[s] = False
        if origin is not None:  # bridge: vLLM's reset starts every ring at row 0
            self.ring_start[b] = origin.index_select(0, rows).to(torch.int32)
        self.mark_reset(ids)

    def verify(self, slot_ids, inputs, out=None):
        ids = self.begin_verify(slot_ids, inputs, out)
        out = self.new_out(len(ids)) if out is None else out
        g, R, T = self.geometry, len(ids), self.T
        blk = self.blocks(slot_ids)
        if self.decode.speculative:  # the delayed commit of the previous window, with this query's lengths
            lens = torch.tensor([T if s >= 0 else 0 for s in ids], dtype=torch.int32, device=self.device)
            qsl = torch.cat([torch.zeros(1, dtype=torch.int32, device=self.device), lens.cumsum(0).to(torch.int32)])
            self._commit_trackers((self.ring_start, self.pnat, self.pql), blk, qsl)
            for s in ids:
                if s >= 0:
                    self.handed[s] = False
        tok = {k: v[:, :T].contiguous() for k, v in inputs.items()}
        o = self.scratch(R, T, g.nheads, g.headdim)
        with self._launch():
            self.ssu.selective_state_update_replayssm_flashinfer(
                self.state, tok["x"], broadcast_last(tok["dt"], g.headdim), self.A3, tok["B"], tok["C"], o,
                self.x_cache, self.B_cache, self.dt_cache, self.ring_start, self.pnat, self.pql,
                logical_window=self.decode.buffer, D=self.D2, dt_bias=self.bias2, dt_softplus=True,
                state_batch_indices=blk, update_trackers=False, **self.z_kw(tok))
        act = self.active_rows(slot_ids)
        out[act] = o.index_select(0, act)
        self.end_verify(ids)
        return out

    def z_kw(self, tok):
        """No z: a gated geometry is refused before anything runs (:meth:`unsupported_geometry`)."""
        return {}

    def commit(self, slot_ids, accepted):
        self.begin_commit(slot_ids, accepted)
        rows = self.active_rows(slot_ids)
        blk = self.blocks(slot_ids)
        if self.decode.speculative:
            self.accepted[blk.index_select(0, rows).long()] = accepted.index_select(0, rows).to(torch.int32)
            for s in self._check_slot_ids(slot_ids):
                if s >= 0:
                    self.handed[s] = True
            return
        act = blk.index_select(0, rows).contiguous()
        with launch_guard(self.device, list(self.modules.values())):
            self.ssu.update_replayssm_ring_trackers(self.ring_start, self.pnat, self.pql, act,
                                                    logical_window=self.decode.buffer,
                                                    ring_buffer_len=self.x_cache.size(2))

    # ---- inspection ----------------------------------------------------------------------------------------
    def _records(self):
        return {"x": self.x_cache[1:].permute(0, 2, 1, 3), "B": self.B_cache[1:].permute(0, 2, 1, 3),
                "dt": self.dt_cache[1:].permute(0, 2, 1)}

    def checkpoint_state(self, slot_ids):
        return self.per_slot(slot_ids, lambda s: self.state[s + 1].double())

    def committed_state(self, slot_ids):
        """Checkpoint + the committed ring rows (processed Δ) folded in fp64, at the cursors vLLM's
        trackers give."""
        rec, (wp, origin) = self._records(), self._cursors()
        ring = self.x_cache.size(2)

        def fold(s):
            idx = torch.tensor([(int(origin[s + 1]) + p) % ring for p in range(int(wp[s + 1]))], dtype=torch.long,
                               device=self.device)
            hist = {k: v[s].index_select(0, idx).double() for k, v in rec.items()}
            return Mamba2Math().fold(self.state[s + 1].double(), hist, self.params64, self.mode)
        return self.per_slot(slot_ids, fold)

    def snapshot(self):
        wp, origin = self._cursors()
        wp = wp[1:].cpu().to(torch.int64)
        return KernelSnapshot(
            checkpoint=self.state[1:].cpu().clone(), checkpoint_scale=None,
            records={k: v.cpu().clone() for k, v in self._records().items()},
            write_pos=wp, origin=origin[1:].cpu().to(torch.int64),
            is_flush=torch.tensor([self.decode.is_flush(int(w)) for w in wp.tolist()]))


class Vllm033Trackers(Vllm033Dispatch):
    """``vllm033-trackers``: ssu_dispatch's wrapper and trackers around a literal checkpointing_ssu."""

    name = "vllm033-trackers"
    description = ("vLLM 0.33.0 release: ssu_dispatch's ring trackers and ReplaySSM wrapper around a literal "
                   "stand-in for FlashInfer checkpointing_ssu (validates the release's bookkeeping; CPU capable)")
    gpu_only = False

    @classmethod
    def unsupported_reason(cls, mode, decode, options):
        return float_mode_reason(mode, "the literal checkpointing_ssu stand-in") or (
            None if mode.dot == "ieee" else "the stand-in reads out as checkpointing_ssu does (ieee modes only)") or (
            cls.ring_reason(decode))

    def check_device(self):
        return None

    def kernel(self):
        def stand_in(*args, **kwargs):
            return checkpointing_ssu_literal(self.params64, self.mode, *args, **kwargs)
        return stand_in


class Vllm033TrackersPaddedRing(Vllm033Trackers):
    """Mutant: the ring padded by T' rows (``ring_buffer_len`` = ``x_cache.size(2)`` as vLLM passes it):
    the kernel's checkpoint test ``pnat + T' > RING - T'`` then fires later than the trackers'
    ``pnat + T' > logical_window``, which move the ring past history never folded."""

    name = "vllm033-trackers-padded-ring"
    kind = "mutant"
    description = ("mutant of vllm033-trackers: the ReplaySSM ring padded by T' rows (vLLM: 'any padding of the "
                   "ring would silently inflate the window')")

    @property
    def ring_pad(self):
        return self.decode.window if self.decode.speculative else 1


__all__ = ["Vllm033Dispatch", "Vllm033Replay", "Vllm033Trackers", "Vllm033TrackersPaddedRing",
           "checkpointing_ssu_literal"]
