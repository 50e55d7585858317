"""The captured execution's engine parts: the raw launch path of a kernel and the fp64 reference over a block of steps.

Oracle: the eager execution (:meth:`replayssm.validators.engine.runner.Lockstep.step`).  Expected
difference: none -- :class:`ChunkReference` runs the family's own step (``reference_prepare`` for a
whole block, exact elementwise ops, then ``reference_advance`` per token: what ``reference_step``
runs), so every value is rounded as the eager execution rounds it; :func:`raw_path` /
:func:`raw_checkpoint` say when a kernel's ``launch_*`` entry points (no host checks, no sync) are
the interface calls a captured block may take instead (tests/jobs/test_drift_fast.py holds both).
Drift's fast path (``validators/jobs/drift/fast.py``) drives the captured execution of a cell.
"""

from __future__ import annotations

import torch

from replayssm.conventions import conv_kwargs
from replayssm.families import Family
from replayssm.validators.engine.runner import readout_magnitude


def raw_path(kernel) -> bool:
    """Whether ``kernel`` can be driven through ``launch_verify``/``launch_commit``: they exist and
    its ``verify``/``commit`` are the ones of the class that defines them (a subclass overriding
    ``verify`` -- a mutant -- must keep going through it)."""
    cls = type(kernel)
    owner = next((c for c in cls.__mro__ if "launch_verify" in vars(c)), None)
    if owner is None or "launch_commit" not in vars(owner):
        return False
    names = ("verify", "commit", "launch_verify", "launch_commit") + (
        ("verify_padded",) if hasattr(owner, "verify_padded") else ())  # what a serving-layout kernel's verify calls
    return all(getattr(cls, n) is getattr(owner, n) for n in names)


def raw_checkpoint(kernel) -> bool:
    """Whether ``kernel``'s checkpoint can be read through ``launch_checkpoint`` (no host sync): it
    exists and ``checkpoint_state`` is the one of the class defining it (a mutant overriding the
    read keeps going through it)."""
    cls = type(kernel)
    owner = next((c for c in cls.__mro__ if "launch_checkpoint" in vars(c)), None)
    return owner is not None and all(getattr(cls, n) is getattr(owner, n)
                                     for n in ("checkpoint_state", "launch_checkpoint"))



class ChunkReference:
    """The family's fp64 reference step over a chunk: ``reference_prepare`` (exact, elementwise) of
    every token of the chunk at once into fixed buffers (what a CUDA graph replays over), then
    ``reference_advance`` token by token -- the same two functions ``reference_step`` runs, so the
    same bits."""

    def __init__(self, fam, K: int, params: dict[str, torch.Tensor], conv=None, fused: bool = False,
                 hoist: bool = False) -> None:
        self.fam, self.K, self.params = fam, K, params
        self.kw = conv_kwargs(conv)  # the kernel's declared conventions (as the slow path's reference_step)
        # the fused Triton step and the hoisted terms compute the default conventions only
        if self.kw and (fused or hoist):
            raise ValueError("fused/hoist: the fused fp64 step computes the default conventions only; "
                             f"this kernel declares {conv.changes()}")
        self.hoist = hoist
        self.advance = fam.reference_advance_fused if fused else fam.reference_advance
        self.fused = fused
        # the fused pass's readout products give the readout magnitude (the same bits, a pass fewer)
        self.products = fused and type(fam).reference_advance_magnitude is not Family.reference_advance_magnitude
        self.buf: dict[str, torch.Tensor] | None = None

    def load(self, tok: dict[str, torch.Tensor], n: int) -> None:
        """Tokens ``[n, R, ...]`` (fp64, token-major) into the buffers."""
        prep = self.fam.reference_prepare(tok, self.params, **self.kw)
        if self.hoist:
            prep = self.fam.reference_hoist(prep, self.params)
        if self.buf is None:
            self.buf = {k: torch.empty((self.K, *v.shape[1:]), dtype=v.dtype, device=v.device) for k, v in prep.items()}
            self.v = {k: b.unbind(0) for k, b in self.buf.items()}
        for k, v in prep.items():
            self.buf[k][:n].copy_(v)

    def step(self, st: torch.Tensor, i: int, y_out: torch.Tensor | None, rows: torch.Tensor | None = None,
             keep: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Token ``i`` of the chunk on ``st``: the new state; the output into ``y_out`` if given.  ``rows``
        (fused only; a bool ``[R]`` mask): the rows whose new state is needed, the others' undefined.
        ``keep`` (fused only; ``(dst, mask)``): the marked rows of the new state also written into ``dst``."""
        if keep is not None and not self.fused:
            raise ValueError("keep: only the fused reference writes kept rows (the captured execution's kept rows)")
        prep = {k: v[i] for k, v in self.v.items()}
        if (rows is not None or keep is not None) and self.fused:
            y, new = self.advance(st, prep, self.params, rows=rows, keep=keep)
        else:
            y, new = self.advance(st, prep, self.params, **self.kw)
        if y_out is not None:
            y_out.copy_(y)
        return new

    def step_magnitude(self, st: torch.Tensor, i: int, y_out: torch.Tensor, tok: dict, scaled: bool,
                       keep: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`step` and ``runner.readout_magnitude`` of the new state (``tok``: the token, fp64;
        ``scaled``: per-row scaled states), from the fused pass's readout products where the family
        writes them (``Family.reference_advance_magnitude``: the same bits)."""
        if not self.products or scaled:
            new = self.step(st, i, y_out, keep=keep)
            return new, readout_magnitude(self.fam, new, tok, self.params, scaled)
        prep = {k: v[i] for k, v in self.v.items()}
        y, new, mag = self.fam.reference_advance_magnitude(st, prep, self.params, keep=keep)
        y_out.copy_(y)
        return new, mag


__all__ = ["ChunkReference", "raw_checkpoint", "raw_path"]
