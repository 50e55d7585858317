"""The causal conv1d of a hybrid mixer: the fp64 step (``naive.py``), the four declared designs of
its speculative state (``policies.py``: how the validator reads a committed window out of a
kernel's raw storage), their literal models (``literal.py``) and the broken ones of the field
reports (``mutants.py``).  docs/mixer.md describes them."""
