"""Scenario inputs: parameters, initial states and per-step window inputs, bit-reproducible.

Oracle: every number is a pure function of ``(scenario.seed, stream, step, element index)``.
A counter-based generator (three rounds of the ``lowbias32`` integer hash, keyed by a splitmix64
digest of the key words) gives 32 random bits per element; the top 16 bits pick an interval of a
65,537-point quantile table and the low 16 bits interpolate linearly inside it.  Only integer
ops, a gather, and separate IEEE fp64 ``mul``/``add`` (each correctly rounded, never fused)
touch the values, and the cast to the activation dtype rounds to nearest even: the same scenario
gives bit-identical inputs on any CPU and on a CUDA device (tests/core/test_scenarios.py checks CPU
bit-identity against a stored digest and, on a GPU, CPU == CUDA).  The quantile tables are
built once on the host and rounded to a 2^-20 grid, so a last-bit difference in the host's libm
cannot change them (their digest is tested too).

The normal law is the table of N(0, 1) (tails cut at +-4.33); the heavy-tailed law is Student's
t with 2 degrees of freedom (closed-form quantile, infinite variance, tails cut at +-180).
Inputs are sampled in fp64, rounded once to the mode's activation dtype, and are upcast exactly by
whoever uses them (kernel, literal model, fp64 reference).

Distributions (docs/validation.md, docs/field_bugs.md; ``A`` means Mamba-2's A and GDN's ``-exp(A_log)``):

* ``mild``: the regime public tests use: raw dt = N(0,1) + dt_bias, dt_bias = U - 4 per head
  (so softplus(N(0,1) - 4 + U)), A in [-2, -1], activations N(0,1);
* ``long-memory``: A in [-0.1, -0.01], dt_bias = U - 6: per-token decay 1 - ~1e-4;
* ``fast-forget``: A in [-8, -4], dt_bias = U - 1: decay ~ 0.03 per token;
* ``large-delta``: raw dt = 6 N(0,1) + 4 + 4U: Delta up to ~30, softplus's identity branch hit;
* ``heavy-tailed``: mild gates, activations Student-t(2);
* ``near-fp16-limit``: mild gates, value inputs (Mamba-2 x, GDN v) N(0,1) * 4096, |x| up to
  ~1.8e4, outputs reach a few 1e4 (fp16 max 65504).
"""

from __future__ import annotations

import hashlib
import math
import statistics
import zlib
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import torch

from replayssm.families import Family, family
from replayssm.interface import Geometry
from replayssm.ops.triton.counter_inputs import counter_values
from replayssm.precision import PrecisionMode, parse_mode

_M32 = 0xFFFFFFFF
_M64 = 0xFFFFFFFFFFFFFFFF
TABLE_BITS = 16
TABLE_SIZE = (1 << TABLE_BITS) + 1
_GRID = 2.0**-20


@dataclass(frozen=True)
class Distribution:
    """An input regime: gate parameter ranges and the law of the activations."""

    name: str
    description: str
    neg_A: tuple[float, float] = (1.0, 2.0)  # -A uniform in [lo, hi]
    dt_bias: tuple[float, float] = (-4.0, 1.0)  # offset + spread * U
    dt_scale: float = 1.0  # raw dt (Mamba-2 dt, GDN a) = dt_scale * N(0, 1)
    act_law: str = "normal"  # "normal" | "t2"
    value_scale: float = 1.0  # Mamba-2 x, GDN v multiplied by this


DISTRIBUTIONS: dict[str, Distribution] = {d.name: d for d in (
    Distribution("mild", "dt = softplus(N(0,1) - 4 + U), A in [-2, -1], N(0,1) activations (public tests)"),
    Distribution("long-memory", "decay ~ 1 - 1e-4 per token: A in [-0.1, -0.01], dt_bias = U - 6",
                 neg_A=(0.01, 0.1), dt_bias=(-6.0, 1.0)),
    Distribution("fast-forget", "decay ~ 0.03 per token: A in [-8, -4], dt_bias = U - 1",
                 neg_A=(4.0, 8.0), dt_bias=(-1.0, 1.0)),
    Distribution("large-delta", "raw dt = 6 N(0,1) + 4 + 4U: Delta up to ~30 (softplus identity branch)",
                 dt_bias=(4.0, 4.0), dt_scale=6.0),
    Distribution("heavy-tailed", "mild gates, Student-t(2) activations (infinite variance)", act_law="t2"),
    Distribution("near-fp16-limit", "mild gates, value inputs N(0,1) * 4096 (outputs near fp16's 65504)",
                 value_scale=4096.0),
)}

# Stable stream ids (crc32 of a name: never Python's salted hash).
def _stream(name: str) -> int:
    return zlib.crc32(name.encode())


# ---- host-side key digest -------------------------------------------------------------------------
def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def key_of(*words: int) -> int:
    """A 64-bit key from integer words (negative words allowed), order-sensitive."""
    h = 0x2545F4914F6CDD1D
    for w in words:
        h = _splitmix64(h ^ (int(w) & _M64))
    return h


def _splitmix64_np(x: np.ndarray) -> np.ndarray:
    """:func:`_splitmix64` of every element of a uint64 array (NumPy's uint64 arithmetic wraps mod 2^64,
    as the host version's masks do)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def keys_of_steps(prefix: tuple[int, ...], steps: list[int]) -> np.ndarray:
    """``key_of(*prefix, s)`` for every step ``s`` (uint64 array): the prefix hashed once, the last
    word's round vectorised."""
    h = 0x2545F4914F6CDD1D
    for w in prefix:
        h = _splitmix64(h ^ (int(w) & _M64))
    return _splitmix64_np(np.asarray(steps, dtype=np.int64).astype(np.uint64) ^ np.uint64(h))


def _key_words(keys) -> torch.Tensor:
    """The three 32-bit words each key feeds the counter hash's rounds: int64 ``[len(keys), 3]`` (``keys``:
    ints or a uint64 array)."""
    k = np.asarray(keys, dtype=np.uint64)
    m32 = np.uint64(_M32)
    return torch.from_numpy(np.stack([k & m32, k >> np.uint64(32), _splitmix64_np(k) & m32], 1).astype(np.int64))


# ---- device-side counter hash (exact integer ops in int64) ------------------------------------------
def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for x in [0, 2^32), without int64 overflow (16-bit halves of c)."""
    lo = x * (c & 0xFFFF)
    hi = ((x * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & _M32


def _lowbias32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def random_bits(key: int, n: int, device) -> torch.Tensor:
    """``n`` 32-bit random words (int64 tensor) for counter values 0..n-1 under ``key``."""
    i = torch.arange(n, dtype=torch.int64, device=device)
    k1, k2, k3 = key & _M32, (key >> 32) & _M32, _splitmix64(key) & _M32
    h = _lowbias32((i & _M32) ^ k1)
    h = _lowbias32(h ^ k2 ^ (i >> 32))
    return _lowbias32(h ^ k3)


# ---- quantile tables --------------------------------------------------------------------------------
def _grid(v: float) -> float:
    return round(v / _GRID) * _GRID


@cache
def _host_table(law: str) -> tuple[torch.Tensor, torch.Tensor]:
    ps = [(j + 0.5) / TABLE_SIZE for j in range(TABLE_SIZE)]
    if law == "normal":
        nd = statistics.NormalDist()
        q = [_grid(nd.inv_cdf(p)) for p in ps]
    elif law == "t2":
        q = [_grid((2.0 * p - 1.0) / (2.0 * p * (1.0 - p)) ** 0.5) for p in ps]
    else:
        raise ValueError(f"law: expected 'normal' or 't2', got {law!r}")
    t = torch.tensor(q, dtype=torch.float64)
    diff = torch.cat([t[1:] - t[:-1], torch.zeros(1, dtype=torch.float64)])
    return t, diff


_DEVICE_TABLES: dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor]] = {}


def _table(law: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    k = (law, str(device))
    if k not in _DEVICE_TABLES:
        t, d = _host_table(law)
        _DEVICE_TABLES[k] = (t.to(device), d.to(device))
    return _DEVICE_TABLES[k]


def table_digest() -> str:
    """sha256 of both quantile tables (tests pin it: a change would change every input)."""
    h = hashlib.sha256()
    for law in ("normal", "t2"):
        h.update(_host_table(law)[0].numpy().tobytes())
    return h.hexdigest()


def _apply_law(law: str, bits: torch.Tensor) -> torch.Tensor:
    """fp64 values of ``law`` from 32-bit words (see the module docstring)."""
    if law == "uniform":
        return torch.mul(bits.to(torch.float64), 2.0**-32)
    table, diff = _table(law, bits.device)
    j = bits >> TABLE_BITS
    f = torch.mul((bits & 0xFFFF).to(torch.float64), 2.0**-TABLE_BITS)
    return torch.add(table[j], torch.mul(f, diff[j]))


def sample(law: str, key: int, shape: tuple[int, ...], device="cpu") -> torch.Tensor:
    """fp64 samples of ``law`` (``normal``, ``t2`` or ``uniform`` on [0, 1)) under ``key``."""
    device = torch.device(device)
    n = 1
    for s in shape:
        n *= int(s)
    return _apply_law(law, random_bits(key, n, device)).reshape(shape)


_SEGMENTS: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def random_bits_batched(keys: list[int], counts: list[int], device) -> list[torch.Tensor]:
    """``random_bits(keys[i], counts[i])`` for every i, bit-identical, in one pass (few kernel
    launches: what makes per-step generation on a GPU cheap)."""
    return list(_random_bits_flat(keys, counts, device).split(counts))


def _random_bits_flat(keys: list[int], counts: list[int], device) -> torch.Tensor:
    """The words of :func:`random_bits_batched`, concatenated in order."""
    device = torch.device(device)
    ck = (tuple(counts), str(device))
    if ck not in _SEGMENTS:
        i = torch.cat([torch.arange(c, dtype=torch.int64) for c in counts])
        seg = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
        _SEGMENTS[ck] = (i.to(device), seg.to(device))
    i, seg = _SEGMENTS[ck]
    k = _key_words(keys).to(device)[seg]
    h = _lowbias32((i & _M32) ^ k[:, 0])
    h = _lowbias32(h ^ k[:, 1] ^ (i >> 32))
    return _lowbias32(h ^ k[:, 2])


# ---- scenario-level generators --------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class ScenarioInputs:
    """A scenario's input generator with its names resolved once: ``sc`` (the JSON value: seed, rows,
    window, distribution, initial state), the family object, the precision mode, the geometry, the
    distribution and every input's ``(law, scale)``.  Built by :func:`inputs_of` (from the objects the
    engine resolved at its door, or from the scenario's names once); the generators below read these
    fields at every step and look no name up again."""

    sc: Any
    family: Family
    mode: PrecisionMode
    geometry: Geometry
    dist: Distribution
    input_shapes: dict[str, tuple[int, ...]]
    laws: dict[str, tuple[str, float]]

    def replace(self, **changes) -> ScenarioInputs:
        """The generator of ``sc.replace(**changes)`` (fields that keep family, mode and geometry: rows,
        slots, seed, initial state ...), the resolved objects kept."""
        if {"family", "mode", "geometry"} & set(changes):
            raise ValueError(f"changes: family, mode and geometry are resolved; got {sorted(changes)}")
        return inputs_of(self.sc.replace(**changes), self.family, self.mode, self.geometry)


def _value_law(fam: Family, d: Distribution, name: str) -> tuple[str, float]:
    """The law of input ``name``'s values (``normal``, ``t2`` or ``uniform``) and their scale."""
    law = fam.input_law(name)
    if law == "gate":
        return "normal", d.dt_scale
    if law == "normal":
        return "normal", 1.0
    return d.act_law, d.value_scale if law == "value" else 1.0


def inputs_of(sc, fam: Family | None = None, mode: PrecisionMode | None = None,
              geometry: Geometry | None = None) -> ScenarioInputs:
    """The input generator of scenario ``sc`` (a :class:`ScenarioInputs` is returned as it is): the
    family, mode and geometry objects given, or looked up from ``sc``'s names here, once."""
    if isinstance(sc, ScenarioInputs):
        return sc
    fam = family(sc.family) if fam is None else fam
    mode = parse_mode(sc.mode) if mode is None else mode
    geometry = sc.geometry_obj if geometry is None else geometry
    d = DISTRIBUTIONS[sc.distribution]
    shapes = geometry.input_shapes()
    return ScenarioInputs(sc, fam, mode, geometry, d, shapes, {n: _value_law(fam, d, n) for n in shapes})


def make_params(sc, device="cpu") -> dict[str, torch.Tensor]:
    """The layer parameters (fp32) of ``sc`` (a scenario or its :class:`ScenarioInputs`;
    ``A``/``dt_bias``/``D`` or ``A_log``/``dt_bias``)."""
    g = inputs_of(sc)
    shapes = g.geometry.param_shapes()

    def u(name):
        return sample("uniform", key_of(g.sc.seed, _stream("param:" + name)), shapes[name], device)

    out = g.family.make_params(u, g.dist)
    return {k: v.to(torch.float32) for k, v in out.items()}


PREFILL_TOKENS = 8  # prompt length of ``initial_state = "prefill"``


def make_initial_state(sc, generation: int = 0, device="cpu") -> torch.Tensor:
    """fp64 ``[rows, *state_shape]`` (``initial_state``): zeros; N(0,1)/2 rounded to fp32; or
    ``prefill``: the prefill -> decode hand-off, the state after an fp64 token-by-token prefill
    (the family's reference recurrence, docs/recurrences.md section 1) of a ``PREFILL_TOKENS`` prompt from zeros, handed
    over in fp32 (what a prefill kernel writes).  ``generation`` > 0 gives the states of later
    resets (slot reuse: each re-admitted request has its own prompt).  ``sc``: a scenario or its
    :class:`ScenarioInputs`."""
    g = inputs_of(sc)
    shape = (g.sc.rows, *g.geometry.state_shape)
    if g.sc.initial_state == "zeros":
        return torch.zeros(shape, dtype=torch.float64, device=device)
    if g.sc.initial_state == "prefill":
        return prefill_state(g, generation, device).to(torch.float32).to(torch.float64)
    x = sample("normal", key_of(g.sc.seed, _stream("initial_state"), generation), shape, device)
    return torch.mul(x, 0.5).to(torch.float32).to(torch.float64)


def prefill_state(sc, generation: int = 0, device="cpu") -> torch.Tensor:
    """fp64 ``[rows, *state_shape]``: the reference recurrence over the prompt of ``generation``
    (``PREFILL_TOKENS`` tokens of the scenario's input law, stream ``prompt``) from zeros."""
    g = inputs_of(sc)
    params = {k: v.to(device=device, dtype=torch.float64) for k, v in make_params(g, device).items()}
    prompt = make_inputs(g, generation, device, stream="prompt", tokens=PREFILL_TOKENS)
    st = torch.zeros((g.sc.rows, *g.geometry.state_shape), dtype=torch.float64, device=device)
    for t in range(PREFILL_TOKENS):
        _, st = g.family.reference_step(st, {n: v[:, t].to(torch.float64) for n, v in prompt.items()}, params)
    return st


def make_inputs(sc, step: int, device="cpu", *, stream: str = "inputs", tokens: int | None = None
                ) -> dict[str, torch.Tensor]:
    """Window inputs of ``step``: each ``[rows, T', *shape]`` (``tokens`` instead of T' when
    given) in the mode's activation dtype.  ``sc``: a scenario or its :class:`ScenarioInputs` (which
    a caller making inputs at every step passes: nothing is looked up)."""
    g = inputs_of(sc)
    act = g.mode.act_dtype
    T = g.sc.window if tokens is None else tokens
    shapes = {name: (g.sc.rows, T, *shape) for name, shape in g.input_shapes.items()}
    counts = [math.prod(s) for s in shapes.values()]
    keys = [key_of(g.sc.seed, _stream(f"{stream}:{name}"), step) for name in shapes]
    if fused_on(device):
        return {name: _fused_values(g, name, [key], count, device).to(act).reshape(full)
                for (name, full), key, count in zip(shapes.items(), keys, counts)}
    return {name: _input_values(g, name, bits).to(act).reshape(full)
            for (name, full), bits in zip(shapes.items(), random_bits_batched(keys, counts, device))}


def _input_values(g: ScenarioInputs, name: str, bits: torch.Tensor) -> torch.Tensor:
    """fp64 values of input ``name`` from its words (elementwise: any batching gives the same bits;
    a product by 1 is exact, so it is skipped)."""
    law, scale = g.laws[name]
    x = _apply_law(law, bits)
    return torch.mul(x, scale) if scale != 1.0 else x


FUSED_DEVICE_TYPES = {"cuda"}  # where the inputs come from one Triton launch per name (the same bits)


def fused_on(device) -> bool:
    """Whether inputs on ``device`` are generated by ``replayssm/ops/triton/counter_inputs.py``."""
    return torch.device(device).type in FUSED_DEVICE_TYPES


def _fused_values(g: ScenarioInputs, name: str, keys: list[int], count: int, device) -> torch.Tensor:
    """:func:`_input_values` of ``count`` words under each of ``keys`` (concatenated), in one launch."""
    device = torch.device(device)
    law, scale = g.laws[name]
    table = None if law == "uniform" else _table(law, device)
    words = _key_words(keys)
    if device.type == "cuda":  # pinned and asynchronous: a pageable copy would wait for the device
        words = words.pin_memory().to(device, non_blocking=True)
    else:
        words = words.to(device)
    return counter_values(words, count, table, scale)


def make_inputs_steps(sc, steps: list[int], device="cpu", *, stream: str = "inputs") -> dict[str, torch.Tensor]:
    """:func:`make_inputs` of several steps in one pass: each ``[len(steps), rows, T', *shape]``,
    bit-identical to stacking ``make_inputs(sc, s)`` over ``steps`` (the same words; only exact
    integer ops, a gather and elementwise IEEE ops touch them)."""
    g = inputs_of(sc)
    act = g.mode.act_dtype
    shapes = {name: (g.sc.rows, g.sc.window, *shape) for name, shape in g.input_shapes.items()}
    keys = np.concatenate([keys_of_steps((g.sc.seed, _stream(f"{stream}:{name}")), steps) for name in shapes])
    if fused_on(device):
        n = len(steps)
        return {name: _fused_values(g, name, keys[i * n:(i + 1) * n], math.prod(full), device).to(act)
                .reshape(n, *full) for i, (name, full) in enumerate(shapes.items())}
    counts = [math.prod(full) for full in shapes.values() for _ in steps]
    words = _random_bits_flat(keys, counts, device).split([c * len(steps) for c in counts[::len(steps)]])
    return {name: _input_values(g, name, bits).to(act).reshape(len(steps), *full)
            for (name, full), bits in zip(shapes.items(), words)}


def inputs_digest(sc, steps: int = 4) -> str:
    """sha256 over the params, initial state and first ``steps`` inputs of ``sc`` (CPU)."""
    h = hashlib.sha256()
    g = inputs_of(sc)
    tensors = [*make_params(g).values(), make_initial_state(g)]
    for s in range(steps):
        tensors += list(make_inputs(g, s).values())
    for t in tensors:
        t = t.contiguous()
        h.update(str(t.dtype).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes())
    return h.hexdigest()


__all__ = ["DISTRIBUTIONS", "FUSED_DEVICE_TYPES", "PREFILL_TOKENS", "Distribution", "ScenarioInputs", "fused_on",
           "inputs_digest", "inputs_of", "key_of", "make_initial_state", "make_inputs", "make_inputs_steps",
           "make_params", "prefill_state", "random_bits", "random_bits_batched", "sample", "table_digest"]
