"""Dao-AILab causal-conv1d 1.7.0's decode conv (the ``circular`` design: ``cache_seqlens``) as the conv of
a mixer kernel under test: ``mixer-causal-conv1d`` = its conv update on a ring of ``d_conv - 1 + T' - 1``
inputs per slot + the family's literal ReplaySSM + the literal gated norm.  At the mixer level it is
validated like any mixer kernel.

Where from: the unpacked sdist (``REPLAYSSM_CAUSAL_CONV1D_SRC=PATH``, the folder holding ``PKG-INFO`` and
``causal_conv1d/``; ``.ci/run`` fetches it with ``CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE pip download --no-deps
--no-binary :all: --no-build-isolation causal-conv1d==1.7.0``) or an install.  Only
``causal_conv1d/causal_conv1d_interface.py`` is executed, unchanged, under its own name: the package
``__init__`` imports the CUDA extension, so ``causal_conv1d.cpp_functions`` is the tree's own file when
the extension ``causal_conv1d_cuda`` is importable and otherwise a stand-in whose functions refuse with
the reason (``sys.modules`` is given back after the import; nothing is copied).

Which function: on a CUDA device with the extension built, ``causal_conv1d_update`` (the CUDA kernel:
``conv_state_indices`` = the slots, ``cache_seqlens`` = the ring cursors, int32); otherwise
``causal_conv1d_update_ref`` (plain torch: gathers the window before the cursor, scatters the new
inputs at the cursor, ``F.conv1d`` in the weight's dtype, then SiLU and one rounding to the input
dtype; also fp64 activations, which the CUDA kernel does not take).  The reference takes no
``conv_state_indices``: the adapter gathers the named slots' rings, calls it, and writes them back
(what an engine without the CUDA kernel does).  The weights are given in the compute dtype (fp32, or
fp64 at s64a64; their values are the activation dtype's, so exact), so the reference accumulates in
fp32 as the CUDA kernel does.  The library has no commit: the engine's books are ``cache_seqlens += k``,
the adapter's commit (the ``circular`` design's).

Oracle: the mixer runner (fp64 whole step, the tolerance rule against the literal mixer, the committed
window bit for bit read by the ``circular`` rule).  Expected error: the literal mixer's order (fp32
conv, one rounding), the window exact.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import torch

from replayssm.adapters._external_conv import ChannelsFirstConvStore, ExternalConvMixer
from replayssm.adapters._sdist_root import sdist_or_install_root
from replayssm.mixer.kernel import register_mixer_kernel
from replayssm.ops.conv.literal import CircularStore

VERSION = "1.7.0"
ENV = "REPLAYSSM_CAUSAL_CONV1D_SRC"
FILE = Path("causal_conv1d", "causal_conv1d_interface.py")
CPP = Path("causal_conv1d", "cpp_functions.py")
HOW = (f"set {ENV}=PATH to its unpacked sdist (CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE pip download --no-deps "
       f"--no-binary :all: --no-build-isolation causal-conv1d=={VERSION}, then tar xzf; .ci/run does it), or "
       f"pip install --no-build-isolation causal-conv1d=={VERSION} where it builds")
_LOADED: dict[str, object] = {}


class Unavailable(RuntimeError):
    """The source cannot be loaded; the message is one line saying how to get it."""


def find_root() -> Path:
    """The folder holding ``causal_conv1d/`` (``$REPLAYSSM_CAUSAL_CONV1D_SRC`` or the install), its version checked."""
    root, _ = sdist_or_install_root(env=ENV, file=FILE, package="causal_conv1d", label="causal-conv1d",
                                    dist="causal-conv1d", version=VERSION, how=HOW, error=Unavailable, resolve=True)
    return root


def cuda_extension() -> bool:
    """Whether the compiled extension ``causal_conv1d_cuda`` is importable (a CUDA build of the package)."""
    return importlib.util.find_spec("causal_conv1d_cuda") is not None


def _exec(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _cpp_stand_in() -> types.ModuleType:
    def refuse(*_a, **_kw):
        raise RuntimeError("causal-conv1d: the CUDA extension causal_conv1d_cuda is not built (the adapter "
                           "uses causal_conv1d_update_ref)")

    mod = types.ModuleType("causal_conv1d.cpp_functions")
    for n in ("causal_conv1d_fwd_function", "causal_conv1d_bwd_function", "causal_conv1d_update_function"):
        setattr(mod, n, refuse)
    return mod


def interface() -> types.ModuleType:
    """``causal_conv1d.causal_conv1d_interface`` from :func:`find_root`'s tree (once per process)."""
    if "interface" in _LOADED:
        return _LOADED["interface"]
    root = find_root()
    names = ("causal_conv1d", "causal_conv1d.cpp_functions", "causal_conv1d.causal_conv1d_interface")
    before = {n: sys.modules[n] for n in names if n in sys.modules}
    try:
        pkg = types.ModuleType("causal_conv1d")
        pkg.__path__ = [str(root / "causal_conv1d")]
        sys.modules["causal_conv1d"] = pkg
        if cuda_extension():
            _exec("causal_conv1d.cpp_functions", root / CPP)
        else:
            sys.modules["causal_conv1d.cpp_functions"] = _cpp_stand_in()
        mod = _exec("causal_conv1d.causal_conv1d_interface", root / FILE)
    except Exception as e:  # one line, never a traceback
        raise Unavailable(f"causal-conv1d {VERSION} from {root}: importing {FILE} failed "
                          f"({type(e).__name__}: {e}); {HOW}") from None
    finally:
        for n in names:
            sys.modules.pop(n, None)
        sys.modules.update(before)
    for fn in ("causal_conv1d_update", "causal_conv1d_update_ref"):
        if not hasattr(mod, fn):
            raise Unavailable(f"causal-conv1d {VERSION} from {root}: {FILE} has no {fn}; {HOW}")
    _LOADED["interface"] = mod
    return mod


def uses_cuda_kernel(device: torch.device) -> bool:
    return torch.device(device).type == "cuda" and cuda_extension()


class CausalConv1dStore(ChannelsFirstConvStore, CircularStore):
    """The ring layout, its verify done by causal-conv1d (conv + SiLU; the CUDA kernel or the reference)."""

    load_kernel = staticmethod(interface)

    def conv_update(self, mod, xs, slots, weight, bias):
        cursor = self.tensors["cursor"][slots].to(device=xs.device, dtype=torch.int32)
        w = weight.contiguous()  # the compute dtype (fp32; fp64 at s64a64), values of the activation dtype
        b = None if bias is None else bias.contiguous()
        if uses_cuda_kernel(xs.device) and xs.dtype != torch.float64:
            idx = torch.tensor(slots, dtype=torch.int32, device=xs.device)
            return mod.causal_conv1d_update(xs, self.tensors["state"], w.float(), None if b is None else b.float(),
                                            activation="silu", cache_seqlens=cursor, conv_state_indices=idx)
        st = self.tensors["state"][slots]  # the named rings, gathered (the reference takes no indices)
        o = mod.causal_conv1d_update_ref(xs, st, w, b, activation="silu", cache_seqlens=cursor)
        self.tensors["state"][slots] = st
        return o


@register_mixer_kernel
class CausalConv1dMixer(ExternalConvMixer):
    name = "mixer-causal-conv1d"
    description = (f"Dao-AILab causal-conv1d {VERSION} causal_conv1d_update (circular, cache_seqlens; the reference "
                   "on CPU) + the literal ReplaySSM")
    conv_policy = "circular"
    store = CausalConv1dStore
    load_source = staticmethod(interface)
    source_error = Unavailable

    @classmethod
    def unsupported_reason(cls, geometry, mode):
        return cls.source_reason()
