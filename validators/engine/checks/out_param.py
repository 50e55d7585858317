"""Check ``out-param``: verify writes into the ``out=`` buffer it was given.

Oracle: docs/kernel_interface.md: ``verify(slot_ids, inputs, out=buf)`` fills ``buf`` and
returns it or None; a different tensor means the caller's buffer was never written.
"""

from __future__ import annotations

from replayssm.validators.engine.checks.registry import BOTH, register_check


@register_check("out-param", hooks="verify-returned", schedule="every-step", kinds=BOTH,
                catches="verify returned a new tensor instead of writing into the out= buffer it was given",
                mutant="mutant-out-param-copy")
def out_param(ctx) -> None:
    if ctx.returned is not ctx.out_given and ctx.returned is not None:
        ctx.fail("out-param", "verify returned a new tensor instead of writing into out=")


__all__ = ["out_param"]
