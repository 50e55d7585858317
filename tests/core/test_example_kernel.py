"""The worked example of docs/kernel_interface.md, validated the way a kernel author would:
through the pytest plugin's one-line fixture and through the CLI's ``--import``."""

import importlib.util
import pathlib
import sys

import pytest

from replayssm.cli import main
from replayssm.scenarios.scenario import Scenario

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "torch_baseline_mamba2.py"


def _load_example():
    name = "replayssm_user_torch_baseline_mamba2"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, EXAMPLE)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name].TorchBaselineMamba2


@pytest.mark.parametrize("mode,decode", [("s32a32", "standard"), ("s32a16", "speculative"),
                                         ("s16a16", "speculative")], ids=lambda v: v)
def test_example_passes_through_the_plugin(replayssm_validate, mode, decode):
    kernel = _load_example()
    schedule = "always-1" if decode == "standard" else "exhaustive"
    replayssm_validate(kernel, Scenario.tiny("mamba2", decode=decode, mode=mode, schedule=schedule))


def test_example_refuses_modes_it_does_not_implement():
    kernel = _load_example()
    from replayssm.validators.pytest_plugin import assert_kernel_valid
    with pytest.raises(ValueError, match="does not support sfp8a16"):
        assert_kernel_valid(kernel, Scenario.tiny("mamba2", mode="sfp8a16", schedule="random", steps=3))


def test_cli_import_runs_the_example(tmp_path):
    _load_example()
    rc = main(["validate", "--kernel", "example-torch-baseline", "--family", "mamba2", "--precision", "s32a16",
               "--schedule", "random", "--steps", "12", "--import", str(EXAMPLE), "--out", str(tmp_path), "--quiet"])
    assert rc == 0
    assert list(tmp_path.glob("*.json")) and list(tmp_path.glob("*.md"))


def test_cli_import_of_a_missing_file_is_a_usage_error(capsys):
    assert main(["validate", "--kernel", "x", "--import", "does/not/exist.py"]) == 2
    assert "no such file" in capsys.readouterr().err
