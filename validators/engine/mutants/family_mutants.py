"""Each family's own broken kernels (``Family.mutants``), registered like every other mutant.

Oracle: none here; each :class:`replayssm.families.FamilyMutant` names its mixin (one deliberate bug
in the family's own arithmetic, written beside the family in ``replayssm/ops/<family>/``) and how to
register it; this module registers it on that family's literal model only, so the registry, the
gallery and the fuzzer see it like the shared mutants, and adding one touches the family's folder only.
"""

from __future__ import annotations

from replayssm.families import families
from replayssm.validators.engine.mutants.registry import register_mutant

for _fam in families().values():
    for _m in _fam.mutants:
        register_mutant(_m.mixin, _m.name, _m.description, klass=_m.klass, families=(_fam.name,), base=_m.base,
                        decodes=_m.decodes, gallery=_m.gallery)

__all__: list[str] = []
