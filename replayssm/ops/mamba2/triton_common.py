"""What the Mamba-2 Triton kernels share: the mode support matrix, the launch configuration,
the cursor kernels, and the wrapper base class (the Δ softplus is ``replayssm.ops.triton.math``'s,
the rounding ``replayssm.ops.triton.rounding``'s).

Every wrapper has two paths:

* the interface path (``reset/verify/commit``), which validates arguments on the host first
  (shapes, dtypes, strides, slot ids; cursors read back from the device) when ``checks`` is on
  (the default; ``options={"checks": False}`` turns it off), and keeps host flags
  (``ready``/``pending``) for those checks;
* the raw launch path (``launch_verify``, ``launch_commit``, ``launch_step``): no host
  synchronisation and no host-side state, so a decode step can be captured in a CUDA graph and
  replayed.  Cursors (``write_pos``, ``origin``, the live draft index, the stochastic-rounding
  write counter) live on the device and are read and advanced there.

Serving layouts (``replayssm/ops/serving_layouts.py``, the base class): ragged windows
(``window_lens``), the packed layout (``query_start_loc``) and standard steps on speculative slots
(one-token verifies) are run by the kernel-interface wrapper around the padded launches (each row's
T'_r tokens in a zero-filled ``[R, T']`` buffer, one launch, positions t < T'_r copied back), not by
the kernels themselves; the raw launches take the padded layout only.
"""

from __future__ import annotations

import contextlib
from typing import ClassVar

import torch
import triton
import triton.language as tl

from replayssm.interface import PAD_SLOT, KernelConfig, next_pow2
from replayssm.ops.serving_layouts import ServingLayouts
from replayssm.ops.triton.rounding import INTERPRET, triton_dtype

# options a Triton Mamba-2 kernel accepts (KernelConfig.options)
OPTIONS = {
    "checks": "bool: validate arguments on the host before each launch (default True)",
    "block_p": "int: state rows (headdim) per tile, a power of two >= 16 (default 16)",
    "split": "int: programs per (row, head) along headdim (default: chosen from the batch size)",
    "num_warps": "int: warps per program (default 4 for the single kernel, 1 for the pre-pass path's stream)",
    "vector_readout": ("bool: ieee readouts of all window positions as fp32 tl.dot instead of a loop of "
                       "multiply-reduce per position (single kernel: default on under the interpreter, whose "
                       "cost is per operation; off on the GPU, where the loop measured faster, "
                       "docs/benchmarks.md; the pre-pass path's stream: only when given, then with kchunks=1)"),
    "split_readout": ("bool: the pre-pass path's stream reads out every window position as bf16-part tensor-core "
                      "products at fp32 accuracy (replayssm/ops/triton/split_dot.py; ieee modes; default off)"),
    "fold": ("str: how a flush folds the buffer into the checkpoint: 'rank1' (rank-1 updates, the GPU "
             "default) or 'dot' (one fp32 tl.dot, the interpreter default)"),
    "fold_unroll": "int: rank-1 fold positions unrolled together (their loads in flight at once; default 1)",
    "prefetch": ("bool: keep the next checkpoint tile's load in flight (double buffering); default: the "
                 "configurations measured fastest on the H200, off for standard decode, on for T' > 1"),
    "route": "str: output_only or state_and_output (replay kernels; fixed by the registered name)",
    "prepass": ("bool: output_only route as two launches, a per-(row, group) coefficient pre-pass and a lean "
                "checkpoint stream (True), or the single fused kernel (False); default: the pre-pass path from "
                "8 rows up on the GPU, always under the interpreter"),
    "coef_warps": "int: warps per pre-pass program (default 2)",
    "pdl": ("bool: pre-pass path: programmatic dependent launch (sm_90+, compiled): the stream starts during its "
            "pre-pass, its first checkpoint tile's load in flight before it waits for the coefficients "
            "(replayssm/ops/triton/pdl.py; default: on in the speculative verify on sm_90+, off in standard decode)"),
    "kchunks": ("int: pre-pass path: dstate as this many chunks summed inside a thread before the cross-lane "
                "reduction of a readout (default 4 for T' > 1 ieee on the GPU, else 1)"),
}

SUPPORTED_STATES = ("fp32", "bf16", "fp16", "fp8e4m3")
SUPPORTED_ACTS = ("fp32", "bf16", "fp16")


# options of the replay kernels' two-launch path only (the baselines refuse them)
PREPASS_OPTIONS = ("prepass", "coef_warps", "kchunks", "split_readout", "pdl")


def mode_unsupported(mode, options: dict, dots: tuple[str, ...],
                     accepted: tuple[str, ...] = tuple(OPTIONS)) -> str | None:
    """Why a Triton Mamba-2 kernel cannot run ``mode`` (None when it can)."""
    if mode.state == "fp64":
        return ("the Triton kernels compute in fp32; the fp64 reference (s64a64) is the literal model "
                "'literal-replay' / 'literal-baseline'")
    if mode.state not in SUPPORTED_STATES:
        return (f"state dtype {mode.state} is not implemented (int8 states are not; the 8-bit state is fp8 "
                f"e4m3 with fp32 row scales, mode sfp8a16); supported states: {SUPPORTED_STATES}")
    if mode.act not in SUPPORTED_ACTS:
        return f"activation dtype {mode.act} is not supported; expected one of {SUPPORTED_ACTS}"
    if mode.dot not in dots:
        return (f"readout dot {mode.dot} is not implemented by this kernel (supported: {dots}); it would "
                f"otherwise run silently in another precision")
    unknown = set(options) - set(accepted)
    if unknown:
        return f"unknown option(s) {sorted(unknown)}; expected some of {sorted(accepted)}"
    return None


def sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132


@triton.jit
def mask_and(vec_mask, cond):
    """``vec_mask & cond`` for a scalar condition, built from comparisons: the interpreter
    rejects a vector store whose mask mixes a scalar boolean in (docs/kernel_interface.md)."""
    return vec_mask & ((vec_mask.to(tl.int32) * 0 + cond.to(tl.int32)) != 0)


@triton.jit
def reset_cursor_kernel(slot_ptr, org_src_ptr, wp_ptr, org_ptr, cnt_ptr, live_ptr, R,
                        HAS_ORG: tl.constexpr, BLOCK: tl.constexpr):
    """(Re)admission: write_pos = 0, origin = given (0), live draft buffer = 0, write counter + 1
    (so a re-admitted slot never reuses a random stream)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    slot = tl.load(slot_ptr + i, mask=i < R, other=-1).to(tl.int64)
    act = (i < R) & (slot >= 0)
    tl.store(wp_ptr + slot, tl.zeros([BLOCK], tl.int32), mask=act)
    tl.store(live_ptr + slot, tl.zeros([BLOCK], tl.int32), mask=act)
    if HAS_ORG:
        o = tl.load(org_src_ptr + i, mask=act, other=0).to(tl.int32)
    else:
        o = tl.zeros([BLOCK], tl.int32)
    tl.store(org_ptr + slot, o, mask=act)
    c = tl.load(cnt_ptr + slot, mask=act, other=0)
    tl.store(cnt_ptr + slot, c + 1, mask=act)


class TritonMamba2Base(ServingLayouts):
    """Storage common to the Triton Mamba-2 kernels; subclasses add their launches."""

    family = "mamba2"
    dots: ClassVar[tuple[str, ...]] = ("ieee",)
    accepted_options: ClassVar[tuple[str, ...]] = tuple(k for k in OPTIONS if k not in PREPASS_OPTIONS)

    @classmethod
    def unsupported_reason(cls, mode, decode, options):
        return mode_unsupported(mode, options, cls.dots, cls.accepted_options)

    def __init__(self, config: KernelConfig) -> None:
        super().__init__(config)
        if self.device.type != "cuda" and not INTERPRET:
            raise ValueError(f"device: kernel {self.name!r} launches Triton kernels; expected a CUDA device "
                             f"(or TRITON_INTERPRET=1 for CPU tensors), got {self.device}")
        opts = config.options
        self.checks = bool(opts.get("checks", True))
        g = self.geometry
        self.block_p = int(opts.get("block_p", 16))
        if self.block_p < 16 or self.block_p & (self.block_p - 1):
            raise ValueError(f"options['block_p']: expected a power of two >= 16, got {self.block_p}")
        self.num_warps = int(opts.get("num_warps", 4))
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"options['num_warps']: expected 1, 2, 4, 8 or 16, got {self.num_warps}")
        self.split_opt = opts.get("split")
        self.vector_readout = bool(opts.get("vector_readout", INTERPRET))
        self.fold = opts.get("fold", "dot" if INTERPRET else "rank1")
        if self.fold not in ("rank1", "dot"):
            raise ValueError(f"options['fold']: expected 'rank1' or 'dot', got {self.fold!r}")
        self.fold_unroll = int(opts.get("fold_unroll", 1))
        if self.fold_unroll not in (1, 2, 4, 8):
            raise ValueError(f"options['fold_unroll']: expected 1, 2, 4 or 8, got {self.fold_unroll}")
        self.prefetch = bool(opts.get("prefetch", self.decode.window > 1))
        self.nchunks = triton.cdiv(g.headdim, self.block_p)
        if self.split_opt is not None and not 1 <= int(self.split_opt) <= self.nchunks:
            raise ValueError(f"options['split']: expected 1..{self.nchunks} (headdim {g.headdim} in tiles of "
                             f"{self.block_p}), got {self.split_opt}")
        self.block_n = max(16, next_pow2(g.dstate))
        self.sms = sm_count(self.device)
        m = self.mode
        self.state_kind = triton_dtype(m.state)
        self.act_kind = triton_dtype(m.act)
        self.sr = m.rounding == "stochastic"
        self.seed = int(m.seed)
        p = {k: v.detach().to(device=self.device, dtype=torch.float32).contiguous() for k, v in config.params.items()}
        self.A, self.dt_bias, self.D = p["A"], p["dt_bias"], p["D"]
        S, dev = self.num_slots, self.device
        self.write_pos = torch.zeros(S, dtype=torch.int32, device=dev)
        self.origin = torch.zeros(S, dtype=torch.int32, device=dev)
        self.counter = torch.zeros(S, dtype=torch.int32, device=dev)
        self.live = torch.zeros(S, dtype=torch.int32, device=dev)
        self.ready = [False] * S
        self.pending = [False] * S
        self._dummy = torch.zeros(1, dtype=m.act_dtype, device=dev)

    # ---- launch helpers ------------------------------------------------------------------------
    def _device_ctx(self):
        return torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()

    def split_for(self, rows: int) -> int:
        """Programs per (row, head) along headdim: enough programs to fill the device."""
        if self.split_opt is not None:
            return int(self.split_opt)
        want = 8 * self.sms
        have = max(1, rows * self.geometry.nheads)
        return max(1, min(self.nchunks, triton.cdiv(want, have)))

    def _z(self, inputs):
        return inputs["z"] if self.geometry.has_z else self._dummy

    def _new_out(self, R: int):
        return torch.full((R, self.decode.window, *self.out_shape), float("nan"), dtype=self.mode.act_dtype,
                          device=self.device)

    def _reset_cursors(self, slot_ids, origin) -> None:
        R = slot_ids.shape[0]
        BLOCK = 128
        with self._device_ctx():
            reset_cursor_kernel[(triton.cdiv(R, BLOCK),)](
                slot_ids, origin if origin is not None else slot_ids, self.write_pos, self.origin, self.counter,
                self.live, R, HAS_ORG=origin is not None, BLOCK=BLOCK)

    def _host_reset(self, ids) -> None:
        for s in ids:
            if s != PAD_SLOT:
                self.ready[s], self.pending[s] = True, False

    def _host_flags(self) -> dict[str, torch.Tensor]:
        return {"ready": torch.tensor(self.ready), "pending": torch.tensor(self.pending),
                "rng_counter": self.counter.detach().clone()}

    def _restore_flags(self, snap) -> None:
        extra = snap.extra
        for key in ("ready", "pending", "rng_counter"):
            if key not in extra:
                raise ValueError(f"snapshot.extra: expected key {key!r} (a snapshot of {self.name!r}), "
                                 f"got {sorted(extra)}")
        self.ready = [bool(v) for v in extra["ready"].tolist()]
        self.pending = [bool(v) for v in extra["pending"].tolist()]
        self.counter.copy_(extra["rng_counter"].to(self.device, torch.int32))

    @staticmethod
    def _check_tensor(name, t, shape, dtype):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(shape) or t.dtype != dtype:
            raise ValueError(f"{name}: expected {dtype} {tuple(shape)}, got "
                             f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")


__all__ = ["OPTIONS", "PAD_SLOT", "TritonMamba2Base", "mask_and", "mode_unsupported"]
