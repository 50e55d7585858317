"""The ``replayssm`` command (also ``python -m replayssm``).

Subcommands are modules listed in :data:`COMMANDS`; each exposes ``add_parser(subparsers)``
(adding its parser, whose ``name`` is the subcommand) and ``run(args) -> int``.  To add one,
write ``replayssm/cli_<name>.py`` and add one line to :data:`COMMANDS`.  A subcommand module
that fails to import does not break the others: calling it reports the import error (exit 2).

``--import MODULE|FILE.py`` (any subcommand, repeatable) imports outside code first, so the kernels
it registers can be named with ``--kernel``.  ``--debug`` (anywhere) prints the traceback of an error.

Exit codes (every subcommand, :data:`EXIT_CONTRACT`): 0 pass, 1 a verdict failed, 2 bad usage or
input, 3 environment (a user module failed to import, output not writable, device missing, the run
would not fit in memory).  Errors are one line on stderr, no traceback unless ``--debug``.

A ``marginal`` verdict (an error above the tolerance rule's bound by at most the marginal band,
docs/validation.md "Verdicts") exits 0 with a MARGINAL line, and 1 under ``--strict``: the band is
where correct implementations with another rounding land, so a marginal is a result to read, not a
red build; a distinct code would turn every ``replayssm ... && next`` into a strict run.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import traceback

from replayssm import __version__
from replayssm.guard import EnvironmentProblem

COMMANDS = [
    "replayssm.cli_list",
    "replayssm.cli_validate",
    "replayssm.cli_fuzz",
    "replayssm.drift_cli",
    "replayssm.cli_bench",
    "replayssm.cli_golden",
    "replayssm.cli_profile",
    "replayssm.cli_results",
    "replayssm.cli_model",
    "replayssm.cli_calibrate",
]

EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_ENV = 0, 1, 2, 3

EXIT_CONTRACT = ("exit codes: 0 pass, or marginal (an error above the tolerance bound within the marginal band: "
                 "a MARGINAL line; --strict makes it 1); 1 a verdict failed; 2 bad usage or input; 3 environment "
                 "(an --import module failed to import, output not writable, device missing, the run would not "
                 "fit in memory). Errors are one line; --debug prints the traceback. --import MODULE|FILE.py "
                 "(repeatable) first imports outside code that registers kernels.")


class UsageError(Exception):
    """A bad command line or input file: printed as one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line instead of usage + message
        raise UsageError(f"{self.prog}: {message} (see --help)")


def _broken_command(subparsers, module: str, err: BaseException) -> None:
    name = module.rsplit(".", 1)[-1].removeprefix("cli_")
    p = subparsers.add_parser(name, help=f"(unavailable: {module} failed to import)", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(_run=lambda args: _report_broken(module, err))


def _report_broken(module: str, err: BaseException) -> int:
    print(f"replayssm: subcommand module {module} failed to import: {type(err).__name__}: {err}", file=sys.stderr)
    return EXIT_ENV


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="replayssm", description="Numerical validation and drift testing for ReplaySSM-style "
                                                   "decode kernels (Mamba-2, Gated DeltaNet).", epilog=EXIT_CONTRACT)
    parser.add_argument("--version", action="version", version=f"replayssm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in COMMANDS:
        try:
            mod = importlib.import_module(module)
        except Exception as e:  # noqa: BLE001 - one broken subcommand must not break the CLI
            _broken_command(sub, module, e)
            continue
        p = mod.add_parser(sub)
        if not p.epilog:
            p.epilog = EXIT_CONTRACT
        p.set_defaults(_run=mod.run)
    return parser


def _device_from_argv(argv: list[str], flag: str = "--device") -> str | None:
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def wants_interpreter(argv: list[str]) -> bool:
    """Whether the command runs its Triton kernels through the interpreter: ``--device cpu``,
    unless ``--kernel-device`` puts the kernel on a GPU (the engine on the CPU, the kernel compiled
    for the GPU: interpreting it there would run NumPy on device pointers)."""
    kdev = _device_from_argv(argv, "--kernel-device")
    return _device_from_argv(argv) == "cpu" and not (kdev or "").startswith("cuda")


def check_device(dev: str, flag: str = "--device") -> str:
    """Validate a ``--device``-like value (``cpu`` or ``cuda[:N]`` with a CUDA device present)."""
    if dev.startswith("cuda"):
        import torch
        if not torch.cuda.is_available():
            raise EnvironmentProblem(f"{flag}: {dev} requested but no CUDA device is available (use {flag} cpu)")
    elif dev != "cpu":
        raise ValueError(f"{flag}: expected cpu or cuda[:N], got {dev!r}")
    return dev


def _take_imports(argv: list[str]) -> tuple[list[str], list[str]]:
    """Split ``--import X`` (any position, repeatable) from the rest of the command line."""
    rest, imports, i = [], [], 0
    while i < len(argv):
        a = argv[i]
        if a == "--import":
            if i + 1 >= len(argv):
                raise UsageError("replayssm: --import expects a module name or a .py file")
            imports.append(argv[i + 1])
            i += 2
            continue
        if a.startswith("--import="):
            imports.append(a.split("=", 1)[1])
        else:
            rest.append(a)
        i += 1
    return rest, imports


def import_kernels(target: str) -> None:
    """Import a module (dotted name) or a Python file so the kernels it registers become usable."""
    if target.endswith(".py"):
        path = os.path.abspath(target)
        if not os.path.isfile(path):
            raise UsageError(f"replayssm: --import {target}: no such file")
        name = "replayssm_user_" + os.path.splitext(os.path.basename(path))[0]
        if getattr(sys.modules.get(name), "__file__", None) == path:
            return
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as e:  # noqa: BLE001 - any failure of user code is the environment's (exit 3)
            sys.modules.pop(name, None)
            raise EnvironmentProblem(f"--import {target}: failed to import: {_one_line(e)}") from e
    else:
        try:
            importlib.import_module(target)
        except Exception as e:  # noqa: BLE001 - as above
            raise EnvironmentProblem(f"--import {target}: failed to import: {_one_line(e)}") from e


def _one_line(e: BaseException) -> str:
    if isinstance(e, SyntaxError):
        return f"SyntaxError: {e.msg} ({os.path.basename(e.filename or '?')}, line {e.lineno})"
    return f"{type(e).__name__}: {' '.join(str(e).split())}"


def _take_flag(argv: list[str], flag: str) -> tuple[list[str], bool]:
    rest = [a for a in argv if a != flag]
    return rest, len(rest) != len(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `--device cpu` runs Triton kernels through the interpreter: set the switch before any kernel
    # module imports triton (replayssm/__init__ only sets it when no CUDA device exists).
    if wants_interpreter(argv):
        os.environ["TRITON_INTERPRET"] = "1"
    argv, debug = _take_flag(argv, "--debug")
    try:
        argv, imports = _take_imports(argv)
        for target in imports:
            import_kernels(target)
        parser = build_parser()
        args = parser.parse_args(argv)
        args._argv = argv  # the command line, for the provenance of --record
        if not getattr(args, "_run", None):
            parser.print_help()
            return EXIT_USAGE
        return int(args._run(args))
    except UsageError as e:
        _debug(debug)
        print(str(e).splitlines()[0] if str(e) else "replayssm: usage error", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as e:
        _debug(debug)
        print(f"replayssm: error: {' '.join(str(e).split())}", file=sys.stderr)
        return EXIT_USAGE
    except EnvironmentProblem as e:
        _debug(debug)
        print(f"replayssm: environment: {' '.join(str(e).split())}", file=sys.stderr)
        return EXIT_ENV
    except MemoryError:
        _debug(debug)
        lower = _SIZE_FLAGS.get(argv[0] if argv else "", "the run's size")
        print(f"replayssm: environment: out of memory (lower {lower})", file=sys.stderr)
        return EXIT_ENV
    except OSError as e:
        _debug(debug)
        print(f"replayssm: environment: {_one_line(e)}", file=sys.stderr)
        return EXIT_ENV
    except KeyboardInterrupt:
        print("replayssm: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the contract: one line, the traceback only with --debug
        _debug(debug)
        print(f"replayssm: internal error: {_one_line(e)} (rerun with --debug for the traceback)", file=sys.stderr)
        return EXIT_ENV


# What to lower after a MemoryError, by subcommand (flags of that subcommand only).
_SIZE_FLAGS = {"validate": "--steps, --batch or --slots", "drift": "--tokens, --rows or --workers",
               "fuzz": "--max-examples", "bench": "--batches or --spec-batches"}


def _debug(on: bool) -> None:
    if on:
        traceback.print_exc()


__all__ = ["COMMANDS", "EXIT_CONTRACT", "EXIT_ENV", "EXIT_FAIL", "EXIT_PASS", "EXIT_USAGE", "EnvironmentProblem",
           "UsageError", "build_parser", "main"]
