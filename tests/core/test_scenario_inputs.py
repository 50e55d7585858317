"""A scenario's input generator resolves its names once (scenarios/inputs.py ``inputs_of``, issue 49 item 2).

Oracle: the bytes a scenario generates (params, initial states of two generations, per-step window
inputs, another stream with another length, a chunk of steps) equal digests pinned at 0ef8a02, the
code before the generator took resolved objects: through a raw :class:`Scenario` and through a
:class:`ScenarioInputs` built from family, mode and geometry objects (as the engine's resolver does).
The module's source looks a name up (``family(...)``, ``parse_mode(...)``, ``.precision``,
``.geometry_obj``) only in ``inputs_of``; ``ScenarioInputs.replace`` refuses a change of a resolved
field with ``ValueError`` naming ``changes``.
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

import pytest
import torch

from replayssm.families import family
from replayssm.precision import parse_mode
from replayssm.scenarios import Scenario
from replayssm.scenarios import inputs as I

pytestmark = pytest.mark.usefixtures("one_thread")

# (family, mode, distribution, initial_state) -> sha256 of everything() at seed 7; pinned at 0ef8a02 (CPU).
PINNED = {
    ("mamba2", "s32a16", "mild", "random"): "384a0b93dd913aaca88fd05eb369106eb0b83d94f68af6ac03a2dc5389542bd6",
    ("mamba2", "s16a16-sr3", "heavy-tailed", "prefill"):
        "7f636719b431c6752570d83278d5c83bd879c459809a707f32b5da39f772d6ed",
    ("mamba2", "sfp16a16", "near-fp16-limit", "zeros"):
        "985dc6542267f66ad8bc405490d87fcc2bd1992a3895002cb23f91bba381bf3d",
    ("gdn", "s16a16-sr3", "heavy-tailed", "prefill"):
        "64783741b2a79b6f4f052e6821a850e59bd7bc81548dc3168578e117069a6b39",
    ("gdn", "s32a32", "large-delta", "prefill"): "a247580200fa32ebb76de82eb65f1643a8482629cc1ba8f03242e4926bb3a4dc",
    ("kda", "s32a16", "mild", "random"): "49e3b941c403cdb79a6c101b2d257a887a0089ad66b9d00983a7052aac644339",
    ("kda", "sfp16a16", "near-fp16-limit", "zeros"): "2067383d9854cfc06e906c5fc53dc3c5d499f8bc6656b4cf77f4dae3066a18b6",
    ("kda", "s32a32", "large-delta", "prefill"): "4d0dc3f9f66f2221d993dece113e6cea151388a270e8de9083fe3b9686ce77bc",
}


def everything(sc) -> str:
    ts = [*I.make_params(sc).values(), I.make_initial_state(sc, 0), I.make_initial_state(sc, 3)]
    for s in range(3):
        ts += list(I.make_inputs(sc, s).values())
    ts += list(I.make_inputs(sc, 1, stream="canary", tokens=2).values())
    ts += list(I.make_inputs_steps(sc, [0, 2, 5]).values())
    h = hashlib.sha256()
    for t in ts:
        t = t.contiguous()
        h.update(str(t.dtype).encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _scenario(fam, mode, dist, init) -> Scenario:
    return Scenario.tiny(fam, "speculative", mode=mode, steps=4).replace(distribution=dist, initial_state=init, seed=7)


@pytest.mark.parametrize("case", sorted(PINNED), ids=lambda c: "-".join(c))
def test_inputs_are_the_pinned_bytes_through_names_and_through_objects(case):
    sc = _scenario(*case)
    gen = I.inputs_of(sc, family(sc.family), parse_mode(sc.mode), sc.geometry_obj)
    assert everything(sc) == everything(gen) == PINNED[case]


def test_only_inputs_of_looks_a_name_up():
    tree = ast.parse(Path(I.__file__).read_text())
    found = []
    for top in tree.body:
        if isinstance(top, (ast.FunctionDef, ast.ClassDef)) and top.name != "inputs_of":
            for n in ast.walk(top):
                f = n.func if isinstance(n, ast.Call) else None
                name = getattr(f, "id", None) or getattr(f, "attr", None)
                if name in ("family", "parse_mode"):
                    found.append(f"{n.lineno}: {name}(...)")
                elif isinstance(n, ast.Attribute) and n.attr in ("precision", "geometry_obj"):
                    found.append(f"{n.lineno}: .{n.attr}")
    assert not found, "scenarios/inputs.py looks a name up outside inputs_of:\n" + "\n".join(found)


def test_replace_keeps_the_resolved_objects_and_refuses_to_change_them():
    sc = _scenario("gdn", "s16a16-sr3", "mild", "random")
    gen = I.inputs_of(sc)
    assert I.inputs_of(gen) is gen
    other = gen.replace(rows=2, slot_ids=(3, 4), origins=None, seed=9)
    assert other.family is gen.family and other.mode is gen.mode and other.geometry is gen.geometry
    assert other.sc == sc.replace(rows=2, slot_ids=(3, 4), origins=None, seed=9)
    for change in ({"mode": "s32a32"}, {"family": "mamba2"}, {"geometry": "tiny"}):
        with pytest.raises(ValueError, match="^changes: "):
            gen.replace(**change)
