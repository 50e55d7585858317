"""The KDA kernels under test, registered on import: the Triton baseline (``baseline.py``,
"triton-baseline") and ReplaySSM (``replay.py``, "triton-replay": ``replay_split.py``,
``replay_spec_split.py`` and the delta rule's one-launch kernels), over the storage of ``triton_base.py``.

Oracle and expected error: each module's docstring (the literal models of ``literal.py`` at the
same precision mode, the fp64 recurrence of ``naive.py``)."""

from replayssm.ops.kda import baseline, replay  # noqa: F401
