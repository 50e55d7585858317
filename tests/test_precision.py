"""Precision-mode ids: parse, print, contradictions, unit roundoff."""

import pytest
import torch

from replayssm.precision import STANDARD_MODES, PrecisionMode, parse_mode

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
