"""The mixer level: one decode step of a hybrid layer's mixer, conv1d -> SiLU -> the family's SSM
step -> gated RMSNorm, with the conv state rolled back beside the SSM state (docs/mixer.md).

``spec.py``: the per-family mixer description (registered by ``replayssm/ops/<family>/mixer_naive.py``)
and the mixer geometry; ``kernel.py``: the mixer kernel interface, its literal models and kernels."""
