"""flash-linear-attention 0.6.0's ``ShortConvolution`` (its decode step on a shift-register cache) as the conv of
a mixer kernel under test: ``mixer-fla-shortconv`` = FLA's conv + the family's literal ReplaySSM + the literal
gated norm, declaring the ``draft-snapshots`` design.

Where from: the installed package (``pip install fla-core==0.6.0 einops``, or ``pip install
'replayssm[adapters]'``), version checked as ``fla.py`` does; ``fla.modules.ShortConvolution`` is built
unchanged (``backend='triton'``, ``activation='silu'``, its weight ``[C, 1, d_conv]`` and bias set from the
mixer's parameters in the compute dtype, fp32: their values are the activation dtype's, so exact).

What FLA gives: a cache ``[N, C, d_conv]`` per sequence (the last d_conv inputs; the update reads columns
1..d_conv-1, appends the new input, convolves the d_conv columns, applies SiLU and stores the shifted cache
in place: ``ShortConvolution.step`` -> the Triton ``causal_conv1d_update`` kernel, one token per sequence,
fp32 arithmetic, outputs rounded to nearest).  It has no slots (the cache is a dense batch), no multi-token
step, and no rollback.  The adapter composes FLA's own update with the books the declared design needs:

* Verify: the named slots' committed caches are gathered into a dense batch; for each draft position s FLA's
  step runs on it (one token per sequence, the cache updated in place by FLA) and the cache after position
  s is kept as snapshot s.  The committed cache is not touched.
* Commit (k accepted): the slot's cache becomes snapshot k - 1 (the design's copy; FLA has none).

Layout: FLA's cache is one column wider than the design's ``state [C, d_conv - 1]``: its column 0 is the
input that FLA's next update shifts out unread.  ``conv_storage`` hands the design's ``state`` and
``snapshots`` as FLA's last d_conv - 1 columns (the committed window is read from there, bit for bit) and
also the whole caches (``fla_cache``, ``fla_snapshots``), so the unnamed-slot check covers every column.

Where it runs: FLA's conv update is Triton only (its other backend is Dao-AILab's CUDA kernel, which
``mixer-causal-conv1d`` validates; ``FLA_CONV_BACKEND=cuda`` is refused).  On a CPU: the Triton interpreter
(``TRITON_INTERPRET=1``; without it Triton has no CPU driver: "0 active drivers").  Under the interpreter
FLA's autotuner cannot time its configs (same error), so the launch uses one of FLA's own configs (the
widest channel block; a config only splits the channels into blocks, each channel's arithmetic is the same);
on a GPU the autotuner chooses.  Activations fp32 and fp16 everywhere, bf16 on a GPU: the interpreter's
fp32 -> bf16 store truncates although FLA names round-to-nearest (measured in
``tests/adapters/test_mixer_fla_shortconv.py``; with the refusal lifted s32a16 fails ssm-state on gdn and
mamba2).  fp64 activations are refused on every device: FLA's store names ``fp_downcast_rounding``, which
Triton's semantic layer (the interpreter's and the GPU compiler's) rejects for an fp32 -> fp64 cast (measured
there, under the interpreter).

Oracle: the mixer runner (fp64 whole step, the tolerance rule against the literal mixer, the committed
window bit for bit read by the ``draft-snapshots`` rule).  Expected error: the literal mixer's order (fp32
accumulation, one rounding to the activation dtype), the snapshots exact (data movement).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import types
import warnings

import torch

from replayssm.adapters import fla as fl
from replayssm.adapters._external_conv import ExternalConvMixer, interpreting
from replayssm.adapters._vllm_source import launch_guard
from replayssm.mixer.kernel import register_mixer_kernel
from replayssm.ops.conv.literal import DraftSnapshotsStore

MODULE = "fla.modules.causal_conv1d.ops"  # ShortConvolution and the Triton update kernel it launches
BACKEND_ENV = "FLA_CONV_BACKEND"
_LOADED: dict[str, types.ModuleType] = {}


def conv_module() -> types.ModuleType:
    """FLA's ``causal_conv1d`` ops module (``ShortConvolution``); ``RuntimeError`` (one line) when it cannot load."""
    if "ops" not in _LOADED:
        fl.installed_version()
        try:
            with warnings.catch_warnings():  # fla warns at import that it runs on CPU when no GPU exists
                warnings.simplefilter("ignore", UserWarning)
                _LOADED["ops"] = importlib.import_module(MODULE)
        except Exception as e:  # one line, never a traceback
            raise RuntimeError(f"flash-linear-attention: importing {MODULE} failed ({type(e).__name__}: {e}); "
                               f"{fl.HOW}") from None
    return _LOADED["ops"]


@contextlib.contextmanager
def one_config(kernel):
    """Under the interpreter, FLA's autotuned ``kernel`` launched with one of its own configs (the widest
    channel block ``BD``): the autotuner would time every config and needs a GPU driver for that."""
    tuner = kernel
    while not hasattr(tuner, "configs"):
        tuner = tuner.fn
    saved = tuner.configs
    if interpreting():
        tuner.configs = [max(saved, key=lambda c: c.kwargs.get("BD", 0))]
    try:
        yield
    finally:
        tuner.configs = saved


class FLAShortConvStore(DraftSnapshotsStore):
    """FLA's caches ``[C, d_conv]`` and one per draft position; the verify is FLA's step, the commit the copy."""

    def __init__(self, num_slots, channels, width, window, act_dtype, compute_dtype, device):
        super().__init__(num_slots, channels, width, window, act_dtype, compute_dtype, device)
        self.tensors = {"cache": torch.zeros((num_slots, channels, width), dtype=act_dtype, device=device),
                        "snapshots": torch.zeros((num_slots, window, channels, width), dtype=act_dtype,
                                                 device=device)}
        self.module = None

    def reset_slot(self, slot, window):
        self.tensors["cache"][slot, :, 1:] = window

    def commit_slot(self, slot, k):
        self.tensors["cache"][slot] = self.tensors["snapshots"][slot, k - 1]

    def short_conv(self, weight, bias):
        """FLA's ``ShortConvolution`` with the mixer's conv weights (built once)."""
        if self.module is None:
            ops = conv_module()
            m = ops.ShortConvolution(self.C, self.w, bias=bias is not None, activation="silu", backend="triton",
                                     device=weight.device, dtype=weight.dtype)
            if m.backend != "triton":
                raise ValueError(f"{BACKEND_ENV}={m.backend}: mixer-fla-shortconv validates FLA's Triton update "
                                 f"(unset {BACKEND_ENV})")
            with torch.no_grad():
                m.weight.copy_(weight[:, None, :])
                if bias is not None:
                    m.bias.copy_(bias)
            self.module = m.requires_grad_(False)
        return self.module

    def verify(self, rows, x, weight, bias):
        out = torch.zeros_like(x)
        if not rows:
            return out
        m, ops = self.short_conv(weight, bias), conv_module()
        rr, slots = [r for r, _ in rows], [s for _, s in rows]
        cache = self.tensors["cache"][slots].contiguous()  # gathered: FLA's cache is a dense batch
        for t in range(x.shape[1]):
            with torch.no_grad(), launch_guard(x.device, modules=(ops,)), one_config(ops.causal_conv1d_update_kernel):
                y, cache = m(x[rr, t:t + 1].contiguous(), cache=cache, output_final_state=True)  # FLA's step
            out[rr, t] = y[:, 0]
            self.tensors["snapshots"][slots, t] = cache
        return out

    def storage(self):
        c, s = self.tensors["cache"], self.tensors["snapshots"]
        return {"state": c[..., 1:].clone(), "snapshots": s[..., 1:].clone(), "fla_cache": c.clone(),
                "fla_snapshots": s.clone()}


@register_mixer_kernel
class FLAShortConvMixer(ExternalConvMixer):
    name = "mixer-fla-shortconv"
    description = (f"flash-linear-attention {fl.VERSION} ShortConvolution step (Triton; draft snapshots kept by "
                   "the adapter) + the literal ReplaySSM")
    conv_policy = "draft-snapshots"
    store = FLAShortConvStore
    triton_conv = True
    load_source = staticmethod(conv_module)
    source_first_line = True
    no_device_reason = "no CUDA device: run with TRITON_INTERPRET=1 (FLA's conv update is Triton only)"

    @classmethod
    def unsupported_reason(cls, geometry, mode):
        reason = cls.source_reason()
        if reason:
            return reason
        if os.environ.get(BACKEND_ENV, "triton") != "triton":
            return (f"{BACKEND_ENV}={os.environ[BACKEND_ENV]} selects Dao-AILab's CUDA update (mixer-causal-conv1d "
                    f"validates it); unset it")
        if mode.act_dtype == torch.float64:
            # measured (tests/adapters/test_mixer_fla_shortconv.py): Triton rejects the kernel's rtne store for fp64
            return "fp64 activations: FLA's update computes in fp32 and its store's rounding mode rejects fp64"
        # bf16 under the interpreter, measured (tests/adapters/test_mixer_fla_shortconv.py): its fp32 -> bf16
        # store truncates
        return cls.triton_reason(mode)
