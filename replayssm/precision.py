"""Precision modes: what a kernel stores and computes in, named by a short id.

A mode names, independently:

* the state/checkpoint format: fp64, fp32, bf16, fp16, fp8 e4m3 or int8 (the last two with
  fp32 scales per slot/head/row);
* the activation and buffer format: fp64, fp32, bf16, fp16;
* the readout dot precision: ieee, tf32 or tf32x3;
* the rounding of state writes: nearest, or stochastic with a seed.

Every storage format is one row of :data:`FORMATS` (dtype, unit roundoff, bytes, the largest
stored magnitude and scale block of a scaled format, its mode-id token, the roles it may take,
whether stochastic rounding applies, its Triton dtype, its tolerance floor, the next-lower format a
"stored one format lower" mutant rounds through, and the modes of it the full sweep covers).  The
mode-id grammar, its parser, the help text :data:`VALID_FORMS`, :data:`STANDARD_MODES` and the
tolerance floors (``validators/engine/tolerances.py``) are generated from the table; a new storage format is
one row here plus its rounding in :mod:`replayssm.rounding` (torch) and
:mod:`replayssm.ops.triton.rounding` (Triton).  Left out, its floor and next-lower format get the
defaults of :attr:`StorageFormat.floor` and :func:`lower_format`.

Short ids: ``s<state>a<act>[-<dot>][-sr[<seed>]]`` with the state and activation tokens of the
table (``64 32 16 fp16 fp8 i8``; a bare ``16`` means bf16).  Examples: ``s64a64`` (the fp64
reference), ``s32a32``, ``s32a16`` (fp32 state, bf16 activations), ``s16a16``, ``sfp16a16``,
``sfp16afp16``, ``sfp8a16``, ``si8a16``, ``s16a16-sr`` (stochastic rounding, seed 0),
``sfp8a16-sr7``, ``s32a16-tf32``.

Each mode knows its unit roundoff ``u`` (the largest of its parts), used to express errors in
units of the precision a kernel declares.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

# Below fp8 e4m3, a "stored one format lower" state is rounded to fp4 e2m1 (no storage format here:
# a rounding target only): these magnitudes, with a per-row scale amax / 6.
FP4_E2M1 = "fp4e2m1"
FP4_E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


@dataclass(frozen=True)
class StorageFormat:
    """One storage format: a row of :data:`FORMATS`."""

    name: str                 # the format's name in a PrecisionMode (mode.state, mode.act)
    token: str                # its token in a mode id (s<token>a<token>)
    dtype: torch.dtype
    unit_roundoff: float      # half the relative gap (scaled formats: relative to the row maximum)
    nbytes: int               # bytes per stored element (scales not counted)
    roles: tuple[str, ...]    # "state" and/or "act"
    stochastic: bool = False  # stochastic rounding of state writes applies
    qmax: float | None = None       # scaled formats: stored = round(x / scale), scale = amax / qmax
    scale_block: str | None = None  # scaled formats: "row", one fp32 scale per last-dimension row
    triton: str | None = None       # the triton.language dtype Triton kernels store it as (None: none)
    note: str = ""            # shown after the token in the help text
    floor_u: float | None = None    # the tolerance floor in u (None: the default, :attr:`floor`)
    lower: str | None = None  # the next-lower format (a FORMATS row or FP4_E2M1; None: :func:`lower_format`)
    sweep: tuple[str, ...] = ()     # the mode ids with this state the full sweep covers (STANDARD_MODES)

    @property
    def scaled(self) -> bool:
        return self.qmax is not None

    @property
    def floor(self) -> float:
        """The tolerance rule's floor in units of u, relative to the row maximum: ``floor_u`` where the
        row sets it, else 4 u (two roundings) capped at 2^-4 of the row maximum, so a coarse format's
        floor (fp8 e4m3: 1 u) stays below the error of a state stored one format lower."""
        return self.floor_u if self.floor_u is not None else min(4.0, 2.0**-4 / self.unit_roundoff)

    @property
    def help(self) -> str:
        return f"{self.token} ({self.note})" if self.note else self.token


FORMATS: dict[str, StorageFormat] = {f.name: f for f in (
    # fp64: the round-off of the replay fold's other summation orders (~1e-14) is 64 u.
    StorageFormat("fp64", "64", torch.float64, 2.0**-53, 8, ("state", "act"), floor_u=64.0, lower="fp32",
                  sweep=("s64a64",)),
    StorageFormat("fp32", "32", torch.float32, 2.0**-24, 4, ("state", "act"), triton="float32", lower="bf16",
                  sweep=("s32a32", "s32a16", "s32afp16")),
    StorageFormat("bf16", "16", torch.bfloat16, 2.0**-8, 2, ("state", "act"), stochastic=True,
                  triton="bfloat16", note="bf16", lower="fp8e4m3", sweep=("s16a16", "s16a16-sr")),
    StorageFormat("fp16", "fp16", torch.float16, 2.0**-11, 2, ("state", "act"), stochastic=True, triton="float16",
                  lower="fp8e4m3", sweep=("sfp16a16", "sfp16a16-sr", "sfp16afp16")),
    # fp8's u (2^-4) is 16x bf16's: a 4 u floor (25 % of the row maximum) let a state stored in
    # fp4 e2m1 pass (worst ratio 0.6); at 1 u the legit variants stay below 0.25 of the bound.
    StorageFormat("fp8e4m3", "fp8", torch.float8_e4m3fn, 2.0**-4, 1, ("state",), stochastic=True, qmax=448.0,
                  scale_block="row", triton="float8e4nv", note="e4m3", floor_u=1.0, lower=FP4_E2M1,
                  sweep=("sfp8a16", "sfp8a16-sr")),
    # int8 with a per-row fp32 scale amax/127: half a step of the row maximum.
    StorageFormat("int8", "i8", torch.int8, 0.5 / 127.0, 1, ("state",), stochastic=True, qmax=127.0,
                  scale_block="row", triton="int8", note="int8", lower="fp8e4m3", sweep=("si8a16",)),
)}


def lower_format(name: str) -> str | None:
    """The format a state of format ``name`` is "stored one format lower" in: the row's ``lower``, else
    the state format with the next larger unit roundoff (None where there is none)."""
    f = storage_format(name)
    if f.lower is not None:
        return f.lower
    coarser = [g for g in STATE_FORMATS.values() if g.unit_roundoff > f.unit_roundoff]
    return min(coarser, key=lambda g: g.unit_roundoff).name if coarser else None


def storage_format(name: str) -> StorageFormat:
    """The :data:`FORMATS` row called ``name`` (``ValueError`` naming the known ones otherwise)."""
    if name not in FORMATS:
        raise ValueError(f"format: expected one of {sorted(FORMATS)}, got {name!r}")
    return FORMATS[name]


def _role(role: str) -> dict[str, StorageFormat]:
    return {f.name: f for f in FORMATS.values() if role in f.roles}


STATE_FORMATS = _role("state")
ACT_FORMATS = _role("act")
_STATE_TOKENS = {f.token: f.name for f in STATE_FORMATS.values()}
_ACT_TOKENS = {f.token: f.name for f in ACT_FORMATS.values()}


def _alternation(tokens) -> str:
    return "|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True))


DOTS = ("ieee", "tf32", "tf32x3")
ROUNDINGS = ("nearest", "stochastic")
_DOT_U = {"ieee": 0.0, "tf32": 2.0**-11, "tf32x3": 2.0**-22}

_ID_RE = re.compile(rf"^s({_alternation(_STATE_TOKENS)})a({_alternation(_ACT_TOKENS)})"
                    rf"(?:-({_alternation(DOTS)}))?(?:-sr(\d+)?)?$")


def _one_of(names) -> str:
    names = list(names)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


# The modes a full sweep covers (each state format's ``sweep``, in the table's order: cheapest state last).
STANDARD_MODES = tuple(m for f in STATE_FORMATS.values() for m in f.sweep)

VALID_FORMS = (
    f"s<state>a<act>[-<dot>][-sr[<seed>]] with state in {{{', '.join(f.help for f in STATE_FORMATS.values())}}}, "
    f"act in {{{', '.join(f.help for f in ACT_FORMATS.values())}}}, dot in {{{', '.join(DOTS)}}}; fp64 state goes "
    f"only with fp64 activations (s64a64, the reference); -sr (stochastic rounding) needs a "
    f"{_one_of(f.name for f in STATE_FORMATS.values() if f.stochastic)} state; tf32/tf32x3 need fp32 arithmetic "
    f"(not s64a64). Examples: s64a64 s32a32 s32a16 s16a16 sfp16a16 sfp16afp16 sfp8a16 si8a16 s16a16-sr "
    f"sfp8a16-sr7 s32a16-tf32"
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
        if self.state not in STATE_FORMATS:
            problems.append(f"state={self.state!r} (expected one of {sorted(STATE_FORMATS)})")
        if self.act not in ACT_FORMATS:
            problems.append(f"act={self.act!r} (expected one of {sorted(ACT_FORMATS)})")
        if self.dot not in DOTS:
            problems.append(f"dot={self.dot!r} (expected one of {DOTS})")
        if self.rounding not in ROUNDINGS:
            problems.append(f"rounding={self.rounding!r} (expected one of {ROUNDINGS})")
        if not isinstance(self.seed, int) or self.seed < 0:
            problems.append(f"seed={self.seed!r} (expected an integer >= 0)")
        if not problems:
            if (self.state == "fp64") != (self.act == "fp64"):
                problems.append("fp64 state and fp64 activations go together (s64a64 is the reference)")
            if self.rounding == "stochastic" and not FORMATS[self.state].stochastic:
                problems.append(f"stochastic rounding needs a "
                                f"{_one_of(f.name for f in STATE_FORMATS.values() if f.stochastic)} state, "
                                f"not {self.state}")
            if self.dot != "ieee" and self.state == "fp64":
                problems.append(f"dot={self.dot} needs fp32 arithmetic; s64a64 computes in fp64")
            if self.rounding == "nearest" and self.seed != 0:
                problems.append("a seed only applies to stochastic rounding")
        if problems:
            raise ValueError("invalid precision mode: " + "; ".join(problems) + ". Valid forms: " + VALID_FORMS)

    # ---- names -------------------------------------------------------------------------------
    @property
    def id(self) -> str:
        s = f"s{FORMATS[self.state].token}a{FORMATS[self.act].token}"
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
        return FORMATS[self.state].dtype

    @property
    def act_dtype(self) -> torch.dtype:
        """The dtype of inputs, buffer records (except decays) and outputs."""
        return FORMATS[self.act].dtype

    @property
    def compute_dtype(self) -> torch.dtype:
        """Arithmetic dtype: fp64 for the reference, fp32 accumulation otherwise."""
        return torch.float64 if self.state == "fp64" else torch.float32

    @property
    def scaled_state(self) -> bool:
        """True for scaled states (fp8, int8), stored with an fp32 scale per slot/head/row."""
        return FORMATS[self.state].scaled

    @property
    def is_reference(self) -> bool:
        return self.state == "fp64"

    # ---- error units ---------------------------------------------------------------------------
    @property
    def state_unit_roundoff(self) -> float:
        return FORMATS[self.state].unit_roundoff

    @property
    def act_unit_roundoff(self) -> float:
        return FORMATS[self.act].unit_roundoff

    @property
    def arith_unit_roundoff(self) -> float:
        """The u of the arithmetic (fp64 for the reference, fp32 otherwise), the readout dot left out:
        what a state's fold and update are judged in.  A readout precision loosens the output checks
        only: a state computed with the dot (a delta rule's ``S k``) carries the dot's rounding through
        the records it builds, which the literal model rounds the same way (:attr:`dot_unit_roundoff`)."""
        return FORMATS["fp64" if self.is_reference else "fp32"].unit_roundoff

    @property
    def dot_unit_roundoff(self) -> float:
        """The u of the readout dot's operands (tf32: 2^-11; ieee: 0, the arithmetic's)."""
        return _DOT_U[self.dot]

    @property
    def compute_unit_roundoff(self) -> float:
        """The u of the readout arithmetic: the arithmetic's or the readout dot's, whichever is coarser."""
        return max(self.arith_unit_roundoff, self.dot_unit_roundoff)

    @property
    def unit_roundoff(self) -> float:
        """The unit roundoff of the coarsest rounding this mode performs."""
        return max(self.state_unit_roundoff, self.act_unit_roundoff, self.compute_unit_roundoff)

    # ---- memory --------------------------------------------------------------------------------
    def state_bytes_per_element(self, row_len: int | None = None) -> float:
        """Bytes per state element, scales amortised over a row of ``row_len`` elements."""
        b = float(FORMATS[self.state].nbytes)
        if self.scaled_state:
            if row_len is None or row_len <= 0:
                raise ValueError(f"row_len: expected a positive row length for {self.state}, got {row_len!r}")
            b += 4.0 / row_len
        return b

    @property
    def act_bytes_per_element(self) -> int:
        return FORMATS[self.act].nbytes


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
