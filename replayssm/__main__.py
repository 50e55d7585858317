"""``python -m replayssm``: the same command as ``replayssm``."""

from replayssm.cli import main

raise SystemExit(main())
