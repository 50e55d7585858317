"""The SGLang source: SGLang 0.5.23's ReplaySSM GDN kernels and its Mamba-2 baseline, loaded from
an install without its deps.

``pip install --no-deps sglang==0.5.23`` (Python >= 3.11).  SGLang's package ``__init__`` pulls in
its whole runtime (psutil, zmq, ...), so when ``import sglang`` fails the kernel files are imported
under their own names through plain package objects over the installed folders (no ``__init__``
runs, nothing is copied), with stand-ins for the helpers they import:
``sglang.srt.utils`` (``is_cuda``, ``is_hip``, ``get_device_sm``, ``is_sm90_supported``,
``is_gfx95_supported``: answered from torch), ``sglang.srt.utils.common`` (``torch_release``) and
``sglang.kernels.jit.utils`` (``is_arch_support_pdl``: False on CPU, SM >= 90 on CUDA).

``load()`` registers (when sglang VERSION is installed):

* ``sglang-replay`` (GDN, ``sglang_gdn.py``): ``fused_recurrent_linear_replayssm`` standard decode;
  ``gdn_replayssm_spec_decode`` speculative verify (exact fold + verify + flush-output launches) with
  ``commit_gdn_replayssm_spec``;
* ``sglang-replay`` (KDA standard decode) and ``sglang-replay-fold`` (KDA speculative,
  fold-every-commit), ``sglang_kda.py``: ``fused_recurrent_linear_replayssm`` with ``is_kda=True``;
  the KDA recurrent verify (``fused_sigmoid_gating_recurrent``, raw-window ring) with
  ``kda_replayssm_spec_decode.commit_kda_replayssm_spec``;
* ``sglang-replay-serving`` (GDN, ``sglang_serving.py``): the same verify as the server launches it
  (``launch_mode="verify"``) with its commit-time fold ``commit_gdn_replayssm_circular``
  (bookkeeping ``fold-at-commit``);
* ``sglang-baseline`` (Mamba-2, ``sglang_mamba2.py``): ``mamba_ssm.selective_state_update``
  (standard; speculative through its intermediate-state buffer).

``tests/adapters/test_adapters_sglang.py`` also tests ``gdn_replayssm_spec_fold``'s docstring claim (a
"BITWISE CLONE of fused_sigmoid_gating_delta_rule_update_kernel's GDN branch").
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path

import torch
from packaging import version as _version

from replayssm.adapters import sglang_gdn, sglang_kda, sglang_mamba2, sglang_serving
from replayssm.registry import register

NAME = "sglang"
VERSION = "0.5.23"
HOW = f"pip install --no-deps sglang=={VERSION} (Python >= 3.11)"
LINEAR = "sglang.kernels.ops.attention.linear"
MODULES = {  # short name -> module
    "fused_sigmoid_gating_recurrent": f"{LINEAR}.fused_sigmoid_gating_recurrent",
    "gdn_replayssm_spec_fold": f"{LINEAR}.gdn_replayssm_spec_fold",
    "gdn_replayssm_spec_decode": f"{LINEAR}.gdn_replayssm_spec_decode",
    "fused_recurrent_linear_replayssm": f"{LINEAR}.fused_recurrent_linear_replayssm",
    "kda_replayssm_spec_decode": f"{LINEAR}.kda_replayssm_spec_decode",
    "mamba_ssm": "sglang.kernels.ops.mamba.triton_ops.mamba_ssm",
}
PACKAGES = ("sglang", "sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.attention", LINEAR,
            "sglang.kernels.ops.attention.fla", "sglang.kernels.ops.mamba", "sglang.kernels.ops.mamba.triton_ops",
            "sglang.kernels.jit", "sglang.srt")
CLASSES = (sglang_gdn.SGLangGDNReplay, sglang_serving.SGLangGDNReplayServing, sglang_kda.SGLangKDAReplay,
           sglang_kda.SGLangKDAReplayFold, sglang_mamba2.SGLangMamba2Baseline)

_LOADED: dict[str, types.ModuleType] = {}


def _sm() -> int:
    if not torch.cuda.is_available():
        return 0
    major, minor = torch.cuda.get_device_capability()
    return major * 10 + minor


def _stand_ins(root: Path) -> None:
    for name in PACKAGES:
        mod = types.ModuleType(name)
        mod.__path__ = [str(root / Path(*name.split(".")[1:]))]
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        mod.__spec__.submodule_search_locations = mod.__path__  # find_spec("sglang") keeps working
        sys.modules[name] = mod
        parent, _, leaf = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], leaf, mod)
    utils = types.ModuleType("sglang.srt.utils")
    utils.is_cuda = torch.cuda.is_available
    utils.is_hip = lambda: False
    utils.get_device_sm = _sm
    utils.is_sm90_supported = lambda: _sm() // 10 == 9
    utils.is_gfx95_supported = lambda: False
    common = types.ModuleType("sglang.srt.utils.common")
    common.torch_release = _version.parse(torch.__version__).release
    utils.common = common
    jit_utils = types.ModuleType("sglang.kernels.jit.utils")
    jit_utils.is_arch_support_pdl = lambda: _sm() >= 90
    for mod in (utils, common, jit_utils):
        sys.modules[mod.__name__] = mod


def _check_installed() -> None:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"sglang: package not installed; {HOW}")
    from importlib import metadata
    have = metadata.version("sglang")
    if have != VERSION:
        raise RuntimeError(f"sglang {have}: the adapter reads the kernels of sglang {VERSION}; {HOW}")


def load(path: str | None = None) -> list[str]:
    """Register the SGLang adapters when sglang VERSION is installed (metadata only: the kernels
    are imported on first use); one-line ``RuntimeError`` when it is missing or another version."""
    _check_installed()
    done = []
    for cls in CLASSES:
        cls.loader = staticmethod(modules)
        cls.interpreter_loops = staticmethod(interpreter_loops)
        register(cls, replace=True)
        done.append(f"{cls.family}/{cls.name}")
    return done


def modules() -> dict[str, types.ModuleType]:
    """The kernel modules (imported on first call); ``RuntimeError`` (one line) when they cannot be."""
    if _LOADED:
        return dict(_LOADED)
    _check_installed()
    spec = importlib.util.find_spec("sglang")
    root = Path(list(spec.submodule_search_locations)[0])
    if "sglang" not in sys.modules:
        try:
            importlib.import_module("sglang")
        except Exception:  # its runtime deps are absent (a --no-deps install): stand-ins
            for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
                del sys.modules[name]
            _stand_ins(root)
    for short, full in MODULES.items():
        try:
            _LOADED[short] = importlib.import_module(full)
        except Exception as e:
            _LOADED.clear()
            raise RuntimeError(f"sglang {VERSION}: importing {full} failed ({type(e).__name__}: {e}); "
                               f"{HOW}") from None
    return dict(_LOADED)


@contextlib.contextmanager
def interpreter_loops(module: types.ModuleType):
    """Interpreter trap (CPU only): in a jitted ``for t in range(0, n)`` the interpreter yields
    Python ints, so a kernel's ``t.to(tl.int64)`` raises.  For the duration of one call the module's
    ``range`` yields int32 interpreter scalars instead (what the compiled kernel's loop variable is)."""
    import builtins

    import numpy as np
    import triton.language as tl
    import triton.runtime.interpreter as interp

    def scalar_range(*args):
        for i in builtins.range(*args):
            yield tl.core.tensor(interp.TensorHandle(np.array([i], dtype=np.int32), tl.int32), tl.int32)

    had = "range" in vars(module)
    saved = vars(module).get("range")
    module.range = scalar_range
    try:
        yield
    finally:
        if had:
            module.range = saved
        else:
            del module.range
