"""Find and import the vLLM 0.33.0 release's ReplaySSM kernels: from a source tree or an installed vLLM.

The release (``vllm==0.33.0``, the first with ``--use-replayssm``) and the ReplaySSM fork share
vLLM's module names (``vllm.model_executor.layers.mamba.ops...``) but not their code.  Both can be
loaded in one process: the release's modules are imported from its tree (``REPLAYSSM_VLLM033_SRC``;
or ``REPLAYSSM_VLLM_SRC`` / ``--vllm-src`` when that names a release tree, told apart from a fork
checkout by ``ssu_dispatch.py`` beside the output-only kernel and no fork ``_spec`` kernel; the
project keeps one at ``../shared/peers/vllm-0.33.0``) the way :mod:`._vllm_source` imports the
fork's (package objects over the tree's folders, their ``__init__`` not run, the same stand-ins
for vLLM internals that are not there), the loaded module objects are kept, and every
``sys.modules`` entry the import added or replaced is put back as it was (the kernels keep
references to their own globals, so they run after that).  Nothing is copied or edited.

An installed ``vllm`` of version 0.33.x is used when no tree is given.  Every failure becomes
:class:`SourceUnavailable` with one line naming what was looked for and how to provide it.
"""

from __future__ import annotations

import contextlib
import enum
import importlib
import importlib.util
import os
import sys
import types
from pathlib import Path

from replayssm.adapters import _vllm_source
from replayssm.adapters._vllm_source import SourceUnavailable

ENV = "REPLAYSSM_VLLM033_SRC"
VERSION = "0.33.0"
MAMBA_OPS = _vllm_source.MAMBA_OPS
REQUIRED = {
    f"{MAMBA_OPS}.selective_state_update_replayssm_output_only": ["selective_state_update_replayssm_output_only"],
    f"{MAMBA_OPS}.ssu_dispatch": ["update_replayssm_ring_trackers", "commit_replayssm_ring_trackers",
                                 "reset_replayssm_ring_trackers", "selective_state_update_replayssm_flashinfer"],
    f"{MAMBA_OPS}.replayssm_config": ["get_replayssm_config"],
}
FORK_ONLY = f"{MAMBA_OPS}.selective_state_update_replayssm_spec"
HOW = (f"set {ENV}=PATH (or pass --vllm-src PATH, REPLAYSSM_VLLM_SRC) to the files of the vllm=={VERSION} "
       f"wheel (the project keeps them at ../shared/peers/vllm-0.33.0), or pip install vllm=={VERSION}")


def _rel(module: str) -> Path:
    return Path(*module.split(".")).with_suffix(".py")


def is_release_tree(root: Path) -> bool:
    """Whether ``root`` holds the release's ReplaySSM Mamba-2 files (and not the fork's spec kernel)."""
    return all((root / _rel(m)).is_file() for m in REQUIRED) and not (root / _rel(FORK_ONLY)).is_file()


def find_tree(path: str | None = None) -> Path | None:
    """The release tree to load from: ``path``, else ``$REPLAYSSM_VLLM033_SRC``, else
    ``$REPLAYSSM_VLLM_SRC`` when it is a release tree; None for an installed vLLM."""
    given = path or os.environ.get(ENV)
    if not given:
        other = os.environ.get(_vllm_source.ENV)
        if other and is_release_tree(Path(other).expanduser()):
            return Path(other).expanduser().resolve()
        return None
    root = Path(given).expanduser()
    if not root.is_dir():
        raise SourceUnavailable(f"vLLM {VERSION} source {given!r} ({ENV}): no such folder; {HOW}")
    missing = [str(_rel(m)) for m in REQUIRED if not (root / _rel(m)).is_file()]
    if missing:
        raise SourceUnavailable(f"vLLM {VERSION} source {given!r} ({ENV}): {len(missing)} file(s) missing, "
                                f"first {missing[0]}; {HOW}")
    return root.resolve()


def _vllm_installed() -> bool:
    """A real vLLM (not the stand-in package the fork's loader may have put in ``sys.modules``)."""
    mod = sys.modules.get("vllm")
    if mod is not None:
        return not getattr(mod, "__replayssm_stand_in__", False)
    return _vllm_source.vllm_installed()


class _Enum(str, enum.Enum):
    pass


def _install_release_stand_ins() -> None:
    """Names the release's files import beyond the fork's (only as annotations or in engine setup
    paths the adapters never call), when vLLM is not installed."""
    _vllm_source._install_stand_ins()
    plat = sys.modules["vllm.platforms"].current_platform
    if not hasattr(type(plat), "is_cpu"):
        type(plat).is_cpu = lambda self: False  # the Triton kernels are wanted, also under the interpreter
    for name in ("vllm.utils", "vllm.config"):
        _vllm_source._stand_in(name, __path__=[])
    _vllm_source._stand_in("vllm.utils.platform_utils",
                           get_device_name_as_file_name=lambda: plat.get_device_name().replace(" ", "_"))
    _vllm_source._stand_in("vllm.config.mamba", MambaConfig=object, MambaSSUAlgorithm=str,
                           MambaBackendEnum=_Enum("MambaBackendEnum", {"TRITON": "triton",
                                                                       "FLASHINFER": "flashinfer", "CPU": "cpu"}))
    _vllm_source._stand_in("vllm.v1.attention.backends.registry",
                           MambaAttentionBackendEnum=_Enum("MambaAttentionBackendEnum",
                                                           {"MAMBA1": "mamba1", "MAMBA2": "mamba2"}))
    _vllm_source._stand_in("vllm.v1.kv_cache_interface", KVCacheConfig=object, MambaSpec=object)


_LOADED: dict[str, types.ModuleType] | None = None
_ROOT: Path | None = None


@contextlib.contextmanager
def _tree_packages(root: Path, prefixes: tuple[str, ...], holders: tuple[str, ...], leaves: tuple[str, ...],
                   packages: list[str]):
    """Package objects over ``root``'s folders for ``packages`` (in order, each set as its parent's
    attribute), inside a block that gives ``sys.modules`` back as it was (see the module doc): the
    modules under ``prefixes`` are taken out for the block (another vLLM source's modules of the same
    names stay out of the tree's imports) and put back after it, the modules it added are dropped,
    and the attributes ``leaves`` of the modules ``holders`` get their old values back."""
    before = {k: v for k, v in sys.modules.items() if k.startswith(prefixes)}
    attrs = [(sys.modules[k], leaf, getattr(sys.modules[k], leaf, None))
             for k in holders if k in sys.modules for leaf in leaves]
    try:
        for k in before:
            del sys.modules[k]
        for name in packages:
            mod = types.ModuleType(name)
            mod.__replayssm_stand_in__ = True
            mod.__path__ = [str(root / Path(*name.split(".")))]
            sys.modules[name] = mod
            parent, _, leaf = name.rpartition(".")
            setattr(sys.modules[parent], leaf, mod)
        yield
    finally:
        for k in [k for k in sys.modules if k.startswith(prefixes)]:
            if k not in before:
                del sys.modules[k]
        sys.modules.update(before)
        for mod, leaf, value in attrs:
            if value is None:
                if hasattr(mod, leaf):
                    delattr(mod, leaf)
            else:
                setattr(mod, leaf, value)


def _import_from_tree(root: Path, names=tuple(REQUIRED)) -> dict[str, types.ModuleType]:
    """Import ``names`` (default REQUIRED) from ``root`` and give ``sys.modules`` back as it was (see the
    module doc): a tree loaded so can sit beside another vLLM source in one process."""
    chain = ["vllm.model_executor", "vllm.model_executor.layers", "vllm.model_executor.layers.mamba", MAMBA_OPS]
    with _tree_packages(root, ("vllm.model_executor",), ("vllm", *chain[:3]),
                        ("model_executor", "layers", "mamba", "ops"), chain):
        return {name: importlib.import_module(name) for name in names}


def _import_checked(what: str, importer, required: dict[str, list[str]]) -> dict[str, types.ModuleType]:
    """``importer()``'s modules (name -> module), each checked to have its ``required`` names;
    :class:`SourceUnavailable` starting with ``what`` on an import failure (one line, never a
    traceback) or a missing name (an incompatible version)."""
    try:
        mods = importer()
    except Exception as e:  # any import failure is one line, never a traceback
        raise SourceUnavailable(f"{what}: import failed "
                                f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); {HOW}") from None
    for name, funcs in required.items():
        absent = [f for f in funcs if not hasattr(mods[name], f)]
        if absent:
            raise SourceUnavailable(f"{what}: incompatible version, {name} has no {', '.join(absent)}; {HOW}")
    return mods


def _import_release(root: Path | None) -> dict[str, types.ModuleType]:
    """REQUIRED from the installed vllm (``root`` None) or from the tree at ``root``."""
    if root is None:
        return {name: importlib.import_module(name) for name in REQUIRED}
    if _vllm_installed():
        importlib.import_module("vllm")
    else:
        _install_release_stand_ins()
    return _import_from_tree(root)


def load(path: str | None = None) -> dict[str, types.ModuleType]:
    """The release's kernel modules (short name -> module); :class:`SourceUnavailable` on any failure."""
    global _LOADED, _ROOT
    root = find_tree(path)
    if _LOADED is not None:
        if root != _ROOT:
            raise SourceUnavailable(f"vLLM {VERSION} kernels: already loaded from {_ROOT or 'the installed vllm'} in "
                                    f"this process; one release source per process (asked for {root})")
        return _LOADED
    where = str(root) if root is not None else "the installed vllm"
    if root is None:
        if not _vllm_installed():
            raise SourceUnavailable(f"vLLM {VERSION} kernels: vllm is not installed and no release tree given; {HOW}")
        version = getattr(importlib.import_module("vllm"), "__version__", "unknown")
        if not str(version).startswith("0.33."):
            raise SourceUnavailable(f"vLLM {VERSION} kernels: the installed vllm is {version}; {HOW}")
    mods = _import_checked(f"vLLM {VERSION} kernels from {where}", lambda: _import_release(root), REQUIRED)
    _LOADED, _ROOT = {n.rpartition(".")[2]: m for n, m in mods.items()}, root
    return _LOADED


KDA_OPS = "vllm.models.kimi_k3.nvidia.ops.recoverssm"
KDA_CUTE = "vllm.models.kimi_k3.nvidia.recoverssm.kernels"
REQUIRED_KDA = {KDA_OPS: ["kda_recoverssm_verify", "KDARecoverSSMRecords", "KDARecoverSSMCommitContext"],
                KDA_CUTE: ["can_use_cute_recoverssm"]}
_KDA_LOADED: dict[str, types.ModuleType] | None = None


def _import_kda_from_tree(root: Path) -> dict[str, types.ModuleType]:
    """Import REQUIRED_KDA from ``root`` (package objects over ``vllm/models/kimi_k3/nvidia/...``, their
    ``__init__`` not run: ``ops/__init__`` imports model code) with one stand-in,
    ``mamba_utils.is_conv_state_dim_first`` (read only by ``KDARecoverSSMCommitContext.create``: it
    says True, the dim-first conv layout the adapter allocates); ``sys.modules`` is given back as it
    was (see the module doc)."""
    pkgs = ["vllm.models", "vllm.models.kimi_k3", "vllm.models.kimi_k3.nvidia", "vllm.models.kimi_k3.nvidia.ops",
            "vllm.models.kimi_k3.nvidia.recoverssm", "vllm.model_executor", "vllm.model_executor.layers",
            "vllm.model_executor.layers.mamba"]
    with _tree_packages(root, ("vllm.models", "vllm.model_executor"), ("vllm",), ("models", "model_executor"), pkgs):
        utils = types.ModuleType("vllm.model_executor.layers.mamba.mamba_utils")
        utils.__replayssm_stand_in__ = True
        utils.is_conv_state_dim_first = lambda: True
        sys.modules[utils.__name__] = utils
        return {name: importlib.import_module(name) for name in (KDA_CUTE, KDA_OPS)}


def _import_kda(root: Path | None) -> dict[str, types.ModuleType]:
    """REQUIRED_KDA from the installed vllm (``root`` None) or from the tree at ``root``."""
    if root is None:
        return {name: importlib.import_module(name) for name in (KDA_CUTE, KDA_OPS)}
    return _import_kda_from_tree(root)


def load_recoverssm(path: str | None = None) -> dict[str, types.ModuleType]:
    """The release's KDA RecoverSSM modules (``recoverssm``: the Triton verify and commit;
    ``kernels``: the CuTe-DSL host side, for its availability rule), from the same source as
    :func:`load` (which runs first); :class:`SourceUnavailable` on any failure."""
    global _KDA_LOADED
    load(path)
    if _KDA_LOADED is not None:
        return _KDA_LOADED
    where = str(_ROOT) if _ROOT is not None else "the installed vllm"
    if _ROOT is not None:
        missing = [str(_rel(m)) for m in REQUIRED_KDA if not (_ROOT / _rel(m)).is_file()]
        if missing:
            raise SourceUnavailable(f"vLLM {VERSION} KDA RecoverSSM from {where}: {missing[0]} missing; {HOW}")
    mods = _import_checked(f"vLLM {VERSION} KDA RecoverSSM from {where}", lambda: _import_kda(_ROOT), REQUIRED_KDA)
    _KDA_LOADED = {n.rpartition(".")[2]: m for n, m in mods.items()}
    return _KDA_LOADED


def provenance() -> str:
    """Where the loaded release came from, for reports and ``replayssm list adapters``."""
    if _LOADED is None:
        return "not loaded"
    if _ROOT is None:
        return f"installed vllm {importlib.import_module('vllm').__version__}"
    return f"vllm {VERSION} release files at {_ROOT}"
