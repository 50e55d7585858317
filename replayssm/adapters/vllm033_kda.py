"""Adapters for the vLLM 0.33.0 release's KDA "RecoverSSM" (Kimi-K3 speculative decode), family kda.

Oracle: the validation engine (fp64 KDA recurrence on the accepted stream under the declared gate
law, the literal model of ``fold-every-commit`` at the same precision mode, exact invariants:
checkpoint bit-identical over a verify, padding rows and canary slots untouched, every output
written).  Expected: the literal model's error within its small factor at every declared mode.

Loaded by :mod:`replayssm.adapters.vllm033` from the release's
``vllm/models/kimi_k3/nvidia/ops/recoverssm.py`` (never copied;
``_vllm033_source.load_recoverssm``).  vLLM runs it only with speculative decoding ("Kimi-K3
supports --use-replayssm only with speculative decoding"):

* verify: the Triton ``kda_recoverssm_verify`` reads the frozen checkpoint (never writes it), steps
  the delta rule in fp32 over the request's window, writes the outputs and, per request row of the
  step and token, the records ``KDARecoverSSMRecords``: the fp32 correction
  ``u_t = sigmoid(b_t) (v_t - S' k_t)`` [V] and the raw key and raw gate ``[k_t | a_t]`` [2K] in the
  activation dtype (exact copies of the inputs);
* commit: ``KDARecoverSSMCommitContext.commit`` (vLLM's host side, built by its own ``create`` over
  one layer) plans the commit (``commit_len = min(accepted, query_len, T')``), compacts the conv
  state and folds the accepted prefix into the checkpoint in fp32,
  ``S = S_0 Diag(prod_t exp g_t) + sum_t u_t (exp(sum_{t' > t} g_t') ⊙ k̂_t)ᵀ``, gates recomputed from
  the raw records.  That is ``fold-every-commit`` (``interface.FoldEveryCommitPolicy``: no history,
  write_pos 0 before every verify, the checkpoint moves only at commit); k = 0 folds nothing
  (``zero_accept = "noop"``).

Two gate laws, one adapter each (``_kda_gate``: ``USE_LOWER_BOUND = lower_bound is not None``):

* ``vllm033-kda-recoverssm``: Kimi-K3's bounded law ``g = lb sigmoid(exp(A_log) (a + dt_bias))``,
  declared as the KDA convention ``gate_lower_bound`` (replayssm/conventions.py) with lb = -5.0
  (vLLM's ``_KDA_GATE_LOGBOUND_MIN``, the fastest forgetting it allows);
* ``vllm033-kda-recoverssm-softplus``: ``lower_bound=None``, the softplus law ``-exp(A_log)
  softplus(a + dt_bias)`` (threshold 20, ``log(1 + exp(x))``), the family's default.

Bridges (besides the ``_base.py`` slot bridge: slot s = block s + 1, null block 0 = vLLM's
``NULL_BLOCK_ID``; a block ``<= 0`` is skipped and its outputs written as zeros):

* **Layout.**  q, k ``[1, N, H, K]``, v ``[1, N, H, V]``, raw gate ``[1, N, H, K]``, raw beta
  ``[1, N, H]`` packed with ``query_start_loc`` (the engine's packed calls pass through, ragged ones
  are packed with each row's length, ``_base.py``); the verify gets the active rows only.  One head
  count for q, k and v (no GQA): other geometries are refused.  Checkpoint ``[blocks, H, V, K]`` (our
  layout); ``dt_bias [H, K]``, ``A_log [H]`` fp32.
* **Records rows.**  The records are indexed by the request's row in the verify's batch, not by slot
  ("not part of a request's state", vLLM's docstring; so the snapshot reports none): the adapter
  keeps each slot's verify row and commits in that row order (rows not committed now get the null
  block, which the plan skips).
* **Conv state.**  The commit also compacts the short-convolution state (``_compact_conv_state_kernel``,
  not part of this op): a zero conv state of width ``T' + 2`` (dim-first, a 4-tap history) is
  allocated and left to it.
* **CuTe-DSL.**  The release's other backend (``recoverssm/cutedsl``: tcgen05 verify and commit) runs
  on SM10x only (its ``can_use_cute_recoverssm``): the option ``backend="cute"`` is refused with that
  one line; ``backend="triton"`` (default) is the path validated here.

Conventions, read from the code: q and k normalised as ``u * rsqrt(sum u^2 + 1e-6)`` (the reciprocal
form, declared), beta ``sigmoid(b)`` in fp32 (not rounded), softplus threshold 20.

Modes: everything in fp32 registers (no dots): the state in the checkpoint tensor's dtype (plain
cast, round to nearest), any float activations, ieee.  Under the Triton interpreter (CPU) a bf16
state or bf16 activations are refused (its fp32 -> bf16 stores truncate; ``_base.py``): those modes
are GPU-only.
"""

from __future__ import annotations

import types

import torch

from replayssm.adapters._base import float_mode_reason, interpreter_reason
from replayssm.adapters._fold_every_commit import FoldEveryCommitAdapter
from replayssm.adapters._vllm_source import launch_guard
from replayssm.interface import PAD_SLOT

LOWER_BOUND = -5.0  # vLLM's _KDA_GATE_LOGBOUND_MIN: the bounded law's fastest forgetting


class Vllm033KDARecoverSSM(FoldEveryCommitAdapter):
    """``vllm033-kda-recoverssm``: Triton ``kda_recoverssm_verify`` + ``KDARecoverSSMCommitContext.commit``,
    bounded gate law (lb = -5)."""

    name = "vllm033-kda-recoverssm"
    family = "kda"
    kind = "replay"
    decodes = ("speculative",)
    bookkeeping = "fold-every-commit"
    zero_accept = "noop"
    supports_packed_layout = True
    supports_ragged_windows = True
    accepted_options = ("backend",)
    lower_bound: float | None = LOWER_BOUND
    description = ("vLLM 0.33.0 release: KDA RecoverSSM (Kimi-K3), Triton kda_recoverssm_verify on a frozen "
                   "checkpoint + commit folding the accepted prefix in fp32 (fold-every-commit), gate "
                   "-5 * sigmoid(exp(A_log) (a + dt_bias))")
    conventions = {"l2_form": "reciprocal", "gate_lower_bound": LOWER_BOUND}

    @classmethod
    def unsupported_geometry(cls, geometry, decode=None):
        if geometry.num_k_heads != geometry.num_v_heads:
            return (f"vLLM 0.33.0's KDA RecoverSSM takes one head count for q, k and v (no GQA): got "
                    f"{geometry.num_k_heads} key heads, {geometry.num_v_heads} value heads")
        return None

    @classmethod
    def unsupported_reason(cls, mode, decode, options):
        backend = options.get("backend", "triton")
        if backend == "cute":
            return ("backend: the CuTe-DSL RecoverSSM path (recoverssm/cutedsl) needs SM10x tensor cores (tcgen05), "
                    "unavailable on this suite's devices: validate backend='triton'")
        if backend != "triton":
            return f"backend: expected 'triton' or 'cute', got {backend!r}"
        if not decode.speculative:
            return "vLLM 0.33.0 runs KDA RecoverSSM with speculative decoding only (Kimi-K3 --use-replayssm)"
        return float_mode_reason(mode, "vLLM 0.33.0's KDA RecoverSSM")

    def __init__(self, config):
        super().__init__(config)
        if self.device.type == "cpu" and interpreter_reason(self.mode):
            raise ValueError(f"mode: kernel {self.name!r} cannot be judged at {self.mode.id} on the CPU: "
                             f"{interpreter_reason(self.mode)[1]}; run it on a GPU (--device cuda)")
        self.mod = type(self).modules["recoverssm"]
        g, m, S, T = self.geometry, self.mode, self.num_slots + 1, self.decode.window
        H, K = g.num_v_heads, g.head_k_dim
        p = {k: v.to(self.device, torch.float32).contiguous() for k, v in config.params.items()}
        self.A_log, self.dt_bias = p["A_log"], p["dt_bias"]
        self.state = torch.zeros((S, *self.state_shape), dtype=m.state_dtype, device=self.device)
        self.records = self.mod.KDARecoverSSMRecords.allocate(self.num_slots, H, T, K, m.act_dtype, self.device)
        self.conv = torch.zeros((S, 1, T + 2), dtype=torch.float32, device=self.device)
        layer = types.SimpleNamespace(kv_cache=(self.conv, self.state), recoverssm_records=self.records,
                                      A_log=self.A_log, dt_bias=self.dt_bias.reshape(-1), local_num_heads=H,
                                      head_dim=K, gate_lower_bound=self.lower_bound)
        self.ctx = self.mod.KDARecoverSSMCommitContext.create([layer], spec_query_len=T,
                                                              max_num_reqs=self.num_slots, backend="triton")
        self.verify_rows: list[int] = []  # the slot of each row of the last verify (records row = batch row)
        self.verify_qsl = torch.zeros(1, dtype=torch.int32, device=self.device)

    def reset(self, slot_ids, initial_state=None, origin=None):
        ids = self.check_reset_args(slot_ids, initial_state, origin)
        rows = self.active_rows(slot_ids)
        b = self.blocks(slot_ids).index_select(0, rows).long()
        self.state[b] = 0 if initial_state is None else initial_state.index_select(0, rows).to(self.state.dtype)
        self.mark_reset(ids)

    def _launch_verify(self, tok, blk, qsl):
        with launch_guard(self.device):
            return self.mod.kda_recoverssm_verify(tok["q"], tok["k"], tok["v"], tok["a"], tok["b"], self.A_log,
                                                  self.dt_bias, self.lower_bound, self.state, self.records, qsl, blk,
                                                  self.decode.window)

    def _launch_commit(self, blk, accepted, qsl):
        with launch_guard(self.device):
            self.ctx.commit(accepted, blk, qsl)

    def verified(self, ids, rows, qsl):
        self.verify_rows, self.verify_qsl = [ids[int(r)] for r in rows], qsl

    def commit(self, slot_ids, accepted):
        ids, ks = self.begin_commit(slot_ids, accepted)
        now = {s: k for s, k in zip(ids, ks) if s != PAD_SLOT}
        blk = torch.tensor([s + 1 if s in now else 0 for s in self.verify_rows], dtype=torch.int32,
                           device=self.device)
        acc = torch.tensor([now.get(s, 0) for s in self.verify_rows], dtype=torch.int32, device=self.device)
        if blk.numel():
            self._launch_commit(blk, acc, self.verify_qsl)


class Vllm033KDARecoverSSMSoftplus(Vllm033KDARecoverSSM):
    """``vllm033-kda-recoverssm-softplus``: the same kernels with ``lower_bound=None`` (softplus gate)."""

    name = "vllm033-kda-recoverssm-softplus"
    lower_bound = None
    description = ("vLLM 0.33.0 release: KDA RecoverSSM, Triton verify + fp32 commit (fold-every-commit), "
                   "softplus gate -exp(A_log) softplus(a + dt_bias) (lower_bound=None)")
    conventions = {"l2_form": "reciprocal"}


CLASSES = (Vllm033KDARecoverSSM, Vllm033KDARecoverSSMSoftplus)
