"""Option parsing and the coefficient layout shared by the replay kernels' two-launch paths (every family).

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


def coef_offsets(sizes) -> dict[str, int]:
    """Offsets of a pre-pass's per-(row, head) coefficient block laid out as ``sizes`` ((name,
    floats) pairs, in order), and its length ``NCOEF`` rounded up to 4 floats (16 bytes)."""
    off, at = {}, 0
    for name, size in sizes:
        off[name] = at
        at += size
    off["NCOEF"] = (at + 3) // 4 * 4
    return off


__all__ = ["coef_offsets", "int_choice", "prepass_option"]
