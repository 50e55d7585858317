"""Triton building blocks every op family's kernels share: the precision library
(:mod:`.rounding`: casts to every storage format, stochastic rounding with one counter-based
random scheme, per-row scaled quantisation, the interpreter-safe forms of docs/kernel_interface.md) and the
scalar math both recurrences need (:mod:`.math`)."""
