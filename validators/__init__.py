"""Validators: drive any registered kernel through a scenario beside the fp64 reference and the
literal model, check exact invariants and the tolerance rule, and report (JSON, Markdown)."""

from replayssm.validators.result import CHECKS, Failure, ValidationResult
from replayssm.validators.runner import Lockstep, run_scenario
from replayssm.validators.tolerances import TABLE, Tolerance, tolerance_for

__all__ = ["CHECKS", "TABLE", "Failure", "Lockstep", "Tolerance", "ValidationResult", "run_scenario",
           "tolerance_for"]
