"""Op families, one folder each (``naive.py`` the fp64 reference, ``literal.py`` the literal models,
``family.py`` the registration, the kernels under test beside them); the shared literal bookkeeping
(``literal.py``).  The built-in families are listed in ``replayssm.families.BUILTIN_FAMILIES``."""
