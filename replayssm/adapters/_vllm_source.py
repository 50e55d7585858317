"""Find and import the vLLM ReplaySSM kernels: from a source tree or an installed vLLM.

A source tree (``REPLAYSSM_VLLM_SRC=PATH`` / ``--vllm-src PATH``, e.g. ``../shared/peers/vllm-replayssm``,
a checkout of the ReplaySSM vLLM fork) is imported under vLLM's own module names without running
its package ``__init__`` files (they pull in the whole engine): the two kernel packages
(``vllm.model_executor.layers.mamba.ops``, ``...fla.ops``) become plain package objects whose
``__path__`` is the tree's folder, so each kernel file and its relative imports load from there,
unchanged.  When vLLM is *not* installed, the few vLLM internals those files import get minimal
stand-ins (:func:`_install_stand_ins`): ``vllm.triton_utils`` (triton, tl), ``vllm.platforms``
(a ``current_platform`` answering from torch), ``vllm.logger``, ``vllm.envs``, ``vllm._custom_ops``
(empty), ``vllm.v1.attention.backends.utils.NULL_BLOCK_ID = 0``.  Nothing is copied or edited.

Every failure becomes :class:`SourceUnavailable` with one line naming what was looked for and how
to provide it.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
import sys
import types
from pathlib import Path

import torch

ENV = "REPLAYSSM_VLLM_SRC"
MAMBA_OPS = "vllm.model_executor.layers.mamba.ops"
FLA_OPS = "vllm.model_executor.layers.fla.ops"
# file (relative to the tree root) -> functions an adapter calls from it
REQUIRED = {
    f"{MAMBA_OPS}.selective_state_update_replayssm_output_only": ["selective_state_update_replayssm_output_only"],
    f"{MAMBA_OPS}.selective_state_update_replayssm_state_and_output": [
        "selective_state_update_replayssm_state_and_output"],
    f"{MAMBA_OPS}.selective_state_update_replayssm_spec": [
        "selective_state_update_replayssm_spec", "commit_replayssm_spec", "reset_replayssm_spec_cursors"],
    f"{MAMBA_OPS}.mamba_ssm": ["selective_state_update"],
    f"{MAMBA_OPS}.replayssm_config": ["override_replayssm_config"],
    f"{FLA_OPS}.fused_recurrent_replayssm": ["fused_recurrent_gated_delta_rule_replayssm"],
    f"{FLA_OPS}.gdn_replayssm_spec_decode": [
        "gdn_replayssm_spec_decode", "commit_gdn_replayssm_spec", "reset_gdn_replayssm_spec_cursors"],
    f"{FLA_OPS}.fused_recurrent": ["fused_recurrent_gated_delta_rule_packed_decode"],
    f"{FLA_OPS}.fused_sigmoid_gating": ["fused_sigmoid_gating_delta_rule_update"],
}
HOW = (f"set {ENV}=PATH or pass --vllm-src PATH (a checkout of the ReplaySSM vLLM fork, "
       f"github.com/Johnny-Liou/ReplaySSM; the project keeps one at ../shared/peers/vllm-replayssm), "
       f"or install that fork")


class SourceUnavailable(Exception):
    """One line: what was looked for, and how to provide it."""


def _rel(module: str) -> Path:
    return Path(*module.split(".")).with_suffix(".py")


def find_tree(path: str | None = None) -> Path | None:
    """The source tree to load from (explicit path, else ``$REPLAYSSM_VLLM_SRC``), or None for an
    installed vLLM.  Raises :class:`SourceUnavailable` for a path without the kernel files."""
    given = path or os.environ.get(ENV)
    if not given:
        return None
    root = Path(given).expanduser()
    missing = [str(_rel(m)) for m in REQUIRED if not (root / _rel(m)).is_file()]
    if missing and root.is_dir() and (root / _rel(f"{MAMBA_OPS}.ssu_dispatch")).is_file():
        raise SourceUnavailable(f"vLLM ReplaySSM source {given!r} (--vllm-src / {ENV}) is a vLLM release tree "
                                f"(ssu_dispatch.py, no fork spec kernel): its kernels are the vllm033-* adapters "
                                f"(source vllm033); the fork's vllm-* adapters need a fork checkout")
    if missing:
        what = "no such folder" if not root.is_dir() else f"{len(missing)} kernel file(s) missing, first {missing[0]}"
        raise SourceUnavailable(f"vLLM ReplaySSM source {given!r} (--vllm-src / {ENV}): {what}; "
                                f"expected a checkout of the ReplaySSM vLLM fork")
    return root.resolve()


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def _stand_in(name: str, **attrs) -> types.ModuleType:
    mod = sys.modules.get(name)
    if mod is None:
        mod = types.ModuleType(name)
        mod.__replayssm_stand_in__ = True
        sys.modules[name] = mod
        parent, _, leaf = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], leaf, mod)
    for k, v in attrs.items():
        setattr(mod, k, v)
    return mod


class _Platform:
    """``vllm.platforms.current_platform``, answered from torch (CPU or one CUDA device)."""

    def is_cuda(self) -> bool:
        return torch.cuda.is_available()

    is_cuda_alike = is_cuda

    def is_rocm(self) -> bool:
        return False

    is_xpu = is_rocm

    def get_device_name(self, device_id: int = 0) -> str:
        return torch.cuda.get_device_name(device_id) if torch.cuda.is_available() else "cpu"

    def is_device_capability_family(self, family: int, device_id: int = 0) -> bool:
        if not torch.cuda.is_available():
            return False
        major, minor = torch.cuda.get_device_capability(device_id)
        return (major * 10 + minor) // 10 == family // 10


class _Logger(logging.LoggerAdapter):
    def info_once(self, msg, *args, **kwargs):
        kwargs.pop("scope", None)
        self.debug(msg, *args, **kwargs)

    warning_once = info_once


def _install_stand_ins() -> None:
    import triton
    import triton.language as tl
    try:
        from triton.language.extra import libdevice as tldevice
    except ImportError:  # pragma: no cover - older triton
        tldevice = None
    for name in ("vllm", "vllm.v1", "vllm.v1.attention", "vllm.v1.attention.backends"):
        _stand_in(name, __path__=[])
    _stand_in("vllm.triton_utils", triton=triton, tl=tl, tldevice=tldevice, HAS_TRITON=True)
    _stand_in("vllm.platforms", current_platform=_Platform())
    _stand_in("vllm.logger", init_logger=lambda name: _Logger(logging.getLogger(name), {}))
    _stand_in("vllm.envs", VLLM_TUNED_CONFIG_FOLDER=None)
    _stand_in("vllm._custom_ops")
    _stand_in("vllm.v1.attention.backends.utils", NULL_BLOCK_ID=0)


def _install_tree(root: Path) -> None:
    """Kernel packages as plain packages over the tree's folders (their __init__ is not run)."""
    chain = ["vllm.model_executor", "vllm.model_executor.layers", "vllm.model_executor.layers.mamba",
             MAMBA_OPS, "vllm.model_executor.layers.fla", FLA_OPS]
    for name in chain:
        folder = root / Path(*name.split("."))
        mod = sys.modules.get(name)
        if mod is None or name in (MAMBA_OPS, FLA_OPS):
            mod = types.ModuleType(name)
            mod.__replayssm_stand_in__ = True
            sys.modules[name] = mod
            parent, _, leaf = name.rpartition(".")
            setattr(sys.modules[parent], leaf, mod)
        mod.__path__ = [str(folder)]


_LOADED: dict[str, types.ModuleType] | None = None
_ROOT: Path | None = None


def load(path: str | None = None) -> dict[str, types.ModuleType]:
    """Import the kernel modules (short name -> module); :class:`SourceUnavailable` on any failure."""
    global _LOADED, _ROOT
    root = find_tree(path)
    if _LOADED is not None:
        if root is not None and root != _ROOT:
            raise SourceUnavailable(f"vLLM ReplaySSM kernels: already loaded from {_ROOT or 'the installed vllm'} in "
                                    f"this process; one vLLM source per process (asked for {root})")
        return _LOADED
    if root is None and not vllm_installed():
        raise SourceUnavailable(f"vLLM ReplaySSM kernels: vllm is not installed and no source tree given; {HOW}")
    if root is not None:
        if vllm_installed():
            importlib.import_module("vllm")
        else:
            _install_stand_ins()
        _install_tree(root)
    mods = {}
    where = str(root) if root is not None else "the installed vllm"
    for name, funcs in REQUIRED.items():
        try:
            mod = importlib.import_module(name)
        except Exception as e:  # any import failure is one line, never a traceback
            raise SourceUnavailable(f"vLLM ReplaySSM kernels from {where}: importing {name} failed "
                                    f"({type(e).__name__}: {e}); {HOW}") from None
        absent = [f for f in funcs if not hasattr(mod, f)]
        if absent:
            raise SourceUnavailable(f"vLLM ReplaySSM kernels from {where}: incompatible version, {name} has no "
                                    f"{', '.join(absent)}; {HOW}")
        mods[name.rpartition(".")[2]] = mod
    _LOADED, _ROOT = mods, root
    return mods


def provenance() -> str:
    """Where the loaded kernels came from, for reports: the tree's path and the commit in its
    ``COMMIT`` file (the peers' copy keeps one), or the installed vllm's version."""
    if _LOADED is None:
        return "not loaded"
    if _ROOT is None:
        return f"installed vllm {importlib.import_module('vllm').__version__}"
    commit = _ROOT / "COMMIT"
    return f"{_ROOT} at commit {commit.read_text().strip() if commit.is_file() else 'unknown (no COMMIT file)'}"


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@contextlib.contextmanager
def _interpreter_traps(modules=None):
    """Two Triton-interpreter traps (docs/kernel_interface.md) the kernels hit on CPU, neutralised for one
    call:

    * a mask combined with a scalar comparison (``mask_v & (write_pos < L)``) comes out int32
      under the interpreter, and its masked load/store raises "mask has unsupported dtype": masks
      are converted to bool (nonzero = true, what the compiled kernel does);
    * a module-level alias of a builtin (fla's ``exp = tl.exp``) is not patched by the interpreter
      and raises "Did you forget to add @triton.jit": each alias in the loaded kernel modules is
      rebound to a forwarder that calls the (patched) ``tl`` builtin of the same name.

    ``modules``: the kernel modules to patch (default: the fork's, :func:`load`)."""
    import triton.language as tl
    import triton.runtime.interpreter as interp
    builder = interp.InterpreterBuilder
    saved_load, saved_store = builder.create_masked_load, builder.create_masked_store

    def _bool(mask):
        if mask.data.dtype != bool:
            mask = interp.TensorHandle(mask.data != 0, tl.int1)
        return mask

    builder.create_masked_load = lambda self, ptrs, mask, *a: saved_load(self, ptrs, _bool(mask), *a)
    builder.create_masked_store = lambda self, ptrs, value, mask, *a: saved_store(self, ptrs, value, _bool(mask), *a)
    aliases = []
    for mod in (modules if modules is not None else (_LOADED or {}).values()):
        for name, value in list(vars(mod).items()):
            if tl.core.is_builtin(value) and hasattr(tl, value.__name__):
                aliases.append((mod, name, value))
                setattr(mod, name, lambda *a, _n=value.__name__, **k: getattr(tl, _n)(*a, **k))
    try:
        yield
    finally:
        builder.create_masked_load, builder.create_masked_store = saved_load, saved_store
        for mod, name, value in aliases:
            setattr(mod, name, value)


@contextlib.contextmanager
def launch_guard(device: torch.device, modules=None):
    """Around an external launch on CPU tensors: ``torch.cuda.device(index)`` (which the kernels
    wrap their launches in) raises for a CPU tensor's ``index = None``: a no-op for the duration of
    the call (and ``torch.get_device_module(cpu).device(None)``, which torch.cpu lacks); under the
    interpreter, also :func:`_interpreter_traps`."""
    if device.type != "cpu":
        yield
        return
    saved, had_cpu = torch.cuda.device, hasattr(torch.cpu, "device")
    torch.cuda.device = lambda index=None: contextlib.nullcontext()
    if not had_cpu:
        torch.cpu.device = lambda index=None: contextlib.nullcontext()
    try:
        with _interpreter_traps(modules) if _interpreting() else contextlib.nullcontext():
            yield
    finally:
        torch.cuda.device = saved
        if not had_cpu:
            del torch.cpu.device
