"""Where the KDA replay's speculative decode breaks at large batch (issue 19): one engine run per
configuration, each in its own process (a CUDA error poisons the context), with
``CUDA_LAUNCH_BLOCKING=1`` so the traceback names the launch that faulted.

    python tools/kda_spec_probe.py [--rows 64,256,512] [--kernels triton-replay,triton-baseline]

Prints one line per (kernel, rows, slot order): pass / fail / the exception's last frames.
Oracle and scenario: tests/ops/kda/test_kda_gpu.py::test_engine_gpu_batch512 (kimi-linear-48b, s32a16,
T' = 4, B = 16, per-row acceptance, 8 steps).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, sys
from replayssm.scenarios.scenario import Scenario
from replayssm.validators.engine.runner import run_scenario
kernel, rows, order, geo, dev = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
ids = tuple(range(1, rows + 1))
if order == "reversed":
    ids = ids[::-1]
sc = Scenario(family="kda", geometry=geo, mode="s32a16", decode="speculative", window=4, buffer=16, rows=rows,
              num_slots=rows + 1, slot_ids=ids, schedule="per-row", steps=8)
res = run_scenario(sc, kernel, device=dev, repeat_check=False, literal_every=0, invariants_every=8,
                   state_every=8)
print(json.dumps({"passed": res.passed, "exception": res.exception,
                  "failures": [str(f) for f in res.failures[:3]]}))
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="8,64,128,256,512")
    ap.add_argument("--kernels", default="triton-replay")
    ap.add_argument("--orders", default="identity,reversed")
    ap.add_argument("--geometry", default="kimi-linear-48b")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args(argv)
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    for kernel in a.kernels.split(","):
        for rows in (int(r) for r in a.rows.split(",")):
            for order in a.orders.split(","):
                cmd = [sys.executable, "-c", CHILD, kernel, str(rows), order, a.geometry, a.device]
                p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
                tag = f"{kernel} rows={rows} {order}"
                last = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
                try:
                    r = json.loads(last)
                except ValueError:
                    print(f"{tag}: process rc={p.returncode}\n{p.stderr[-3000:]}", flush=True)
                    continue
                if r["exception"]:
                    print(f"{tag}: EXCEPTION\n{r['exception'].get('traceback', r['exception'])}", flush=True)
                else:
                    print(f"{tag}: {'pass' if r['passed'] else 'FAIL ' + str(r['failures'])}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
