"""Shared pieces of the mutants: a delegating FamilyMath to override one method of, mode filters, patching.

Oracle: none; helpers only (each mutant module states its bugs).
"""

from __future__ import annotations

import contextlib

from replayssm.ops.literal import FamilyMath


class DelegatingMath(FamilyMath):
    """A FamilyMath that forwards everything to ``inner``; mutants override one method."""

    def __init__(self, inner: FamilyMath) -> None:
        self.inner = inner

    def record_layout(self, geometry):
        return self.inner.record_layout(geometry)

    def fold(self, s0, hist, params, mode):
        return self.inner.fold(s0, hist, params, mode)

    def window(self, s0, hist, win, params, mode, options, **conv):
        return self.inner.window(s0, hist, win, params, mode, options, **conv)

    def step(self, s, tok, params, **conv):
        return self.inner.step(s, tok, params, **conv)


class WrapMath:
    """Mixin: the instance's ``math`` is ``math_wrapper(class math)``."""

    math_wrapper: type[DelegatingMath]

    def __init__(self, config):
        super().__init__(config)
        self.math = self.math_wrapper(type(self).math)


def only_modes(states: tuple[str, ...] = (), stochastic: bool | None = None, why: str = ""):
    """An ``unsupported_reason`` refusing modes where the mutant's bug cannot exist."""

    @classmethod
    def unsupported_reason(cls, mode, decode, options):
        if states and mode.state not in states:
            return f"this mutant's bug lives in {'/'.join(states)} state storage ({why})"
        if stochastic is not None and (mode.rounding == "stochastic") != stochastic:
            return f"this mutant's bug lives in {'stochastic' if stochastic else 'nearest'} rounding ({why})"
        return None

    return unsupported_reason


def with_methods(math: FamilyMath, *mixins: type) -> FamilyMath:
    """A copy of the family math object ``math`` whose class also has ``mixins`` (methods overriding
    its own, calling ``super()`` for the rest): one method changed whatever the family."""
    cls = type(f"{''.join(m.__name__ for m in mixins)}{type(math).__name__}", (*mixins, type(math)), {})
    out = cls.__new__(cls)
    out.__dict__.update(vars(math))
    return out


@contextlib.contextmanager
def patched(module, name: str, value):
    """Temporarily replace a module global (the literal math calls ``softplus`` as one)."""
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


__all__ = ["DelegatingMath", "WrapMath", "only_modes", "patched", "with_methods"]
