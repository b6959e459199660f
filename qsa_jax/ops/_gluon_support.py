"""Gluon kernels through ``jax_triton.triton_call``: the one place that reaches into jax-triton.

jax-triton 0.3.1 compiles every kernel from Triton IR: its lowering calls
``jax_triton.triton_lib.get_or_create_triton_kernel``, which builds a plain ``ASTSource`` and
runs the TTIR -> TTGIR -> LLVM -> PTX passes itself. A Gluon kernel (``gluon.jit``) is written
at the TTGIR level (its layouts are part of the program) and must be compiled by
``triton.compile`` from a ``GluonASTSource``, which runs Gluon's own passes. ``install()``
wraps that one jax-triton function: a Gluon kernel is compiled by ``triton.compile`` for the
device's capability, with jax-triton's conventions for the arguments (every array 16-byte
aligned, an integer argument equal to 1 a constant, as jax-triton does for every kernel), and
handed back as a ``TritonKernel`` built as jax-triton builds one (its PTX, name, warps and
shared memory; the slot where jax-triton keeps the kernel's TTIR text gets the TTGIR, which
is what a Gluon kernel has -- launching reads only the PTX); any other kernel goes to
jax-triton unchanged. ``unavailable_reason`` is what the launch plans consult: where it is not
None (a Triton whose Gluon the kernel was not written for, or jax-triton's internals moved) they
keep the Triton kernel, on the shim's torch route as well, which shares the plans. Gluon is
experimental and changes between Triton releases (3.8 has no ``gl.thread_barrier``, which the
kernel calls; jax-triton 0.4.1, which needs Triton >= 3.7, no longer has the function this
hook wraps), so the kernel is offered only on the Triton releases in ``GLUON_TRITON``. Private
API: ``tests/test_gluon.py`` fails when an upgrade of the tested jax-triton moves it (the
function's name and keyword arguments, and the ``TritonKernel`` constructor), and when the
tested Triton or jax-triton changes without the kernel and this hook being checked on it.
The shim's torch route needs none of this: Triton's own launcher runs Gluon kernels.
"""

from __future__ import annotations

import functools

from qsa_jax.ops._triton_support import import_jax_triton

# The keyword arguments of jax_triton.triton_lib.get_or_create_triton_kernel this wrapper
# forwards, as jax-triton 0.3.1 names them (checked by install() and by the test).
EXPECTED_KEYWORDS = ("num_warps", "num_stages", "num_ctas", "compute_capability", "enable_fp_fusion",
                     "metaparams", "dump")

# The Triton releases (major.minor) whose Gluon ``gluon_kernels`` is written for and was
# compiled, run and compared bit for bit on (H100, sessions 20-21).
GLUON_TRITON = ("3.6",)

_COMPILED: dict = {}


def is_gluon(fn) -> bool:
    return bool(getattr(fn, "is_gluon", lambda: False)())


def _triton_lib():
    import_jax_triton()
    from jax_triton import triton_lib

    return triton_lib


POSITIONAL = ("backend_init_func", "platform", "fn", "arg_dtypes", "scalar_args")


def signature_problems(source: str | None = None) -> list[str]:
    """What of jax-triton's private API this module relies on has moved ([] when nothing),
    read from the source of ``jax_triton/triton_lib.py`` (``source``: that text; default the
    installed file), so that it can be checked where jax-triton cannot be imported (no GPU):
    the function, its arguments, that the lowering calls it by its module-level name, and the
    ``TritonKernel`` it builds (7 positional arguments)."""
    import ast

    from qsa_jax.ops._triton_support import triton_lib_functions

    parsed = triton_lib_functions(source)
    if parsed is None:
        return ["jax_triton is not installed"]
    defs, _ = parsed
    fn = defs.get("get_or_create_triton_kernel")
    if fn is None:
        return ["jax_triton.triton_lib.get_or_create_triton_kernel is gone"]
    problems = []
    positional = tuple(a.arg for a in fn.args.args)
    if positional != POSITIONAL:
        problems.append(f"get_or_create_triton_kernel's positional arguments are now {positional}")
    keywords = {a.arg for a in fn.args.kwonlyargs}
    missing = [k for k in EXPECTED_KEYWORDS if k not in keywords]
    if missing:
        problems.append(f"get_or_create_triton_kernel no longer takes {missing}")
    lowering = defs.get("triton_kernel_call_lowering")
    called = lowering is not None and any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "get_or_create_triton_kernel"
        for n in ast.walk(lowering))
    if not called:
        problems.append("triton_kernel_call_lowering no longer calls get_or_create_triton_kernel by name")
    builds = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
              and n.func.attr == "TritonKernel"]
    if len(builds) != 1 or len(builds[0].args) != 7:
        problems.append("get_or_create_triton_kernel no longer builds TritonKernel from 7 positional arguments")
    return problems


def compile_for_jax_triton(fn, arg_dtypes, scalar_args, *, num_warps, num_ctas, compute_capability,
                           enable_fp_fusion, metaparams):
    """(the compiled ``triton.CompiledKernel``, the argument attributes jax-triton's lowering
    reads) for Gluon kernel ``fn``, as jax-triton would specialise a Triton kernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    signature = {fn.arg_names[i]: dtype for i, dtype in enumerate(arg_dtypes)}
    scalar_positions = {i for i, _, _ in scalar_args}
    # jax-triton assumes every array is 16-byte aligned (JAX allocates so) and says so.
    attrs = {(i,): ([["tt.divisibility", 16]] if i not in scalar_positions and dtype.startswith("*") else [])
             for i, dtype in enumerate(arg_dtypes)}
    constants = dict(metaparams)
    constants.update({k: None for _, k, v in scalar_args if v is None})
    constants.update({fn.arg_names[i]: 1 for i, _, v in scalar_args if v == 1})
    for name in constants:
        signature[name] = "constexpr"
    key = (fn, tuple(signature.items()), tuple(sorted(constants.items())), num_warps, num_ctas,
           compute_capability, enable_fp_fusion)
    compiled = _COMPILED.get(key)
    if compiled is None:
        source = GluonASTSource(fn, signature, constexprs=constants, attrs=attrs)
        compiled = triton.compile(source, target=GPUTarget("cuda", compute_capability, 32),
                                  options=dict(num_warps=num_warps, num_ctas=num_ctas,
                                               enable_fp_fusion=enable_fp_fusion))
        _COMPILED[key] = compiled
    return compiled, attrs


@functools.lru_cache(maxsize=None)
def unavailable_reason() -> str | None:
    """None when Gluon kernels can go through the installed jax-triton and Triton, else why not
    (read from the sources: works without a GPU)."""
    try:
        import triton
        import triton.experimental.gluon  # noqa: F401
    except ImportError as exc:
        return f"this Triton has no Gluon ({exc})"
    release = ".".join(triton.__version__.split(".")[:2])
    if release not in GLUON_TRITON:
        return (f"the Gluon kernel is written for Triton {' / '.join(GLUON_TRITON)}, "
                f"this is Triton {triton.__version__}")
    problems = signature_problems()
    return "; ".join(problems) if problems else None


@functools.lru_cache(maxsize=None)
def install() -> None:
    """Route Gluon kernels in ``jax_triton.triton_call`` through ``triton.compile`` (idempotent)."""
    lib = _triton_lib()
    problems = signature_problems()
    if problems:
        raise RuntimeError("jax-triton's internals moved; Gluon kernels cannot be launched through it: "
                           + "; ".join(problems))
    original = lib.get_or_create_triton_kernel

    @functools.wraps(original)
    def get_or_create_triton_kernel(backend_init_func, platform, fn, arg_dtypes, scalar_args, *, num_warps,
                                    num_stages, num_ctas, compute_capability, enable_fp_fusion, metaparams, dump):
        if not is_gluon(fn):
            return original(backend_init_func, platform, fn, arg_dtypes, scalar_args, num_warps=num_warps,
                            num_stages=num_stages, num_ctas=num_ctas, compute_capability=compute_capability,
                            enable_fp_fusion=enable_fp_fusion, metaparams=metaparams, dump=dump)
        if platform != "cuda":
            raise NotImplementedError(f"Gluon kernels here are built for CUDA, not {platform!r}")
        if compute_capability is None:
            compute_capability = lib.triton_kernel_call_lib.get_compute_capability(0)
        compiled, attrs = compile_for_jax_triton(
            fn, arg_dtypes, scalar_args, num_warps=4 if num_warps is None else num_warps, num_ctas=num_ctas,
            compute_capability=compute_capability, enable_fp_fusion=enable_fp_fusion, metaparams=metaparams)
        kernel = lib.triton_kernel_call_lib.TritonKernel(
            compiled.metadata.name, compiled.metadata.num_warps, num_ctas, compiled.metadata.shared,
            compiled.asm["ptx"], compiled.asm.get("ttgir", ""), compute_capability)
        return kernel, attrs

    lib.get_or_create_triton_kernel = get_or_create_triton_kernel
