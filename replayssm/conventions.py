"""Declared conventions: choices that change a kernel's numbers without being wrong.

Oracle: the published kernels' own code (read in ../shared/peers/vllm-replayssm, the FLA and
SGLang installs; what each adapter declares is named in its module).  A kernel declares the
conventions it computes with (``KernelUnderTest.conventions``, a dict of the fields below; the
defaults are this project's own kernels'); the fp64 reference and the literal model then follow
the declared recurrence, so a kernel is measured against the recurrence it claims, and results
name the convention (``ValidationResult.conventions``):

* ``beta_rounded`` (GDN, KDA): beta = sigmoid(b) rounded to the activation dtype before use (vLLM's
  packed decode and its ReplaySSM standard decode, SGLang's GDN / KDA ReplaySSM standard decode
  store ``sigmoid(b).to(b.dtype)``); default False (beta kept in the compute dtype);
* ``softplus_threshold`` (every family): softplus(u) = u above it (vLLM, FLA, SGLang: 20);
* ``l2_eps`` (GDN, KDA): q, k <- u / sqrt(sum u^2 + eps) (everyone: 1e-6);
* ``l2_form`` (GDN, KDA): ``"division"`` u / sqrt(.) or ``"reciprocal"`` u * (1 / sqrt(.)) (vLLM's
  ReplaySSM kernels, FLA's ``l2norm``, SGLang's KDA standard decode and recurrent verify; rsqrt is
  the reciprocal form too);
* ``gate_lower_bound`` (KDA): the gate law.  None (default): ``g = -exp(A_log) softplus(a + dt_bias)``
  (FLA's ``naive_kda_gate``); a number lb in [-5, 0): the bounded law
  ``g = lb * sigmoid(exp(A_log) (a + dt_bias))`` of Kimi-K3 (``gate_lower_bound`` of its
  ``linear_attn_config``, vLLM 0.33.0's ``_kda_gate`` with ``USE_LOWER_BOUND``; vLLM asserts
  ``-5 <= lb < 0``), so every channel's log decay lies in (lb, 0).  A gate law, not a rounding
  choice: a kernel declaring it is measured against that recurrence, and our KDA kernels, which
  compute the softplus law only, refuse it (``ops/kda/triton_base.py``).

Expected effect: beta rounded to bf16 moves a GDN state by ~bf16 u relative per token (fails the
default recurrence at s32a16); the others move values by an fp32 ulp or by exp(-threshold).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

# field -> (type check, what is expected)
FIELDS = {
    "beta_rounded": (lambda v: isinstance(v, bool), "true or false"),
    "softplus_threshold": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 88,
                           "a number in (0, 88]"),
    "l2_eps": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1, "a number in (0, 1)"),
    "l2_form": (lambda v: v in ("division", "reciprocal"), "'division' or 'reciprocal'"),
    "gate_lower_bound": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and -5 <= v < 0,
                         "a number in [-5, 0) (the bounded KDA gate law)"),
}


@dataclass(frozen=True)
class Conventions:
    """One set of conventions; ``beta_dtype`` is the activation dtype beta is rounded to (None:
    not rounded), resolved from ``beta_rounded`` and the precision mode by :func:`declared`."""

    beta_rounded: bool = False
    softplus_threshold: float = 20.0
    l2_eps: float = 1e-6
    l2_form: str = "division"
    gate_lower_bound: float | None = None
    beta_dtype: torch.dtype | None = None

    # ---- the arithmetic they name (plain torch, in the dtype of the input) -----------------------------
    def softplus(self, u: torch.Tensor) -> torch.Tensor:
        """log1p(exp(u)), the identity for u > threshold."""
        t = self.softplus_threshold
        return torch.where(u > t, u, torch.log1p(torch.exp(torch.clamp(u, max=t))))

    def l2norm(self, u: torch.Tensor) -> torch.Tensor:
        """u / sqrt(sum(u^2) + eps) over the last dimension (or u * (1 / sqrt(...)))."""
        den = torch.sqrt((u * u).sum(-1, keepdim=True) + self.l2_eps)
        return u * (1.0 / den) if self.l2_form == "reciprocal" else u / den

    def beta(self, b: torch.Tensor) -> torch.Tensor:
        """sigmoid(b), rounded to ``beta_dtype`` first when the kernel declares it."""
        s = torch.sigmoid(b)
        return s if self.beta_dtype is None else s.to(self.beta_dtype).to(s.dtype)

    def kda_log_gate(self, a: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
        """KDA's per-channel log decay ``[..., HV, K]`` from ``a [..., HV, K]``, ``A_log [HV]``,
        ``dt_bias [HV, K]``: ``-exp(A_log) softplus(a + dt_bias)``, or with ``gate_lower_bound`` lb
        ``lb * sigmoid(exp(A_log) (a + dt_bias))``."""
        A = torch.exp(A_log)[:, None]
        if self.gate_lower_bound is None:
            return -A * self.softplus(a + dt_bias)
        return self.gate_lower_bound * torch.sigmoid(A * (a + dt_bias))

    # ---- naming ----------------------------------------------------------------------------------------
    def changes(self) -> dict:
        """The fields that differ from the defaults."""
        return {f: getattr(self, f) for f in FIELDS if getattr(self, f) != getattr(DEFAULT, f)}

    @property
    def is_default(self) -> bool:
        return not self.changes()

    def label(self, fields: tuple[str, ...] = tuple(FIELDS)) -> str:
        """E.g. ``beta fp32, softplus threshold 20, l2 eps 1e-06 (division)`` over ``fields``."""
        parts = []
        if "beta_rounded" in fields:
            parts.append(f"beta rounded to {str(self.beta_dtype).replace('torch.', '')}" if self.beta_dtype
                         else "beta in the compute dtype")
        if "softplus_threshold" in fields:
            parts.append(f"softplus threshold {self.softplus_threshold:g}")
        if "l2_eps" in fields:
            parts.append(f"l2 eps {self.l2_eps:g} ({self.l2_form})")
        if "gate_lower_bound" in fields and self.gate_lower_bound is not None:
            parts.append(f"gate {self.gate_lower_bound:g} * sigmoid(exp(A_log) (a + dt_bias))")
        return ", ".join(parts) + ("" if self.is_default else " (declared)")


DEFAULT = Conventions()


def declared(decl: dict, fields: tuple[str, ...], act_dtype: torch.dtype, who: str = "kernel") -> Conventions:
    """The conventions ``decl`` declares for a family whose recurrence has ``fields``; ValueError
    naming ``conventions`` for an unknown field, a field the family has no use for, or a bad value."""
    if not isinstance(decl, dict):
        raise ValueError(f"conventions: {who} declares {decl!r}; expected a dict of {sorted(FIELDS)}")
    for k, v in decl.items():
        if k not in FIELDS:
            raise ValueError(f"conventions: {who} declares unknown {k!r}; expected some of {sorted(FIELDS)}")
        if k not in fields:
            raise ValueError(f"conventions: {who} declares {k!r}, which this family's recurrence does not have "
                             f"(its conventions: {', '.join(fields) or 'none'})")
        ok, want = FIELDS[k]
        if not ok(v):
            raise ValueError(f"conventions: {who} declares {k}={v!r}; expected {want}")
    conv = dataclasses.replace(DEFAULT, **decl)
    if conv.beta_rounded:
        conv = dataclasses.replace(conv, beta_dtype=act_dtype)
    return conv


def conv_kwargs(conv: Conventions | None) -> dict:
    """``{"conv": conv}`` for conventions other than the defaults, else ``{}``: a family's reference
    and literal math take ``conv=`` only when it lists conventions, and only such are declared."""
    return {} if conv is None or conv.is_default else {"conv": conv}


__all__ = ["DEFAULT", "FIELDS", "Conventions", "conv_kwargs", "declared"]
