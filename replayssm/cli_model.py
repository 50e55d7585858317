"""``replayssm model``: a transformers hybrid model whose recurrent mixers decode through the kernel
under test, judged under teacher forcing by the next-token distribution (docs/model.md).

Oracle: the same model's prefill of the same token stream with every recurrence in fp64
(validators/jobs/model/forcing.py).  Needs the optional extra ``replayssm[model]`` (transformers); without
it the command says so in one line (exit 3).  Exit 1 when a run is outside its model-level budget
(``[model.<family>."<mode>"]`` of golden/tolerances.toml), 2 on bad input (a missing or unsupported
``--weights`` directory, a plan that would not exercise ReplaySSM).
"""

from __future__ import annotations

import torch

from replayssm.cli import check_device
from replayssm.guard import check_record_path, check_writable
from replayssm.records import Recorder, add_record_argument, append
from replayssm.records.jobs import source
from replayssm.validators.jobs.model import forcing, hf, report
from replayssm.validators.jobs.model.job import ModelJob
from replayssm.validators.jobs.model.job import run as run_job


def add_parser(subparsers):
    p = subparsers.add_parser("model", help="teacher-forced next-token check of a hybrid model (transformers) "
                              "whose mixers decode through the kernel", description=__doc__.split("\n\n")[0])
    p.add_argument("--family", choices=sorted(hf.FAMILY_ARCH), help="the recurrent family under test: its "
                   f"architecture {hf.FAMILY_ARCH} unless --arch names one (default gdn)")
    p.add_argument("--arch", help=f"random model architecture: {sorted(hf.ARCHITECTURES)} (default: the "
                   "--family's)")
    p.add_argument("--size", default="tiny", help="random model size: tiny (CPU) or real (a real model's mixer "
                   "shapes, few layers)")
    p.add_argument("--weights", metavar="DIR", help="a local checkpoint directory (save_pretrained; no network) "
                   "instead of a random model")
    p.add_argument("--kernel", default="literal-replay", help="the kernel under test (default literal-replay)")
    p.add_argument("--precision", default="s32a32", help="comma-separated precision modes (default s32a32)")
    p.add_argument("--schedules", default=",".join(forcing.SCHEDULES),
                   help=f"comma-separated acceptance schedules from {list(forcing.SCHEDULES)} (default all)")
    p.add_argument("--tokens", type=int, default=64, help="positions judged per run (default 64)")
    p.add_argument("--window", type=int, default=4, help="speculative window T' (default 4)")
    p.add_argument("--buffer", type=int, default=8, help="history block B >= T' (default 8)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights, stream and schedule (default 0)")
    p.add_argument("--entropy-fraction", type=float, default=0.5,
                   help="a random model's LM head is scaled to this fraction of ln(vocab) (default 0.5)")
    p.add_argument("--mutant", choices=sorted(forcing.MUTANTS), help="run a model-level mutant instead")
    p.add_argument("--budgets", metavar="FILE", help="budget file (default golden/tolerances.toml)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]: where the model and the kernel run (default cpu)")
    p.add_argument("--out", metavar="DIR", default="out/model", help="report folder (default out/model)")
    add_record_argument(p)
    return p


def _split(text: str) -> tuple:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def run(args) -> int:
    hf.require()
    dev = check_device(args.device)
    check_record_path(args.record)
    check_writable(args.out, "--out")
    if dev == "cpu":
        torch.set_num_threads(1)
    arch = args.arch or hf.FAMILY_ARCH[args.family or "gdn"]
    job = ModelJob(arch=arch, family=args.family, size=args.size, weights=args.weights, kernel=args.kernel,
                   modes=_split(args.precision), schedules=_split(args.schedules), tokens=args.tokens,
                   window=args.window, buffer=args.buffer, seed=args.seed, entropy_fraction=args.entropy_fraction,
                   device=dev, mutant=args.mutant, budgets=args.budgets)
    recorder = Recorder("model", device=dev, source=source(args)) if args.record else None

    def progress(r, head):
        print(f"model: {r['mode']} {r['schedule']}: p95 |dlogprob| {r['metrics']['p95_abs_dlogprob']:.3g}, "
              f"k3-KL {r['metrics']['k3_kl']:.3g}, top-1 {r['metrics']['top1_agreement']:.3f} -> {r['verdict']}")
        if recorder:  # each run's record as it completes: a run cut short keeps the runs it finished
            append(args.record, report.records(recorder, {**head, "runs": [r]}))

    rep = run_job(job, progress=progress)
    paths = report.write(rep, args.out)
    print(f"model: {rep['verdict'].upper()} {len(rep['runs'])} run(s), teacher entropy {rep['entropy']:.3f} nats; "
          f"report {paths[1]}, plots {paths[2]}")
    return 1 if rep["verdict"] == "fail" else 0
