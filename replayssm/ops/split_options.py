"""Option parsing shared by the replay kernels' two-launch paths (both families).

Oracle: none (argument checking); a bad value raises ValueError naming the option and what was
expected, before anything is allocated."""

from __future__ import annotations


def prepass_option(options: dict) -> bool | None:
    """``options['prepass']``: True (the pre-pass + stream pair), False (the single kernel) or None
    (absent: chosen per launch from the number of rows)."""
    value = options.get("prepass")
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"options['prepass']: expected True, False or absent (automatic), got {value!r}")
    return value


def int_choice(options: dict, key: str, allowed: tuple[int, ...], default: int) -> int:
    """``options[key]`` as an int from ``allowed`` (``default`` when absent)."""
    value = int(options.get(key, default))
    if value not in allowed:
        raise ValueError(f"options[{key!r}]: expected one of {allowed}, got {value}")
    return value


__all__ = ["int_choice", "prepass_option"]
