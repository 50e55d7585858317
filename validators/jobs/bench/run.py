"""GPU benchmark job (``replayssm bench``): kernel time, achieved bandwidth and the traffic model, any family.

Oracle for the numbers: the memory-traffic model of docs/recurrences.md section 2 (baseline ``2 S`` per
standard step, replay ``S + R + S/L``; speculative baseline ``(1 + T') S`` per verify) and the
device's own copy bandwidth, measured in the same run with a preallocated ``dst.copy_(src)``
(bytes read + written over the ``do_bench`` median).  Expected: a memory-bound kernel reaches
75-95 % of the copy bandwidth; the speedup limit of replay over baseline is the ratio of their
modelled bytes.

Method (device/METHOD.md): every timed unit is a CUDA graph of a whole cursor cycle (standard
decode: L steps, so each flush is counted once per L steps; speculative: the steady-state cycle
of the acceptance schedule) over several input/state sets rotated so that what one step reads
is not left in L2 by the step before (enough sets for 4x the L2 size); ``triton.testing.do_bench``
median with warm-up, L2 cleared between replays.  Fresh random non-zero inputs and states.
Before timing, each benchmarked configuration (kernel + launch options) is validated by the
engine (:func:`check_configuration`: ``run_scenario`` at the bench geometry over more than a whole
cursor cycle, the fp64 reference, the literal model's tolerance rule and every exact check), so a
broken configuration cannot win a sweep.

The family supplies what is family-specific (``replayssm.families.Family``): the bytes model
(``traffic``), the default geometry (``bench_geometry``) and the launch options swept
(``bench_launch_candidates``).  :func:`bench_family` is the suite of one family; the reusable pieces
are :func:`copy_bandwidth`, :func:`graph_median_ms`, :func:`num_sets`, :func:`cursor_cycle`,
:func:`markdown_table`.

The pytest-benchmark suite (tests/bench, ``nox -s bench``) takes its cases from the registries
(:func:`bench_cases`: every family x deployable kernel x decode case x batch; the regression gate's
subset) and times each with :func:`measure_case` (every replay a sample, :func:`time_kernel_samples`);
:func:`slow_fraction` is the test-only slowdown that shows the gate failing on a slower kernel.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field

import torch
import triton
import triton.testing

from replayssm.families import family, family_names, preset
from replayssm.interface import DecodeConfig, KernelConfig
from replayssm.precision import parse_mode
from replayssm.records import git_state
from replayssm.registry import get, kernels
from replayssm.scenarios.inputs import make_params
from replayssm.scenarios.scenario import Scenario
from replayssm.validators.engine.resolved import resolve
from replayssm.validators.engine.runner import declared_policy, run_scenario

# ---- generic harness ----------------------------------------------------------------------------------


def _do_bench(fn, rep_ms: float) -> float:
    return float(triton.testing.do_bench(fn, warmup=max(25, rep_ms // 4), rep=rep_ms, return_mode="median"))


def _do_bench_all(fn, rep_ms: float) -> list[float]:
    """Every timed replay of ``do_bench`` (ms, L2 cleared before each): its median is :func:`_do_bench`."""
    return [float(t) for t in triton.testing.do_bench(fn, warmup=max(25, rep_ms // 4), rep=rep_ms, return_mode="all")]


def copy_bandwidth(device="cuda", nbytes: int = 4 << 30, rep_ms: float = 400) -> dict:
    """Device copy bandwidth: a preallocated ``dst.copy_(src)`` of ``nbytes``, bytes read + written
    over the do_bench median (destination allocated outside the timed region)."""
    n = nbytes // 4
    src = torch.empty(n, dtype=torch.float32, device=device).normal_()
    dst = torch.empty_like(src)
    ms = _do_bench(lambda: dst.copy_(src), rep_ms)
    return {"bytes": 2 * nbytes, "ms": ms, "tbps": 2 * nbytes / (ms * 1e-3) / 1e12}


def graph_median_ms(fn, *, warmup_calls: int = 2, rep_ms: float = 300) -> float:
    """Median time of one call of ``fn`` replayed from a CUDA graph (``fn`` is run eagerly
    ``warmup_calls`` times first: compilation, autotuning, allocator warm-up)."""
    return statistics.median(graph_samples_ms(fn, warmup_calls=warmup_calls, rep_ms=rep_ms))


def graph_samples_ms(fn, *, warmup_calls: int = 2, rep_ms: float = 300) -> list[float]:
    """Every replay's time (ms) of ``fn`` captured as one CUDA graph (``do_bench``: L2 cleared before
    each replay, CUDA events around it), after ``warmup_calls`` eager calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup_calls):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    times = _do_bench_all(graph.replay, rep_ms)
    del graph
    return times


def num_sets(bytes_per_set: float, device="cuda", l2_multiple: float = 4.0, min_sets: int = 2,
             max_sets: int = 64) -> int:
    """How many input/state sets to rotate so one cycle touches ``l2_multiple`` x the L2 size."""
    l2 = torch.cuda.get_device_properties(device).L2_cache_size if torch.cuda.is_available() else 50 << 20
    return int(min(max_sets, max(min_sets, math.ceil(l2_multiple * l2 / max(bytes_per_set, 1.0)))))


def cursor_cycle(decode: DecodeConfig, k: int) -> tuple[list[int], list[tuple[int, bool]]]:
    """Cursor path of one slot committing ``k`` every step from reset: (prefix write_pos list,
    steady cycle of (write_pos, flush)).  Replaying the cycle returns the cursor to its start."""
    wp, origin, seen, path = 0, 0, {}, []
    while wp not in seen:
        seen[wp] = len(path)
        flush = decode.is_flush(wp)
        path.append((wp, flush))
        wp, origin = decode.commit_cursor(wp, origin, flush, k)
    start = seen[wp]
    return [w for w, _ in path[:start]], path[start:]


def markdown_table(headers: list[str], rows: list[list]) -> str:
    def cell(v):
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        return str(v)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def environment() -> dict:
    env = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "torch": torch.__version__, "triton": triton.__version__,
           "python": platform.python_version()}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, sms=p.multi_processor_count, l2_mb=p.L2_cache_size / 2**20,
                   memory_gb=round(p.total_memory / 1e9, 1))
    env["commit"], env["dirty"] = git_state()  # $REPLAYSSM_COMMIT names the commit of a copy without .git
    return env


# ---- one configuration ----------------------------------------------------------------------------------


@dataclass
class BenchRow:
    case: str
    batch: int
    baseline_us: float
    replay_us: float
    ratio: float
    baseline_tbps: float
    replay_tbps: float
    baseline_pct_copy: float
    replay_pct_copy: float
    model_limit: float
    sets: int
    baseline_config: dict = field(default_factory=dict)
    replay_config: dict = field(default_factory=dict)
    check: str = ""


def random_inputs(fam, g, rows: int, window: int, dtype, gen: torch.Generator, device) -> dict[str, torch.Tensor]:
    """Fresh random non-zero inputs for timing: N(0, 1), gate pre-activations shifted by -2 (a
    moderate decay, as in serving)."""
    out = {}
    for name, shape in g.input_shapes().items():
        t = torch.randn((rows, window, *shape), generator=gen, device=device)
        if fam.input_law(name) == "gate":
            t = t - 2.0
        out[name] = t.to(dtype)
    return out


def check_scenario_of(family_name: str, geometry: str, mode: str, decode: DecodeConfig, k: int, options: dict,
                      rows: int = 4) -> Scenario:
    """The validation scenario of one bench configuration: ``rows`` rows committing ``k`` every
    step for a whole cursor cycle plus one step (every flush phase), with the launch options."""
    prefix, cyc = cursor_cycle(decode, k)
    return Scenario.build(family_name, decode=decode.decode, batch=rows, padding=0, window=decode.window,
                          buffer=decode.buffer, geometry=geometry, mode=mode, schedule="fixed",
                          schedule_params={"k": k}, steps=len(prefix) + len(cyc) + 1, kernel_options=dict(options))


def check_configuration(kernel: str, sc: Scenario, device) -> str:
    """The engine's verdict on one bench configuration (:func:`check_scenario_of`): ``run_scenario``
    against the fp64 reference with the literal model's tolerance rule and every exact check.
    Raises AssertionError naming the first failure; returns the worst output error in units of the
    tolerance bound."""
    options = dict(sc.kernel_options)
    geometry, mode = sc.geometry, sc.mode
    res = run_scenario(sc, kernel, device=device, repeat_check=False)
    if not res.passed:
        first = res.failures[0] if res.failures else None
        raise AssertionError(f"{kernel} {options}: fails validation at {geometry} {mode}: "
                             f"{first.check + ': ' + first.message if first else res.exception}")
    return f"{res.summary.get('worst bound_ratio', 0.0):.2f} of bound"


def _build(family_name, name, g, params, mode, decode, slots, device, options):
    cls = get(name, family_name)
    quiet = {"checks": False} if "checks" in cls.accepted_options else {}  # no host checks in the timed loop
    cfg = KernelConfig(g, params, mode, decode.with_policy(declared_policy(cls)), num_slots=slots, device=device,
                       options={**quiet, **options})  # the kernel's own bookkeeping (e.g. fold-every-commit)
    return cls(cfg)


SLOW_ENV = "REPLAYSSM_BENCH_SLOW"


def slow_fraction(name: str, text: str | None = None) -> float:
    """Test-only slowdown of kernel ``name`` from ``$REPLAYSSM_BENCH_SLOW`` (``KERNEL=FRACTION[,...]``,
    e.g. ``triton-replay=0.3``): each timed step of that kernel is followed by an extra memory pass of
    ``FRACTION`` x the step's modelled bytes (read + write of a scratch buffer), real work inside the
    timed graph.  It exists so the benchmark gate can be shown to fail on a slower kernel
    (the bench-gate profile); never set it for a measurement."""
    text = os.environ.get(SLOW_ENV, "") if text is None else text
    out = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        kernel, sep, frac = item.partition("=")
        try:
            value = float(frac)
        except ValueError:
            value = -1.0
        if not sep or not kernel or not value > 0:
            raise ValueError(f"{SLOW_ENV}: expected KERNEL=FRACTION[,KERNEL=FRACTION] with FRACTION > 0, got {text!r}")
        out[kernel] = value
    return out.get(name, 0.0)


def step_bytes(family_name: str, geometry: str, mode: str, kind: str, decode: DecodeConfig, k: int) -> float:
    """Modelled bytes per batch row of one timed step (docs/recurrences.md sections 2-4): the baseline's
    ``baseline_step``, a replay kernel's mean over the cursor cycle of committing ``k`` every step."""
    t = family(family_name).traffic(preset(geometry, family_name), parse_mode(mode))
    if kind == "baseline":
        return t.baseline_step(decode.window)
    return t.replay_cycle_mean(decode, cursor_cycle(decode, k)[1])


@dataclass
class KernelTiming:
    """Times of one benchmarked configuration: every replay of the whole cursor cycle, per step."""

    samples_us: list[float]  # one per timed replay, divided by the steps it holds
    verdict: str  # the engine's verdict before timing (:func:`check_configuration`)
    sets: int
    steps_per_replay: int
    timing: str  # "cuda-graph" (our kernels), "eager" (host bookkeeping per step: adapters), "wall" (CPU)
    slow_fraction: float = 0.0

    @property
    def median_us(self) -> float:
        return statistics.median(self.samples_us)


def time_kernel_samples(family_name: str, name: str, geometry: str, mode: str, decode: DecodeConfig, batch: int,
                        nsets: int, k: int, options: dict, device, gen: torch.Generator, rep_ms: float,
                        verdict: str | None = None) -> KernelTiming:
    """µs per step (verify + commit) of kernel ``name`` over a full cursor cycle, every replay, after
    the engine has validated the configuration (:func:`check_configuration`; ``verdict``: the verdict
    of that same configuration from an earlier call, which the caller vouches for).  A kernel with
    ``timed_step`` (the adapters of external kernels) is replayed through it: its launches alone, no
    host syncs, so one CUDA graph captures it.  Kernels with a raw
    launch path or host checks that can be turned off are replayed from one CUDA graph; the others
    (adapters: host bookkeeping, device syncs) are timed eagerly by ``do_bench``."""
    sc = check_scenario_of(family_name, geometry, mode, decode, k, options)
    r = resolve(sc, name, device)
    fam, g, cls = r.family, r.geometry, r.kernel_cls
    if verdict is None:
        verdict = check_configuration(name, sc, device)
    act = r.mode.act_dtype
    params = {n: v.to(device) for n, v in make_params(sc).items()}
    kern = _build(family_name, name, g, params, mode, decode, batch * nsets, device, options)
    T = decode.window
    acc = torch.full((batch,), k, dtype=torch.int64, device=device)
    prefix, cyc = cursor_cycle(decode, k)
    slow = slow_fraction(name)
    scratch_n = math.ceil(slow * batch * step_bytes(family_name, geometry, mode, cls.kind, decode, k) / 8)
    sets = []
    for s in range(nsets):
        ids = torch.arange(s * batch, (s + 1) * batch, dtype=torch.int64, device=device)
        kern.reset(ids, 0.5 * torch.randn((batch, *g.state_shape), generator=gen, device=device))
        sets.append((ids, random_inputs(fam, g, batch, T, act, gen, device),
                     torch.empty((batch, T, *g.out_shape), dtype=act, device=device),
                     torch.zeros(scratch_n, dtype=torch.float32, device=device) if slow else None))
    fused = not decode.speculative and hasattr(kern, "launch_step")
    raw = hasattr(kern, "launch_verify") and hasattr(kern, "launch_commit")
    timed = ({id(ids): kern.timed_step(ids, inp, out, acc) for ids, inp, out, _ in sets}
             if hasattr(kern, "timed_step") else None)

    def one_step(ids, inp, out, extra):
        if timed is not None:
            timed[id(ids)]()
        elif fused:
            kern.launch_step(ids, inp, out)
        elif raw:
            kern.launch_verify(ids, inp, out)
            kern.launch_commit(ids, acc)
        else:
            kern.verify(ids, inp, out)
            kern.commit(ids, acc)
        if extra is not None:
            extra.add_(1.0)  # the test-only slowdown: reads and writes 8 bytes per element

    for _ in prefix:
        for st in sets:
            one_step(*st)

    def cycle():
        for _ in range(len(cyc)):
            for st in sets:
                one_step(*st)

    steps = len(cyc) * nsets
    if not device_is_cuda(device):
        ms, timing = [wall_ms(cycle)], "wall"
    elif timed is not None or fused or raw or "checks" in cls.accepted_options:
        ms, timing = graph_samples_ms(cycle, warmup_calls=1, rep_ms=rep_ms), "cuda-graph"
    else:
        cycle()
        ms, timing = _do_bench_all(cycle, rep_ms), "eager"
    return KernelTiming([t * 1e3 / steps for t in ms], verdict, nsets, steps, timing, slow)


def time_kernel(family_name: str, name: str, geometry: str, mode: str, decode: DecodeConfig, batch: int, nsets: int,
                k: int, options: dict, device, gen: torch.Generator, rep_ms: float,
                verdict: str | None = None) -> tuple[float, str]:
    """Median µs per step (verify + commit) of kernel ``name`` over a full cursor cycle, after the
    engine has validated the configuration (:func:`check_configuration`, or ``verdict`` given)."""
    t = time_kernel_samples(family_name, name, geometry, mode, decode, batch, nsets, k, options, device, gen, rep_ms,
                            verdict)
    return t.median_us, t.verdict


def device_is_cuda(device) -> bool:
    return torch.device(device).type == "cuda"


def wall_ms(fn) -> float:
    """CPU stand-in for :func:`graph_median_ms` (the interpreter smoke test of this harness)."""
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def best_configuration(family_name, name, geometry, mode, decode, batch, nsets, k, candidates, device, gen, rep_ms,
                       log=print):
    """The fastest of ``candidates`` (launch options): ``(µs, options, verdict)``."""
    best = None
    for opts in candidates:
        us, verdict = time_kernel(family_name, name, geometry, mode, decode, batch, nsets, k, opts, device, gen,
                                  rep_ms)
        if device_is_cuda(device):
            torch.cuda.empty_cache()  # the kernel instance and its sets are gone with time_kernel's frame
        log(f"    {name:16s} {decode.decode:11s} batch {batch:4d} {opts} {us:10.2f} us  {verdict}")
        if best is None or us < best[0]:
            best = (us, opts, verdict)
    return best


# ---- one family's suite ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchItem:
    """One row of a family's suite (:func:`bench_plan`): the baseline and the replay kernel timed on
    one decode case at one batch size (each the fastest of its launch candidates), and their
    modelled bytes per step.  ``index``: the row's place in the table (its inputs' seed offset)."""

    index: int
    case: str
    batch: int
    base: DecodeConfig
    rep: DecodeConfig
    k: int
    b_bytes: float
    r_bytes: float


def bench_plan(family_name: str, geometry: str, mode="s32a16", L=16, batches=(1, 8, 32, 128, 256, 512),
               spec_batches=(128, 512), window=4, spec_buffer=16) -> list[BenchItem]:
    """The rows of :func:`bench_family`, in table order: standard decode at each of ``batches``, then
    speculative all-accepted and half-accepted at each of ``spec_batches`` (no device needed)."""
    traffic = family(family_name).traffic(preset(geometry, family_name), parse_mode(mode))
    std, base1 = DecodeConfig("standard", 1, L), DecodeConfig("standard", 1, 1)
    rb, bb = traffic.replay_cycle_mean(std, cursor_cycle(std, 1)[1]), traffic.baseline_step(1)
    items = [(f"standard L={L}", b, base1, std, 1, bb * b, rb * b) for b in batches]
    dec = DecodeConfig("speculative", window, spec_buffer)
    for label, k in (("all accepted", window), ("half accepted", max(1, window // 2))):
        rb_s, bb_s = traffic.replay_cycle_mean(dec, cursor_cycle(dec, k)[1]), traffic.baseline_step(window)
        items += [(f"spec T'={window} B={spec_buffer} {label}", b, dec, dec, k, bb_s * b, rb_s * b)
                  for b in spec_batches]
    return [BenchItem(i, *it) for i, it in enumerate(items)]


def bench_row(family_name: str, geometry: str, mode: str, item: BenchItem, *, copy: dict, device="cuda",
              rep_ms=200, sweep=True, seed=0, max_sets=64, baseline="triton-baseline", replay="triton-replay",
              log=print) -> BenchRow:
    """Time one row (:class:`BenchItem`): the baseline's and the replay's fastest launch candidate
    (only the default without ``sweep``), fresh inputs from seed ``seed + item.index``, so a row
    gets the same inputs in any process and order (``replayssm bench --backend ray``)."""
    fam = family(family_name)
    traffic = fam.traffic(preset(geometry, family_name), parse_mode(mode))
    gen = torch.Generator(device=device).manual_seed(seed + item.index)
    nsets = num_sets(item.batch * traffic.state, device, max_sets=max_sets)

    def best(name, kind, dec):
        cands = fam.bench_launch_candidates(kind, dec, item.batch)
        return best_configuration(family_name, name, geometry, mode, dec, item.batch, nsets, item.k,
                                  cands if sweep else cands[:1], device, gen, rep_ms, log)

    b_us, b_opts, b_chk = best(baseline, "baseline", item.base)
    r_us, r_opts, r_chk = best(replay, "replay", item.rep)
    return _row(item.case, item.batch, b_us, r_us, item.b_bytes, item.r_bytes, copy, nsets, b_opts, r_opts,
                f"{b_chk}/{r_chk}")


def copy_line(copy: dict) -> str:
    return f"copy bandwidth: {copy['tbps']:.3f} TB/s ({copy['bytes'] / 2**30:.0f} GiB moved in {copy['ms']:.3f} ms)"


def bench_family(family_name: str, geometry: str | None = None, mode="s32a16", L=16,
                 batches=(1, 8, 32, 128, 256, 512), spec_batches=(128, 512), window=4, spec_buffer=16, device="cuda",
                 rep_ms=200, sweep=True, seed=0, copy=None, max_sets=64, baseline="triton-baseline",
                 replay="triton-replay", log=print) -> dict:
    """Standard decode (baseline vs replay over a full L cycle) and speculative T' = ``window``
    (all drafts accepted, half accepted) against the per-draft-state baseline; each cell is the
    fastest of the family's launch candidates (only the default without ``sweep``).  The rows are
    :func:`bench_plan`'s, each timed by :func:`bench_row`."""
    geometry = geometry or family(family_name).bench_geometry
    plan = bench_plan(family_name, geometry, mode, L, batches, spec_batches, window, spec_buffer)
    if copy is None:
        copy = copy_bandwidth(device)
        if device_is_cuda(device):
            torch.cuda.empty_cache()
    log(copy_line(copy))
    rows: list[BenchRow] = []
    for item in plan:
        rows.append(bench_row(family_name, geometry, mode, item, copy=copy, device=device, rep_ms=rep_ms, sweep=sweep,
                              seed=seed, max_sets=max_sets, baseline=baseline, replay=replay, log=log))
        log(row_line(rows[-1]))
    return {"family": family_name, "geometry": geometry, "mode": mode, "L": L, "copy": copy, "env": environment(),
            "rows": [asdict(r) for r in rows]}


# The fields of a bench result that are measured times or follow from them (bandwidths, ratios, the
# copy ceiling); everything else (cases, batches, model limits, sets, verdicts, launch options without
# a sweep) is the same in every run of one configuration, serial or on a Ray cluster.
TIMING_ROW_FIELDS = ("baseline_us", "replay_us", "ratio", "baseline_tbps", "replay_tbps", "baseline_pct_copy",
                     "replay_pct_copy")


def without_timings(result: dict) -> dict:
    """``result`` (:func:`bench_family`) less what differs between two runs of one configuration: the
    timing fields of its rows (:data:`TIMING_ROW_FIELDS`, set to None), the copy ceiling and the date.
    With a launch sweep the chosen options are a timing result too; compare runs without one."""
    rows = [{k: (None if k in TIMING_ROW_FIELDS else v) for k, v in r.items()} for r in result["rows"]]
    env = {k: v for k, v in result["env"].items() if k != "date"}
    return {**result, "copy": None, "env": env, "rows": rows}


# ---- the benchmark suite's cases (tests/bench: pytest-benchmark, nox -s bench) ------------------------------

BENCH_MODE = "s32a16"
BENCH_L = 16
BENCH_WINDOW = 4
BENCH_SPEC_BUFFER = 16
STANDARD_BATCHES = (1, 8, 32, 128, 256, 512)  # docs/benchmarks.md
SPEC_BATCHES = (128, 512)
GATE_BATCHES = (8, 128)  # the gate's subset (nox -s bench -- --gate): one launch-bound, one bandwidth-bound size
GATE_SPEC_BATCHES = (128,)
GATE_KERNELS = ("triton-baseline", "triton-replay")  # our two kernels of every family


@dataclass(frozen=True)
class BenchCase:
    """One benchmark of the suite: a kernel, a decode case and a batch size at the family's bench geometry."""

    family: str
    kernel: str
    kind: str  # the kernel's kind: "baseline" or "replay"
    decode: str  # "standard" or "speculative"
    accepted: str  # speculative: "all" (k = T') or "half" (k = T'/2); standard: ""
    batch: int
    geometry: str
    mode: str = BENCH_MODE
    L: int = BENCH_L
    window: int = BENCH_WINDOW
    spec_buffer: int = BENCH_SPEC_BUFFER

    @property
    def id(self) -> str:
        if self.decode == "standard":
            return f"{self.family}-{self.kernel}-std-L{self.L}-b{self.batch}"
        return f"{self.family}-{self.kernel}-spec-T{self.window}B{self.spec_buffer}-{self.accepted}-b{self.batch}"

    @property
    def group(self) -> str:
        """The cases timed side by side (every kernel of one family, decode case and batch)."""
        if self.decode == "standard":
            return f"{self.family} std L{self.L} b{self.batch}"
        return f"{self.family} spec T'{self.window} B{self.spec_buffer} {self.accepted} b{self.batch}"

    @property
    def k(self) -> int:
        if self.decode == "standard":
            return 1
        return self.window if self.accepted == "all" else max(1, self.window // 2)

    @property
    def decode_config(self) -> DecodeConfig:
        if self.decode == "speculative":
            return DecodeConfig("speculative", self.window, self.spec_buffer)
        return DecodeConfig("standard", 1, 1 if self.kind == "baseline" else self.L)  # a baseline keeps no ring

    def unsupported_reason(self) -> str | None:
        cls = get(self.kernel, self.family)
        if self.decode not in cls.decodes:
            return f"{self.kernel} implements {list(cls.decodes)} decode, not {self.decode}"
        return cls.unsupported_reason(parse_mode(self.mode), self.decode_config, {})


def is_model(cls) -> bool:
    """A literal model (``literal-*``, defined in a family's ``literal.py``) or a mutant: validation
    oracles and witnesses, not kernels anyone deploys, so never benchmarked."""
    return cls.kind == "mutant" or cls.name.startswith("literal-") or cls.__module__.rsplit(".", 1)[-1] == "literal"


def bench_kernels(family_name: str) -> list[str]:
    """The family's kernels the suite times: every registered kernel that is not a model
    (:func:`is_model`): the family's Triton kernels, a plug-in's, and the adapters registered by
    ``adapters.load()``."""
    return [name for (_, name), cls in kernels(family_name).items() if not is_model(cls)]


def bench_cases(gate: bool = False) -> list[BenchCase]:
    """Every (family, kernel, decode case, batch) of the suite, families from the registry; ``gate``:
    the subset the regression gate times (our two kernels, :data:`GATE_BATCHES`, all-accepted speculative)."""
    out = []
    for fam_name in family_names():
        fam = family(fam_name)
        for name in bench_kernels(fam_name):
            if gate and name not in GATE_KERNELS:
                continue
            kind = get(name, fam_name).kind
            for b in GATE_BATCHES if gate else STANDARD_BATCHES:
                out.append(BenchCase(fam_name, name, kind, "standard", "", b, fam.bench_geometry))
            for acc in ("all",) if gate else ("all", "half"):
                for b in GATE_SPEC_BATCHES if gate else SPEC_BATCHES:
                    out.append(BenchCase(fam_name, name, kind, "speculative", acc, b, fam.bench_geometry))
    return out


def measure_case(case: BenchCase, *, copy: dict | None, device="cuda", rep_ms: float = 100, seed: int = 0,
                 max_sets: int = 64) -> tuple[KernelTiming, dict]:
    """Validate (fp64, :func:`check_configuration`) and time one suite case in its default launch
    configuration: ``(timing, extra)`` with the bytes moved per step, the achieved bandwidth and the
    copy ceiling of the same run (``copy``, from :func:`copy_bandwidth`; None on a CPU)."""
    geometry, mode, dec = case.geometry, case.mode, case.decode_config
    row = step_bytes(case.family, geometry, mode, case.kind, dec, case.k)
    nsets = num_sets(case.batch * family(case.family).traffic(preset(geometry, case.family), parse_mode(mode)).state,
                     device, max_sets=max_sets)
    gen = torch.Generator(device=device).manual_seed(seed)
    t = time_kernel_samples(case.family, case.kernel, geometry, mode, dec, case.batch, nsets, case.k, {}, device,
                            gen, rep_ms)
    if device_is_cuda(device):
        torch.cuda.empty_cache()
    nbytes = row * case.batch
    tbps = nbytes / (t.median_us * 1e-6) / 1e12
    extra = {"family": case.family, "kernel": case.kernel, "kind": case.kind, "case": case.id,
             "decode": case.decode, "accepted": case.accepted, "batch": case.batch, "geometry": geometry,
             "mode": mode, "window": dec.window, "buffer": dec.buffer, "k": case.k, "bytes_per_step": nbytes,
             "median_us": t.median_us,
             "tbps": tbps, "copy_tbps": copy["tbps"] if copy else None,
             "pct_copy": 100 * tbps / copy["tbps"] if copy else None, "sets": t.sets,
             "steps_per_replay": t.steps_per_replay, "timing": t.timing, "check": t.verdict,
             "slow_fraction": t.slow_fraction}
    if device_is_cuda(device):
        extra["gpu"] = torch.cuda.get_device_name(device)
    return t, extra


def _row(case, batch, b_us, r_us, b_bytes, r_bytes, copy, nsets, b_opts, r_opts, check) -> BenchRow:
    b_tb = b_bytes / (b_us * 1e-6) / 1e12
    r_tb = r_bytes / (r_us * 1e-6) / 1e12
    return BenchRow(case, batch, b_us, r_us, b_us / r_us, b_tb, r_tb, 100 * b_tb / copy["tbps"],
                    100 * r_tb / copy["tbps"], b_bytes / r_bytes, nsets, b_opts, r_opts, check)


def row_line(r: BenchRow) -> str:
    return (f"{r.case:34s} batch {r.batch:4d}: baseline {r.baseline_us:9.2f} us ({r.baseline_tbps:.2f} TB/s, "
            f"{r.baseline_pct_copy:.0f}%)  replay {r.replay_us:9.2f} us ({r.replay_tbps:.2f} TB/s, "
            f"{r.replay_pct_copy:.0f}%)  ratio {r.ratio:.2f} (model {r.model_limit:.2f})  sets {r.sets}  "
            f"cfg {r.baseline_config}/{r.replay_config}  {r.check}")


HEADERS = ["case", "batch", "baseline µs", "replay µs", "ratio", "baseline TB/s (% copy)", "replay TB/s (% copy)",
           "model limit"]


def table(result: dict) -> str:
    rows = [[r["case"], r["batch"], r["baseline_us"], r["replay_us"], r["ratio"],
             f"{r['baseline_tbps']:.2f} ({r['baseline_pct_copy']:.0f}%)",
             f"{r['replay_tbps']:.2f} ({r['replay_pct_copy']:.0f}%)", r["model_limit"]] for r in result["rows"]]
    return markdown_table(HEADERS, rows)


__all__ = ["BENCH_MODE", "GATE_BATCHES", "GATE_KERNELS", "GATE_SPEC_BATCHES", "SLOW_ENV", "SPEC_BATCHES",
           "STANDARD_BATCHES", "TIMING_ROW_FIELDS", "BenchCase", "BenchItem", "BenchRow", "KernelTiming", "bench_cases",
           "bench_family", "bench_kernels", "bench_plan", "bench_row", "copy_line", "without_timings",
           "best_configuration", "check_configuration", "check_scenario_of", "copy_bandwidth", "cursor_cycle",
           "environment", "graph_median_ms", "graph_samples_ms", "is_model", "markdown_table", "measure_case",
           "num_sets", "random_inputs", "slow_fraction", "step_bytes", "table", "time_kernel", "time_kernel_samples"]
