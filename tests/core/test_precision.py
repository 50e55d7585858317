"""Precision-mode ids: parse, print, contradictions, unit roundoff; the format table they come from."""

import pytest
import torch

from replayssm.precision import (
    ACT_FORMATS,
    FORMATS,
    STANDARD_MODES,
    STATE_FORMATS,
    VALID_FORMS,
    PrecisionMode,
    parse_mode,
    storage_format,
)

EXTRA = ["s32a16-tf32", "s32a32-tf32x3", "sfp8a16-sr7", "si8a16", "si8a16-sr", "s16a16-tf32-sr3", "sfp16afp16"]


@pytest.mark.parametrize("mode_id", list(STANDARD_MODES) + EXTRA)
def test_id_round_trips(mode_id):
    m = parse_mode(mode_id)
    assert m.id == mode_id
    assert parse_mode(m.id) == m


@pytest.mark.parametrize("bad", ["s32", "s8a16", "s32a8", "x32a32", "s32a16-sr", "s64a16", "s32a64",
                                 "s64a64-tf32", "s32a32-sr", "s16a16-fp8", "", "S32A32"])
def test_bad_ids_list_valid_forms(bad):
    with pytest.raises(ValueError, match="Valid forms"):
        parse_mode(bad)


def test_non_string_rejected():
    with pytest.raises(ValueError, match="mode"):
        parse_mode(32)


def test_constructor_validates():
    with pytest.raises(ValueError, match="seed only applies"):
        PrecisionMode(state="bf16", act="bf16", seed=3)
    with pytest.raises(ValueError, match="state='fp12'"):
        PrecisionMode(state="fp12")


@pytest.mark.parametrize("mode_id,u", [
    ("s64a64", 2.0**-53), ("s32a32", 2.0**-24), ("s32a16", 2.0**-8), ("s32afp16", 2.0**-11),
    ("sfp16afp16", 2.0**-11), ("sfp8a16", 2.0**-4), ("s32a32-tf32", 2.0**-11), ("si8a16", 2.0**-8),
])
def test_unit_roundoff(mode_id, u):
    assert parse_mode(mode_id).unit_roundoff == pytest.approx(u, rel=0.02)


def test_dtypes_and_bytes():
    m = parse_mode("sfp8a16-sr5")
    assert m.state_dtype == torch.float8_e4m3fn and m.act_dtype == torch.bfloat16
    assert m.compute_dtype == torch.float32 and m.rounding == "stochastic" and m.seed == 5
    assert m.state_bytes_per_element(row_len=128) == pytest.approx(1 + 4 / 128)
    assert parse_mode("s64a64").compute_dtype == torch.float64
    with pytest.raises(ValueError, match="row_len"):
        m.state_bytes_per_element()


@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS.keys())
def test_every_format_row_makes_mode_ids(fmt):
    """Each row's token parses in its roles, with the row's dtype, roundoff, bytes and scaling."""
    assert fmt.help in VALID_FORMS and storage_format(fmt.name) is fmt
    if fmt.name == "fp64":
        return  # fp64 goes only with fp64 (s64a64, tested above)
    if "state" in fmt.roles:
        m = parse_mode(f"s{fmt.token}a16")
        assert (m.state, m.state_dtype, m.state_unit_roundoff, m.scaled_state) == \
            (fmt.name, fmt.dtype, fmt.unit_roundoff, fmt.scaled)
        assert m.state_bytes_per_element(row_len=64) == fmt.nbytes + (4 / 64 if fmt.scaled else 0)
        if fmt.stochastic:
            assert parse_mode(f"s{fmt.token}a16-sr3").id == f"s{fmt.token}a16-sr3"
        else:
            with pytest.raises(ValueError, match="stochastic rounding needs"):
                parse_mode(f"s{fmt.token}a16-sr")
    if "act" in fmt.roles:
        m = parse_mode(f"s32a{fmt.token}")
        assert (m.act, m.act_dtype, m.act_bytes_per_element) == (fmt.name, fmt.dtype, fmt.nbytes)


def test_format_table_is_consistent():
    """Tokens are unique per role; exactly the 1-byte formats are row-scaled (the Triton library
    derives a kernel's scaling from its 8-bit storage dtype); a scaled row has qmax and block."""
    for group in (STATE_FORMATS, ACT_FORMATS):
        tokens = [f.token for f in group.values()]
        assert len(set(tokens)) == len(tokens)
    for f in FORMATS.values():
        assert f.scaled == (f.nbytes == 1) == (f.scale_block == "row")
        assert f.dtype.itemsize == f.nbytes and set(f.roles) <= {"state", "act"}
    with pytest.raises(ValueError, match="format: expected one of"):
        storage_format("fp12")
