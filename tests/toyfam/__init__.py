"""A test family (issue 12's proof of the family protocol): decaying linear attention,
``S <- exp(g) S + v k^T``, ``o = S q``, with a scalar log-decay ``g = -exp(A_log) softplus(a + dt_bias)``
per head.  One folder (this one: naive.py, literal.py, family.py) and one registration line
(importing this package, which ``family.py`` registers) give it every job: validate, fuzz, drift,
bench and the CLI (tests/core/test_family_protocol.py)."""

from toyfam import family, literal, naive  # noqa: F401
