"""The named checks of one mixer step, each a small function returning a failure message or None.

Oracle per check:

* ``mixer-output``: every window output (drafts included) against the fp64 whole-step reference on
  committed prefix + window[0..s], by the tolerance rule ``err <= factor * err(literal) + floor``
  (``validators/tolerances.bound``; err(literal): the larger error of the literal mixer in its two
  legitimate conv orders at the same mode, ``runner.LITERALS``; scale: the row's max |ref|), or
  per window position the fp64 arithmetic envelope (the SSM level's running-error bound of the SSM
  part's arithmetic, mapped through the gated norm, ``envelope.py``) + floor where that is larger,
  as the SSM level's ``output`` check does (another SSM operation order: ``mixer-triton-replay``).
* ``conv-state``: the committed conv window, read from the kernel's raw storage by its declared
  design (``replayssm/ops/conv/policies.py``), equals the last d_conv - 1 accepted conv inputs bit for bit.
* ``ssm-state``: the committed SSM state against the fp64 reference, tolerance rule (state units), or
  the envelope's ``state_arith`` + floor where larger.
* ``padding``: padding rows' outputs keep their poison bits; every active output is written (finite).
* ``unnamed-slots``: the conv and SSM storage of slots not named in the step keep their bits.
Witnesses: ``validators/engine/mixer/mutants.py`` (each caught by one of these; tests/engine/test_mixer.py).
"""

from __future__ import annotations

import torch

from replayssm.validators.engine.invariants import bits_equal
from replayssm.validators.engine.tolerances import bound

CHECKS = ("mixer-output", "conv-state", "ssm-state", "padding", "unnamed-slots")


def tolerance_failure(what: str, mode, got: torch.Tensor, lits: tuple[torch.Tensor, ...], ref: torch.Tensor,
                      state: bool, arith: torch.Tensor | None = None) -> tuple[str | None, float]:
    """Max abs errors of ``got`` and of the literal models ``lits`` against ``ref`` (one row): a message
    when ``got`` breaks the bound, and the ratio err / bound.  The bound is the literal rule (factor x
    the literals' largest error + floor), or ``arith`` + floor where that is larger (the fp64
    arithmetic envelope, ``envelope.py``): ``arith`` per window position ``[T']`` (outputs, whose
    first dim is the position) or one value (state); None: the literal rule alone."""
    if not torch.isfinite(got).all():
        return f"{what}: non-finite values", float("inf")
    lead = 1 if arith is not None and arith.dim() == 1 and arith.numel() > 1 else 0
    ref = ref.cpu()  # the kernel's and the literals' tensors on the device, the fp64 reference on the host
    diff = (got.double().cpu() - ref).abs()
    err = diff.flatten(lead).amax(-1) if lead else diff.max().reshape(1)
    err_lit = max((lit.double().cpu() - ref).abs().max().item() for lit in lits)
    scale = ref.abs().max().item()
    b_lit = bound(mode, err_lit, scale, state=state)
    floor = bound(mode, 0.0, scale, state=state)
    b = torch.full_like(err, b_lit)
    env = None
    if arith is not None:
        env = arith.double().cpu().reshape(err.shape) + floor
        b = torch.maximum(b, env)
    ratios = torch.where(b > 0, err / b.clamp_min(1e-300), torch.where(err == 0, 0.0, float("inf")))
    t = int(ratios.argmax())
    ratio, e, bb = float(ratios[t]), float(err[t]), float(b[t])
    if e > bb:
        rel = e / scale if scale else float("inf")
        which = (f"the fp64 arithmetic envelope {float(env[t]):.3e} (literal rule {b_lit:.3e})"
                 if env is not None and float(env[t]) > b_lit else
                 f"the literal rule: literal {err_lit:.3e}" + ("" if env is None else
                                                               f", arithmetic envelope {float(env[t]):.3e}"))
        where = f" at position {t}" if lead else ""
        return (f"{what}: max abs error {e:.3e}{where} > bound {bb:.3e} ({which}; scale {scale:.3e}); "
                f"relative {rel:.2e}"), ratio
    return None, ratio


def read_committed(policy, storage: dict[str, torch.Tensor], slot: int, width: int, channels: int, window: int
                   ) -> tuple[torch.Tensor | None, str | None]:
    """The committed window by the declared design's rule, or why the storage is not that design's layout
    (its fields and per-slot shapes)."""
    want = policy.storage_shapes(channels, width, window)
    have = {n: tuple(t.shape[1:]) for n, t in storage.items()}
    if any(have.get(n) != shp for n, shp in want.items()):
        return None, (f"conv-state: the storage holds {have}, the declared design {policy.name!r} keeps {want} "
                      f"per slot")
    try:
        return policy.committed_window(storage, slot, width), None
    except (IndexError, RuntimeError) as e:
        return None, f"conv-state: the storage cannot be read as {policy.name!r}: {e}"


def conv_state_failure(window: torch.Tensor, expected: torch.Tensor) -> str | None:
    if tuple(window.shape) != tuple(expected.shape) or window.dtype != expected.dtype:
        return (f"conv-state: committed window {window.dtype} {tuple(window.shape)}, expected {expected.dtype} "
                f"{tuple(expected.shape)}")
    if bits_equal(window.cpu(), expected.cpu()):
        return None
    diff = (window.cpu() != expected.cpu())
    cols = sorted({int(c) for c in diff.nonzero()[:, -1].tolist()})
    return (f"conv-state: committed window differs from the last {expected.shape[-1]} accepted conv inputs in "
            f"column(s) {cols} ({int(diff.sum())} of {diff.numel()} elements; it is data movement: bit for bit)")


def padding_failure(out: torch.Tensor, pad_rows: list[int], active_rows: list[int]) -> str | None:
    for r in pad_rows:
        if not torch.isnan(out[r]).all():
            return f"padding: row {r} is a padding row, its outputs were written"
    for r in active_rows:
        if torch.isnan(out[r]).any():
            return f"padding: row {r}'s outputs are not all written (poison left)"
    return None


def unnamed_failure(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor], slots: list[int]
                    ) -> str | None:
    for name in before:
        for s in slots:
            if not bits_equal(before[name][s].cpu(), after[name][s].cpu()):
                return f"unnamed-slots: {name} of slot {s} changed, the step did not name it"
    return None
