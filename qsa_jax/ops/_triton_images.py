"""JAX's launches of this package's Triton kernels run the machine code Triton's own launcher runs.

Why. jax-triton lowers a kernel to PTX and hands the PTX to jaxlib, which assembles it with the
ptxas XLA finds: the CUDA toolkit's, 13.0 on the lent machines. Triton's launcher (the shim's
torch route, and vLLM's originals) assembles the same PTX with the ptxas Triton bundles, 12.8
for Triton 3.6. The two releases schedule the split kernel differently. At TP1 fp8 16-64 rows,
13.0's schedule is 2.5-3.9% slower on an H100. That was measured in one process on the same
fresh inputs, with the torch route under either assembler (session 28; notes/triton.md).

jaxlib loads a pre-assembled image when the kernel's proto carries one
(``TritonKernel.module_image``, field 11, added by jax-ml/jax d35d53a, Aug 2026; jax 0.11.2 has
it). Then it does not assemble the PTX. ``install()`` wraps jax-triton's CUDA lowering. For this
package's kernels it assembles the PTX with Triton's ptxas and Triton's flags, through
``CUDABackend.make_cubin`` as Triton's launcher does, and adds the image to the proto. Every
other kernel is lowered by jax-triton unchanged. ``config.jax_triton_images_from_triton_ptxas``
switches it off at lowering time. jaxlib keeps the first image it loads for a kernel (its
cache is keyed by name, shared memory, PTX and capability, not by the image) for the life of the
process, so switching takes effect in a fresh process.

jax-triton 0.4.1 (the pair for triton >= 3.7) lowers differently; there ``signature_problems``
names the changes, nothing is installed, and jaxlib assembles as before.

Private API, all of it here:
- jax-triton's lowering function, primitive and backend factory (``jax_triton.triton_lib``);
- that the lowering returns the custom call's results, with the kernel-call proto
  zlib-compressed in the op's ``backend_config``;
- jaxlib's proto field numbers (the wire format, below);
- JAX's lowering registry (``registered_rule``), so that install() wraps the rule in place.

``tests/test_triton_images.py`` fails when an upgrade of the tested jax-triton or JAX moves them,
and checks the proto edit against bytes written out by hand. Its GPU tests show that the
lowering carries Triton's image for every kernel, and that jaxlib loads it: a wrong one fails
the launch.
"""

from __future__ import annotations

import functools
import re
import warnings
import zlib
from typing import Callable

# jaxlib/gpu/triton.proto (jax 0.11.2): field numbers this module reads or writes.
ANY_KERNEL_CALL = 1  # TritonAnyKernelCall.kernel_call (TritonKernelCall); 2 is an autotuned call
CALL_KERNEL = 1  # TritonKernelCall.kernel (TritonKernel)
KERNEL_NAME, KERNEL_SHARED_MEM, KERNEL_PTX, KERNEL_CAPABILITY = 1, 3, 4, 6  # TritonKernel fields
KERNEL_MODULE_IMAGE = 11  # TritonKernel.module_image (ModuleImageProto)
IMAGE_OBJECT_FILE, IMAGE_KERNEL_NAME, IMAGE_SHARED_MEM = 1, 2, 3  # ModuleImageProto fields

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5  # protobuf wire types


# ---------------------------------------------------------------------------- the wire format


def _varint(value: int) -> bytes:
    if value < 0:  # protobuf writes negative int32/int64 as 10-byte two's complement; none here
        raise ValueError(f"negative varint {value}")
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        byte = buf[pos]
        value |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if not byte & 0x80:
            return value, pos


def _fields(buf: bytes) -> list[tuple[int, object, bytes]]:
    """(field number, value, the field's encoded bytes) in order; value is an int (varint,
    fixed32, fixed64) or the payload bytes (length-delimited: only these are ever read as a
    message)."""
    out, pos = [], 0
    while pos < len(buf):
        start = pos
        key, pos = _read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ValueError("field number 0 is not valid protobuf")
        if wire == _VARINT:
            value, pos = _read_varint(buf, pos)
        elif wire == _LEN:
            size, pos = _read_varint(buf, pos)
            value, pos = buf[pos:pos + size], pos + size
        elif wire in (_I64, _I32):
            size = 8 if wire == _I64 else 4
            value, pos = int.from_bytes(buf[pos:pos + size], "little"), pos + size
        else:
            raise ValueError(f"wire type {wire} (field {number}) is not one jaxlib's protos use")
        if pos > len(buf):
            raise ValueError(f"field {number} runs past the end of the message")
        out.append((number, value, buf[start:pos]))
    return out


def _len_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | _LEN) + _varint(len(payload)) + payload


def _varint_field(number: int, value: int) -> bytes:
    return _varint(number << 3 | _VARINT) + _varint(value)


def _replace(buf: bytes, number: int, edit: Callable[[bytes], bytes | None]) -> bytes | None:
    """``buf`` with its (single) length-delimited field ``number`` replaced by ``edit(payload)``;
    None when the field is absent, repeated, or ``edit`` returns None."""
    fields = _fields(buf)
    hits = [i for i, (n, _, _) in enumerate(fields) if n == number]
    if len(hits) != 1 or not isinstance(fields[hits[0]][1], bytes):
        return None
    new = edit(fields[hits[0]][1])
    if new is None:
        return None
    return b"".join(_len_field(number, new) if i == hits[0] else raw for i, (_, _, raw) in enumerate(fields))


def kernel_fields(call_proto: bytes) -> dict[int, object] | None:
    """The ``TritonKernel`` fields (number -> value) of a serialized ``TritonAnyKernelCall``
    holding one kernel call; None for an autotuned call."""
    top = {n: v for n, v, _ in _fields(call_proto)}
    if not isinstance(top.get(ANY_KERNEL_CALL), bytes):
        return None
    call = {n: v for n, v, _ in _fields(top[ANY_KERNEL_CALL])}
    if not isinstance(call.get(CALL_KERNEL), bytes):
        return None
    return {n: v for n, v, _ in _fields(call[CALL_KERNEL])}


def with_image(call_proto: bytes, assemble: Callable[[str, int], bytes] | None,
               max_registers: int | None = None) -> bytes | None:
    """``call_proto`` (a serialized ``TritonAnyKernelCall``) with ``assemble(ptx, capability)``
    as its kernel's module image (none when ``assemble`` is None), after ``max_registers``
    (when given) has gone into the kernel's PTX as a ``.maxnreg`` directive; None when there is
    nothing to do: an autotuned call (several kernels; none of this package's), or a kernel that
    already carries an image. The PTX field is replaced too, so jaxlib (which keys its loaded
    modules by the PTX) keeps a capped and an uncapped kernel apart in one process."""

    def edit_kernel(kernel: bytes) -> bytes | None:
        fields = {n: v for n, v, _ in _fields(kernel)}
        if KERNEL_MODULE_IMAGE in fields or not isinstance(fields.get(KERNEL_PTX), bytes):
            return None
        ptx = fields[KERNEL_PTX].decode()
        if max_registers:
            ptx = with_max_registers(ptx, max_registers)
            kernel = _replace(kernel, KERNEL_PTX, lambda _: ptx.encode())
        if assemble is None:
            return kernel if max_registers else None
        name = fields.get(KERNEL_NAME, b"")
        image = (_len_field(IMAGE_OBJECT_FILE, assemble(ptx, fields.get(KERNEL_CAPABILITY, 0)))
                 + _len_field(IMAGE_KERNEL_NAME, name)
                 + _varint_field(IMAGE_SHARED_MEM, fields.get(KERNEL_SHARED_MEM, 0)))
        # A message field may appear after the others: a parser takes fields in any order.
        return kernel + _len_field(KERNEL_MODULE_IMAGE, image)

    return _replace(call_proto, ANY_KERNEL_CALL, lambda call: _replace(call, CALL_KERNEL, edit_kernel))


def with_max_registers(ptx: str, count: int) -> str:
    """``ptx`` (one kernel entry) with ``.maxnreg count`` among its entry's performance
    directives, where Triton's own ``maxnreg`` option puts it (after ``.reqntid``, before the
    body's brace); an existing ``.maxnreg`` there is replaced. ptxas then allocates at most
    ``count`` registers per thread, spilling the rest."""
    if not 16 <= count <= 255:  # ptxas's range on sm_90
        raise ValueError(f"max_registers={count}: ptxas takes 16-255 registers per thread")
    entries = [m.start() for m in re.finditer(r"\.entry\s", ptx)]
    if len(entries) != 1:
        raise ValueError(f"expected one .entry in the PTX, found {len(entries)}")
    body = ptx.index("{", entries[0])
    header = re.sub(r"\n\.maxnreg \d+", "", ptx[entries[0]:body])
    if not header.endswith("\n"):
        header += "\n"
    return ptx[:entries[0]] + header + f".maxnreg {count}\n" + ptx[body:]


# ---------------------------------------------------------------------------- the assembler


def _cuda_backend(capability: int, enable_fp_fusion: bool):
    """Triton's CUDA backend for ``capability`` and its options, as Triton's launcher builds them."""
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend

    backend = CUDABackend(GPUTarget("cuda", capability, 32))
    return backend, backend.parse_options({"enable_fp_fusion": enable_fp_fusion})


def assemble_like_triton(ptx: str, capability: int, enable_fp_fusion: bool = True) -> bytes:
    """The cubin Triton's launcher makes of ``ptx``: Triton's ptxas (``TRITON_PTXAS_PATH`` or
    the bundled one) with Triton's flags, through the CUDA backend's own ``make_cubin``. Cached
    by the PTX and by every setting that changes make_cubin's ptxas command, read now (a
    process may change Triton's knobs between two lowerings)."""
    from triton import knobs
    from triton.backends.nvidia.compiler import get_ptxas

    backend, options = _cuda_backend(capability, enable_fp_fusion)
    settings = (get_ptxas(backend.target.arch).path, bool(knobs.compilation.disable_line_info),
                bool(knobs.nvidia.disable_ptxas_opt), options.ptx_options)
    return _assemble(ptx, capability, enable_fp_fusion, settings)


@functools.lru_cache(maxsize=128)
def _assemble(ptx: str, capability: int, enable_fp_fusion: bool, settings: tuple) -> bytes:
    """``settings`` only keys the cache: make_cubin reads the same knobs itself."""
    import contextlib
    import io

    backend, options = _cuda_backend(capability, enable_fp_fusion)
    # On failure make_cubin prints the whole PTX to stdout; its exception names the problem.
    with contextlib.redirect_stdout(io.StringIO()):
        return backend.make_cubin(ptx, {}, options, capability)


# ---------------------------------------------------------------------------- the lowering


def is_ours(fn) -> bool:
    """Whether the kernel ``fn`` (a Triton or Gluon ``JITFunction``) is defined in this package."""
    return getattr(getattr(fn, "fn", fn), "__module__", "").startswith("qsa_jax.")


def with_images(original: Callable, *, enabled: Callable[[], bool], assemble: Callable | None = None,
                ours: Callable = is_ours) -> Callable:
    """A lowering rule that lowers as ``original`` does (jax-triton's, with the keyword
    parameters of ``triton_kernel_call_p``) and, for ``ours(fn)`` while ``enabled()``, puts
    ``assemble(ptx, capability, enable_fp_fusion)`` (default: this module's
    ``assemble_like_triton``, looked up at each lowering) into the custom call's proto.

    Whatever goes wrong on the way (ptxas fails or is missing, the proto is not what this
    module reads) leaves the custom call as ``original`` made it, with a warning: jaxlib then
    assembles the PTX, as it does without this module. jaxlib caches an image by kernel name,
    shared memory, PTX and capability (not by the flags that made it), so the first image a
    process loads for a PTX is the one it keeps.

    A ``maxnreg`` parameter (Triton's launch option, which jax-triton does not know) is taken
    out before ``original`` sees it and written into the PTX (``with_max_registers``), with or
    without the image; where that fails the lowering raises rather than launch without it."""
    from jax.interpreters.mlir import ir

    def lowering(ctx, *args, fn, enable_fp_fusion=True, **params):
        # Triton's maxnreg launch option (config.triton_fp8_register_cap): jax-triton would take it
        # for a kernel argument, so it goes into the PTX here instead.
        max_registers = params.pop("maxnreg", None) if ours(fn) else None
        results = original(ctx, *args, fn=fn, enable_fp_fusion=enable_fp_fusion, **params)
        images = ours(fn) and enabled()
        if not (images or max_registers):
            return results
        try:
            owner = results[0].owner
            op = getattr(owner, "operation", owner)
            proto = zlib.decompress(ir.StringAttr(op.attributes["backend_config"]).value_bytes)
            assembler = assemble or assemble_like_triton
            patched = with_image(proto, (lambda ptx, cc: assembler(ptx, cc, enable_fp_fusion)) if images else None,
                                 max_registers)
        except Exception as exc:
            name = getattr(fn, "__name__", fn)
            if not max_registers:
                warnings.warn(f"qsa_jax: {name} keeps jaxlib's own assembly of its PTX: "
                              f"{type(exc).__name__}: {str(exc)[:500]}", RuntimeWarning, stacklevel=2)
                return results
            # The cap was asked for: never a silent launch without it. Where the image failed
            # (e.g. ptxas), the capped PTX alone, which jaxlib assembles.
            try:
                patched = with_image(proto, None, max_registers)
            except Exception as again:
                raise RuntimeError(f"qsa_jax: {name}: maxnreg={max_registers} could not be put into its PTX "
                                   f"({type(again).__name__}: {again})") from exc
            if patched is not None:
                warnings.warn(f"qsa_jax: {name} keeps jaxlib's own assembly of its capped PTX: "
                              f"{type(exc).__name__}: {str(exc)[:500]}", RuntimeWarning, stacklevel=2)
        if patched is None and max_registers:
            raise RuntimeError(f"qsa_jax: {getattr(fn, '__name__', fn)}: maxnreg={max_registers} could not be put "
                               "into its PTX (an autotuned call, or a kernel that already carries an image)")
        if patched is not None:
            op.attributes["backend_config"] = ir.StringAttr.get(zlib.compress(patched))
        return results

    return lowering


def registered_rule(primitive, platform: str):
    """The lowering rule registered for ``primitive`` on ``platform`` now, or None. JAX has no
    public getter; this reads its registry (``jax._src.interpreters.mlir``), so that install()
    wraps whatever rule is in place (another library's wrapper included) instead of replacing
    it. tests/test_triton_images.py fails when a JAX upgrade moves the registry."""
    from jax._src.interpreters import mlir as mlir_internal

    entry = mlir_internal._platform_specific_lowerings.get(platform, {}).get(primitive)
    return None if entry is None else entry.rule  # a LoweringRuleEntry(rule, inline) in jax 0.11


# ---------------------------------------------------------------------------- the hook

# What install() needs of jax_triton/triton_lib.py (jax-triton 0.3.1), read from its source.
LOWERING_KEYWORDS = ("fn", "enable_fp_fusion")


def signature_problems(source: str | None = None) -> list[str]:
    """What of jax-triton's private API this module relies on has moved ([] when nothing), read
    from the source of ``jax_triton/triton_lib.py`` (default: the installed file) so that it can
    be checked where jax-triton cannot be imported (no GPU)."""
    import ast

    from qsa_jax.ops._triton_support import triton_lib_functions

    parsed = triton_lib_functions(source)
    if parsed is None:
        return ["jax_triton is not installed"]
    defs, tree = parsed
    problems = []
    fn = defs.get("triton_kernel_call_lowering")
    if fn is None:
        return ["jax_triton.triton_lib.triton_kernel_call_lowering is gone"]
    positional = tuple(a.arg for a in fn.args.args)
    if positional[:2] != ("backend_init_func", "ctx") or fn.args.vararg is None:
        problems.append(f"triton_kernel_call_lowering's arguments are now {positional}")
    keywords = {a.arg for a in fn.args.kwonlyargs}
    if missing := [k for k in LOWERING_KEYWORDS if k not in keywords]:
        problems.append(f"triton_kernel_call_lowering no longer takes {missing}")
    text = ast.unparse(fn)
    for needle, what in (("kernel_call.to_proto(", "builds the kernel-call proto with to_proto"),
                         ("backend_config=zlib.compress(call_proto)", "passes the proto zlib-compressed "
                          "as backend_config")):
        if needle not in text:
            problems.append(f"triton_kernel_call_lowering no longer {what}")
    if ast.unparse(fn.body[-1]) != "return rule(ctx, *array_args)":
        problems.append("triton_kernel_call_lowering no longer ends by returning the custom call's results")
    registered = any(
        isinstance(n, ast.Call) and ast.unparse(n.func) == "mlir.register_lowering"
        and "functools.partial(triton_kernel_call_lowering, get_cuda_backend)" in ast.unparse(n)
        and "platform='cuda'" in ast.unparse(n)
        for n in ast.walk(tree))
    if not registered:
        problems.append("triton_kernel_call_lowering is no longer registered for 'cuda' with get_cuda_backend")
    if "get_cuda_backend" not in defs:
        problems.append("jax_triton.triton_lib.get_cuda_backend is gone")
    return problems


def jaxlib_problem() -> str | None:
    """None when the installed jaxlib loads a kernel proto's pre-assembled image. The same jaxlib
    change added the ``instantiate`` stage of the Triton FFI handler, which is visible from
    Python; older jaxlibs ignore the image (an unknown field) and assemble the PTX."""
    try:
        from jaxlib import gpu_triton

        handlers = gpu_triton._cuda_triton.registrations()["triton_kernel_call_ffi"]
    except Exception as exc:  # no CUDA jaxlib, or the module moved
        return f"jaxlib's CUDA Triton module is not available ({type(exc).__name__}: {exc})"
    if "instantiate" not in handlers:
        return "this jaxlib predates pre-assembled Triton images (jax-ml/jax d35d53a): it assembles the PTX"
    return None


_REASON: list[str | None] = []


def assembler_in_use() -> str:
    """Which assembler made the machine code of the jax-triton kernels JAX launches here, in
    words (the benchmark records it beside the versions)."""
    from qsa_jax import config

    install()
    reason = unavailable_reason()
    if reason is not None:
        return f"jaxlib's (XLA's ptxas): {reason}"
    if not config.jax_triton_images_from_triton_ptxas():
        return "jaxlib's (XLA's ptxas): config.jax_triton_images_from_triton_ptxas() is off"
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        capability = config.device_capability() or (9, 0)
        tool = get_ptxas(capability[0] * 10 + capability[1])
        return f"Triton's ptxas {tool.version} ({tool.path}), carried in the kernel protos"
    except Exception as exc:  # the lowering would warn and fall back the same way
        return f"Triton's ptxas, carried in the kernel protos (its version unknown: {exc})"


def unavailable_reason() -> str | None:
    """None once ``install()`` has put the hook in place; otherwise why not (also before install)."""
    return _REASON[0] if _REASON else "install() has not run"


@functools.lru_cache(maxsize=None)
def install() -> None:
    """Wrap jax-triton's CUDA lowering (idempotent). Where jax-triton's internals moved or jaxlib
    cannot take an image, nothing is installed and ``unavailable_reason`` says why: JAX's route
    then runs what jaxlib assembles, as before."""
    try:
        problems = signature_problems()
        reason = "; ".join(problems) if problems else jaxlib_problem()
        if reason is None:
            from jax.interpreters import mlir

            from qsa_jax import config
            from qsa_jax.ops._triton_support import import_jax_triton

            import_jax_triton()
            from jax_triton import triton_lib as lib

            original = (registered_rule(lib.triton_kernel_call_p, "cuda")
                        or functools.partial(lib.triton_kernel_call_lowering, lib.get_cuda_backend))
            mlir.register_lowering(lib.triton_kernel_call_p,
                                   # looked up at each lowering, so that tests and the benchmark can switch it
                                   with_images(original, enabled=lambda: config.jax_triton_images_from_triton_ptxas()),
                                   platform="cuda")
    except Exception as exc:  # never in the way of a launch: jaxlib then assembles, as before
        reason = f"the hook could not be installed ({type(exc).__name__}: {exc})"
    _REASON[:] = [reason]
