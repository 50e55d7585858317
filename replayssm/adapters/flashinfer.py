"""The FlashInfer source: ``flashinfer.mamba`` (flashinfer-python 0.7.2.post1; CUDA JIT, GPU only).

``pip install flashinfer-python==0.7.2.post1`` (its JIT needs nvcc, ninja and apache-tvm-ffi on the
GPU machine; tools/README.md says how to install carried wheels offline).  Registers, family
mamba2, when it is installed and a CUDA device is present:

* ``flashinfer-baseline``: ``selective_state_update``.  Standard decode in place; speculative as
  SGLang's MTP verify: one launch over the window with ``disable_state_update=True`` and an
  ``intermediate_states_buffer [slots, T', H, P, N]`` (``intermediate_state_indices`` = our block),
  commit(k) copies draft state k - 1 into the slot (the count includes the bonus token).
* ``flashinfer-replay``: ``checkpointing_ssu``, ReplaySSM Mamba-2 with **host-owned cursors**: the
  kernel reads ``ring_start`` / ``prev_num_accepted_tokens`` per cache slot, replays the live ring
  rows ``(ring_start + j) % RING`` for ``j < pnat``, appends the window at ``(ring_start + pnat + i)
  % RING`` and checkpoints when ``pnat + T' > RING - T'``; the adapter moves the cursors at commit
  (the flush advances ``ring_start`` by ``pnat``, then ``pnat = k``; else ``pnat += k``).

Oracle: the validation engine (fp64 recurrence, the literal models at the same mode, exact
invariants).  Expected: the literal model's error within its small factor at every declared mode.

Bridges (besides the poisoned output scratch of ``_base.py``): padding rows are ``pad_slot_id = -1``
(our slot s is cache slot s + 1; slot 0 unused); the per-head parameters are stride-0 views of the
``[H]`` vectors, ``A`` as ``[H, P, N]`` and ``dt_bias`` / ``D`` as ``[H, P]`` with strides ``(1, 0)``,
and ``dt`` as ``[..., H, P]`` with strides ``(..., 1, 0)``: the kernels' validators accept nothing else
(tie_hdim; ``validate_D_tensor`` and friends in ``csrc/selective_state_update.cu``, the ``(tie_hdim)``
checks of ``csrc/checkpointing_ssu.cu``; a contiguous ``D`` was refused on an H200).
``selective_state_update`` takes ``dt``, ``D`` and ``dt_bias`` in one dtype (its "weight" type), so the
baseline passes ``dt`` upcast to fp32 beside the fp32 parameters (exact: the same values);
``checkpointing_ssu`` types ``dt`` apart and gets the raw input. Both add the bias and apply softplus
themselves (``dt_cache`` holds the processed Δ in fp32, the family's record). The ring is the kernel's
``RING = B + T'`` rows indexed modulo RING, so B + T' must be a power of two (the spec's ring of
next_pow2(B + T') rows is then the same ring); B <= 16 (``max_window``). Standard decode of
``flashinfer-replay`` is its T' = 1 case: the ``flush-when-full`` bookkeeping (flush when L records are
held, folding the history only), L + 1 a power of two.

Modes, read from the code (``flashinfer/data/include/flashinfer/mamba``):
``checkpointing_ssu``: 2-byte inputs only (bf16 / fp16; its products are m16n8k16 MMAs on them,
``-tf32`` modes are not it), the state fp32 / bf16 / fp16, or fp8 e4m3 / int8 with an fp32 decode
scale per (slot, head, row) (``state_scale``, our per-row scale); stochastic rounding (Philox,
``rand_seed``) for fp16, fp8 and int8 states.  The Philox stream is keyed by the seed and the
element's offset only, so the adapter passes a new seed every verify (``mode.seed`` * 2^32 + the
instance's verify count: reproducible for a given run).  ``selective_state_update``: fp32 / bf16 /
fp16 states and activations, round to nearest (its fp16 stochastic rounding and int16 block-scaled
states are not bridged: refused).
"""

from __future__ import annotations

import dataclasses
import importlib.util

import torch

from replayssm.adapters._base import SlotAdapter, broadcast_last, float_mode_reason, tie_hdim
from replayssm.adapters._checkpoint_only import CheckpointOnlyAdapter
from replayssm.interface import KernelSnapshot
from replayssm.ops.mamba2.literal import Mamba2Math
from replayssm.registry import register
from replayssm.rounding import dequantize_state, quantize_state

NAME = "flashinfer"
VERSION = "0.7.2.post1"
HOW = (f"pip install flashinfer-python=={VERSION} on a CUDA machine (JIT: nvcc, ninja, apache-tvm-ffi); "
       f"offline: tools/README.md, \"Adapter sources\"")
_MAMBA: dict = {}


def _mamba():
    if "m" not in _MAMBA:
        import flashinfer.mamba as m  # imported on first use: its import sets up the JIT
        _MAMBA["m"] = m
    return _MAMBA["m"]


def tied_dt(dt: torch.Tensor, geometry, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``dt [..., H]`` (raw, before bias and softplus) as ``[..., H, P]`` with strides ``(..., 1, 0)``,
    converted to ``dtype`` first when one is given (an upcast: exact)."""
    return broadcast_last(dt if dtype is None else dt.to(dtype), geometry.headdim)


class _FlashInfer(SlotAdapter):
    family = "mamba2"
    triton_source = False  # CUDA JIT
    dt_dtype = None  # the dtype dt is passed in; None: the activation dtype (the raw input)

    def __init__(self, config):
        super().__init__(config)
        if self.device.type != "cuda":
            raise ValueError(f"device: FlashInfer's kernels are CUDA JIT (GPU only), got {self.device}")
        self.mamba = _mamba()
        g = self.geometry
        p = {k: v.to(self.device, torch.float32) for k, v in config.params.items()}
        self.params64 = {k: v.double() for k, v in p.items()}
        tied = tie_hdim(p, g)
        self.A3, self.bias2, self.D2 = tied["A"], tied["dt_bias"], tied["D"]
        self.T = self.decode.window if self.decode.speculative else 1

    def index(self, slot_ids):
        return torch.where(slot_ids >= 0, self.blocks(slot_ids), -1).to(torch.int32).contiguous()

    def window(self, inputs, R):
        tok = {k: v[:, :self.T].contiguous() for k, v in inputs.items()}
        return tok, tied_dt(tok["dt"], self.geometry, self.dt_dtype)


class FlashInferSSU(_FlashInfer, CheckpointOnlyAdapter):
    name = "flashinfer-baseline"
    kind = "baseline"
    dt_dtype = torch.float32  # selective_state_update: dt, D and dt_bias in one dtype (the fp32 parameters')
    description = ("FlashInfer selective_state_update (Mamba-2 baseline, CUDA; speculative: intermediate state "
                   "buffer, commit copies the accepted draft state)")

    @classmethod
    def unsupported_reason(cls, mode, decode, options):
        return float_mode_reason(mode, "FlashInfer's selective_state_update (the stochastic-rounding and int16 "
                                       "paths are not bridged)")

    def __init__(self, config):
        super().__init__(config)
        S = self.num_slots + 1
        self.state = torch.zeros((S, *self.state_shape), dtype=self.mode.state_dtype, device=self.device)
        self.inter = (torch.zeros((S, self.T, *self.state_shape), dtype=self.mode.state_dtype, device=self.device)
                      if self.decode.speculative else None)

    def reset(self, slot_ids, initial_state=None, origin=None):
        ids = self.check_reset_args(slot_ids, initial_state, origin)
        rows = self.active_rows(slot_ids)
        b = self.blocks(slot_ids).index_select(0, rows).long()
        self.state[b] = 0 if initial_state is None else initial_state.index_select(0, rows).to(self.state.dtype)
        self.mark_reset(ids)

    def verify(self, slot_ids, inputs, out=None):
        ids = self.begin_verify(slot_ids, inputs, out)
        out = self.new_out(len(ids)) if out is None else out
        g, R = self.geometry, len(ids)
        tok, dt = self.window(inputs, R)
        o = self.scratch(R, self.T, g.nheads, g.headdim)
        idx = self.index(slot_ids)
        if self.decode.speculative:  # multi-token (batch, T', ...) with the intermediate buffer
            kw = dict(disable_state_update=True, intermediate_states_buffer=self.inter, intermediate_state_indices=idx,
                      cache_steps=self.T)
        else:  # single-token layout (batch, nheads, dim)
            tok, dt, o, kw = {k: v[:, 0] for k, v in tok.items()}, dt[:, 0], o[:, 0], {}
        self.mamba.selective_state_update(self.state, tok["x"], dt, self.A3, tok["B"], tok["C"], self.D2,
                                          z=tok.get("z"), dt_bias=self.bias2, dt_softplus=True, state_batch_indices=idx,
                                          pad_slot_id=-1, out=o, **kw)
        act = self.active_rows(slot_ids)
        out[act] = (o if self.decode.speculative else o[:, None]).index_select(0, act)
        self.end_verify(ids)
        return out

    def commit(self, slot_ids, accepted):
        self.begin_commit(slot_ids, accepted)
        if self.decode.speculative:
            act = self.active_rows(slot_ids)
            b = self.blocks(slot_ids).index_select(0, act).long()
            self.state[b] = self.inter[b, accepted.index_select(0, act).long().to(self.device) - 1]

    def snapshot_extra(self):
        return {} if self.inter is None else {"drafts": self.inter[1:].cpu().clone()}


class FlashInferCheckpointing(_FlashInfer):
    name = "flashinfer-replay"
    kind = "replay"
    bookkeeping = "flush-when-full"  # standard decode is its T' = 1 case; speculative: the spec rule
    description = ("FlashInfer checkpointing_ssu (ReplaySSM Mamba-2, CUDA; host-owned ring_start / "
                   "prev_num_accepted cursors; int8 / fp8 states, Philox stochastic rounding)")

    @classmethod
    def unsupported_reason(cls, mode, decode, options):
        what = "FlashInfer's checkpointing_ssu"
        if mode.state not in ("fp32", "bf16", "fp16", "fp8e4m3", "int8"):
            return f"{what} stores fp32, bf16, fp16, fp8 e4m3 or int8 states, not {mode.state}"
        if mode.act not in ("bf16", "fp16"):
            return f"{what} takes 2-byte activations (bf16 or fp16: MMA operands), not {mode.act}"
        if mode.dot != "ieee":
            return f"{what}'s products are MMAs on 16-bit operands (exact products): ieee modes only, not {mode.dot}"
        if mode.rounding == "stochastic" and mode.state not in ("fp16", "fp8e4m3", "int8"):
            return f"{what} rounds stochastically only into fp16, fp8 and int8 states, not {mode.state}"
        if decode.ring_rows != decode.buffer + decode.window:
            return (f"{what}'s ring is B + T' rows indexed modulo B + T': B + T' must be a power of two "
                    f"(got {decode.buffer + decode.window})")
        if decode.buffer > 16:
            return f"{what} replays at most 16 cached tokens: B <= 16 (got {decode.buffer})"
        return None

    def __init__(self, config):
        super().__init__(config)
        g, m, S = self.geometry, self.mode, self.num_slots + 1
        ring = self.decode.ring_rows
        z = dict(device=self.device)
        self.state = torch.zeros((S, *self.state_shape), dtype=m.state_dtype, **z)
        self.scale = torch.ones((S, g.nheads, g.headdim), dtype=torch.float32, **z) if m.scaled_state else None
        self.x_cache = torch.zeros((S, g.nheads, ring, g.headdim), dtype=m.act_dtype, **z)
        self.B_cache = torch.zeros((S, g.ngroups, ring, g.dstate), dtype=m.act_dtype, **z)
        self.dt_cache = torch.zeros((S, g.nheads, ring), dtype=torch.float32, **z)
        self.ring_start = torch.zeros(S, dtype=torch.int32, **z)
        self.pnat = torch.zeros(S, dtype=torch.int32, **z)
        self.flushed = [False] * self.num_slots  # per slot: whether its pending verify flushed
        self.verifies = 0

    def reset(self, slot_ids, initial_state=None, origin=None):
        ids = self.check_reset_args(slot_ids, initial_state, origin)
        rows = self.active_rows(slot_ids)
        b = self.blocks(slot_ids).index_select(0, rows).long()
        self.ring_start[b] = 0 if origin is None else origin.index_select(0, rows).to(torch.int32)
        self.pnat[b] = 0
        if initial_state is None:
            self.state[b] = torch.zeros((), dtype=self.state.dtype, device=self.device)
            if self.scale is not None:
                self.scale[b] = 1.0
        else:
            nearest = dataclasses.replace(self.mode, rounding="nearest")
            q, sc = quantize_state(initial_state.index_select(0, rows).to(self.device), nearest)
            self.state[b] = q
            if self.scale is not None:
                self.scale[b] = sc.to(torch.float32)
        self.mark_reset(ids)

    def verify(self, slot_ids, inputs, out=None):
        ids = self.begin_verify(slot_ids, inputs, out)
        out = self.new_out(len(ids)) if out is None else out
        g, R = self.geometry, len(ids)
        tok, dt = self.window(inputs, R)
        o = self.scratch(R, self.T, g.nheads, g.headdim)
        kw = {}
        if self.mode.rounding == "stochastic":
            seed = (self.mode.seed << 32) + self.verifies
            kw = dict(rand_seed=torch.tensor([seed], dtype=torch.int64, device=self.device), philox_rounds=10)
        for s in ids:
            if s >= 0:
                self.flushed[s] = self.decode.is_flush(int(self.pnat[s + 1]))
        self.mamba.checkpointing_ssu(
            self.state, self.x_cache, self.B_cache, self.dt_cache, self.ring_start, self.pnat, tok["x"], dt, self.A3,
            tok["B"], tok["C"], o, D=self.D2, z=tok.get("z"), dt_bias=self.bias2, dt_softplus=True,
            state_batch_indices=self.index(slot_ids), pad_slot_id=-1, state_scale=self.scale, algorithm="monolith",
            **kw)
        self.verifies += 1
        act = self.active_rows(slot_ids)
        out[act] = o.index_select(0, act)
        self.end_verify(ids)
        return out

    def commit(self, slot_ids, accepted):
        ids, ks = self.begin_commit(slot_ids, accepted)
        for s, k in zip(ids, ks):  # the host owns the cursors (the kernel only reads them)
            if s >= 0:
                wp, origin = self.decode.commit_cursor(int(self.pnat[s + 1]), int(self.ring_start[s + 1]),
                                                       self.flushed[s], k)
                self.pnat[s + 1], self.ring_start[s + 1] = wp, origin

    # ---- inspection ----------------------------------------------------------------------------------
    def _records(self):
        return {"x": self.x_cache[1:].permute(0, 2, 1, 3), "B": self.B_cache[1:].permute(0, 2, 1, 3),
                "dt": self.dt_cache[1:].permute(0, 2, 1)}

    def _checkpoint(self, s: int) -> torch.Tensor:
        return dequantize_state(self.state[s + 1], None if self.scale is None else self.scale[s + 1], torch.float64)

    def checkpoint_state(self, slot_ids):
        return self.per_slot(slot_ids, self._checkpoint)

    def committed_state(self, slot_ids):
        """Checkpoint + the committed records (processed Δ) folded in fp64."""
        rec = self._records()

        def fold(s):
            idx = self.hist_rows(s, int(self.pnat[s + 1]), int(self.ring_start[s + 1]))
            hist = {k: v[s].index_select(0, idx).double() for k, v in rec.items()}
            return Mamba2Math().fold(self._checkpoint(s), hist, self.params64, self.mode)
        return self.per_slot(slot_ids, fold)

    def snapshot(self):
        return KernelSnapshot(
            checkpoint=self.state[1:].cpu().clone(),
            checkpoint_scale=None if self.scale is None else self.scale[1:].cpu().clone(),
            records={k: v.cpu().clone() for k, v in self._records().items()},
            write_pos=self.pnat[1:].cpu().to(torch.int64), origin=self.ring_start[1:].cpu().to(torch.int64),
            is_flush=torch.tensor([self.decode.is_flush(int(w)) for w in self.pnat[1:].tolist()]))


def load(path: str | None = None) -> list[str]:
    """Register both adapters when flashinfer-python VERSION is installed and CUDA is present (its
    kernels are compiled on first use); one-line ``RuntimeError`` otherwise."""
    from importlib import metadata
    if importlib.util.find_spec("flashinfer") is None:
        raise RuntimeError(f"flashinfer: package not installed; {HOW}")
    try:
        have = metadata.version("flashinfer-python")
    except metadata.PackageNotFoundError:
        have = "unknown"
    if have != VERSION:
        raise RuntimeError(f"flashinfer-python {have} installed, the adapter is written against {VERSION}; {HOW}")
    if not torch.cuda.is_available():
        raise RuntimeError(f"flashinfer-python {have}: installed, but its kernels are CUDA JIT and no CUDA device "
                           f"is visible (GPU only)")
    done = []
    for cls in (FlashInferSSU, FlashInferCheckpointing):
        register(cls, replace=True)
        done.append(f"{cls.family}/{cls.name} (flashinfer-python {have})")
    return done
