"""Bench: the kernels' timings (run), the table, and the comparison against other kernels."""
