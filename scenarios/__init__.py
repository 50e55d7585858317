"""Scenarios: one JSON-serialisable value fixing a validation run (geometry, batch, precision,
input regime, acceptance schedule, length, seed), and the generators that expand it into
bit-reproducible inputs and step plans."""

from replayssm.scenarios.inputs import DISTRIBUTIONS, make_initial_state, make_inputs, make_params
from replayssm.scenarios.scenario import Scenario
from replayssm.scenarios.schedules import SCHEDULES, StepPlan, default_steps, plan

__all__ = ["DISTRIBUTIONS", "SCHEDULES", "Scenario", "StepPlan", "default_steps", "make_initial_state",
           "make_inputs", "make_params", "plan"]
