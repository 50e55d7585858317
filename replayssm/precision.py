"""Precision modes: what a kernel stores and computes in, named by a short id.

A mode names, independently (spec section 5):

* the state/checkpoint dtype: fp64, fp32, bf16, fp16, fp8 e4m3 or int8 (the last two with
  fp32 scales per slot/head/row);
* the activation and buffer dtype: fp64, fp32, bf16, fp16;
* the readout dot precision: ieee, tf32 or tf32x3;
* the rounding of state writes: nearest, or stochastic with a seed.

Short ids: ``s<state>a<act>[-<dot>][-sr[<seed>]]`` with state in ``64 32 16 fp16 fp8 i8`` and
act in ``64 32 16 fp16``; a bare ``16`` means bf16.  Examples: ``s64a64`` (the fp64 reference),
``s32a32``, ``s32a16`` (fp32 state, bf16 activations), ``s16a16``, ``sfp16a16``, ``sfp16afp16``,
``sfp8a16``, ``si8a16``, ``s16a16-sr`` (stochastic rounding, seed 0), ``sfp8a16-sr7``,
``s32a16-tf32``.

Each mode knows its unit roundoff ``u`` (the largest of its parts), used to express errors in
units of the precision a kernel declares.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

# name -> (torch dtype, unit roundoff, bytes per element)
_DTYPES: dict[str, tuple[torch.dtype, float, int]] = {
    "fp64": (torch.float64, 2.0**-53, 8),
    "fp32": (torch.float32, 2.0**-24, 4),
    "bf16": (torch.bfloat16, 2.0**-8, 2),
    "fp16": (torch.float16, 2.0**-11, 2),
    "fp8e4m3": (torch.float8_e4m3fn, 2.0**-4, 1),
    # int8 with a per-row fp32 scale amax/127: half a step of the row maximum.
    "int8": (torch.int8, 0.5 / 127.0, 1),
}

_STATE_TOKENS = {"64": "fp64", "32": "fp32", "16": "bf16", "fp16": "fp16", "fp8": "fp8e4m3", "i8": "int8"}
_ACT_TOKENS = {"64": "fp64", "32": "fp32", "16": "bf16", "fp16": "fp16"}
_STATE_NAMES = {v: k for k, v in _STATE_TOKENS.items()}
_ACT_NAMES = {v: k for k, v in _ACT_TOKENS.items()}

DOTS = ("ieee", "tf32", "tf32x3")
ROUNDINGS = ("nearest", "stochastic")
_DOT_U = {"ieee": 0.0, "tf32": 2.0**-11, "tf32x3": 2.0**-22}

_ID_RE = re.compile(r"^s(64|32|16|fp16|fp8|i8)a(64|32|16|fp16)(?:-(ieee|tf32|tf32x3))?(?:-sr(\d+)?)?$")

VALID_FORMS = (
    "s<state>a<act>[-<dot>][-sr[<seed>]] with state in {64, 32, 16 (bf16), fp16, fp8 (e4m3), i8 (int8)}, "
    "act in {64, 32, 16 (bf16), fp16}, dot in {ieee, tf32, tf32x3}; fp64 state goes only with fp64 "
    "activations (s64a64, the reference); -sr (stochastic rounding) needs a 16-bit, fp8 or int8 state; "
    "tf32/tf32x3 need fp32 arithmetic (not s64a64). Examples: s64a64 s32a32 s32a16 s16a16 sfp16a16 "
    "sfp16afp16 sfp8a16 si8a16 s16a16-sr sfp8a16-sr7 s32a16-tf32"
)

# The modes a full sweep covers, cheapest state last.
STANDARD_MODES = (
    "s64a64",
    "s32a32",
    "s32a16",
    "s32afp16",
    "s16a16",
    "s16a16-sr",
    "sfp16a16",
    "sfp16a16-sr",
    "sfp16afp16",
    "sfp8a16",
    "sfp8a16-sr",
    "si8a16",
)


@dataclass(frozen=True)
class PrecisionMode:
    """A precision mode.  Build one with :func:`parse_mode` or the constructor (validated)."""

    state: str = "fp32"
    act: str = "bf16"
    dot: str = "ieee"
    rounding: str = "nearest"
    seed: int = 0

    def __post_init__(self) -> None:
        problems = []
        if self.state not in _STATE_NAMES:
            problems.append(f"state={self.state!r} (expected one of {sorted(_STATE_NAMES)})")
        if self.act not in _ACT_NAMES:
            problems.append(f"act={self.act!r} (expected one of {sorted(_ACT_NAMES)})")
        if self.dot not in DOTS:
            problems.append(f"dot={self.dot!r} (expected one of {DOTS})")
        if self.rounding not in ROUNDINGS:
            problems.append(f"rounding={self.rounding!r} (expected one of {ROUNDINGS})")
        if not isinstance(self.seed, int) or self.seed < 0:
            problems.append(f"seed={self.seed!r} (expected an integer >= 0)")
        if not problems:
            if (self.state == "fp64") != (self.act == "fp64"):
                problems.append("fp64 state and fp64 activations go together (s64a64 is the reference)")
            if self.rounding == "stochastic" and self.state in ("fp64", "fp32"):
                problems.append(f"stochastic rounding needs a 16-bit, fp8 or int8 state, not {self.state}")
            if self.dot != "ieee" and self.state == "fp64":
                problems.append(f"dot={self.dot} needs fp32 arithmetic; s64a64 computes in fp64")
            if self.rounding == "nearest" and self.seed != 0:
                problems.append("a seed only applies to stochastic rounding")
        if problems:
            raise ValueError("invalid precision mode: " + "; ".join(problems) + ". Valid forms: " + VALID_FORMS)

    # ---- names -------------------------------------------------------------------------------
    @property
    def id(self) -> str:
        s = f"s{_STATE_NAMES[self.state]}a{_ACT_NAMES[self.act]}"
        if self.dot != "ieee":
            s += f"-{self.dot}"
        if self.rounding == "stochastic":
            s += "-sr" + (str(self.seed) if self.seed else "")
        return s

    def __str__(self) -> str:
        return self.id

    # ---- dtypes --------------------------------------------------------------------------------
    @property
    def state_dtype(self) -> torch.dtype:
        """The storage dtype of the checkpoint/state."""
        return _DTYPES[self.state][0]

    @property
    def act_dtype(self) -> torch.dtype:
        """The dtype of inputs, buffer records (except decays) and outputs."""
        return _DTYPES[self.act][0]

    @property
    def compute_dtype(self) -> torch.dtype:
        """Arithmetic dtype: fp64 for the reference, fp32 accumulation otherwise."""
        return torch.float64 if self.state == "fp64" else torch.float32

    @property
    def scaled_state(self) -> bool:
        """True for fp8/int8 states, stored with an fp32 scale per slot/head/row."""
        return self.state in ("fp8e4m3", "int8")

    @property
    def is_reference(self) -> bool:
        return self.state == "fp64"

    # ---- error units ---------------------------------------------------------------------------
    @property
    def state_unit_roundoff(self) -> float:
        return _DTYPES[self.state][1]

    @property
    def act_unit_roundoff(self) -> float:
        return _DTYPES[self.act][1]

    @property
    def compute_unit_roundoff(self) -> float:
        return max(_DTYPES["fp64" if self.is_reference else "fp32"][1], _DOT_U[self.dot])

    @property
    def unit_roundoff(self) -> float:
        """The unit roundoff of the coarsest rounding this mode performs."""
        return max(self.state_unit_roundoff, self.act_unit_roundoff, self.compute_unit_roundoff)

    # ---- memory --------------------------------------------------------------------------------
    def state_bytes_per_element(self, row_len: int | None = None) -> float:
        """Bytes per state element, scales amortised over a row of ``row_len`` elements."""
        b = float(_DTYPES[self.state][2])
        if self.scaled_state:
            if row_len is None or row_len <= 0:
                raise ValueError(f"row_len: expected a positive row length for {self.state}, got {row_len!r}")
            b += 4.0 / row_len
        return b

    @property
    def act_bytes_per_element(self) -> int:
        return _DTYPES[self.act][2]


def parse_mode(mode: str | PrecisionMode) -> PrecisionMode:
    """Parse a short id (``s32a16``, ``s16a16-sr7`` ...).  Unknown ids raise ``ValueError``."""
    if isinstance(mode, PrecisionMode):
        return mode
    if not isinstance(mode, str):
        raise ValueError(f"mode: expected a precision-mode id string, got {type(mode).__name__}. "
                         f"Valid forms: {VALID_FORMS}")
    m = _ID_RE.match(mode.strip())
    if not m:
        raise ValueError(f"unknown precision mode {mode!r}. Valid forms: {VALID_FORMS}")
    state, act, dot, seed = m.groups()
    sr = "-sr" in mode
    return PrecisionMode(
        state=_STATE_TOKENS[state],
        act=_ACT_TOKENS[act],
        dot=dot or "ieee",
        rounding="stochastic" if sr else "nearest",
        seed=int(seed) if seed else 0,
    )


REFERENCE = parse_mode("s64a64")
