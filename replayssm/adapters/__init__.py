"""Adapters: kernels written elsewhere, registered as ``KernelUnderTest`` kernels.

Loading is explicit and cheap to skip: importing ``replayssm`` (or this package) imports no
external code.  :func:`load` (called by the CLI and the tests) tries every adapter source and
registers the kernels of those that are available; :func:`availability` says, per source, either
what was registered or one line naming what was looked for and how to provide it.

Sources: ``vllm`` (the official ReplaySSM kernels of the vLLM fork and vLLM's baselines; a source
tree via ``REPLAYSSM_VLLM_SRC=PATH`` / ``--vllm-src PATH``, or an installed vLLM); ``vllm033`` (the
vLLM 0.33.0 release's own ReplaySSM kernels: ``REPLAYSSM_VLLM033_SRC=PATH``, ``--vllm-src PATH`` naming
a release tree, or an installed vLLM 0.33.x); ``fla``
(flash-linear-attention, ``pip install fla-core==0.6.0 einops``); ``sglang`` (SGLang 0.5.23 kernels,
``pip install --no-deps sglang==0.5.23``); ``mamba_ssm`` (mamba-ssm 2.3.2.post1's Triton
``selective_state_update``: an unpacked sdist via ``REPLAYSSM_MAMBA_SSM_SRC=PATH``, or an install);
``flashinfer`` (flashinfer-python 0.7.2.post1, CUDA JIT, GPU only).
"""

from __future__ import annotations

import importlib

SOURCES = {"vllm": "replayssm.adapters.vllm", "vllm033": "replayssm.adapters.vllm033",
           "fla": "replayssm.adapters.fla", "sglang": "replayssm.adapters.sglang",
           "mamba_ssm": "replayssm.adapters.mamba_ssm", "flashinfer": "replayssm.adapters.flashinfer"}

_STATUS: dict[str, tuple[bool, str]] = {}


def load(force: bool = False) -> dict[str, tuple[bool, str]]:
    """Try every source once (``force``: again, e.g. after ``REPLAYSSM_VLLM_SRC`` changed);
    returns :func:`availability`."""
    for name, module in SOURCES.items():
        if name in _STATUS and not force:
            continue
        mod = importlib.import_module(module)
        try:
            kernels = mod.load()
        except Exception as e:  # one line per source, never a traceback
            _STATUS[name] = (False, str(e).splitlines()[0] if str(e) else type(e).__name__)
        else:
            _STATUS[name] = (True, "registered " + ", ".join(kernels) if kernels
                             else "installed; it registers no kernels yet")
    return availability()


def availability() -> dict[str, tuple[bool, str]]:
    """Per source: (available, one line) -- what was registered, or what was looked for and how to
    provide it.  Sources not tried yet (no :func:`load`) are reported as such."""
    return {name: _STATUS.get(name, (False, "not loaded (call replayssm.adapters.load())")) for name in SOURCES}


__all__ = ["SOURCES", "availability", "load"]
