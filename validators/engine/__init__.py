"""The engine: one scenario through a kernel beside the fp64 reference and the literal model (the
orchestrator, the checks and their witness mutants, metrics, tolerances, invariants, results)."""
