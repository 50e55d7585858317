"""What every vLLM-style adapter shares: the slot bridge, poisoned output scratch, host bookkeeping.

* **Null block 0 vs padding slot −1.**  vLLM reserves physical block 0 as the null block (padding
  rows point at it and kernels skip or zero them).  An adapter allocates ``num_slots + 1`` blocks;
  our slot ``s`` is block ``s + 1`` and a padding row (``-1``) is block 0.
* **Outputs through a poisoned scratch.**  Some external kernels write padding rows' outputs (zeros,
  or a result from the null block): every launch writes into a NaN-filled scratch and only the
  active rows are copied into the caller's ``out``, so the engine's padding-output check sees only
  the writes that reach our rows, and an element the kernel never wrote stays NaN (caught by the
  unwritten-output check).
* Inspection (``checkpoint_state``, ``committed_state``) is fp64 on the host side of the bridge:
  padding rows come back NaN.
* **Timed steps** (``timed_step``, for the bench job's side-by-side runs): the external kernels'
  launches alone, on inputs packed once beforehand the way vLLM hands them over (``mixed_qkv``,
  ``conv_out``, ``query_start_loc``), outputs left in the packed scratch, no host work and nothing a
  CUDA graph cannot capture.  Standard decode takes per-row cursors: the ``L`` cursor positions are
  built beforehand (:meth:`SlotAdapter.cursor_positions`) and call ``n`` uses position ``n mod L``,
  which is what the device cursor would hold when every row commits one token per step.  A timed
  step leaves the adapter's own cursor bookkeeping behind: the instance is for timing only after it.
* **Serving layouts** (an adapter whose speculative kernel takes ``query_start_loc`` / ``cu_seqlens``
  declares ``supports_packed_layout``, ``supports_ragged_windows`` and ``supports_mixed_decode``):
  :meth:`SlotAdapter.pack_tokens` hands the kernel the packed layout as the caller gave it (the
  buffer and its offsets: the kernel reads row r's T'_r tokens at ``Q[r]..Q[r+1]-1`` itself) and
  packs a padded call with each row's own length (``window_lens``; 1 at a standard step on the
  speculative slots; else T'); the kernel's packed outputs go back to the caller's positions only.
  A standard-decode object's kernels take one token per row and no offsets: a packed call (one
  token per active row) is unpacked for them (:meth:`SlotAdapter.standard_from_packed`).
"""

from __future__ import annotations

import itertools
import os
from typing import ClassVar

import torch

from replayssm.interface import PAD_SLOT, KernelUnderTest
from replayssm.precision import PrecisionMode

FLOAT_STATES = ("fp32", "bf16", "fp16")
FLOAT_ACTS = ("fp32", "bf16", "fp16")


def float_mode_reason(mode: PrecisionMode, what: str, dots: tuple[str, ...] = ("ieee",)) -> str | None:
    """The common refusal: fp32/bf16/fp16 states stored with round-to-nearest, fp32/bf16/fp16
    activations, readouts in one of ``dots``."""
    if mode.state not in FLOAT_STATES:
        return f"{what} stores the state in the state tensor's own dtype (fp32, bf16 or fp16), not {mode.state}"
    if mode.act not in FLOAT_ACTS:
        return f"{what} takes fp32, bf16 or fp16 activations, not {mode.act}"
    if mode.rounding != "nearest":
        return f"{what} stores the state with a plain cast (round to nearest), not stochastic rounding"
    if mode.dot not in dots:
        return f"{what} reads out with {' / '.join(dots)} dots, not {mode.dot}"
    return None



def broadcast_last(t: torch.Tensor, *sizes: int) -> torch.Tensor:
    """``t`` (made contiguous) with trailing dimensions of ``sizes``, each of stride 0: a view in the
    layout the Mamba-2 kernels take for per-head values (tie_hdim: ``A [H, P, N]``, ``dt_bias`` /
    ``D [H, P]``, ``dt [..., H, P]``).  ``expand`` keeps a size-1 dimension's stride, and the kernels
    that detect a broadcast by stride 0 (vLLM's ``A.stride(-2) == 0``, FlashInfer's validators)
    then refuse a head dimension of 1; ``as_strided`` gives stride 0 at every size."""
    t = t.contiguous()
    return t.as_strided((*t.shape, *sizes), (*t.stride(), *([0] * len(sizes))))


def tie_hdim(params: dict, geometry) -> dict:
    """The Mamba-2 per-head ``A``, ``dt_bias``, ``D`` (each ``[H]``) in the kernels' tie_hdim layout
    (:func:`broadcast_last`): ``A`` as ``[H, P, N]`` with strides ``(1, 0, 0)``, ``dt_bias`` and ``D``
    as ``[H, P]`` with strides ``(1, 0)`` (views: the values are the vectors' own)."""
    P, N = geometry.headdim, geometry.dstate
    return {"A": broadcast_last(params["A"], P, N), "dt_bias": broadcast_last(params["dt_bias"], P),
            "D": broadcast_last(params["D"], P)}


def dot_key_tile_reason(geometry, what: str) -> str | None:
    """The limit of the ReplaySSM GDN / KDA kernels of the vLLM fork and SGLang 0.5.23 (their launch
    wrappers raise "BKT must be >=16 for tl.dot"): the key dimension is one tile of next_pow2(K)
    columns, split in nk parts of at least 16 (the adapters pass nk = 1 there), so K >= 9."""
    K = geometry.head_k_dim
    if K < 9:
        return (f"{what} contract the key dimension with tl.dot on tiles of next_pow2(K) >= 16 columns "
                f"(they raise 'BKT must be >=16'): K >= 9, got K = {K}")
    return None


def key_tile_splits(K: int) -> int:
    """``nk``, the number of tiles the ReplaySSM GDN / KDA kernels split the key dimension into: their
    default 2, or 1 where tiles of next_pow2(K) / 2 columns would be below the 16 a ``tl.dot`` needs
    (K <= 16, the tiny geometry)."""
    return 1 if (1 << max(0, (K - 1).bit_length())) // 2 < 16 else 2


def default_dot_reason(mode: PrecisionMode, fp32_reason: str) -> str | None:
    """The refusal for a kernel whose ``tl.dot`` runs at Triton's default precision on operands in the
    activation dtype: with fp32 activations tf32 on the GPU (``-tf32`` modes only: ``fp32_reason``
    otherwise), with 16-bit activations 16-bit operands, exact products (ieee modes only)."""
    if mode.act == "fp32" and mode.dot != "tf32":
        return fp32_reason
    if mode.act != "fp32" and mode.dot != "ieee":
        return f"with {mode.act} activations its dots take 16-bit operands (exact products): ieee modes only"
    return None


def mixed_qkv(tok: dict) -> torch.Tensor:
    """The packed ``mixed_qkv = [q | k | v]`` of one token per row (the GDN / KDA kernels' input)."""
    return torch.cat([tok["q"].flatten(1), tok["k"].flatten(1), tok["v"].flatten(1)], 1).contiguous()


def triton_interpreted() -> bool:
    """Whether Triton kernels run through the interpreter in this process (no compiler: none of its
    shape limits, e.g. a ``tl.dot``'s minimum K, applies)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# What a Triton kernel can do that the Triton interpreter (the CPU) does not run as the GPU does
# (docs/kernel_interface.md): an adapter declares the ones its kernels do in
# ``interpreter_traps``; :func:`interpreter_reason` is the one place that decides what that refuses.
INTERPRETER_TRAPS = {
    "bf16-dot": "bf16 tl.dot returns garbage (~1e10: it multiplies raw bf16 bit patterns)",
    "bf16-cast": "fp32 -> bf16 casts truncate (round toward zero; the GPU rounds to nearest even)",
}


def interpreter_reason(mode: PrecisionMode, traps=tuple(INTERPRETER_TRAPS)) -> tuple[str, str] | None:
    """Why a Triton kernel written elsewhere that does ``traps`` (names of :data:`INTERPRETER_TRAPS`)
    cannot be judged at ``mode`` under the Triton interpreter (we cannot widen their code as ours
    does): ``("state", why)`` for a bf16 state stored through a cast (every store rounds toward
    zero, an error that grows with the flushes -- the fuzzer drew a 5.3 u "failure" of vLLM's Mamba-2
    baseline after 5 stores), ``("act", why)`` for bf16 activations read by a bf16 ``tl.dot``
    (vLLM's Mamba-2 replay kernel at s32a16: a 1.4e10 error on the CPU, 2.6e-3 on the GPU) or
    written through a cast, None otherwise.  The engine refuses both on a CPU
    (:class:`SlotAdapter`); the fuzzer draws neither there."""
    unknown = sorted(set(traps) - set(INTERPRETER_TRAPS))
    if unknown:
        raise ValueError(f"interpreter_traps: unknown trap(s) {unknown}; expected names of {sorted(INTERPRETER_TRAPS)}")
    if mode.state == "bf16" and "bf16-cast" in traps:
        return "state", f"the Triton interpreter's {INTERPRETER_TRAPS['bf16-cast']}, in every bf16 state store"
    if mode.act == "bf16":
        hit = [t for t in ("bf16-dot", "bf16-cast") if t in traps]
        if hit:
            return "act", "the Triton interpreter's " + " and its ".join(INTERPRETER_TRAPS[t] for t in hit)
    return None


class SlotAdapter(KernelUnderTest):
    """Base of the adapters: block mapping, scratch outputs, reset/pending flags on the host."""

    accepted_options: ClassVar[tuple[str, ...]] = ()  # the adapters read no KernelConfig option
    modules: ClassVar[dict] = {}  # filled by the adapter's register(): short module name -> module
    source: ClassVar[str] = ""  # where the external code came from (path, commit), for reports
    triton_source: ClassVar[bool] = True  # Triton kernels (on CPU: the interpreter's small fuzz strategy)
    # What its Triton kernels do that the interpreter runs unlike the GPU (INTERPRETER_TRAPS): every
    # adapter's kernels store their bf16 outputs (and bf16 states) through fp32 -> bf16 casts, and
    # contract bf16 operands with tl.dot where they take bf16 activations; one whose kernels do not
    # declares less.
    interpreter_traps: ClassVar[tuple[str, ...]] = ("bf16-dot", "bf16-cast")

    @classmethod
    def interpreter_refusal(cls, mode: PrecisionMode) -> str | None:
        """The one-line refusal of ``mode`` on the CPU (the Triton interpreter), or None."""
        why = interpreter_reason(mode, cls.interpreter_traps) if cls.triton_source else None
        if why is None:
            return None
        return (f"mode: kernel {cls.name!r} cannot be judged at {mode.id} on the CPU: {why[1]}; run it on a GPU "
                f"(--device cuda, or --kernel-device cuda)")

    def __init__(self, config) -> None:
        super().__init__(config)
        refusal = self.interpreter_refusal(self.mode) if self.device.type == "cpu" else None
        if refusal:
            raise ValueError(refusal)
        self.ready = [False] * self.num_slots
        self.pending = [False] * self.num_slots
        self.win_len = [self.decode.window] * self.num_slots  # window length of each slot's last verify

    # ---- the GDN / KDA kernels' parameters and per-block buffers -------------------------------------------
    def delta_rule_params(self, params: dict) -> None:
        """``A_log`` and ``dt_bias`` as the GDN / KDA kernels take them (fp32, contiguous, on the device),
        ``params64`` (fp64, for the literal fold) and the query scale ``K^-1/2``."""
        p = {k: v.to(self.device, torch.float32).contiguous() for k, v in params.items()}
        self.A_log, self.dt_bias = p["A_log"], p["dt_bias"]
        self.params64 = {k: v.double() for k, v in p.items()}
        self.scale = self.geometry.head_k_dim ** -0.5

    def delta_rule_rows(self, rows: int, *, key_gate: bool = False):
        """Zeroed per-block buffers of ``rows`` rows in the GDN / KDA kernels' layout: values
        ``[blocks, HV, rows, V]`` and keys ``[blocks, H, rows, K]`` in the activation dtype, and a gate
        (or beta) ``[blocks, HV, rows]`` in fp32 (``[blocks, HV, rows, K]`` with ``key_gate``: KDA's
        gate per key channel)."""
        g, S, z = self.geometry, self.num_slots + 1, dict(device=self.device)
        gate = (S, g.num_v_heads, rows, g.head_k_dim) if key_gate else (S, g.num_v_heads, rows)
        return (torch.zeros((S, g.num_v_heads, rows, g.head_v_dim), dtype=self.mode.act_dtype, **z),
                torch.zeros((S, g.num_k_heads, rows, g.head_k_dim), dtype=self.mode.act_dtype, **z),
                torch.zeros(gate, dtype=torch.float32, **z))

    # ---- the slot bridge -----------------------------------------------------------------------------
    def blocks(self, slot_ids: torch.Tensor) -> torch.Tensor:
        """int32 physical block per row: slot + 1, padding (-1) -> the null block 0."""
        return torch.where(slot_ids >= 0, slot_ids + 1, 0).to(torch.int32).contiguous()

    def active_rows(self, slot_ids: torch.Tensor) -> torch.Tensor:
        return (slot_ids != PAD_SLOT).nonzero().flatten()

    def scratch(self, *shape: int) -> torch.Tensor:
        return torch.full(shape, float("nan"), dtype=self.mode.act_dtype, device=self.device)

    def new_out(self, R: int) -> torch.Tensor:
        return torch.full((R, self.decode.window, *self.out_shape), float("nan"), dtype=self.mode.act_dtype,
                          device=self.device)

    # ---- host bookkeeping (bad calls are refused before anything changes) -----------------------------
    def begin_verify(self, slot_ids, inputs, out, window_lens=None, query_start_loc=None) -> list[int]:
        ids = self.check_verify_args(slot_ids, inputs, out, window_lens=window_lens, query_start_loc=query_start_loc)
        for r, s in enumerate(ids):
            if s != PAD_SLOT and not self.ready[s]:
                raise ValueError(f"slot_ids[{r}]: slot {s} was never reset")
            if s != PAD_SLOT and self.pending[s]:
                raise ValueError(f"slot_ids[{r}]: slot {s} has an uncommitted verify; commit it first")
        return ids

    def end_verify(self, ids: list[int], lens: list[int] | None = None) -> None:
        for r, s in enumerate(ids):
            if s != PAD_SLOT:
                self.pending[s] = True
                self.win_len[s] = self.decode.window if lens is None else lens[r]

    def begin_commit(self, slot_ids, accepted) -> tuple[list[int], list[int]]:
        ids, ks = self.check_commit_args(slot_ids, accepted, self.pending, self.win_len)
        if not self.decode.speculative and any(k != 1 for s, k in zip(ids, ks) if s != PAD_SLOT):
            raise ValueError("accepted: standard decode commits exactly 1 token per row")
        for s in ids:
            if s != PAD_SLOT:
                self.pending[s] = False
        return ids, ks

    def mark_reset(self, ids: list[int]) -> None:
        for s in ids:
            if s != PAD_SLOT:
                self.ready[s] = True
                self.pending[s] = False

    # ---- serving layouts (checked by begin_verify first) --------------------------------------------------
    def pack_tokens(self, ids: list[int], inputs, window_lens=None, query_start_loc=None):
        """``(tokens, offsets, lens, put)``: the verify's tokens back to back (``{name: [n, ...]}``),
        int32 offsets ``[R + 1]``, each row's window length, and ``put(o, out)`` copying the kernel's
        packed outputs ``o [n, ...]`` to the caller's positions.  Packed layout: the caller's buffer
        (its first n = Q[R] tokens) and offsets as given; padded: each row's first T'_r tokens."""
        if query_start_loc is not None:
            lens = self.check_query_start_loc(ids, query_start_loc, int(next(iter(inputs.values())).shape[0]))
            n = sum(lens)

            def put(o, out):
                out[:n] = o[:n]
            return {k: v[:n] for k, v in inputs.items()}, query_start_loc.to(torch.int32), lens, put
        width = self.call_window(inputs)
        lens = self.check_window_lens(ids, window_lens, width)
        idx = torch.tensor([r * width + t for r, m in enumerate(lens) for t in range(m)], dtype=torch.long,
                           device=self.device)
        qsl = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=self.device)

        def put(o, out):
            out.view(-1, *out.shape[2:]).index_copy_(0, idx, o[:idx.numel()].to(out.dtype))
        return {k: v.flatten(0, 1).index_select(0, idx) for k, v in inputs.items()}, qsl, lens, put

    def pack_active(self, ids: list[int], slot_ids, inputs, window_lens=None, query_start_loc=None):
        """:meth:`pack_tokens` for a kernel given the active rows only: ``(tokens, blocks, offsets, lens,
        put, rows)`` with the tokens as one sequence (``{name: [1, n, ...]}``), the active rows' blocks and
        their offsets (a padding row holds no tokens, ``Q[r+1] = Q[r]``), each row's window length, the
        ``put`` of :meth:`pack_tokens` and the active rows."""
        tok, qsl, lens, put = self.pack_tokens(ids, inputs, window_lens, query_start_loc)
        act = self.active_rows(slot_ids)
        qsl = torch.cat([qsl[:1], qsl[1:].index_select(0, act)]).contiguous()
        blk = self.blocks(slot_ids).index_select(0, act).contiguous()
        return {k: v[None].contiguous() for k, v in tok.items()}, blk, qsl, lens, put, act

    def begin_serving_verify(self, slot_ids, inputs, out, window_lens=None, query_start_loc=None):
        """``(ids, out)``: :meth:`begin_verify`'s checks, and ``out`` or a new :meth:`serving_out` buffer."""
        ids = self.begin_verify(slot_ids, inputs, out, window_lens, query_start_loc)
        return ids, self.serving_out(inputs, query_start_loc) if out is None else out

    def serving_out(self, inputs, query_start_loc=None) -> torch.Tensor:
        """A NaN output buffer in the caller's layout (packed ``[N, ...]``, else ``[R, T_call, ...]``)."""
        first = next(iter(inputs.values()))
        lead = (first.shape[0],) if query_start_loc is not None else (first.shape[0], first.shape[1])
        return torch.full((*lead, *self.out_shape), float("nan"), dtype=self.mode.act_dtype, device=self.device)

    def standard_from_packed(self, slot_ids, inputs, out, query_start_loc, verify):
        """A packed standard-decode verify (one token per active row, at ``query_start_loc[r]``) run
        through ``verify``, the padded standard path (its kernels take one token per row, no offsets)."""
        ids = self.check_verify_args(slot_ids, inputs, out, query_start_loc=query_start_loc)
        first = next(iter(inputs.values()))
        lens = self.check_query_start_loc(ids, query_start_loc, int(first.shape[0]))
        starts = query_start_loc.tolist()
        rows = torch.tensor([r for r, m in enumerate(lens) if m], dtype=torch.long, device=self.device)
        toks = torch.tensor([starts[r] for r, m in enumerate(lens) if m], dtype=torch.long, device=self.device)
        padded = {}
        for k, v in inputs.items():
            padded[k] = torch.zeros((len(ids), 1, *v.shape[1:]), dtype=v.dtype, device=self.device)
            padded[k][rows, 0] = v.index_select(0, toks)
        got = verify(slot_ids, padded, None)
        out = self.serving_out(inputs, query_start_loc) if out is None else out
        out[toks] = got[rows, 0]
        return out

    # ---- timed steps (bench job) -------------------------------------------------------------------------
    @staticmethod
    def no_padding(slot_ids: torch.Tensor, step: str = "a timed step") -> None:
        """Refuse padding rows in a timed ``step`` (its launches take every row as a request)."""
        if bool((slot_ids < 0).any()):
            raise ValueError(f"slot_ids: {step} takes no padding rows")

    def uniform_offsets(self, R: int) -> torch.Tensor:
        """int32 offsets ``[R + 1]`` of ``R`` rows of T' tokens each (a timed speculative step's packing)."""
        T = self.decode.window
        return torch.arange(0, (R + 1) * T, T, dtype=torch.int32, device=self.device)

    def cursor_positions(self, blk: torch.Tensor, write_pos: torch.Tensor):
        """For a timed standard-decode step: ``(start, [(write_pos, is_flush)] * L)`` per-row int32 /
        bool tensors of every cursor position; all rows must share one cursor (as in the bench)."""
        wp = write_pos.index_select(0, blk.long())
        if wp.numel() and bool((wp != wp[0]).any()):
            raise ValueError("slot_ids: a timed standard-decode step needs every row at the same cursor")
        L, R = self.decode.buffer, blk.shape[0]
        pos = [torch.full((R,), p, dtype=torch.int32, device=self.device) for p in range(L)]
        return (int(wp[0]) if wp.numel() else 0), [(p, p == L - 1) for p in pos]

    # ---- inspection -------------------------------------------------------------------------------------
    def per_slot(self, slot_ids, fn) -> torch.Tensor:
        """fp64 ``[R, *state_shape]`` from ``fn(slot)``; NaN rows for padding."""
        ids = self._check_slot_ids(slot_ids)
        out = torch.full((len(ids), *self.state_shape), float("nan"), dtype=torch.float64, device=self.device)
        for r, s in enumerate(ids):
            if s != PAD_SLOT:
                out[r] = fn(s)
        return out

    def hist_rows(self, s: int, write_pos: int, origin: int) -> torch.Tensor:
        """Physical ring rows of slot ``s``'s committed history (logical positions 0..write_pos-1)."""
        rows = self.decode.ring_rows
        return torch.tensor([(origin + p) % rows for p in range(write_pos)], dtype=torch.long, device=self.device)
