"""The Triton precision library (replayssm/ops/triton/rounding.py) against its torch oracle.

Oracle: torch's round-to-nearest-even casts, ``replayssm.rounding.quantize_state`` /
``dequantize_state`` (scaled rows, bit for bit) and the definition of unbiased stochastic
rounding.  Every storage format of ``precision.FORMATS`` that has a Triton dtype is tested, so a
new row is covered as soon as it is added.  Runs through the Triton interpreter on CPU, where the
plain casts are wrong (spec 9): fp32 -> bf16 truncates, fp32 -> fp8 e4m3 drops the carry of a
mantissa round-up into the exponent.  The first test shows both traps are real, so the bit-exact
tests below are not vacuous.
"""

import pytest
import torch
import triton
import triton.language as tl

from replayssm.ops.triton.rounding import (
    INTERPRET,
    TRITON_DTYPES,
    cast_nearest,
    cast_stochastic,
    load_state,
    philox_bits,
    store_state,
    triton_dtype,
)
from replayssm.precision import FORMATS, parse_mode
from replayssm.rounding import dequantize_state, quantize_state

FLOATS = [f for f in FORMATS.values() if f.name in TRITON_DTYPES and f.dtype.is_floating_point]
STOCHASTIC = [f for f in FORMATS.values() if f.name in TRITON_DTYPES and f.stochastic]
SCALED = [f for f in FORMATS.values() if f.name in TRITON_DTYPES and f.scaled]
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


def _ids(fmts):
    return [f.name for f in fmts]


@triton.jit
def _plain_cast_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n)
    tl.store(y_ptr + i, x.to(y_ptr.dtype.element_ty), mask=i < n)


@triton.jit
def _nearest_kernel(x_ptr, y_ptr, n, INTERP: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n)
    tl.store(y_ptr + i, cast_nearest(x, y_ptr.dtype.element_ty, INTERP), mask=i < n)


@triton.jit
def _stochastic_kernel(x_ptr, y_ptr, n, seed, slot, counter, stream_id, INTERP: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n)
    bits = philox_bits(seed, i, slot, counter, stream_id)
    tl.store(y_ptr + i, cast_stochastic(x, bits, y_ptr.dtype.element_ty, INTERP), mask=i < n)


@triton.jit
def _rows_kernel(x_ptr, y_ptr, sc_ptr, back_ptr, seed, ROWS: tl.constexpr, COLS: tl.constexpr,
                 SCALED: tl.constexpr, SR: tl.constexpr, INTERP: tl.constexpr):
    """store_state of a [ROWS, COLS] tile, then load_state of what was stored."""
    r = tl.arange(0, ROWS)
    c = tl.arange(0, COLS)
    offs = r[:, None] * COLS + c[None, :]
    m = (r[:, None] < ROWS) & (c[None, :] < COLS)
    store_state(y_ptr + offs, sc_ptr + r, tl.load(x_ptr + offs), m, r < ROWS, offs, seed, 0, 0, 0, SCALED, SR, INTERP)
    tl.debug_barrier()
    tl.store(back_ptr + offs, load_state(y_ptr + offs, sc_ptr + r, m, r < ROWS, SCALED))


def _values(fmt, n=4096, seed=0):
    """Random magnitudes over 24 binades plus the edge cases (clamped to the format's range)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-12, 12, (n,), generator=g).float())
    edges = torch.tensor([0.0, -0.0, 1.0, -1.0, 1.9961, 0.49, 1e-30, -1e-30, 3.0e-3, 2.0**-10 * 1.5, 2.0**-10 * 2.5,
                          65504.0, 448.0, -448.0, float("inf"), float("-inf"), float("nan")])
    x[: edges.numel()] = edges
    if fmt.scaled:  # a scaled format only ever stores |x| <= qmax (the row scale puts it there)
        x = x.clamp(-fmt.qmax, fmt.qmax)
    return x


# Under the interpreter the kernels run on CPU tensors; on a GPU (TRITON_INTERPRET=0) compiled, on CUDA.
DEV = "cuda" if torch.cuda.is_available() and not INTERPRET else "cpu"


def _run(kernel, x, dtype, block=1024, **kw):
    y = torch.empty(x.shape, dtype=dtype, device=DEV)
    kernel[(triton.cdiv(x.numel(), block),)](x.to(DEV), y, x.numel(), BLOCK=block, **kw)
    return y.cpu()


def _bit_mismatches(a, b):
    a_nan, b_nan = torch.isnan(a.float()), torch.isnan(b.float())
    same = (a.view(_BITS[a.itemsize]) == b.view(_BITS[b.itemsize])) | (a_nan & b_nan)
    return int((~same).sum())


@pytest.mark.skipif(not INTERPRET, reason="the trap is the interpreter's (the GPU casts round to nearest even)")
@pytest.mark.filterwarnings("ignore:invalid value encountered")
@pytest.mark.parametrize("name", ["bf16", "fp8e4m3"])
def test_interpreter_plain_casts_are_wrong(name):
    x = _values(FORMATS[name])
    y = _run(_plain_cast_kernel, x, FORMATS[name].dtype)
    assert _bit_mismatches(y, x.to(FORMATS[name].dtype)) > 10


@pytest.mark.filterwarnings("ignore:invalid value encountered")
@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # fp16 casts of |x| > 65504 give inf, as torch
@pytest.mark.parametrize("fmt", FLOATS, ids=_ids(FLOATS))
def test_cast_nearest_is_torchs_round_to_nearest_even(fmt):
    x = _values(fmt)
    y = _run(_nearest_kernel, x, fmt.dtype, INTERP=INTERPRET)
    assert _bit_mismatches(y, x.to(fmt.dtype)) == 0


def test_cast_nearest_int8_rounds_half_to_even_like_torch():
    q = torch.cat([torch.arange(-127, 127.5, 0.5), torch.linspace(-127, 127, 999)])
    y = _run(_nearest_kernel, q, torch.int8, INTERP=INTERPRET)
    assert torch.equal(y, torch.round(q).to(torch.int8))


def _neighbours(x, fmt):
    """The two representable values around each x (torch only), as fp64."""
    if not fmt.dtype.is_floating_point:
        return torch.floor(x).double(), torch.ceil(x).double()
    near = x.to(fmt.dtype)
    bits = near.view(_BITS[fmt.nbytes]).to(torch.int32)
    nv = near.double()
    up = torch.where(nv.abs() < x.double().abs(), bits + 1, bits - 1)
    other = up.to(_BITS[fmt.nbytes]).view(fmt.dtype).double()
    return torch.minimum(nv, other), torch.maximum(nv, other)


@pytest.mark.parametrize("fmt", STOCHASTIC, ids=_ids(STOCHASTIC))
def test_stochastic_round_picks_a_neighbour_unbiased_and_reproducibly(fmt):
    g = torch.Generator().manual_seed(1)
    base = (torch.randn(64, generator=g) * 3).clamp(-100, 100)
    x = base.repeat_interleave(512)  # 512 draws of each value
    key = dict(seed=7, slot=2, counter=3, stream_id=1, INTERP=INTERPRET)  # "stream" is a launch option
    y = _run(_stochastic_kernel, x, fmt.dtype, **key)
    lo, hi = _neighbours(x, fmt)
    yd = y.double()
    assert bool(((yd == lo) | (yd == hi)).all()), "a stochastically rounded value is not a neighbour"
    gap = (hi - lo).view(64, 512)[:, 0]
    mean_err = (yd - x.double()).view(64, 512).mean(1) / gap
    # unbiased: the mean over 512 draws within 4.5 sigma (sigma <= 0.5 / sqrt(512) ulp)
    assert float(mean_err.abs().max()) < 4.5 * 0.5 / 512 ** 0.5
    part = x[:1024]  # the stream's properties on a slice (the interpreter's cost is per program)
    assert torch.equal(y[:1024], _run(_stochastic_kernel, part, fmt.dtype, **key))
    assert torch.equal(y[:1024], _run(_stochastic_kernel, part, fmt.dtype, block=256, **key)), \
        "the stream must not depend on the launch grid"
    for word in ("seed", "slot", "counter", "stream_id"):
        other = _run(_stochastic_kernel, part, fmt.dtype, **{**key, word: key[word] + 1})
        assert not torch.equal(y[:1024], other), f"another {word} must give another stream"


@pytest.mark.filterwarnings("ignore:invalid value encountered")  # numpy on inf - inf inside the interpreter
@pytest.mark.parametrize("fmt", [f for f in STOCHASTIC if f.dtype.is_floating_point],
                         ids=_ids([f for f in STOCHASTIC if f.dtype.is_floating_point]))
def test_stochastic_round_keeps_exact_and_special_values(fmt):
    x = torch.tensor([0.0, 1.0, -2.0, 0.5, float("inf"), float("-inf"), float("nan")] + [3.0] * 9)
    y = _run(_stochastic_kernel, x, fmt.dtype, seed=1, slot=0, counter=0, stream_id=0, INTERP=INTERPRET).float()
    assert torch.equal(y[:4], x[:4]) and torch.isnan(y[6])
    if not torch.tensor(float("inf")).to(fmt.dtype).float().isinf():  # e4m3fn: saturates, as the oracle
        top = torch.finfo(fmt.dtype).max
        assert y[4] == top and y[5] == -top
    else:
        assert y[4] == float("inf") and y[5] == float("-inf")


def _state(seed=1):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(8, 16, generator=g) * torch.exp(torch.randn(8, 1, generator=g) * 3)
    s[3] = 0.0  # an all-zero row keeps scale 1
    s[5, 7] = 1e-30  # far below the row maximum: flushed to zero
    return s


def _store_rows(s, fmt, sr=False):
    y = torch.empty(s.shape, dtype=fmt.dtype, device=DEV)
    sc = torch.full((s.shape[0],), float("nan"), device=DEV)
    back = torch.empty(s.shape, device=DEV)
    _rows_kernel[(1,)](s.to(DEV), y, sc, back, 5, s.shape[0], s.shape[1], SCALED=fmt.scaled, SR=sr, INTERP=INTERPRET)
    return y.cpu(), sc.cpu(), back.cpu()


@pytest.mark.parametrize("fmt", SCALED, ids=_ids(SCALED))
def test_scaled_rows_match_quantize_state_bit_for_bit(fmt):
    """Per-row scales amax / qmax and the stored values equal ``rounding.quantize_state``; loading
    them back equals ``dequantize_state``."""
    s = _state()
    mode = parse_mode(f"s{fmt.token}a16")
    y, sc, back = _store_rows(s, fmt)
    want, want_sc = quantize_state(s, mode)
    assert torch.equal(sc, want_sc) and float(sc[3]) == 1.0
    assert _bit_mismatches(y, want) == 0
    assert torch.equal(back, dequantize_state(want, want_sc))


@pytest.mark.parametrize("fmt", SCALED, ids=_ids(SCALED))
def test_scaled_rows_stochastic_within_one_step_of_the_row(fmt):
    s = _state(2)
    y, sc, back = _store_rows(s, fmt, sr=True)
    want_sc = quantize_state(s, parse_mode(f"s{fmt.token}a16"))[1]
    assert torch.equal(sc, want_sc)
    rel = (back.double() - s.double()).abs() / s.double().abs().amax(-1, keepdim=True).clamp(min=1e-300)
    assert float(rel.max()) <= 4 * fmt.unit_roundoff  # one step of the row maximum: 2u (int8) / 2u relative (fp8)
    assert float(y.float().abs().max()) <= fmt.qmax


@pytest.mark.parametrize("fmt", [f for f in FLOATS if not f.scaled], ids=_ids([f for f in FLOATS if not f.scaled]))
def test_unscaled_rows_are_plain_nearest_casts(fmt):
    s = _state()
    y, sc, back = _store_rows(s, fmt)
    assert _bit_mismatches(y, s.to(fmt.dtype)) == 0 and torch.isnan(sc).all(), "no scale is written"
    assert torch.equal(back, s.to(fmt.dtype).float())


def test_store_state_refuses_a_scale_flag_that_contradicts_the_format():
    s = _state()
    with pytest.raises(Exception) as err:
        _rows_kernel[(1,)](s.to(DEV), torch.empty(8, 16, dtype=torch.bfloat16, device=DEV), torch.ones(8, device=DEV),
                           torch.empty(8, 16, device=DEV), 0, 8, 16, SCALED=True, SR=False, INTERP=INTERPRET)
    # compiled, Triton wraps the static assertion in a CompilationError naming the source line
    assert "8-bit formats are scaled" in f"{err.value} {err.value.__cause__}"


def test_triton_dtype_of_every_format():
    for f in FORMATS.values():
        if f.triton is None:
            with pytest.raises(ValueError, match="fmt: expected a storage format Triton kernels can store"):
                triton_dtype(f.name)
        else:
            assert triton_dtype(f.name) == triton_dtype(f.dtype) == getattr(tl, f.triton)
    with pytest.raises(ValueError, match="fp12"):
        triton_dtype("fp12")
