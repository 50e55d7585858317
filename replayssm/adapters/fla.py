"""The FLA source: flash-linear-attention's fused recurrent GDN and KDA kernels as baselines.

``pip install fla-core==0.6.0 einops`` (or ``pip install replayssm[adapters]``); registers
``fla-baseline`` for family gdn (``fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule``)
and for family kda (``fla.ops.kda.fused_recurrent_kda``).

Oracle: the validation engine against ``literal-baseline`` (fp64 gated delta rule on the accepted
stream; the literal baseline at the same mode for the tolerance rule).  Expected: the literal
model's error within its small factor.

FLA's kernel is a dense-batch, training-style recurrence: ``[N, T, ...]`` inputs, one initial state
per sequence, no slots, no padding, no speculative bookkeeping.  Bridges:

* **Slots.**  The adapter owns the per-slot states, gathers the active rows' states into a dense
  ``[n, HV, V, K]`` batch (``state_v_first=True`` is our ``[V, K]`` layout), runs the kernel and
  scatters back; padding rows are never passed to it (their outputs stay untouched).
* **Gates in the kernel.**  ``g`` = raw ``a`` with ``use_gate_in_kernel=True`` (the kernel computes
  ``-exp(A_log) softplus(a + dt_bias)``), ``beta`` = raw ``b`` with ``use_beta_sigmoid_in_kernel=True``,
  q / k L2-normalised in the kernel, scale K^-1/2.  KDA (read in ``fla/ops/kda/fused_recurrent.py``)
  takes the same arguments with ``g`` = ``a [N, T, HV, K]`` (the gate pre-activation per key
  channel; without ``use_gate_in_kernel`` it would be the log decay itself), ``A_log [HV]`` and
  ``dt_bias`` read at ``i_hv * K + k`` (our ``[HV, K]``, contiguous; the docstring's ``[HV]`` is
  the GDN shape), ``lower_bound=None`` (the softplus gate, not the sigmoid "safe gate"),
  ``allow_neg_eigval=False``: exactly ``naive.py``'s recurrence (``S *= exp(g)`` per key column,
  ``v -= S k``, ``v *= beta``, ``S += v kᵀ``, ``o = S q``), checked against FLA's own
  ``naive_recurrent_kda`` when the family was written.
* **Speculative decode** by keeping draft states in the adapter: the kernel runs one token at a
  time (T = 1 per launch, the state it returns feeding the next), each draft position's state is
  kept, and commit(k) makes draft k - 1 live (the accepted count includes the bonus token).

Conventions (both families): beta = sigmoid(b) in fp32, q / k divided by sqrt(sum u^2 + 1e-6),
softplus threshold 20 (``log(1 + exp(x))`` below it; on NVIDIA FLA's ``softplus`` is PTX
``ex2.approx`` / ``lg2.approx``, which the GPU run judges): the defaults, nothing declared.

Modes: FLA returns the final state in fp32; the adapter stores it in the mode's state dtype (fp32,
bf16 or fp16: a round-to-nearest cast, as a serving engine keeping a bf16 state would), and the
next token starts from the stored value.  Activations fp32 / bf16 / fp16; fp32 arithmetic, no dots.
"""

from __future__ import annotations

import importlib
import importlib.util
import warnings

import torch

from replayssm.adapters._base import float_mode_reason
from replayssm.adapters._draft_states import DraftStatesAdapter
from replayssm.adapters._vllm_source import launch_guard
from replayssm.registry import register

NAME = "fla"
VERSION = "0.6.0"
HOW = f"pip install fla-core=={VERSION} einops (or pip install 'replayssm[adapters]')"

_FN = {}


class FLABaselineGDN(DraftStatesAdapter):
    op = ("fla.ops.gated_delta_rule", "fused_recurrent_gated_delta_rule")  # (module, function)
    name = "fla-baseline"
    family = "gdn"
    kind = "baseline"
    description = ("flash-linear-attention fused_recurrent_gated_delta_rule (GDN baseline; speculative: "
                   "draft states kept by the adapter)")
    # Read in fla-core 0.6.0 (ops/gated_delta_rule/fused_recurrent.py): beta = sigmoid(b) in fp32,
    # q, k divided by sqrt(sum u^2 + 1e-6), softplus threshold 20: the default conventions.
    conventions: dict = {}

    @classmethod
    def unsupported_reason(cls, mode, decode, options):
        return float_mode_reason(mode, "FLA's fused recurrent GDN (with the adapter's state store)")

    def __init__(self, config):
        super().__init__(config)
        self.fn = _kernel(*self.op)
        T = self.decode.window if self.decode.speculative else 1
        self.T = T
        p = {k: v.to(self.device, torch.float32).contiguous() for k, v in config.params.items()}
        self.A_log, self.dt_bias = p["A_log"], p["dt_bias"]
        self.drafts = torch.zeros((self.num_slots, T, *self.state_shape), dtype=self.mode.state_dtype,
                                  device=self.device)
        self.live = torch.ones(self.num_slots, dtype=torch.long, device=self.device)  # accepted count

    def reset(self, slot_ids, initial_state=None, origin=None):
        ids = self.check_reset_args(slot_ids, initial_state, origin)
        rows = self.active_rows(slot_ids)
        s = slot_ids.index_select(0, rows).long()
        self.drafts[s, 0] = 0 if initial_state is None else initial_state.index_select(0, rows).to(self.drafts.dtype)
        self.live[s] = 1
        self.mark_reset(ids)

    def verify(self, slot_ids, inputs, out=None):
        ids = self.begin_verify(slot_ids, inputs, out)
        out = self.new_out(len(ids)) if out is None else out
        act = self.active_rows(slot_ids)
        s = slot_ids.index_select(0, act).long()
        state = self.drafts[s, self.live[s] - 1].contiguous()
        tok = {k: v.index_select(0, act) for k, v in inputs.items()}
        for t in range(self.T):
            one = {k: v[:, t:t + 1].contiguous() for k, v in tok.items()}
            with launch_guard(self.device):
                o, ht = self.fn(
                    one["q"], one["k"], one["v"], g=one["a"], beta=one["b"], initial_state=state,
                    output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                    A_log=self.A_log, dt_bias=self.dt_bias, use_beta_sigmoid_in_kernel=True, state_v_first=True)
            out[act, t] = o[:, 0].to(out.dtype)
            state = ht.to(self.drafts.dtype)
            self.drafts[s, t] = state
            state = state.contiguous()
        self.end_verify(ids)
        return out

    def commit(self, slot_ids, accepted):
        self.begin_commit(slot_ids, accepted)
        act = self.active_rows(slot_ids)
        self.live[slot_ids.index_select(0, act).long()] = accepted.index_select(0, act).long()

    def _drafts(self) -> torch.Tensor:
        return self.drafts


class FLABaselineKDA(FLABaselineGDN):
    op = ("fla.ops.kda", "fused_recurrent_kda")
    family = "kda"
    description = ("flash-linear-attention fused_recurrent_kda (KDA baseline; speculative: draft states kept by "
                   "the adapter)")
    # Read in fla-core 0.6.0 (ops/kda/fused_recurrent.py): beta = sigmoid(b) in fp32, q, k divided by
    # sqrt(sum u^2 + 1e-6), softplus threshold 20 (fla/ops/utils/softplus.py): the default conventions.
    conventions: dict = {}

    @classmethod
    def unsupported_reason(cls, mode, decode, options):
        return float_mode_reason(mode, "FLA's fused recurrent KDA (with the adapter's state store)")

    def timed_step(self, slot_ids, inputs, out, accepted):
        """Standard decode, for the bench (``_base.py``): FLA's serving launch alone,
        ``fused_recurrent_kda_fwd`` reading and writing the slots' states in place through
        ``ssm_state_indices`` (as vLLM calls it), on inputs made contiguous once; one token, so the
        same arithmetic and roundings as :meth:`verify`'s gather / kernel / cast / scatter."""
        if self.decode.speculative:
            raise ValueError("decode: FLA's KDA timed step is for standard decode (speculative keeps the draft "
                             "states in the adapter)")
        self.no_padding(slot_ids)
        fwd = _kernel("fla.ops.kda.fused_recurrent", "fused_recurrent_kda_fwd")
        pool = self.drafts.view(self.num_slots, *self.state_shape)  # T = 1: one state per slot
        idx, tok = slot_ids.to(torch.int32).contiguous(), {k: v.contiguous() for k, v in inputs.items()}

        def step():
            with launch_guard(self.device):
                fwd(tok["q"], tok["k"], tok["v"], g=tok["a"], beta=tok["b"], A_log=self.A_log, dt_bias=self.dt_bias,
                    initial_state=pool, inplace_final_state=True, ssm_state_indices=idx,
                    use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                    state_v_first=True)
        return step


CLASSES = (FLABaselineGDN, FLABaselineKDA)


def _kernel(module: str, function: str):
    """FLA's kernel, imported on first use (importing fla is slow: load() stays cheap)."""
    if module not in _FN:
        try:
            with warnings.catch_warnings():  # fla warns at import that it runs on CPU when no GPU exists
                warnings.simplefilter("ignore", UserWarning)
                mod = importlib.import_module(module)
        except Exception as e:
            raise ValueError(f"flash-linear-attention: importing {module} failed "
                             f"({type(e).__name__}: {e}); {HOW}") from None
        _FN[module] = getattr(mod, function)
    return _FN[module]


def installed_version() -> str:
    """fla-core's version when it is VERSION (checked from its metadata, not imported); one-line ``RuntimeError``
    otherwise."""
    from importlib import metadata
    if importlib.util.find_spec("fla") is None:
        raise RuntimeError(f"flash-linear-attention: package 'fla' not installed; {HOW}")
    try:
        have = metadata.version("fla-core")
    except metadata.PackageNotFoundError:
        have = "unknown"
    if have != VERSION:
        raise RuntimeError(f"flash-linear-attention: fla-core {have} installed, the adapter is written against "
                           f"fla-core {VERSION}; {HOW}")
    return have


def load(path: str | None = None) -> list[str]:
    """Register ``fla-baseline`` (gdn, kda) when fla-core VERSION is installed (:func:`installed_version`)."""
    have = installed_version()
    for cls in CLASSES:
        register(cls, replace=True)
    return [f"{cls.family}/{cls.name} (fla-core {have})" for cls in CLASSES]
