"""Storage, device cursors, argument checks and inspection shared by the delta-rule Triton kernels (Gated
DeltaNet, KDA), and their jitted gate, normalisation, row, block and ticket helpers (rounding:
``replayssm.ops.triton.rounding``).

Oracle: the literal models of each family's ``literal.py`` over its ``naive.py`` (same snapshot layout, same
cursor rules of ``DecodeConfig``; gates and the L2 norm as written there).  Expected error: none for the
storage; the inspection methods are exact (``committed_state`` folds the stored checkpoint and
records in fp64); gates and norms are fp32 (a few ulp, from the GPU's exp/log).

Every cursor lives on the device (int32 per slot: ``write_pos``, ``origin``, ``is_flush``,
``current`` draft position of the speculative baseline, ``ready``, ``pending``, a ``ticket``
used by standard decode to advance the cursor inside the step kernel, and the int64
stochastic-rounding write count ``sr_count``).  A step therefore launches kernels only, with no
host synchronisation, and can be captured in a CUDA graph.

``options``:

* ``checks`` (default True): host-side argument and cursor checks before every launch, the
  validation path (each check reads the device cursors: one synchronisation per call).  With
  ``checks=False`` the calls launch straight away (benchmarks, CUDA graphs); bad input is then
  undefined behaviour.
* ``block_v``: value rows per program (a power of two; default chosen from the batch size),
  ``num_warps``: warps per program (default from the tile size).
* ``readout`` (speculative replay): ``reduce`` (default) reads the state out against each window
  k and q with row reductions, token by token for T' <= 4; ``tile`` forces the generic [T', *]
  tile form used above 4; ``dot`` (the pre-pass path's stream only) reads every ``S_0 k_i`` and
  ``S_0 q_s`` of the window out as one ieee fp32 ``tl.dot`` (FMA units: the key axis is summed inside
  each thread, no cross-lane reduction per readout; the layout the official kernels use for their
  tensor-core readouts, at fp32 accuracy).  (An fp32 FMA ``tl.dot`` readout in the single kernel was
  measured 2x slower on an H200 and removed; the stream's is a launch candidate of the bench.)
  ``split`` (the replay kernel's pre-pass path, ieee modes): the same product on bf16 tensor cores,
  the fp32 state and window vectors each written as bf16 parts (``replayssm/ops/triton/split_dot.py``:
  fp32 accuracy; an fp16 / bf16 state needs 2 / 1 parts); 64 value rows on 4 warps by default; the
  speculative stream takes the key axis in chunks of ``key_chunk`` (16-128, default 32) keys
  (``replay_split_tc.py``).

Standard decode (T' = 1): ``verify`` applies the token and advances the cursor on the device (the
last of a slot's programs to finish, through an atomic ticket); ``commit(1)`` only closes the
step (with checks on it verifies there was a step to close).  Speculative decode: ``commit``
launches the device-side cursor update.

Serving layouts (``replayssm/ops/serving_layouts.py``, the base class): ragged windows
(``window_lens``), the packed layout (``query_start_loc``) and standard steps on speculative slots
(one-token verifies) are run by the kernel-interface wrapper around the padded launches (each row's
T'_r tokens in a zero-filled ``[R, T']`` buffer, one launch, positions t < T'_r copied back), not by
the kernels themselves; the raw launches take the padded layout only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm.interface import PAD_SLOT, KernelSnapshot, next_pow2
from replayssm.ops.serving_layouts import ServingLayouts
from replayssm.ops.triton.math import softplus
from replayssm.ops.triton.rounding import INTERPRET, STREAM_FLUSH, STREAM_RESET, cast_nearest, store_state

STATES = ("fp32", "bf16", "fp16", "fp8e4m3")
ACTS = ("fp32", "bf16", "fp16")
OPTIONS = ("checks", "block_v", "num_warps", "readout")
# options of the replay kernel's two-launch path only (the baselines refuse them)
PREPASS_OPTIONS = ("prepass", "coef_warps", "kchunks", "fold_unroll", "tiles", "key_chunk", "pdl")
READOUTS = ("reduce", "tile", "dot", "split")


def launch_shape(geometry, R: int, sm_count: int, interpret: bool, block_v: int | None = None,
                 num_warps: int | None = None, default_block_v: int = 8) -> tuple[int, int, int]:
    """(block_v, value blocks, num_warps) for R rows.  Default: ``default_block_v`` value rows and
    about 32 state elements per thread (one warp for 8 rows of K = 128), the fastest or within 2 %
    of it at every batch size on an H200 (docs/benchmarks.md); under the interpreter whole value
    heads (fewer, larger programs run faster there)."""
    V, BK = geometry.head_v_dim, next_pow2(geometry.head_k_dim)
    Vp = next_pow2(V)
    bv = block_v or (Vp if interpret else default_block_v)
    bv = min(bv, Vp)
    nw = num_warps or max(1, min(8, bv * BK // 1024))
    return bv, triton.cdiv(V, bv), nw


@triton.jit
def gates(a, b, A_log, dt_bias):
    """g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b) (docs/recurrences.md section 1; fp32, a few ulp
    from exp/log): one gate per value head, or with ``a, dt_bias [BK]`` one per key channel (KDA)."""
    g = -tl.exp(A_log) * softplus(a + dt_bias)
    beta = 1.0 / (1.0 + tl.exp(-b))
    return g, beta


@triton.jit
def program_row(slot_ptr, HV: tl.constexpr, H: tl.constexpr, BK: tl.constexpr, K: tl.constexpr):
    """A per-(row, value head, value-row block) program's prologue: its row ``r``, value head ``h``, third grid
    index, slot (negative: a padding row, the caller returns), key head ``hk`` (value head h reads key head
    ``h // (HV / H)``) and the key offsets and mask ``[BK]``."""
    r = tl.program_id(0)
    h = tl.program_id(1)
    p = tl.program_id(2)
    slot = tl.load(slot_ptr + r).to(tl.int64)
    offs_k = tl.arange(0, BK)
    return r, h, p, slot, h // (HV // H), offs_k, offs_k < K


@triton.jit
def gate_params(A_log_ptr, dt_bias_ptr, h, offs_k, mk, K: tl.constexpr, PER_CHANNEL_GATE: tl.constexpr):
    """Value head ``h``'s gate parameters: ``A_log`` and ``dt_bias`` (a scalar, or ``[BK]`` per key channel)."""
    if PER_CHANNEL_GATE:
        dt_bias = tl.load(dt_bias_ptr + h * K + offs_k, mask=mk, other=0.0)
    else:
        dt_bias = tl.load(dt_bias_ptr + h)
    return tl.load(A_log_ptr + h), dt_bias


@triton.jit
def token_gates(a_ptr, b_ptr, tok, h, offs_k, mk, A_log, dt_bias, HV: tl.constexpr, K: tl.constexpr,
                PER_CHANNEL_GATE: tl.constexpr):
    """Token ``tok``'s log gate ``g`` (a scalar, or ``[BK]`` per key channel) and ``beta`` for value head ``h``
    (:func:`gates`, the parameters from :func:`gate_params`)."""
    if PER_CHANNEL_GATE:
        a = tl.load(a_ptr + (tok * HV + h) * K + offs_k, mask=mk, other=0.0).to(tl.float32)
    else:
        a = tl.load(a_ptr + tok * HV + h).to(tl.float32)
    b = tl.load(b_ptr + tok * HV + h).to(tl.float32)
    return gates(a, b, A_log, dt_bias)


@triton.jit
def token_qk(q_ptr, k_ptr, tok, hk, offs_k, mk, H: tl.constexpr, K: tl.constexpr, SCALE: tl.constexpr):
    """Token ``tok``'s L2-normalised q (times ``SCALE``) and k of key head ``hk``, ``[BK]`` fp32."""
    q = tl.load(q_ptr + (tok * H + hk) * K + offs_k, mask=mk, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + (tok * H + hk) * K + offs_k, mask=mk, other=0.0).to(tl.float32)
    return l2_normalise(q, 0) * SCALE, l2_normalise(k, 0)


@triton.jit
def token_inputs(q_ptr, k_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, tok, h, hk, offs_k, mk, H: tl.constexpr,
                 HV: tl.constexpr, K: tl.constexpr, SCALE: tl.constexpr, PER_CHANNEL_GATE: tl.constexpr):
    """Token ``tok``'s normalised q (times ``SCALE``) and k (:func:`token_qk`), log gate and beta for value head
    ``h`` (:func:`gate_params`, :func:`token_gates`)."""
    qn, kn = token_qk(q_ptr, k_ptr, tok, hk, offs_k, mk, H, K, SCALE)
    A_log, dt_bias = gate_params(A_log_ptr, dt_bias_ptr, h, offs_k, mk, K, PER_CHANNEL_GATE)
    g, beta = token_gates(a_ptr, b_ptr, tok, h, offs_k, mk, A_log, dt_bias, HV, K, PER_CHANNEL_GATE)
    return qn, kn, g, beta


@triton.jit
def delta_step(s, g, beta, v, kn, PER_CHANNEL_GATE: tl.constexpr):
    """One delta-rule step of a state tile ``s [BV, BK]`` (fp32): ``S <- alpha S`` (or ``S Diag(alpha)`` per key
    channel), ``d = beta (v - S k)``, ``S <- S + d k^T``, ``alpha = exp(g)``: the new tile and ``d``."""
    if PER_CHANNEL_GATE:
        s = s * tl.exp(g)[None, :]
        d = beta * (v - tl.sum(s * kn[None, :], 1))
        s = s + d[:, None] * kn[None, :]
    else:
        alpha = tl.exp(g)
        d = beta * (v - alpha * tl.sum(s * kn[None, :], 1))
        s = alpha * s + d[:, None] * kn[None, :]
    return s, d


@triton.jit
def select_row(x, sel):
    """Row ``sel`` (a one-hot mask over dim 0) of tile ``x`` as a vector."""
    return tl.sum(tl.where(sel[:, None], x, 0.0), 0)


@triton.jit
def l2_normalise(x, axis: tl.constexpr):
    """x / sqrt(sum(x^2) + 1e-6) along ``axis``."""
    n = tl.sqrt_rn(tl.sum(x * x, axis) + 1e-6)
    return x / tl.expand_dims(n, axis)


@triton.jit
def value_block(pv, vt, offs_k, mk, NVT: tl.constexpr, BV: tl.constexpr, V: tl.constexpr, K: tl.constexpr):
    """Block ``vt`` of a standard-decode program's ``NVT`` blocks of value rows (program ``pv``): its
    rows ``offs_v`` [BV], their mask, the [BV, BK] state mask and the tile's offsets in a head."""
    offs_v = (pv * NVT + vt) * BV + tl.arange(0, BV)
    mv = offs_v < V
    return offs_v, mv, mv[:, None] & mk[None, :], offs_v[:, None] * K + offs_k[None, :]


@triton.jit
def store_block(flush, s, d, ckpt_ptr, sc_ptr, d_rec_ptr, base, tile, ms, offs_v, mv, slot, w, h, seed, cnt,
                HV: tl.constexpr, V: tl.constexpr, K: tl.constexpr, L: tl.constexpr, SCALED: tl.constexpr,
                SR: tl.constexpr, INTERPRET: tl.constexpr):
    """A standard-decode value block's writes: at a flush its folded state ``s`` into the checkpoint
    (nearest or stochastic rounding, fp8 with per-row scales), else its corrected values ``d`` as the
    token's record (row ``w``)."""
    if flush:
        store_state(ckpt_ptr + base * K + tile, sc_ptr + base + offs_v, s, ms, mv, h * V * K + tile, seed, slot,
                    cnt, STREAM_FLUSH, SCALED, SR, INTERPRET)
    else:
        tl.store(d_rec_ptr + ((slot * L + w) * HV + h) * V + offs_v,
                 cast_nearest(d, d_rec_ptr.dtype.element_ty, INTERPRET), mask=mv)


@triton.jit
def ticket(ticket_ptr, slot, NPROG: tl.constexpr):
    """True in exactly one program of a slot's ``NPROG`` programs: the last to take a ticket, which
    then resets it for the next launch.  Called after every read of the slot's cursor: each program
    has consumed the cursor (its loads and stores depend on it) before it issues the atomic, so the
    last program's cursor write cannot reach a read of this launch.  A relaxed atomic suffices (an
    acq_rel one would fence every program on its outstanding stores)."""
    old = tl.atomic_add(ticket_ptr + slot, 1, sem="relaxed")
    last = old == NPROG - 1
    tl.store(ticket_ptr + slot, 0, mask=last)
    return last


@triton.jit(do_not_specialize=["seed", "num_slots"])
def _reset_kernel(slot_ptr, init_ptr, origin_in_ptr, st_ptr, sc_ptr, wpos_ptr, origin_ptr, isflush_ptr,
                  cur_ptr, ready_ptr, pending_ptr, ticket_ptr, sr_ptr, seed, num_slots,
                  HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                  NVB: tl.constexpr, NPOS: tl.constexpr, FLUSH0: tl.constexpr, HAS_INIT: tl.constexpr,
                  HAS_ORIGIN: tl.constexpr, SCALED: tl.constexpr, SR: tl.constexpr, INTERPRET: tl.constexpr):
    r = tl.program_id(0)
    h = tl.program_id(1)
    vb = tl.program_id(2)
    slot = tl.load(slot_ptr + r).to(tl.int64)
    if slot < 0:
        return
    offs_k = tl.arange(0, BK)
    offs_v = vb * BV + tl.arange(0, BV)
    mk = offs_k < K
    mv = offs_v < V
    ms = mv[:, None] & mk[None, :]
    tile = offs_v[:, None] * K + offs_k[None, :]
    if HAS_INIT:
        s = tl.load(init_ptr + (r * HV + h) * V * K + tile, mask=ms, other=0.0).to(tl.float32)
    else:
        s = tl.zeros([BV, BK], dtype=tl.float32)
    base = (slot * NPOS * HV + h) * V
    cnt = tl.load(sr_ptr + slot)
    store_state(st_ptr + base * K + tile, sc_ptr + base + offs_v, s, ms, mv, h * V * K + tile, seed, slot, cnt,
                STREAM_RESET, SCALED, SR, INTERPRET)
    first = (h + vb) == 0
    if HAS_ORIGIN:
        org = tl.load(origin_in_ptr + r).to(tl.int32)
    else:
        org = 0
    tl.store(wpos_ptr + slot, 0, mask=first)
    tl.store(origin_ptr + slot, org, mask=first)
    tl.store(isflush_ptr + slot, FLUSH0, mask=first)
    tl.store(cur_ptr + slot, 0, mask=first)
    tl.store(ready_ptr + slot, 1, mask=first)
    tl.store(pending_ptr + slot, 0, mask=first)
    last = ticket(ticket_ptr, slot, HV * NVB)
    tl.store(sr_ptr + slot, cnt + 1, mask=last)


@triton.jit(do_not_specialize=["R"])
def _close_step_kernel(slot_ptr, pending_ptr, R, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    slot = tl.load(slot_ptr + offs, mask=offs < R, other=-1)
    tl.store(pending_ptr + slot, 0, mask=(offs < R) & (slot >= 0))


def launch_decode(kernel, kern, slot_ids, inputs, out, tiles, **extra) -> None:
    """Launch a standard-decode replay ``kernel`` (a family's one-launch step) of ``kern`` for all rows:
    ``tiles(rows, value blocks)`` value blocks per program, ``extra`` the kernel's own constexprs."""
    R = slot_ids.shape[0]
    bv, nvb, nw = kern.launch_shape(R)
    nvt = tiles(R, nvb)
    nprog = triton.cdiv(nvb, nvt)
    L = kern.decode.buffer
    kernel[(R, kern.HV, nprog)](
        slot_ids, inputs["q"], inputs["k"], inputs["v"], inputs["a"], inputs["b"], out, kern.A_log, kern.dt_bias,
        kern.states, kern.scales, kern.records["d"], kern.records["k"], kern.records["g"], kern.write_pos,
        kern.pending, kern.ticket, kern.sr_count, kern.seed, kern.num_slots,
        H=kern.H, HV=kern.HV, K=kern.K, V=kern.V, L=L, SCALE=kern.K ** -0.5, BK=kern.BK, BV=bv,
        BL=triton.next_power_of_2(max(L - 1, 1)), NPROG=nprog, NVT=nvt, SCALED=kern.scaled, SR=kern.sr,
        INTERPRET=kern.interpret, num_warps=nw, **extra)


class TritonDeltaRuleBase(ServingLayouts):
    """Common part of the delta-rule Triton kernels (not registered itself): a family's base sets ``family``
    and ``PER_CHANNEL_GATE`` (its kernels' constexpr: one gate per value head, or one per key channel)."""

    PER_CHANNEL_GATE = False
    NPOS_EXTRA = 0  # extra state positions per slot beyond the checkpoint (speculative baseline)
    accepted_options: tuple[str, ...] = OPTIONS
    DEFAULT_BLOCK_V = 8
    DEFAULT_NUM_WARPS: int | None = None  # None: about 32 state elements per thread (launch_shape)
    SPLIT_READOUT = False  # whether readout="split" (bf16-part tensor-core readouts) is implemented

    @classmethod
    def unsupported_reason(cls, mode, decode, options):
        if mode.state not in STATES:
            return (f"state dtype {mode.state} is not implemented (states: fp32, bf16, fp16, fp8e4m3 with "
                    f"per-row fp32 scales); fp64 is the literal models' reference mode")
        if mode.act not in ACTS:
            return f"activation dtype {mode.act} is not implemented (activations: fp32, bf16, fp16)"
        ro = options.get("readout", "reduce")
        if ro == "split" and mode.dot != "ieee":
            return (f"option readout='split': the fp32-accurate readout of the ieee modes; dot={mode.dot} declares "
                    f"its own tensor-core readout")
        if mode.dot != "ieee" and not cls.tensor_core_readouts(decode, options):
            return (f"dot={mode.dot}: this kernel's readouts are fp32 FMA reductions (no tensor-core dot), so "
                    f"only ieee is implemented here")
        unknown = set(options) - set(cls.accepted_options)
        if unknown:
            return f"unknown option(s) {sorted(unknown)}; expected a subset of {cls.accepted_options}"
        bv = options.get("block_v")
        if bv is not None and (not isinstance(bv, int) or bv < 1 or bv & (bv - 1)):
            return f"option block_v={bv!r}: expected a power of two"
        nw = options.get("num_warps")
        if nw is not None and nw not in (1, 2, 4, 8, 16):
            return f"option num_warps={nw!r}: expected 1, 2, 4, 8 or 16"
        if ro not in READOUTS:
            return f"option readout={ro!r}: expected one of {READOUTS}"
        if ro == "dot" and cls.kind != "replay":
            return "option readout='dot': the replay kernel's stream readout (a baseline has none)"
        if ro == "split" and not cls.SPLIT_READOUT:
            return "option readout='split': the GDN replay kernel's stream readout (this kernel has none)"
        return None

    @classmethod
    def tensor_core_readouts(cls, decode, options) -> bool:
        """Whether this kernel (with these options) reads the state out with a tf32 / tf32x3 dot."""
        return False

    def __init__(self, config) -> None:
        super().__init__(config)
        g, dev, S = self.geometry, self.device, self.num_slots
        self.H, self.HV, self.K, self.V = g.num_k_heads, g.num_v_heads, g.head_k_dim, g.head_v_dim
        self.checks = bool(config.options.get("checks", True))
        self.block_v = config.options.get("block_v")
        self.num_warps = config.options.get("num_warps")
        self.readout = config.options.get("readout", "reduce")
        # a dot readout contracts the key axis, and a compiled tl.dot needs 16 there: pad the key tile
        # (masked past K); the interpreter takes any width, so only a GPU run saw K < 16 fail to compile
        # (the nightly GPU fuzz found it: kda s32a16-tf32 at K = 2..8, docs/fuzzing.md)
        dot = self.mode.dot != "ieee" or self.readout in ("dot", "split")
        self.BK = max(next_pow2(self.K), 16) if dot else next_pow2(self.K)
        self.interpret = INTERPRET or dev.type != "cuda"
        self.sm_count = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 1
        self.A_log = config.params["A_log"].to(device=dev, dtype=torch.float32).contiguous()
        self.dt_bias = config.params["dt_bias"].to(device=dev, dtype=torch.float32).contiguous()
        # stochastic rounding: replayssm.ops.triton.rounding's Philox scheme, keyed by the mode seed
        self.seed = self.mode.seed
        self.sr = self.mode.rounding == "stochastic"
        self.scaled = self.mode.scaled_state
        self.npos = 1 + self.NPOS_EXTRA
        # per-slot state positions: [slots, npos, HV, V, K] (npos = 1 except the speculative baseline)
        self.states = torch.zeros((S, self.npos, *self.state_shape), dtype=self.mode.state_dtype, device=dev)
        self.scales = torch.ones((S, self.npos, *self.state_shape[:-1]), dtype=torch.float32, device=dev)
        i32 = dict(dtype=torch.int32, device=dev)
        self.write_pos = torch.zeros(S, **i32)
        self.origin = torch.zeros(S, **i32)
        self.is_flush = torch.zeros(S, **i32)
        self.current = torch.zeros(S, **i32)
        self.ready = torch.zeros(S, **i32)
        self.pending = torch.zeros(S, **i32)
        self.ticket = torch.zeros(S, **i32)
        self.sr_count = torch.zeros(S, dtype=torch.int64, device=dev)

    # ---- launch geometry ---------------------------------------------------------------------------
    def launch_shape(self, R: int) -> tuple[int, int, int]:
        """(block_v, value blocks, num_warps) for a batch of R rows (see :func:`launch_shape`)."""
        return launch_shape(self.geometry, R, self.sm_count, self.interpret, self.block_v,
                            self.num_warps or self.DEFAULT_NUM_WARPS, self.DEFAULT_BLOCK_V)

    # ---- cursors on the host (checks and inspection only) ----------------------------------------
    def _host(self, t: torch.Tensor) -> list[int]:
        return [int(x) for x in t.tolist()]

    def _check_ready(self, ids: list[int]) -> None:
        ready = self._host(self.ready)
        for r, s in enumerate(ids):
            if s != PAD_SLOT and not ready[s]:
                raise ValueError(f"slot_ids[{r}]: slot {s} was never reset")

    def _check_pending(self, ids: list[int]) -> None:
        pending = self._host(self.pending)
        for r, s in enumerate(ids):
            if s != PAD_SLOT and not pending[s]:
                raise ValueError(f"slot_ids[{r}]: slot {s} has no verify to commit")

    def _alloc_out(self, R: int, out):
        if out is not None:
            return out
        shape = (R, self.decode.window, *self.out_shape)
        if self.checks:
            return torch.full(shape, float("nan"), dtype=self.mode.act_dtype, device=self.device)
        return torch.empty(shape, dtype=self.mode.act_dtype, device=self.device)

    # ---- reset -------------------------------------------------------------------------------------------
    def reset(self, slot_ids, initial_state=None, origin=None) -> None:
        if self.checks:
            self.check_reset_args(slot_ids, initial_state, origin)
        R = slot_ids.shape[0]
        if R == 0:
            return
        init = None if initial_state is None else initial_state.to(torch.float32).contiguous()
        bv, nvb, nw = self.launch_shape(R)
        _reset_kernel[(R, self.HV, nvb)](
            slot_ids, init if init is not None else self.scales, origin if origin is not None else slot_ids,
            self.states, self.scales, self.write_pos, self.origin, self.is_flush, self.current, self.ready,
            self.pending, self.ticket, self.sr_count, self.seed, self.num_slots,
            HV=self.HV, K=self.K, V=self.V, BK=self.BK, BV=bv, NVB=nvb, NPOS=self.npos,
            FLUSH0=int(self.decode.is_flush(0)), HAS_INIT=init is not None, HAS_ORIGIN=origin is not None,
            SCALED=self.scaled, SR=self.sr, INTERPRET=self.interpret, num_warps=nw)

    def _close_step(self, slot_ids) -> None:
        R = slot_ids.shape[0]
        if R:
            _close_step_kernel[(triton.cdiv(R, 256),)](slot_ids, self.pending, R, BLOCK=256)

    # ---- inspection ----------------------------------------------------------------------------------
    def _state_at(self, slot: int, pos: int) -> torch.Tensor:
        st = self.states[slot, pos].to(torch.float64)
        if self.scaled:
            st = st * self.scales[slot, pos].to(torch.float64).unsqueeze(-1)
        return st

    def _checkpoints64(self, slots: torch.Tensor) -> torch.Tensor:
        """The checkpoints (ring position 0) of ``slots`` in fp64, gathered on the device."""
        st = self.states[:, 0].index_select(0, slots).to(torch.float64)
        if self.scaled:
            st = st * self.scales[:, 0].index_select(0, slots).to(torch.float64).unsqueeze(-1)
        return st

    def _checkpoint_pos(self, slot: int) -> int:
        return 0

    def checkpoint_state(self, slot_ids) -> torch.Tensor:
        ids = self._check_slot_ids(slot_ids)
        out = torch.full((len(ids), *self.state_shape), float("nan"), dtype=torch.float64, device=self.device)
        for r, s in enumerate(ids):
            if s != PAD_SLOT:
                out[r] = self._state_at(s, self._checkpoint_pos(s))
        return out

    def _flags(self) -> dict[str, torch.Tensor]:
        return {"ready": self.ready.clone(), "pending": self.pending.clone(), "sr_count": self.sr_count.clone()}

    supports_restore = True

    def _restore_flags(self, snap: KernelSnapshot) -> None:
        for name in ("ready", "pending", "sr_count"):
            if name not in snap.extra:
                raise ValueError(f"snapshot.extra: expected key {name!r} (a snapshot of {self.name!r})")
        self.ready.copy_(snap.extra["ready"])
        self.pending.copy_(snap.extra["pending"])
        self.sr_count.copy_(snap.extra["sr_count"])
        self.ticket.zero_()


__all__ = ["ACTS", "OPTIONS", "PREPASS_OPTIONS", "READOUTS", "STATES", "TritonDeltaRuleBase", "delta_step",
           "gate_params", "gates", "l2_normalise", "launch_decode", "launch_shape", "program_row", "select_row",
           "store_block", "ticket", "token_gates", "token_inputs", "token_qk", "value_block"]
