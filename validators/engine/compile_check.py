"""Do the Triton kernels a CPU run launched compile for the GPU?  A check the interpreter cannot make.

Under ``TRITON_INTERPRET=1`` a Triton kernel runs as NumPy, so the compiler's own rules never apply:
a ``tl.dot`` whose contracted axis is under 16 (8 in Triton >= 3.9), a block shape that is not a
power of two, a type the backend cannot lower -- code that passes every interpreted test and then
fails to compile on the GPU (the nightly GPU fuzz found kda ``triton-replay`` failing so at K < 16
in ``s32a16-tf32``: docs/fuzzing.md, run 6).

``record()`` notes every kernel launch the interpreter runs (its function, the type of each tensor
argument, the value of each scalar and constexpr, ``num_warps`` / ``num_stages``); ``compile_all``
then compiles each distinct specialisation for a CUDA target (default sm_90, the H200) in a
separate process without the interpreter, through ``triton.compile`` (no GPU needed: Triton's
CUDA backend and ``ptxas`` run on the CPU).  A constexpr named ``INTERPRET`` or ``INTERP`` (this
suite's kernels' switch for interpreter-safe code) is compiled as ``False``: what the GPU runs.

Oracle: the Triton compiler itself.  Expected result: every launched specialisation compiles; a
failure names the kernel, its constexprs and the compiler's message.  A launch whose arguments
cannot be described (a constexpr that is not a plain value) is reported as not checked, never as
compiled.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

_DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
           torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
           torch.bool: "i1", torch.float8_e4m3fn: "fp8e4nv", torch.float8_e5m2: "fp8e5"}
_OPTIONS = ("num_warps", "num_stages")
# constexprs that switch this suite's kernels to interpreter-safe code: compiled as False (what the GPU runs)
INTERPRETER_SWITCHES = ("INTERPRET", "INTERP")


def _describe(v):
    """(kind, value) of one launch argument, JSON-safe; None when it cannot be described."""
    import triton.language as tl  # triton is loaded by the interpreted run being recorded

    if isinstance(v, torch.Tensor):
        t = _DTYPES.get(v.dtype)
        return None if t is None else ["ptr", "*" + t]
    if v is None or isinstance(v, (bool, int, float, str)):
        return ["value", v]
    if isinstance(v, tl.dtype):
        return ["tl.dtype", v.name]
    if hasattr(v, "value") and isinstance(v.value, (bool, int, float, str, type(None))):
        return ["value", v.value]  # a tl.constexpr wrapper
    return None


def spec_of(fn, arg_names: list[str], args: tuple, kwargs: dict) -> dict:
    """The launch of ``fn`` with ``args`` / ``kwargs`` as a JSON-safe specialisation record."""
    bound = dict(zip(arg_names, args))
    bound.update({k: v for k, v in kwargs.items() if k in arg_names})
    described, missing = {}, []
    for name, v in bound.items():
        d = _describe(v)
        if d is None:
            missing.append(f"{name}={type(v).__name__}")
        else:
            described[name] = d
    opts = {k: kwargs[k] for k in _OPTIONS if k in kwargs and kwargs[k] is not None}
    return {"module": fn.__module__, "qualname": fn.__qualname__, "args": described, "options": opts,
            "undescribed": missing}


def _key(spec: dict) -> str:
    return json.dumps(spec, sort_keys=True)


@contextlib.contextmanager
def record():
    """Collect the distinct launches of interpreted Triton kernels inside the block: yields the
    list it fills (one record per specialisation)."""
    from triton.runtime.interpreter import InterpretedFunction

    seen, specs = set(), []
    original = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        spec = spec_of(self.fn, self.arg_names, args, kwargs)
        k = _key(spec)
        if k not in seen:
            seen.add(k)
            specs.append(spec)
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = run
    try:
        yield specs
    finally:
        InterpretedFunction.run = original


def _jit_function(spec: dict):
    import importlib

    obj = importlib.import_module(spec["module"])
    for part in spec["qualname"].split("."):
        obj = getattr(obj, part)
    while not hasattr(obj, "params") and hasattr(obj, "fn"):  # autotune / heuristics wrappers
        obj = obj.fn
    return obj


def compile_one(spec: dict, arch: int = 90) -> dict:
    """Compile one specialisation for ``cuda:<arch>`` (in a process without the interpreter)."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    name = f"{spec['module']}.{spec['qualname']}"
    if spec["undescribed"]:
        return {"kernel": name, "status": "not checked", "why": f"arguments {spec['undescribed']}"}
    try:
        fn = _jit_function(spec)
    except (ImportError, AttributeError) as e:  # a kernel made inside a function, or renamed
        return {"kernel": name, "status": "not checked", "why": f"no module-level JIT function: {e}"}
    if not hasattr(fn, "params"):
        return {"kernel": name, "status": "not checked", "why": f"not a JIT function: {type(fn).__name__}"}
    signature, constexprs, shown = {}, {}, {}
    for p in fn.params:
        pname = p.name
        if pname in spec["args"]:
            kind, v = spec["args"][pname]
        elif p.default is not inspect.Parameter.empty:  # left to its default at the launch
            kind, v = "value", p.default
        else:
            return {"kernel": name, "status": "not checked", "why": f"argument {pname} not recorded"}
        if kind == "tl.dtype":
            v = tl.dtype(v)
        if p.is_constexpr:
            v = False if pname in INTERPRETER_SWITCHES else v
            signature[pname] = "constexpr"
            constexprs[(p.num,)] = v
            shown[pname] = v if isinstance(v, (bool, int, float, str, type(None))) else str(v)
        elif kind == "ptr":
            signature[pname] = v
        elif v is None:
            signature[pname] = "constexpr"
            constexprs[(p.num,)] = None
        elif isinstance(v, bool):
            signature[pname] = "i1"
        elif isinstance(v, int):
            signature[pname] = "i32" if -2**31 <= v < 2**31 else "i64"
        elif isinstance(v, float):
            signature[pname] = "fp32"
        else:
            return {"kernel": name, "status": "not checked", "why": f"argument {pname}={v!r}"}
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    try:
        triton.compile(src, target=GPUTarget("cuda", arch, 32), options=dict(spec["options"]))
    except Exception as e:  # noqa: BLE001 - every compiler error is the finding
        msg = str(e).strip().splitlines()
        return {"kernel": name, "status": "failed", "constexprs": shown, "error": f"{type(e).__name__}: "
                + (msg[-1] if msg else "")}
    return {"kernel": name, "status": "compiled", "constexprs": shown}


def compile_all(specs: list[dict], arch: int = 90, timeout_s: float = 1200.0) -> list[dict]:
    """Compile every specialisation in ``specs`` for ``cuda:<arch>`` in a fresh process (the
    interpreter off); one result per spec, in order."""
    check_arch(arch, "arch")
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = Path(tmp) / "specs.json", Path(tmp) / "results.json"
        inp.write_text(json.dumps(specs))
        env = dict(os.environ, TRITON_INTERPRET="0")  # "0", not unset: replayssm turns it on without CUDA
        env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
        proc = subprocess.run([sys.executable, "-m", "replayssm.validators.engine.compile_check", str(inp), str(out),
                               str(arch)], env=env, capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"compile_check: the compiling process failed (exit {proc.returncode}): "
                               f"{proc.stderr.strip()[-2000:]}")
        return json.loads(out.read_text())


def report(launches: list[dict], arch: int = 90) -> tuple[bool, list[str]]:
    """Compile ``launches`` for sm_<arch>: (True only when every one compiled -- a launch not
    checked, or none at all, is not a pass; the lines that say so: a verdict line, then one per
    launch that failed or was not checked)."""
    results = compile_all(launches, arch=arch)
    n = {s: sum(r["status"] == s for r in results) for s in ("compiled", "failed", "not checked")}
    ok = bool(results) and n["compiled"] == len(results)
    verdict = "PASS" if ok else ("FAIL" if n["failed"] else "INCOMPLETE")
    lines = [f"compile for sm_{arch}: {verdict}: {len(results)} distinct Triton launches, {n['compiled']} compiled, "
             f"{n['failed']} failed, {n['not checked']} not checked" + ("" if results else " (the run launched none)")]
    for r in results:
        if r["status"] == "failed":
            lines.append(f"  {r['kernel']} {r['constexprs']}: {r['error']}")
        elif r["status"] == "not checked":
            lines.append(f"  {r['kernel']}: not checked: {r['why']}")
    return ok, lines


def check_arch(arch, flag: str = "--compile-for") -> None:
    """Refuse a compute capability that is not an integer >= 70, naming ``flag``."""
    if not isinstance(arch, int) or arch < 70:
        raise ValueError(f"{flag}: expected a CUDA compute capability >= 70 (90 = H200), got {arch!r}")


def main(argv: list[str]) -> int:
    inp, out, arch = argv
    specs = json.loads(Path(inp).read_text())
    Path(out).write_text(json.dumps([compile_one(s, int(arch)) for s in specs]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


__all__ = ["check_arch", "compile_all", "compile_one", "record", "report", "spec_of"]
