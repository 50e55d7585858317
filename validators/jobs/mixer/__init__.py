"""The jobs at the mixer level (``--level mixer``): the fuzzer (``fuzz.py``), the long drift run
(``drift.py``), the step's time against its bytes (``bench.py``) and their command lines (``cli.py``),
each over a mixer kernel (``replayssm/mixer/``) judged by ``validators/engine/mixer/``.  docs/mixer.md."""
