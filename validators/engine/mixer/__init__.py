"""The mixer-level validation: a mixer kernel driven through speculative steps beside the fp64
whole-step reference (``runner.py``), its named checks (``checks.py``), the broken mixers of the
field reports (``mutants.py``) and the ``--level mixer`` jobs (``cli.py``).  docs/mixer.md."""
