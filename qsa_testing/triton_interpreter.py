"""Running Triton kernels on CPU through Triton's interpreter (test support, not installed).

Two users: the jax-triton kernels of this package (tests/test_triton.py) and the originals
themselves (tests/test_originals_interpreter.py), both at reduced sizes. Triton 3.6's
interpreter, under NumPy 2, gets five things wrong that these kernels rely on, and runs no
inline PTX;
``patch_interpreter`` fixes them for the current process, at test time (nothing of Triton is
vendored or edited on disk):

* a scalar tensor used as a loop bound has no ``__index__``;
* bf16 ``tl.dot`` multiplies the raw 16-bit patterns instead of the values;
* fp32 -> bf16 casts truncate where the GPU rounds to nearest even;
* a comparison keeps its left operand's dtype (an fp32 0/1 array), so ``mask & (x > y)``
  with a float ``x`` fails in NumPy (the originals' split merge does exactly that);
* e4m3 (``float8e4nv``) NaN, the codes 0x7F and 0xFF, converts to +-480 (the bit arithmetic
  reads it as a normal number) where the GPU's conversion gives NaN, so NaN poison in an fp8
  cache is invisible to a stray read (a load without its mask passed the fp8 cases);
* ``tl.inline_asm_elementwise`` raises: the one block the jax-triton kernels use
  (``triton_kernels.E4M3X4_TO_F16X4_PTX``, e4m3 bytes -> fp16, sm_89+'s pair conversion) is
  computed here from the bytes as the GPU converts them (the NaN codes to a NaN, its payload
  aside); any other block still raises.
  Only the plumbing around it is tested that way: whether the PTX does what this emulation
  says is for the GPU to show (tools/fp8_kernel_ab.py compares the knob's output with the
  plain kernel's: identical at 16-wide tiles on an H100, session 19).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import types

import numpy as np

_PATCHED = False


def patch_interpreter() -> None:
    """Apply the fixes above (idempotent; affects interpreter mode only)."""
    global _PATCHED
    if _PATCHED:
        return
    import ml_dtypes
    import triton.language as tl
    import triton.runtime.interpreter as ti

    patch_tensor = ti._patch_lang_tensor

    def patched(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    ti._patch_lang_tensor = patched

    def as_f32(data):
        return (np.asarray(data).view(np.uint16).astype(np.uint32) << 16).view(np.float32)

    dot = ti.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.scalar == tl.bfloat16:
            return ti.TensorHandle(np.matmul(as_f32(a.data), as_f32(b.data), dtype=np.float32) + d.data,
                                   d.dtype.scalar)
        return dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    ti.InterpreterBuilder.create_dot = create_dot
    cast = ti.InterpreterBuilder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return ti.TensorHandle(np.asarray(src.data, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16),
                                   dst_type.scalar)
        return cast(self, src, dst_type)

    ti.InterpreterBuilder.cast_impl = cast_impl

    def boolean(compare):
        def create(self, lhs, rhs):
            return ti.TensorHandle(np.asarray(compare(self, lhs, rhs).data).astype(np.bool_), tl.int1)
        return create

    for name in dir(ti.InterpreterBuilder):
        if name.startswith(("create_icmp", "create_fcmp")):
            setattr(ti.InterpreterBuilder, name, boolean(getattr(ti.InterpreterBuilder, name)))

    convert = ti._convert_float  # every float conversion of the interpreter goes through it
    float_of_bits = {16: np.float16, 32: np.float32}

    def convert_float(input, input_dtype, output_dtype, rounding_mode):
        out = convert(input, input_dtype, output_dtype, rounding_mode)
        if input_dtype == tl.float8e4nv:
            nan = (np.frombuffer(np.ascontiguousarray(input).tobytes(), np.uint8) & 0x7F) == 0x7F
            if nan.any():
                as_float = (ml_dtypes.bfloat16 if output_dtype == tl.bfloat16
                            else float_of_bits[output_dtype.primitive_bitwidth])
                out = out.copy()
                out.reshape(-1)[nan] = np.array(np.nan, as_float).view(out.dtype)
        return out

    ti._convert_float = convert_float

    def create_inline_asm(self, inline_asm, constraints, values, result_types, is_pure, pack):
        # Imported here, not above: the kernels module must be first imported under the
        # interpreter's environment by whoever runs its kernels (a kernel calling this has been).
        from qsa_jax.ops.sparse_attention.triton_kernels import E4M3X4_TO_F16X4_PTX

        if inline_asm != E4M3X4_TO_F16X4_PTX.value or pack != 4 or len(values) != 1:
            raise NotImplementedError("inline_asm not supported in interpreter mode "
                                      "(qsa_testing emulates E4M3X4_TO_F16X4_PTX only)")
        codes = np.ascontiguousarray(values[0].data).view(np.uint8)
        result = ti.TensorHandle(codes.view(ml_dtypes.float8_e4m3fn).astype(np.float16), tl.float16)
        return types.SimpleNamespace(get_result=lambda i: result)

    ti.InterpreterBuilder.create_inline_asm = create_inline_asm
    _PATCHED = True


@contextlib.contextmanager
def _interpret_env():
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"  # read by @triton.jit when a module is executed
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = before


def interpreted_originals() -> types.ModuleType:
    """The originals (vLLM 0.30.0) with every kernel in Triton's interpreter.

    Needs a process that imported triton with ``TRITON_INTERPRET=1`` already set (or not at
    all yet): Triton's own library functions (``tl.zeros``, ``tl.sigmoid``, ...) are made
    interpretable only at its import. A compiled copy of the originals already loaded in this
    process stays as it is. Raises ``OriginalsUnavailable``.
    """
    from qsa_testing import originals

    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("interpreted_originals() needs a fresh process with TRITON_INTERPRET=1 set "
                           "before triton is imported")
    key = originals.module_name() + "_interpreted"
    if key in sys.modules:
        return sys.modules[key]
    patch_interpreter()
    compiled = sys.modules.pop(originals.module_name(), None)
    try:
        with _interpret_env():
            module = originals.load()
    finally:
        sys.modules.pop(originals.module_name(), None)
        if compiled is not None:
            sys.modules[originals.module_name()] = compiled
    sys.modules[key] = module
    return module


def on_device(t):
    """``t`` (a CPU torch tensor) as one whose ``is_cuda`` says True.

    The originals' store and compress wrappers refuse non-CUDA tensors before launching; the
    interpreter itself runs on host memory. Only that one attribute differs.
    """
    return t.as_subclass(_device_tensor_class())


@functools.lru_cache(maxsize=None)
def _device_tensor_class():
    import torch

    class InterpretedDeviceTensor(torch.Tensor):
        is_cuda = True

    return InterpretedDeviceTensor
