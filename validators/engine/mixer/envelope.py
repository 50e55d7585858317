"""The mixer level's arithmetic envelope: the SSM level's fp64 running-error bound of the SSM part,
driven per slot beside the mixer reference, its output part mapped through the gated RMSNorm.

Oracle: :class:`~replayssm.validators.engine.checks.fp64_bound.RunningBound` (a running-error
analysis in fp64 from the reference's own quantities) on the SSM inputs the fp64 mixer reference
computes (its conv outputs split into the SSM's per-token inputs, ``MixerSpec.reference_parts``),
with the flushes of the plan's decode (its cursor rule per slot, reset at admit) and the accepted
counts.  Its arithmetic-only part (``output_arith`` [R, T'], ``state_arith`` [R]) bounds how far a
correct SSM kernel with another operation order may be from the literal one (the envelope the SSM
level's ``output`` and ``state`` checks take where it is larger than the literal rule).

The norm (``MixerSpec.norm``): per group of ``n`` elements ``out_i = m_i v_i r``, ``r = (ms +
eps)^-1/2``, ``ms = sum_j v_j^2 / n``, with ``v = y`` and ``m = w act(z)`` (norm before the gate:
GDN, KDA) or ``v = y act(z)`` and ``m = w`` (Mamba-2).  An SSM output error ``dy`` with ``|dy_j| <=
b`` (the token's ``output_arith`` of the element's head) moves ``v`` by ``|dv_j| <= |g_j| b`` (``g = act(z)`` or 1).  To
first order ``d(v_i r) = dv_i r + v_i dr`` and ``dr = -r (sum_j v_j dv_j) / (n (ms + eps))``, so

    |d out_i| <= |m_i| r (|dv_i| + |v_i| (sum_j |v_j| |dv_j|) / (n (ms + eps)))

(:func:`norm_bound`, the largest over the token's elements).  The remainder: ``v -> v r`` is
``sqrt(n) v / a`` with ``a = sqrt(|v|^2 + n eps)``, whose Jacobian has norm
``<= 1/a`` and second derivative ``<= 3/a^2``; with ``q = |dv| / a`` (at the group's reference) and
``a >= (1 - q) a_0`` along the segment, the second-order term is at most ``1.5 q / (1 - q)^2`` of the
first-order one's scale: the bound is multiplied by ``1 + 2 q / (1 - q)^2`` (q < 1/2; a group with q
>= 1/2 gets no envelope, its output too far off for a first-order statement).  Expected: a correct
kernel (another SSM operation order, e.g. ``triton-replay``'s output-only readout) within it; a
kernel that rounds beyond its declared formats (an SSM output rounded to bf16 at s32a32) outside it
(tests/engine/test_mixer_envelope.py).
"""

from __future__ import annotations

import torch

from replayssm.families import family
from replayssm.ops.conv.naive import silu
from replayssm.validators.engine.checks.fp64_bound import RunningBound, error_model, state_norm


def norm_bound(spec, g, y: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """Per token, the bound on ``|norm(y + dy) - norm(y)|`` (largest over its elements) given
    ``|dy| <= dy``: ``y``, ``z`` ``[T, *out_shape]`` fp64, ``weight`` the norm's weight, ``dy`` per
    token and head ``[T, H]`` (H: the output's leading dim; per token ``[T]`` otherwise).  Derivation
    in the module docstring."""
    T, group = y.shape[0], spec.norm_group(g)
    if dy.dim() == 2 and dy.shape[1] != y.shape[1]:
        dy = dy.amax(-1)
    dy = dy.view(T, -1, *([1] * (y.dim() - 2))).expand_as(y)
    act = silu(z) if spec.gate_act == "silu" else torch.sigmoid(z)
    v = y.reshape(T, -1, group)
    a = act.reshape(v.shape).abs()
    w = weight.reshape(-1, group).abs()
    if spec.norm_before_gate:
        gv, m = torch.ones_like(v), w * a
    else:
        v, gv, m = v * act.reshape(v.shape), a, w.expand_as(v)
    dv = gv * dy.reshape(v.shape)
    den = (v * v).mean(-1, keepdim=True) + spec.norm_eps
    r = torch.rsqrt(den)
    first = m * r * (dv + v.abs() * (v.abs() * dv).sum(-1, keepdim=True) / (group * den))
    q = dv.norm(dim=-1, keepdim=True) / (group * den).sqrt()
    second = torch.where(q < 0.5, 1 + 2 * q / (1 - q).clamp_min(0.5) ** 2, torch.zeros_like(q))
    return (first * second).flatten(1).amax(-1)


class MixerEnvelope:
    """The fp64 running-error bound of each slot's SSM part (``RunningBound`` with one row per slot)
    and the slots' decode cursors; None from :meth:`build` for a family without an error model."""

    def __init__(self, terms, geometry, mode, decode, num_slots: int, replay: bool, device) -> None:
        fam = family(geometry.family)
        self.spec, self.g, self.dec, self.device = geometry.spec, geometry, decode, device
        heads = state_norm(torch.zeros((1, *geometry.state_shape), dtype=torch.float64)).shape[1]
        self.bound = RunningBound(terms, mode, replay, num_slots, heads, device,
                                  records_read_state="state-read-records" in fam.capabilities)
        self.readout_fam = fam
        self.cursor = [(0, 0)] * num_slots

    @classmethod
    def build(cls, kernel, geometry, mode, decode, num_slots: int, device) -> MixerEnvelope | None:
        terms = error_model(geometry.family)
        if terms is None:
            return None
        ssm = getattr(kernel, "ssm", None)
        replay = ssm is None or getattr(ssm, "base_kind", ssm.kind) != "baseline"
        return cls(terms, geometry, mode, decode, num_slots, replay, device)

    def admit(self, slots: list[int], states: torch.Tensor) -> None:
        """Slots ``slots`` start from ``states`` (all slots' states, ``[S, ...]``; their initial ones)."""
        self.bound.reset(slots, states.to(self.device, torch.float64))
        for s in slots:
            self.cursor[s] = (0, 0)

    def window(self, slots: list[int], toks: list[dict], accepted: list[int], params: dict
               ) -> dict[str, torch.Tensor]:
        """Advance slots ``slots`` over the window's SSM inputs ``toks`` (per position, fp64, one row
        per slot) keeping each slot's accepted prefix, and move their cursors by the commit:
        ``output_arith`` per head [R, T', H] and ``state_arith`` [R]."""
        b, sl = self.bound, torch.tensor(slots, dtype=torch.long, device=self.device)
        full = b.cur
        b.cur = {k: v.index_select(0, sl) for k, v in full.items()}
        flush = torch.tensor([self.dec.is_flush(self.cursor[s][0]) for s in slots], dtype=torch.bool,
                             device=self.device)
        like = torch.zeros((len(slots), *self.g.state_shape), dtype=torch.float64, device=self.device)
        ssm_params = {n: params[n] for n in self.g.ssm.param_shapes()}

        def readout(s_abs, tok):
            return self.readout_fam.readout_magnitude(s_abs, tok, ssm_params)
        out = b.window(toks, ssm_params, flush, self.dec.speculative,
                       torch.tensor(accepted, device=self.device), like, readout)
        for k, v in b.cur.items():
            full[k].index_copy_(0, sl, v)
        b.cur = full
        for s, f, k in zip(slots, flush.tolist(), accepted):
            self.cursor[s] = tuple(self.dec.commit_cursor(*self.cursor[s], f, k))
        return {"output_arith": out["output_arith_heads"], "state_arith": out["state_arith"]}

    def output_bound(self, y: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
        """One row's mixer-output arithmetic bound per window position (:func:`norm_bound`)."""
        return norm_bound(self.spec, self.g.ssm, y, z, weight, dy)


__all__ = ["MixerEnvelope", "norm_bound"]
