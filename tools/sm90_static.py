"""Static counts of the GDN speculative stream kernel compiled for sm_90a without a GPU: registers,
spill stores, SASS instructions, shuffles, FMAs (the table in docs/benchmarks.md, issue 17).

Method: ``triton.compile`` of ``replayssm.ops.gdn.replay_split._gdn_stream_kernel`` for
``GPUTarget("cuda", 90, 32)`` at qwen35-4b, T' = 4, B = 16 (ring 32), fp32 state, bf16 activations;
the PTX is assembled by the ptxas that Triton bundles (``-v`` prints registers and spills) and
disassembled by its cuobjdump.  A newer Triton may emit a PTX ISA version its bundled ptxas does
not accept: ``--ptx-version`` rewrites the header (the kernels use no newer instruction).  Counts are
static (the loop over value blocks is not unrolled: per tile, not per program).

    python tools/sm90_static.py [--ptx-version 8.7]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import subprocess
import tempfile

os.environ["TRITON_INTERPRET"] = "0"  # before replayssm: compile, do not interpret

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from replayssm.ops.gdn import replay_split  # noqa: E402

BIN = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
SIG = {"slot_ptr": "*i64", "v_ptr": "*bf16", "out_ptr": "*bf16",
       "ckpt_ptr": "*fp32", "sc_ptr": "*fp32", "d_rec_ptr": "*bf16", "k_rec_ptr": "*bf16", "coef_ptr": "*fp32",
       "meta_ptr": "*i64", "qk_ptr": "*fp32", "seed": "i64", "num_slots": "i32"}


def stream_counts(rdot: bool, bv: int, warps: int, ptx_version: str | None, kc: int = 1) -> dict:
    lay = replay_split.coef_layout(16, 4)
    const = dict(H=16, HV=32, K=128, V=128, T=4, RING=32, SPEC=True, SCALE=128 ** -0.5, BK=128, BV=bv, JB=16, TP=4,
                 SCALED=False, SR=False, INTERPRET=False, KC=kc, DOT="ieee", RDOT=rdot, NSP=0, FU=4, NVT=128 // bv,
                 NCOEF=lay["NCOEF"], **{f"O_{k}": v for k, v in lay.items() if k != "NCOEF"})
    kern = replay_split._gdn_stream_kernel
    # the JIT marks 16-byte-aligned pointers (every torch allocation) divisible by 16; without it the
    # loads are not vectorised and the layouts differ from the GPU's
    attrs = {(kern.arg_names.index(n),): [["tt.divisibility", 16]] for n, t in SIG.items() if t.startswith("*")}
    src = ASTSource(kern, {**SIG, **dict.fromkeys(const, "constexpr")}, constexprs=const, attrs=attrs)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}).asm["ptx"]
    if ptx_version:
        ptx = re.sub(r"^\.version \S+", f".version {ptx_version}", ptx, count=1, flags=re.M)
    with tempfile.TemporaryDirectory() as d:
        (pathlib.Path(d) / "k.ptx").write_text(ptx)
        log = subprocess.run([str(BIN / "ptxas"), "-arch=sm_90a", "-v", f"{d}/k.ptx", "-o", f"{d}/k.cubin"],
                             capture_output=True, text=True)
        if log.returncode:
            raise SystemExit(f"ptxas failed (try --ptx-version): {log.stderr.strip().splitlines()[0]}")
        sass = subprocess.run([str(BIN / "cuobjdump"), "-sass", f"{d}/k.cubin"], capture_output=True, text=True).stdout
    spill = re.search(r"(\d+) bytes spill stores", log.stderr)
    return {"readout": "dot" if rdot else "reduce", "value_rows": bv, "warps": warps, "kchunks": kc,
            "registers": int(re.search(r"Used (\d+) registers", log.stderr).group(1)),
            "spill_bytes": int(spill.group(1)) if spill else 0,
            "sass": sum(1 for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", line)),
            "SHFL": sass.count("SHFL"), "FFMA": sass.count("FFMA")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ptx-version", default=None, help="rewrite the PTX ISA version (e.g. 8.7)")
    args = ap.parse_args()
    for rdot, bv, warps, kc in ((False, 8, 1, 1), (True, 8, 1, 1), (False, 8, 1, 8), (False, 16, 1, 8),
                                (False, 16, 2, 8), (False, 32, 2, 8), (False, 32, 4, 8)):
        print(stream_counts(rdot, bv, warps, args.ptx_version, kc))


if __name__ == "__main__":
    main()
