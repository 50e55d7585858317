"""A mixer scenario: family, geometry preset, precision mode, step plan (slots, accepted counts,
resets) and seed; what the mixer fuzzer draws, saves as a failure artifact and ``replayssm validate
--level mixer --scenario FILE`` replays.

Oracle: :func:`runner.validate_mixer` (the fp64 whole-step reference, the literal mixer's tolerance
rule, the conv window bit for bit); this module only describes a run and says whether a kernel can
take it (:func:`mixer_reason`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from replayssm.mixer.kernel import ComposedMixer, MixerKernel, mixer_kernel
from replayssm.mixer.spec import MixerGeometry, mixer_preset
from replayssm.precision import parse_mode
from replayssm.registry import get
from replayssm.validators.engine.mixer.runner import MixerPlan, MixerResult, validate_mixer

ARTIFACT_KIND = "replayssm-mixer-failure"


def mixer_reason(cls: type[MixerKernel], geometry: MixerGeometry, mode, plan: MixerPlan) -> str | None:
    """Why ``cls`` cannot run ``plan`` at ``mode`` (its own reason, or its SSM kernel's), else None."""
    mode = parse_mode(mode)
    reason = cls.unsupported_reason(geometry, mode)
    if reason is None and issubclass(cls, ComposedMixer):
        ssm = get(cls.ssm_kernel, geometry.family)
        reason = ssm.unsupported_reason(mode, plan.decode, {})
    if reason is None and plan.decode.decode not in cls.decodes:
        reason = f"{plan.decode.decode} decode is not one of its decodes {cls.decodes}"
    return reason


@dataclass(frozen=True)
class MixerScenario:
    family: str
    mode: str
    plan: MixerPlan
    seed: int = 0
    geometry: str = "tiny"
    d_conv: int = 4

    @property
    def mixer_geometry(self) -> MixerGeometry:
        return mixer_preset(self.geometry, self.family, self.d_conv)

    def run(self, kernel: type[MixerKernel] | str, device="cpu", max_failures: int = 20) -> MixerResult:
        cls = mixer_kernel(kernel) if isinstance(kernel, str) else kernel
        reason = mixer_reason(cls, self.mixer_geometry, self.mode, self.plan)
        if reason:
            raise ValueError(f"--kernel: {cls.name} does not support this run: {reason}")
        return validate_mixer(cls, self.mixer_geometry, self.mode, self.plan, seed=self.seed, device=device,
                              max_failures=max_failures)

    @property
    def size(self) -> tuple[int, int]:
        """(active rows of the widest step, steps): the size of a reproducer."""
        return max(sum(s >= 0 for s in ids) for ids, _ in self.plan.steps), len(self.plan.steps)

    def to_dict(self) -> dict:
        return {"level": "mixer", "family": self.family, "geometry": self.geometry, "d_conv": self.d_conv,
                "mode": self.mode, "seed": self.seed, "plan": self.plan.to_dict()}

    @classmethod
    def from_dict(cls, d: dict) -> MixerScenario:
        if not isinstance(d, dict) or d.get("level") != "mixer":
            raise ValueError("scenario: expected a mixer scenario (a JSON object with level \"mixer\")")
        try:
            sc = cls(str(d["family"]), str(d["mode"]), MixerPlan.from_dict(d["plan"]), int(d.get("seed", 0)),
                     str(d.get("geometry", "tiny")), int(d.get("d_conv", 4)))
        except KeyError as e:
            raise ValueError(f"scenario: missing field {e}") from None
        sc.mixer_geometry  # noqa: B018  (refuses an unknown family or preset now)
        parse_mode(sc.mode)
        return sc


def save_artifact(folder, sc: MixerScenario, kernel: str, res: MixerResult) -> Path:
    """``<folder>/mixer-<family>-<kernel>.json``: the scenario and its first failure."""
    path = Path(folder) / f"mixer-{sc.family}-{kernel}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    f = res.first_failure
    path.write_text(json.dumps({"kind": ARTIFACT_KIND, "kernel": kernel, "scenario": sc.to_dict(),
                                "failure": None if f is None else vars(f), "verdict": res.verdict()}, indent=1)
                    + "\n")
    return path


def load_scenario(path) -> tuple[MixerScenario, str | None]:
    """A mixer scenario file (an artifact or a bare scenario): the scenario and the kernel it names."""
    try:
        d = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"--scenario: {path} is not a readable JSON file ({type(e).__name__})") from None
    if isinstance(d, dict) and d.get("kind") == ARTIFACT_KIND:
        return MixerScenario.from_dict(d.get("scenario")), d.get("kernel")
    return MixerScenario.from_dict(d), None
