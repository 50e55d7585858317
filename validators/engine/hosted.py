"""A kernel computing on one device, driven and judged by an engine on another.

``hosted(cls, "cuda")`` is ``cls`` (same name, family, declarations and capabilities: a subclass)
whose instances build the real kernel on the GPU and forward every call of the kernel interface
(``reset``, ``verify``, ``commit``, ``committed_state``, ``checkpoint_state``, ``snapshot``,
``restore``, ``materialize``), moving tensor arguments to the kernel's device and results back to the engine's.
The engine, the literal model and the fp64 reference then run on the CPU, where tiny fuzz
scenarios are cheaper than thousands of small GPU launches and host syncs per scenario (the
nightly GPU set, docs/fuzzing.md, "Nightly run 6").

Oracle: nothing changes in what is judged: the kernel sees the same values (copies are exact),
its outputs and states come back bit for bit, a ``verify(..., out=buf)`` writes the engine's
poisoned buffer (copied over and back, so untouched positions stay poisoned), and an argument
error is the kernel's own, raised before anything changes.  Expected error: none (tested: the
step digests of a hosted run equal the plain run's).
"""

from __future__ import annotations

import dataclasses

import torch

from replayssm.interface import KernelSnapshot, KernelUnderTest


def _to(x, device: torch.device):
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, dict):
        return {k: _to(v, device) for k, v in x.items()}
    return x


def _device(device) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cpu":
        return torch.device("cpu")  # CPU tensors carry no index
    if dev.type == "cuda" and dev.index is None and torch.cuda.is_available():
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def hosted(cls: type[KernelUnderTest], kernel_device) -> type[KernelUnderTest]:
    """``cls`` computing on ``kernel_device`` behind the interface, for an engine on any device."""
    if not (isinstance(cls, type) and issubclass(cls, KernelUnderTest)):
        raise ValueError(f"cls: expected a KernelUnderTest subclass, got {cls!r}")
    if getattr(cls, "hosted_on", None) is not None:
        raise ValueError(f"cls: {cls.name!r} is already hosted on {cls.hosted_on}")
    kdev = _device(kernel_device)
    if kdev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"kernel_device: {kernel_device!r} needs CUDA, which this torch does not see")

    class Hosted(cls):
        hosted_on = kdev

        def __init__(self, config):
            params = {k: v.to(kdev) for k, v in config.params.items()}
            self.inner = cls(dataclasses.replace(config, params=params, device=kdev))
            KernelUnderTest.__init__(self, config)

        def reset(self, slot_ids, initial_state=None, origin=None):
            self.inner.reset(_to(slot_ids, kdev), _to(initial_state, kdev), _to(origin, kdev))

        def verify(self, slot_ids, inputs, out=None, **kw):
            dev_out = None if out is None else out.to(kdev)
            ret = self.inner.verify(_to(slot_ids, kdev), _to(inputs, kdev), out=dev_out, **_to(kw, kdev))
            if out is not None:
                out.copy_(dev_out)
                if ret is dev_out:
                    return out
            return _to(ret, self.device)

        def commit(self, slot_ids, accepted):
            self.inner.commit(_to(slot_ids, kdev), _to(accepted, kdev))

        def committed_state(self, slot_ids, **kw):
            return self.inner.committed_state(_to(slot_ids, kdev), **_to(kw, kdev)).to(self.device)

        def checkpoint_state(self, slot_ids):
            return self.inner.checkpoint_state(_to(slot_ids, kdev)).to(self.device)

        def snapshot(self) -> KernelSnapshot:
            snap = self.inner.snapshot()
            cpu = torch.device("cpu")
            return KernelSnapshot(**{f.name: _to(getattr(snap, f.name), cpu) for f in dataclasses.fields(snap)})

        def restore(self, snapshot):
            self.inner.restore(snapshot)

        def materialize(self, slot_ids, upto, dst_slot_ids):
            self.inner.materialize(_to(slot_ids, kdev), _to(upto, kdev), _to(dst_slot_ids, kdev))

    Hosted.__name__ = Hosted.__qualname__ = f"{cls.__name__}On{kdev.type.capitalize()}"
    Hosted.__module__ = cls.__module__
    return Hosted


__all__ = ["hosted"]
