"""Validators: drive any registered kernel through a scenario beside the fp64 reference and the
literal model, check exact invariants and the tolerance rule, and report (JSON, Markdown).

Names are imported lazily (the pytest plugin loads this package at pytest startup: it must stay
cheap and must not import kernel modules)."""

from importlib import import_module

_EXPORTS = {
    "CHECKS": "engine.result", "Failure": "engine.result", "ValidationResult": "engine.result",
    "Lockstep": "engine.runner", "run_scenario": "engine.runner",
    "FACTOR": "engine.tolerances", "Tolerance": "engine.tolerances", "tolerance_for": "engine.tolerances",
    "assert_kernel_valid": "pytest_plugin",
}


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(f"replayssm.validators.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'replayssm.validators' has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
