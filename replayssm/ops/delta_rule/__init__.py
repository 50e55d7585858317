"""The delta-rule family base shared by Gated DeltaNet (``ops/gdn``, one gate per value head) and Kimi Delta
Attention (``ops/kda``, one gate per key channel): geometry and family hooks (``family.py``), the fp64 step's
shared parts (``naive.py``), the literal models' bookkeeping (``literal.py``), the calibration variants
(``variants.py``), the mixer (``mixer.py``) and the Triton storage, prologues and kernels
(``triton_base.py``, ``baseline.py``, the one-launch replay kernels ``replay_decode.py`` and ``replay_spec.py``
over the history helpers ``history_head.py`` and ``history_channel.py``), parameterised by ``per_channel_gate``
(a ``PER_CHANNEL_GATE`` constexpr in the kernels, as flash-linear-attention's common fused recurrent kernel
has ``IS_KDA``): the next delta-rule variant is a preset of these.

Oracle and expected error: each module's docstring."""
