"""The mixer level's arithmetic envelope (validators/engine/mixer/envelope.py), on CPU at tiny shapes.

Oracles: the fp64 mixer reference with the SSM level's running-error bound of the SSM part mapped
through the gated norm; a finite difference of the norm for the mapping; the default plan's verdicts
(our ``mixer-triton-replay``, an output-only readout, fails the literal rule alone at gdn s32a32 and
passes with the envelope; an SSM kernel whose flush folds in bf16 arithmetic at s32a32 still fails).
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "0" if __import__("torch").cuda.is_available() else "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from replayssm.mixer.kernel import ComposedMixer  # noqa: E402
from replayssm.mixer.spec import mixer_preset  # noqa: E402
from replayssm.ops.conv.literal import STORES  # noqa: E402
from replayssm.validators.engine import mutants  # noqa: E402, F401  (registers the SSM mutants by name)
from replayssm.validators.engine.mixer.envelope import norm_bound  # noqa: E402
from replayssm.validators.engine.mixer.runner import default_plan, validate_mixer  # noqa: E402


@pytest.mark.parametrize("fam", ("mamba2", "gdn", "kda"))
def test_norm_bound_covers_random_perturbations(fam):
    """|norm(y + dy) - norm(y)| <= norm_bound(|dy| <= b per head) for random sign patterns of |dy| = b
    (the worst case of the first-order bound's elementwise form)."""
    g = mixer_preset("tiny", fam)
    spec, gen = g.spec, torch.Generator().manual_seed(1)
    y = torch.randn((3, *g.out_shape), generator=gen, dtype=torch.float64) * 0.05
    z = torch.randn(y.shape, generator=gen, dtype=torch.float64)
    w = torch.rand(spec.norm_weight_shape(g.ssm), generator=gen, dtype=torch.float64) + 0.5
    b = torch.rand((3, g.out_shape[0]), generator=gen, dtype=torch.float64) * 1e-4
    bound = norm_bound(spec, g.ssm, y, z, w, b)
    for _ in range(20):
        sign = torch.randint(0, 2, y.shape, generator=gen).double() * 2 - 1
        dy = sign * b.view(3, -1, *([1] * (y.dim() - 2)))
        diff = (spec.norm(y + dy, z, w, g.ssm) - spec.norm(y, z, w, g.ssm)).flatten(1).abs().amax(-1)
        assert (diff <= bound).all(), (diff, bound)


def _mixer(ssm):
    return type("M_" + ssm.replace("-", "_"), (ComposedMixer,), {
        "name": "mx-" + ssm, "conv_policy": "compact-at-commit", "store": STORES["compact-at-commit"],
        "ssm_kernel": ssm, "description": ssm})


@pytest.mark.slow
def test_envelope_is_what_passes_triton_replay_gdn_s32a32():
    """Without the envelope our mixer-triton-replay fails mixer-output at step 21 (the literal rule alone,
    1.28x); with it the same run passes (rec: docs/mixer.md)."""
    g = mixer_preset("tiny", "gdn")
    plan = default_plan(g.d_conv, steps=22)
    off = validate_mixer("mixer-triton-replay", g, "s32a32", plan, arith_envelope=False, max_failures=1)
    assert not off.passed and off.first_failure.check == "mixer-output", off.verdict()
    on = validate_mixer("mixer-triton-replay", g, "s32a32", plan)
    assert on.passed, on.verdict()


def test_bf16_fold_arithmetic_still_fails():
    """An SSM kernel whose flush folds in bf16 arithmetic (mutant-flush-bf16-arithmetic) at s32a32 is
    worse than the envelope: the mixer level still fails it."""
    g = mixer_preset("tiny", "gdn")
    res = validate_mixer(_mixer("mutant-flush-bf16-arithmetic"), g, "s32a32", default_plan(g.d_conv, steps=8),
                         max_failures=1)
    assert not res.passed, res.verdict()
    assert res.first_failure.check in ("mixer-output", "ssm-state"), res.verdict()
