"""Static counts of Triton kernels compiled for sm_90a without a GPU: registers, spill stores, SASS
instructions and the instructions that tell where a kernel binds (shuffles, shared-memory loads and
stores, barriers, special-function ops, FMAs).

Method: ``triton.compile`` for ``GPUTarget("cuda", 90, 32)`` with the JIT's 16-byte pointer
divisibility (every torch allocation; without it loads are not vectorised and the layouts differ
from the GPU's); the PTX is assembled by the ptxas that Triton bundles (``-v`` prints registers and
spills) and disassembled by its cuobjdump.  A newer Triton may emit a PTX ISA version its bundled
ptxas does not accept: ``--ptx-version`` rewrites the header (the kernels use no newer instruction).
Counts are static (a loop body counts once: per trip, not per program); the device runs another
Triton (3.6), so counts may differ there.

Kernels (benchmark geometries: GDN qwen35-4b, KDA kimi-linear-48b; fp32 state, bf16 activations):

* ``gdn-spec-stream`` (default): the GDN speculative stream (T' = 4, B = 16) in the layouts of the
  table in docs/benchmarks.md (issue 17);
* ``kda-coef``: the KDA standard-decode pre-pass (L = 16) on ``--warps`` warps (issue 19: its
  ``[history, K]`` tiles were L1-bound, docs/benchmarks.md "Kimi Delta Attention");
* ``kda-decode``: the KDA one-launch standard decode, a whole value head per program.

    python tools/sm90_static.py [KERNEL] [--warps N] [--ptx-version 8.7]
"""

from __future__ import annotations

import argparse
import collections
import os
import pathlib
import re
import subprocess
import tempfile

os.environ["TRITON_INTERPRET"] = "0"  # before replayssm: compile, do not interpret

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from replayssm.ops.delta_rule import replay_decode  # noqa: E402
from replayssm.ops.gdn import replay_split  # noqa: E402
from replayssm.ops.kda import replay_split as kda_split  # noqa: E402

BIN = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
WATCHED = ("SHFL", "LDS", "STS", "BAR", "MUFU", "FFMA", "LDG", "STG")
GDN_STREAM_SIG = {"slot_ptr": "*i64", "v_ptr": "*bf16", "out_ptr": "*bf16", "ckpt_ptr": "*fp32", "sc_ptr": "*fp32",
                  "d_rec_ptr": "*bf16", "k_rec_ptr": "*bf16", "coef_ptr": "*fp32", "meta_ptr": "*i64",
                  "qk_ptr": "*fp32", "seed": "i64", "num_slots": "i32"}
KDA_COEF_SIG = {"slot_ptr": "*i64", "q_ptr": "*bf16", "k_ptr": "*bf16", "a_ptr": "*bf16", "b_ptr": "*bf16",
                "A_log_ptr": "*fp32", "dt_bias_ptr": "*fp32", "k_rec_ptr": "*bf16", "g_rec_ptr": "*fp32",
                "wpos_ptr": "*i64", "pending_ptr": "*i32", "ticket_ptr": "*i32", "sr_ptr": "*i64", "coef_ptr": "*fp32",
                "meta_ptr": "*i64"}
KDA_DECODE_SIG = {"slot_ptr": "*i64", "q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "a_ptr": "*bf16",
                  "b_ptr": "*bf16", "out_ptr": "*bf16", "A_log_ptr": "*fp32", "dt_bias_ptr": "*fp32",
                  "ckpt_ptr": "*fp32", "sc_ptr": "*fp32", "d_rec_ptr": "*bf16", "k_rec_ptr": "*bf16",
                  "g_rec_ptr": "*fp32", "wpos_ptr": "*i64", "pending_ptr": "*i32", "ticket_ptr": "*i32",
                  "sr_ptr": "*i64", "seed": "i64", "num_slots": "i32"}


def sass_counts(kern, sig: dict, const: dict, warps: int, ptx_version: str | None) -> dict:
    """Compile ``kern`` for sm_90a (argument types ``sig``, constexprs ``const``) and count its SASS."""
    attrs = {(kern.arg_names.index(n),): [["tt.divisibility", 16]] for n, t in sig.items() if t.startswith("*")}
    src = ASTSource(kern, {**sig, **dict.fromkeys(const, "constexpr")}, constexprs=const, attrs=attrs)
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
    ops = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", line)
        if m:
            ops[m.group(1).split(".")[0]] += 1
    spill = re.search(r"(\d+) bytes spill stores", log.stderr)
    return {"warps": warps, "registers": int(re.search(r"Used (\d+) registers", log.stderr).group(1)),
            "spill_bytes": int(spill.group(1)) if spill else 0, "sass": sum(ops.values()),
            **{op: ops[op] for op in WATCHED}}


def gdn_stream_counts(rdot: bool, bv: int, warps: int, ptx_version: str | None, kc: int = 1) -> dict:
    lay = replay_split.coef_layout(16, 4)
    const = dict(H=16, HV=32, K=128, V=128, T=4, RING=32, SPEC=True, SCALE=128 ** -0.5, BK=128, BV=bv, JB=16, TP=4,
                 SCALED=False, SR=False, INTERPRET=False, KC=kc, DOT="ieee", RDOT=rdot, NSP=0, FU=4, NVT=128 // bv,
                 PDL=False, NCOEF=lay["NCOEF"], **{f"O_{k}": v for k, v in lay.items() if k != "NCOEF"})
    return {"readout": "dot" if rdot else "reduce", "value_rows": bv, "kchunks": kc,
            **sass_counts(replay_split._gdn_stream_kernel, GDN_STREAM_SIG, const, warps, ptx_version)}


def kda_coef_counts(warps: int, ptx_version: str | None) -> dict:
    lay = kda_split.coef_layout(16, 128)
    const = dict(H=32, HV=32, K=128, L=16, SCALE=128 ** -0.5, BK=128, JB=16, INTERPRET=False, HU=4,
                 NCOEF=lay["NCOEF"], **{f"O_{k}": v for k, v in lay.items() if k != "NCOEF"})
    return {"kernel": "kda-coef", **sass_counts(kda_split._kda_coef_kernel, KDA_COEF_SIG, const, warps, ptx_version)}


def kda_decode_counts(warps: int, ptx_version: str | None) -> dict:
    const = dict(H=32, HV=32, K=128, V=128, L=16, SCALE=128 ** -0.5, BK=128, BV=8 * warps, BL=16, NPROG=1,
                 NVT=128 // (8 * warps), HU=4, SCALED=False, SR=False, INTERPRET=False, PER_CHANNEL_GATE=True)
    return {"kernel": "kda-decode", "value_rows": 8 * warps,
            **sass_counts(replay_decode._replay_decode_kernel, KDA_DECODE_SIG, const, warps, ptx_version)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kernel", nargs="?", default="gdn-spec-stream",
                    choices=("gdn-spec-stream", "kda-coef", "kda-decode"))
    ap.add_argument("--warps", type=int, default=1, help="warps per program (kda-coef, kda-decode; default 1)")
    ap.add_argument("--ptx-version", default=None, help="rewrite the PTX ISA version (e.g. 8.7)")
    args = ap.parse_args()
    if args.kernel == "kda-coef":
        print(kda_coef_counts(args.warps, args.ptx_version))
    elif args.kernel == "kda-decode":
        print(kda_decode_counts(args.warps, args.ptx_version))
    else:
        for rdot, bv, warps, kc in ((False, 8, 1, 1), (True, 8, 1, 1), (False, 8, 1, 8), (False, 16, 1, 8),
                                    (False, 16, 2, 8), (False, 32, 2, 8), (False, 32, 4, 8)):
            print(gdn_stream_counts(rdot, bv, warps, args.ptx_version, kc))


if __name__ == "__main__":
    main()
