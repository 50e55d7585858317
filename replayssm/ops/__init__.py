"""Op families.  Importing this package registers every built-in kernel."""

from replayssm.ops import gdn, mamba2  # noqa: F401
