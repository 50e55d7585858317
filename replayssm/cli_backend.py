"""The ``--backend`` flags of ``replayssm fuzz`` and ``replayssm bench`` (docs/scaleout.md): ``local``
(this process, the default) or ``ray`` (one Ray task per unit of work,
:mod:`replayssm.validators.jobs.scaleout.ray_jobs`).  Ray is an optional extra (``replayssm[ray]``):
without it ``--backend ray`` is one line and exit 3, before any work."""

from __future__ import annotations

from replayssm.guard import EnvironmentProblem, float_in
from replayssm.validators.jobs.scaleout.ray_backend import require_ray


def add_backend_arguments(p, unit: str) -> None:
    """``--backend``, ``--ray-address`` and ``--gpus-per-task`` (fuzz and bench; docs/scaleout.md)."""
    p.add_argument("--backend", choices=("local", "ray"), default="local",
                   help=f"local: this process; ray: one Ray task per {unit} on a Ray cluster, pulled longest first "
                        "(pip install 'replayssm[ray]'; docs/scaleout.md)")
    p.add_argument("--ray-address", default=None, metavar="ADDRESS",
                   help="the Ray cluster to join (--backend ray; default: RAY_ADDRESS, else a local cluster)")
    p.add_argument("--gpus-per-task", type=float_in(0, 1, hi_open=False, what="a fraction of a GPU"), default=None,
                   metavar="X",
                   help=f"GPUs one Ray task ({unit}) takes, 0 < x <= 1: a fraction packs several on a card, which "
                        "time-slice it (--backend ray; default 1)")


def check_backend(args) -> None:
    """The backend flags, refused before any work: the Ray flags only with ``--backend ray``, which
    without Ray installed is one line (exit 3)."""
    if args.backend != "ray":
        for flag, v in (("--ray-address", args.ray_address), ("--gpus-per-task", args.gpus_per_task)):
            if v is not None:
                raise ValueError(f"{flag}: only with --backend ray")
        return
    try:
        require_ray()
    except ImportError as e:
        raise EnvironmentProblem(str(e)) from None


__all__ = ["add_backend_arguments", "check_backend"]
