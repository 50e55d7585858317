"""The package's layers point only down (docs/architecture.md), checked on the source with an AST walk.

core (precision, rounding, interface, registry, families, ops, adapters) <- scenarios <- engine
(validators/engine/: runner, checks, metrics, tolerances, invariants, result, mutants, fuzz artifacts)
<- jobs (validators/jobs/: fuzz, drift, bench, calibration, model, scale-out, the results page) <- top
(CLI modules, the pytest plugin).  The layer of a validators module is its folder.  A module may import its
own layer and the layers below; no module imports a first-party module inside a function (a
function-local import hides a cycle), except the pytest plugin, which every pytest session of a
user's loads and which must not import torch and the engine until its fixture is used."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Source folder -> installed package prefix (pyproject's package-dir mapping).
FOLDERS = {"replayssm": "replayssm", "validators": "replayssm.validators", "scenarios": "replayssm.scenarios",
           "golden": "replayssm.golden"}
LAYERS = ["core", "scenarios", "engine", "jobs", "top"]
TOP = ("replayssm.cli", "replayssm.cli_list", "replayssm.cli_validate", "replayssm.cli_fuzz", "replayssm.cli_bench",
       "replayssm.drift_cli", "replayssm.__main__", "replayssm.validators.pytest_plugin")
LAZY_OK = {"replayssm.validators.pytest_plugin"}


def layer_of(module: str) -> str:
    if module in TOP or module.startswith("replayssm.cli"):
        return "top"
    if module.startswith("replayssm.scenarios"):
        return "scenarios"
    if module.startswith("replayssm.validators.jobs"):
        return "jobs"
    if module.startswith("replayssm.validators.engine") or module == "replayssm.validators":
        return "engine"
    if module.startswith("replayssm.validators."):
        return "unplaced"
    return "core"


def modules() -> dict[str, Path]:
    out = {}
    for folder, prefix in FOLDERS.items():
        for p in sorted((ROOT / folder).rglob("*.py")):
            rel = p.relative_to(ROOT / folder).with_suffix("")
            parts = [x for x in rel.parts if x != "__init__"]
            out[".".join([prefix, *parts])] = p
    return out


def _resolve(node: ast.ImportFrom, module: str, is_pkg: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_pkg else 0)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imports(module: str, path: Path) -> list[tuple[str, int, bool]]:
    """(imported first-party module, line, inside a function) of every import in ``path``."""
    tree = ast.parse(path.read_text())
    local = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
             for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            names = [a.name for a in n.names]
        elif isinstance(n, ast.ImportFrom):
            base = _resolve(n, module, path.name == "__init__.py")
            names = [f"{base}.{a.name}" if base == "replayssm" or f"{base}.{a.name}" in ALL
                     else base for a in n.names]
        else:
            continue
        out += [(m, n.lineno, id(n) in local) for m in names if m.split(".")[0] == "replayssm"]
    return out


ALL = modules()


def test_layer_map_covers_the_package():
    """Every module has a layer: a validators module outside engine/ and jobs/ (and not top) fails here."""
    assert len(ALL) > 40, len(ALL)
    assert not [m for m in ALL if layer_of(m) not in LAYERS], [m for m in ALL if layer_of(m) not in LAYERS]
    assert layer_of("replayssm.validators.engine.runner") == "engine"
    assert layer_of("replayssm.validators.jobs.drift.sweep") == "jobs"
    assert layer_of("replayssm.cli_validate") == "top" and layer_of("replayssm.ops.mamba2.naive") == "core"


@pytest.mark.parametrize("module", sorted(ALL))
def test_imports_point_down(module):
    mine = LAYERS.index(layer_of(module))
    bad = []
    for target, line, local in imports(module, ALL[module]):
        known = target if target in ALL else max((m for m in ALL if target.startswith(m + ".")), key=len,
                                                 default=target)
        if LAYERS.index(layer_of(known)) > mine:
            bad.append(f"line {line}: {module} ({layer_of(module)}) imports {target} ({layer_of(known)})")
        if local and module not in LAZY_OK:
            bad.append(f"line {line}: function-local import of {target}")
    assert not bad, "\n".join(bad)


def test_the_checker_sees_an_upward_import(tmp_path):
    """The walk has teeth: an engine module importing the CLI, and a function-local import, are found."""
    p = tmp_path / "runner.py"
    p.write_text("from replayssm.cli_list import load_kernels\n\ndef f():\n    from replayssm.registry import get\n")
    found = imports("replayssm.validators.engine.runner", p)
    assert ("replayssm.cli_list.load_kernels", 1, False) in found or ("replayssm.cli_list", 1, False) in found
    assert any(local for _, _, local in found)
    assert layer_of("replayssm.cli_list") == "top"
