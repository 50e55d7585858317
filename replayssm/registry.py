"""Registry of kernels under test, by family and name.

Each family's package (``replayssm.families.BUILTIN_FAMILIES``) registers its literal models and
Triton kernels when it is imported, which the first lookup here does.  Outside kernels register with::

    from replayssm.registry import register
    register(MyKernel)            # a KernelUnderTest subclass with name and family set

Names are letters, digits, ``_ . -`` (``guard.check_name``): they become parts of file names.

and are then usable everywhere by name (CLI ``--kernel``, the runner, the fuzzer, drift).
"""

from __future__ import annotations

from replayssm.families import families
from replayssm.guard import check_name
from replayssm.interface import KernelConfig, KernelUnderTest

_REGISTRY: dict[tuple[str, str], type[KernelUnderTest]] = {}
_BUILTINS_LOADED = False


def register(cls: type[KernelUnderTest], *, replace: bool = False) -> type[KernelUnderTest]:
    """Register a kernel class (usable as a decorator).  Names are unique per family."""
    if not (isinstance(cls, type) and issubclass(cls, KernelUnderTest)):
        raise ValueError(f"cls: expected a KernelUnderTest subclass, got {cls!r}")
    if not cls.name or not cls.family:
        raise ValueError(f"cls: {cls.__name__} must set the class attributes name and family")
    check_name(cls.name, "name")  # names become file names (results, cells, failure artifacts)
    key = (cls.family, cls.name)
    if key in _REGISTRY and _REGISTRY[key] is not cls and not replace:
        raise ValueError(f"name: kernel {cls.name!r} is already registered for family {cls.family!r}")
    _REGISTRY[key] = cls
    return cls


def unregister_family_kernels(family: str) -> None:
    """Remove every kernel registered for ``family`` (a plug-in or test family being taken away)."""
    for key in [k for k in _REGISTRY if k[0] == family]:
        del _REGISTRY[key]


def _load_builtins() -> None:
    global _BUILTINS_LOADED
    if not _BUILTINS_LOADED:
        _BUILTINS_LOADED = True
        families()  # importing each family's package registers its kernels


def kernels(family: str | None = None) -> dict[tuple[str, str], type[KernelUnderTest]]:
    """All registered kernels, optionally of one family."""
    _load_builtins()
    return {k: v for k, v in sorted(_REGISTRY.items()) if family is None or k[0] == family}


def get(name: str, family: str) -> type[KernelUnderTest]:
    """The kernel class registered as ``name`` for ``family``; ValueError lists the choices."""
    _load_builtins()
    cls = _REGISTRY.get((family, name))
    if cls is None:
        have = sorted(n for f, n in _REGISTRY if f == family)
        raise ValueError(f"kernel: no kernel {name!r} for family {family!r}; expected one of {have}")
    return cls


def build(name: str, config: KernelConfig) -> KernelUnderTest:
    """Instantiate the registered kernel ``name`` for ``config``."""
    return get(name, config.geometry.family)(config)
