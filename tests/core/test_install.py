"""The package installs whole: a wheel, installed non-editable, carries its budgets and corpus.

Oracle: the repository's own ``golden/`` folder.  The test builds a wheel from a copy of the
sources that pyproject.toml names (its package-dir folders and the readme), installs it with
``--no-deps`` into a fresh virtual environment that sees the dependencies (torch, triton, ...)
through a ``.pth`` file of their site directories only, so the editable install of the checkout
is not visible (a ``.pth`` line adds a directory to ``sys.path``; the editable finder's own
``.pth`` inside it is not executed), and then, from a directory outside the repository, with
``-I`` and no ``PYTHONPATH``:

* ``replayssm`` and its golden data are imported from the new environment (``__file__`` checked);
* ``replayssm drift --check`` (one tiny cell) checks the budget that ``golden/tolerances.toml``
  holds for that cell and passes;
* ``python -m replayssm.validators.jobs.fuzz.regressions check`` replays every corpus entry of the
  repository's ``golden/regressions/`` and all hold.
"""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pip
import pytest

from replayssm.validators.jobs.drift.budgets import load_budgets

ROOT = Path(__file__).resolve().parents[2]
# One wheel build and install for the module: its tests share one pytest-xdist worker.
pytestmark = pytest.mark.xdist_group("install")
if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

# The dependencies the installed package imports, seen through their site directories.
DEPENDENCIES = ("torch", "triton", "numpy", "scipy", "tqdm", "hypothesis", "jsonschema", "jinja2")
DRIFT = ["drift", "--check", "--families", "mamba2", "--kernels", "literal-replay", "--modes", "s32a32",
         "--schedules", "standard", "--scenarios", "long-memory", "--tokens", "256", "--rows", "1",
         "--workers", "1", "--device", "cpu", "--no-progress"]


def _run(cmd, cwd, env, timeout=300) -> subprocess.CompletedProcess:
    p = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{' '.join(map(str, cmd))} -> exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


def _copy_sources(dest: Path) -> None:
    """The files a wheel build reads: pyproject.toml, setup.py (the package list), the readme and
    every package-dir folder."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    dest.mkdir()
    shutil.copy2(ROOT / "pyproject.toml", dest)
    shutil.copy2(ROOT / "setup.py", dest)
    shutil.copy2(ROOT / meta["project"]["readme"], dest)
    junk = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in sorted(set(meta["tool"]["setuptools"]["package-dir"].values())):
        shutil.copytree(ROOT / folder, dest / folder, ignore=junk)


def _dependency_dirs() -> list[str]:
    dirs = []
    for name in DEPENDENCIES:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin, f"{name} is not installed"
        d = str(Path(spec.origin).resolve().parents[1])
        if d not in dirs:
            dirs.append(d)
    return dirs


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(python, replayssm console script, run directory, environment) of a fresh wheel install."""
    tmp = tmp_path_factory.mktemp("install")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env.update(OMP_NUM_THREADS="1", PYTHONNOUSERSITE="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    src = tmp / "src"
    _copy_sources(src)
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(src), "-w", tmp / "wheel"], tmp, env)
    (wheel,) = (tmp / "wheel").glob("replayssm-*.whl")
    target = tmp / "venv"
    # pip >= 22.3 installs into another interpreter (--python); an older one needs pip in the venv.
    pip_targets = tuple(int(x) for x in pip.__version__.split(".")[:2]) >= (22, 3)
    venv.EnvBuilder(with_pip=not pip_targets, system_site_packages=False, clear=True).create(target)
    python = target / "bin" / "python"
    pip_cmd = [sys.executable, "-m", "pip", "--python", python] if pip_targets else [python, "-I", "-m", "pip"]
    purelib = Path(_run([python, "-I", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp,
                        env).stdout.strip())
    (purelib / "_replayssm_test_dependencies.pth").write_text("\n".join(_dependency_dirs()) + "\n")
    _run([*pip_cmd, "install", "-q", "--no-deps", "--no-index", wheel], tmp, env)
    run_dir = tmp / "run"
    run_dir.mkdir()
    return python, target / "bin" / "replayssm", run_dir, env, target


def test_the_wheel_copy_runs_with_its_golden_data(installed):
    python, _, run_dir, env, target = installed
    code = ("import replayssm, replayssm.golden, replayssm.validators; "
            "print(replayssm.__file__); print(replayssm.validators.__file__); "
            "print(replayssm.golden.path('tolerances.toml'))")
    paths = [Path(p) for p in _run([python, "-I", "-c", code], run_dir, env).stdout.split()]
    for p in paths:
        assert p.is_file(), f"{p}: not installed by the wheel"
        assert p.resolve().is_relative_to(target.resolve()), f"{p} is not from the wheel install"
        assert not p.resolve().is_relative_to(ROOT), f"{p} comes from the checkout"
    assert paths[2].read_text() == (ROOT / "golden" / "tolerances.toml").read_text()


def test_the_wheel_carries_the_record_schema(installed):
    python, _, run_dir, env, _ = installed
    code = ("import json, replayssm.records as R; "
            "r = R.Recorder('validate').record('c', metrics={}, verdict='none'); "
            "print(R.schema()['title']); print(r['commit'])")
    title, commit = _run([python, "-I", "-c", code], run_dir, env).stdout.splitlines()
    assert title == json.loads((ROOT / "replayssm" / "records" / "record.schema.json").read_text())["title"]
    assert commit == "unknown"  # an installed copy is no checkout: nothing shows it is a commit's


def test_installed_drift_check_checks_the_packaged_budget(installed):
    _, script, run_dir, env, _ = installed
    out = run_dir / "drift"
    p = _run([script, *DRIFT, "--out", out], run_dir, env)
    assert "budget check PASS (1 cells)" in p.stdout + p.stderr
    report = json.loads((out / "drift_report.json").read_text())
    assert report["check"]["enabled"] and report["check"]["pass"] and report["check"]["cells"] == 1
    (cell,) = report["cells"]
    want = load_budgets(ROOT / "golden" / "tolerances.toml").get_budget("mamba2", "s32a32")
    assert cell["check"]["budget"] == want.to_dict()
    assert cell["tokens_run"] == 256 and cell["exception"] is None


def test_installed_regression_corpus_replays(installed):
    python, _, run_dir, env, _ = installed
    p = _run([python, "-I", "-m", "replayssm.validators.jobs.fuzz.regressions", "check"], run_dir, env)
    names = sorted(f.name for f in (ROOT / "golden" / "regressions").glob("*.json"))
    assert names, "the repository has no regression corpus"
    assert sorted(re.findall(r"^ok   (\S+\.json):", p.stdout, re.M)) == names, p.stdout


def test_the_wheel_carries_every_package_of_the_checkout(installed):
    # setup.py finds the packages (a new family folder needs no packaging line): every folder with
    # an __init__.py under a package-dir folder must be importable from the install
    python, _, run_dir, env, target = installed
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    want = sorted({name for name in meta["tool"]["setuptools"]["package-dir"]} | {
        f"{name}." + ".".join(init.parent.relative_to(ROOT / folder).parts)
        for name, folder in meta["tool"]["setuptools"]["package-dir"].items()
        for init in (ROOT / folder).rglob("__init__.py") if init.parent != ROOT / folder})
    assert {"replayssm.ops.mamba2", "replayssm.ops.gdn", "replayssm.ops.kda"} <= set(want)
    code = "import importlib, sys; [print(importlib.import_module(m).__file__) for m in sys.argv[1:]]"
    files = _run([python, "-I", "-c", code, *want], run_dir, env).stdout.split()
    assert len(files) == len(want)
    assert all(Path(f).resolve().is_relative_to(target.resolve()) for f in files), files
