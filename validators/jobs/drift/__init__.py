"""Drift: long runs per cell (sweep), the CUDA-graph fast path, budgets, analysis, the report and its verdict."""
