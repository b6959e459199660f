"""``qsa_jax.ops._triton_images``: JAX's launches carry the cubin Triton's ptxas makes.

CPU: jax-triton's private API is where the hook expects it (and the checker notices each
change), the proto edit against bytes written out by hand, and the lowering wrapper on a
stand-in primitive lowered for the CPU. GPU (marker ``gpu``): jaxlib loads the image the
proto carries (a wrong image fails the launch), and the image is the one Triton's launcher
makes for the same kernel.
"""

from __future__ import annotations

import zlib

import pytest

from qsa_jax.ops import _triton_images as T
from qsa_testing.stack import pinned_version

# A TritonAnyKernelCall written out by hand (jaxlib/gpu/triton.proto field numbers):
#   TritonKernel      {kernel_name 1: "k", num_warps 2: 4, shared_mem_bytes 3: 16, ptx 4: "P",
#                      compute_capability 6: 90}
#   TritonKernelCall  {kernel 1: <kernel>, grid_0 2: 3}
#   TritonAnyKernelCall {kernel_call 1: <call>, name 4: "n"}
KERNEL = bytes.fromhex("0a016b" "1004" "1810" "220150" "305a")
CALL = bytes.fromhex("0a0c") + KERNEL + bytes.fromhex("1003")
ANY = bytes.fromhex("0a10") + CALL + bytes.fromhex("22016e")
# The same with ModuleImageProto {object_file 1: "ELF", kernel_name 2: "k", shared_mem_bytes 3: 16}
# as the kernel's field 11 (key 0x5a), every enclosing length grown by its 12 bytes.
IMAGE = bytes.fromhex("0a03454c46" "12016b" "1810")
ANY_WITH_IMAGE = (bytes.fromhex("0a1c") + bytes.fromhex("0a18") + KERNEL + bytes.fromhex("5a0a") + IMAGE
                  + bytes.fromhex("1003") + bytes.fromhex("22016e"))


def test_hand_written_proto_is_what_the_reader_sees():
    assert T.kernel_fields(ANY) == {1: b"k", 2: 4, 3: 16, 4: b"P", 6: 90}


def test_with_image_writes_the_bytes_worked_out_by_hand():
    calls = []

    def assemble(ptx, cc):
        calls.append((ptx, cc))
        return b"ELF"

    assert T.with_image(ANY, assemble) == ANY_WITH_IMAGE
    assert calls == [("P", 90)]
    fields = T.kernel_fields(ANY_WITH_IMAGE)
    assert fields[T.KERNEL_MODULE_IMAGE] == IMAGE


def test_with_image_leaves_autotuned_calls_and_kernels_with_an_image():
    autotuned = bytes.fromhex("1200") + bytes.fromhex("22016e")  # TritonAnyKernelCall {autotuned 2: {}}
    assert T.with_image(autotuned, lambda ptx, cc: b"ELF") is None
    assert T.with_image(ANY_WITH_IMAGE, lambda ptx, cc: pytest.fail("assembled twice")) is None


def test_with_image_round_trips_long_fields():
    """Multi-byte lengths (a real PTX is ~100 KB and a cubin as large) survive the edit."""
    ptx, image = "P" * 200_000, bytes(range(256)) * 700
    kernel = (T._len_field(1, b"sparse_attention_split_kernel") + T._varint_field(2, 1)
              + T._varint_field(3, 70_000) + T._len_field(4, ptx.encode()) + T._varint_field(6, 90))
    call = T._len_field(1, kernel) + T._varint_field(2, 132) + T._len_field(5, b"\x08\x00")
    proto = T._len_field(1, call) + T._len_field(3, b"meta") + T._len_field(4, b"qsa_sparse_attention_split")
    patched = T.with_image(proto, lambda p, cc: image if (p, cc) == (ptx, 90) else b"wrong")
    fields = T.kernel_fields(patched)
    assert fields[T.KERNEL_PTX] == ptx.encode() and fields[T.KERNEL_SHARED_MEM] == 70_000
    assert {n: v for n, v, _ in T._fields(fields[T.KERNEL_MODULE_IMAGE])} == {
        1: image, 2: b"sparse_attention_split_kernel", 3: 70_000}
    # Everything beside the kernel is kept, in order.
    top = [(n, v) for n, v, _ in T._fields(patched)]
    assert top[1:] == [(3, b"meta"), (4, b"qsa_sparse_attention_split")]
    call_fields = [(n, v) for n, v, _ in T._fields(top[0][1])]
    assert call_fields[1:] == [(2, 132), (5, b"\x08\x00")]


def test_a_truncated_proto_is_an_error_not_a_guess():
    with pytest.raises(ValueError, match="past the end"):
        T.kernel_fields(ANY[:10])  # the kernel call's length promises more bytes than follow
    with pytest.raises(ValueError, match="truncated varint"):
        T.kernel_fields(ANY[:-2])  # the name's key with no length


def test_malformed_or_unexpected_protos():
    with pytest.raises(ValueError, match="negative"):
        T._varint(-1)
    with pytest.raises(ValueError, match="field number 0"):
        T.kernel_fields(bytes.fromhex("0001"))  # key 0: field 0, varint
    # A fixed32 where the kernel call should be is not read as a message.
    assert T.kernel_fields(bytes.fromhex("0d01020304")) is None
    assert T.with_image(bytes.fromhex("0d01020304"), lambda ptx, cc: b"ELF") is None
    # A repeated kernel call (proto3 would merge the two): left alone rather than guessed at.
    assert T.with_image(ANY[:-3] + ANY[:-3], lambda ptx, cc: b"ELF") is None
    # A kernel without PTX: nothing to assemble.
    no_ptx = bytes.fromhex("0a0b") + bytes.fromhex("0a09") + bytes.fromhex("0a016b" "1004" "1810" "305a")
    assert T.with_image(no_ptx, lambda ptx, cc: pytest.fail("assembled without PTX")) is None


# ------------------------------------------------------------------------ the register cap

# A one-entry PTX as Triton writes it (header, parameters, .reqntid, body).
SMALL_PTX = (".version 8.7\n.target sm_90a\n.address_size 64\n\n.visible .entry k(\n"
             "\t.param .u64 .ptr .global .align 1 k_param_0\n)\n.reqntid 32\n{\n\tret;\n\n}\n")


def _proto_with_ptx(ptx: str) -> bytes:
    kernel = T._len_field(1, b"k") + T._varint_field(2, 1) + T._len_field(4, ptx.encode()) + T._varint_field(6, 90)
    return T._len_field(1, T._len_field(1, kernel) + T._varint_field(2, 3)) + T._len_field(4, b"n")


def test_with_max_registers_places_and_replaces_the_directive():
    capped = T.with_max_registers(SMALL_PTX, 200)
    assert capped == SMALL_PTX.replace(".reqntid 32\n{", ".reqntid 32\n.maxnreg 200\n{")
    assert T.with_max_registers(capped, 168) == SMALL_PTX.replace(".reqntid 32\n{", ".reqntid 32\n.maxnreg 168\n{")
    for bad in (0, 15, 256):
        with pytest.raises(ValueError, match="16-255"):
            T.with_max_registers(SMALL_PTX, bad)
    with pytest.raises(ValueError, match="one .entry"):
        T.with_max_registers(SMALL_PTX + SMALL_PTX[SMALL_PTX.index(".visible"):], 200)


def test_with_image_writes_the_cap_into_the_ptx_it_assembles_and_carries():
    proto = _proto_with_ptx(SMALL_PTX)
    capped = T.with_max_registers(SMALL_PTX, 224)
    # No image (the switch off): the PTX field alone changes, so jaxlib assembles the capped PTX.
    fields = T.kernel_fields(T.with_image(proto, None, 224))
    assert fields[T.KERNEL_PTX] == capped.encode() and T.KERNEL_MODULE_IMAGE not in fields
    assert T.with_image(proto, None) is None  # nothing asked: nothing to do
    seen = []
    fields = T.kernel_fields(T.with_image(proto, lambda ptx, cc: seen.append(ptx) or b"ELF", 224))
    assert seen == [capped] and fields[T.KERNEL_PTX] == capped.encode()
    assert {n: v for n, v, _ in T._fields(fields[T.KERNEL_MODULE_IMAGE])}[T.IMAGE_OBJECT_FILE] == b"ELF"


def _sm90_split_kernel(maxnreg=None):
    """The split kernel at the fp8 table's one-split, one-warp launch (TP4, 32-wide tiles),
    compiled for sm_90 on the CPU with Triton's own ``maxnreg`` option (None: none)."""
    pytest.importorskip("triton")
    import os
    import sys

    import triton

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
    import sm90_split_kernel_ab as A

    from bench import inputs

    compile_ = triton.compile
    try:
        if maxnreg:
            triton.compile = lambda src, target=None, options=None: compile_(
                src, target=target, options=dict(options, maxnreg=maxnreg))
        return A, A.ours(inputs.geometry("TP4", cpu=True, pool_gb=0.01), 2048, 32, 1, 1, "jax-triton", fp8=True)
    finally:
        triton.compile = compile_


def test_the_cap_is_tritons_own_directive_and_ptxas_keeps_to_it(tmp_path):
    """JAX's route writes the directive Triton's launcher would (the torch route passes Triton
    ``maxnreg``): the edited PTX of the uncapped kernel is the capped kernel's PTX, character
    for character; and ptxas allocates no more than the cap where the kernel wants more."""
    A, plain = _sm90_split_kernel()
    _, capped = _sm90_split_kernel(224)
    assert T.with_max_registers(plain.asm["ptx"], 224) == capped.asm["ptx"]
    try:
        ptxas = A.ptxas_path()
    except IndexError:
        pytest.skip("Triton's bundled ptxas is not installed here")
    registers = {}
    for name, ptx in (("plain", plain.asm["ptx"]), ("capped", T.with_max_registers(plain.asm["ptx"], 224))):
        (tmp_path / f"{name}.ptx").write_text(ptx)
        registers[name] = int(A.P.ptxas_info(ptxas, str(tmp_path / f"{name}.ptx"))["registers"])
    assert registers["plain"] > 224 >= registers["capped"], registers


# ------------------------------------------------------------------------ the lowering wrapper


def _custom_call_protos(module):
    from jax.interpreters.mlir import ir

    found = []

    def visit(op):
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    inner = inner.operation
                    if inner.name == "stablehlo.custom_call":
                        found.append(zlib.decompress(ir.StringAttr(inner.attributes["backend_config"]).value_bytes))
                    visit(inner)

    visit(module.operation)
    return found


def test_lowering_wrapper_edits_only_our_kernels_and_only_while_enabled():
    """A stand-in for jax-triton's primitive, lowered on the CPU to a custom call whose
    backend_config is the hand-written proto, compressed as jax-triton compresses it."""
    import jax
    import jax.numpy as jnp
    from jax.extend.core import Primitive
    from jax.interpreters import mlir

    prim = Primitive("qsa_test_triton_kernel_call")
    prim.def_abstract_eval(lambda x, **_: jax.core.ShapedArray(x.shape, x.dtype))

    def original(ctx, x, *, fn, enable_fp_fusion, grid):
        return jax.ffi.ffi_lowering("qsa_test_target", api_version=2, backend_config=zlib.compress(ANY))(ctx, x)

    state = {"enabled": True}
    assembled = []

    def assemble(ptx, cc, enable_fp_fusion):
        assembled.append((ptx, cc, enable_fp_fusion))
        return b"ELF"

    mlir.register_lowering(prim, T.with_images(original, enabled=lambda: state["enabled"], assemble=assemble,
                                               ours=lambda fn: fn == "ours"), platform="cpu")

    def lowered(fn, fusion=True):
        f = jax.jit(lambda x: prim.bind(x, fn=fn, enable_fp_fusion=fusion, grid=(1, 1, 1)))
        return _custom_call_protos(f.lower(jnp.ones(4)).compiler_ir("stablehlo"))

    assert lowered("ours", fusion=False) == [ANY_WITH_IMAGE]
    assert assembled == [("P", 90, False)]
    assert lowered("theirs") == [ANY]  # another library's kernel: as jax-triton lowered it
    state["enabled"] = False
    assert lowered("ours") == [ANY]  # switched off: read at lowering
    assert len(assembled) == 1

    # An assembler that fails (ptxas missing or erroring) leaves jax-triton's proto, with a warning.
    def failing(ptx, cc, enable_fp_fusion):
        raise RuntimeError("Cannot find ptxas")

    mlir.register_lowering(prim, T.with_images(original, enabled=lambda: True, assemble=failing,
                                               ours=lambda fn: True), platform="cpu")
    with pytest.warns(RuntimeWarning, match="keeps jaxlib's own assembly.*Cannot find ptxas"):
        assert lowered("ours") == [ANY]


def test_lowering_wrapper_takes_maxnreg_into_the_ptx():
    """Triton's ``maxnreg`` option (``config.triton_fp8_register_cap``) never reaches jax-triton's
    lowering (which would take it for a kernel argument): the wrapper takes it out and writes
    it into our kernel's PTX, with the image or (switched off) without; where it cannot, the
    lowering raises instead of launching uncapped."""
    import jax
    import jax.numpy as jnp
    from jax.extend.core import Primitive
    from jax.interpreters import mlir

    prim = Primitive("qsa_test_triton_kernel_call_maxnreg")
    prim.def_abstract_eval(lambda x, **_: jax.core.ShapedArray(x.shape, x.dtype))
    state = {"enabled": True, "proto": _proto_with_ptx(SMALL_PTX)}

    def original(ctx, x, *, fn, enable_fp_fusion, grid):  # no maxnreg: jax-triton's has none
        return jax.ffi.ffi_lowering("qsa_test_target", api_version=2,
                                    backend_config=zlib.compress(state["proto"]))(ctx, x)

    assembled = []
    mlir.register_lowering(prim, T.with_images(original, enabled=lambda: state["enabled"],
                                               assemble=lambda ptx, cc, fusion: assembled.append(ptx) or b"ELF",
                                               ours=lambda fn: fn == "ours"), platform="cpu")

    def lowered(**params):
        f = jax.jit(lambda x: prim.bind(x, fn="ours", enable_fp_fusion=True, grid=(1, 1, 1), **params))
        return [T.kernel_fields(p) for p in _custom_call_protos(f.lower(jnp.ones(4)).compiler_ir("stablehlo"))]

    capped = T.with_max_registers(SMALL_PTX, 200)
    [fields] = lowered(maxnreg=200)
    assert fields[T.KERNEL_PTX] == capped.encode() and assembled == [capped]
    state["enabled"] = False
    [fields] = lowered(maxnreg=200)
    assert fields[T.KERNEL_PTX] == capped.encode() and T.KERNEL_MODULE_IMAGE not in fields
    [fields] = lowered()
    assert fields[T.KERNEL_PTX] == SMALL_PTX.encode()
    # ptxas failing: the capped PTX alone (jaxlib assembles it), with a warning, never uncapped.
    def failing(ptx, cc, fusion):
        raise RuntimeError("Cannot find ptxas")

    mlir.register_lowering(prim, T.with_images(original, enabled=lambda: True, assemble=failing,
                                               ours=lambda fn: fn == "ours"), platform="cpu")
    with pytest.warns(RuntimeWarning, match="capped PTX.*Cannot find ptxas"):
        [fields] = lowered(maxnreg=200)
    assert fields[T.KERNEL_PTX] == capped.encode() and T.KERNEL_MODULE_IMAGE not in fields
    state["proto"] = ANY  # its PTX ("P") has no entry to cap
    with pytest.raises(RuntimeError, match="maxnreg=200 could not be put"):
        lowered(maxnreg=200)


def test_registered_rule_reads_jaxs_lowering_registry():
    """install() wraps the rule in place (jax's private registry): this fails when it moves."""
    from jax.extend.core import Primitive
    from jax.interpreters import mlir

    prim = Primitive("qsa_test_registry")

    def rule(ctx, x):
        return [x]

    assert T.registered_rule(prim, "cpu") is None
    mlir.register_lowering(prim, rule, platform="cpu")
    assert T.registered_rule(prim, "cpu") is rule
    assert T.registered_rule(prim, "cuda") is None


def test_jaxlib_without_the_instantiate_stage_is_named(monkeypatch):
    """Feature detection: jaxlib's module-image support came with the Triton FFI handler's
    ``instantiate`` stage (jax-ml/jax d35d53a); without it nothing is installed."""
    import types

    from jaxlib import gpu_triton

    old = types.SimpleNamespace(registrations=lambda: {"triton_kernel_call_ffi": {"initialize": 1, "execute": 2}})
    monkeypatch.setattr(gpu_triton, "_cuda_triton", old, raising=False)
    assert "predates pre-assembled" in T.jaxlib_problem()
    new = types.SimpleNamespace(registrations=lambda: {"triton_kernel_call_ffi": {"instantiate": 0, "execute": 2}})
    monkeypatch.setattr(gpu_triton, "_cuda_triton", new, raising=False)
    assert T.jaxlib_problem() is None


def test_is_ours_knows_the_package_kernels():
    from qsa_jax.ops.sparse_attention import triton_kernels as K

    assert T.is_ours(K.sparse_attention_split_kernel) and T.is_ours(K.sparse_attention_merge_kernel)
    assert not T.is_ours(pytest.fail) and not T.is_ours(None)


def test_install_never_raises_and_says_why_not_here():
    T.install()
    reason = T.unavailable_reason()
    import jax

    if jax.default_backend() == "cpu":
        assert reason  # the jaxlib without CUDA, or (jax-triton 0.4.1) the moved internals


def test_another_jax_triton_is_not_hooked():
    """Beside a jax-triton other than the pinned one (0.4.1 with triton >= 3.7: its lowering takes
    other arguments and builds its backend config differently), the checker names the moved
    internals, so install() puts nothing in place and jaxlib assembles as before. Runs in the
    torch 2.14 CI step (tools/check_vllm_pins.sh), whose venv has jax-triton 0.4.1."""
    import importlib.metadata
    import importlib.util

    if importlib.util.find_spec("jax_triton") is None:
        pytest.skip("jax-triton is not installed")
    installed, pinned = importlib.metadata.version("jax-triton"), pinned_version("jax-triton")
    if installed == pinned:
        pytest.skip(f"this is the pinned jax-triton {pinned}: the hook's own test covers it")
    problems = T.signature_problems()
    assert problems, f"jax-triton {installed}'s lowering passes the checker written for {pinned}"
    T.install()
    assert T.unavailable_reason()


# ------------------------------------------------------------------------ jax-triton's private API


def test_jax_triton_private_api_is_where_the_hook_expects():
    """The checker passes on the tested jax-triton and notices each change the hook depends on."""
    import importlib.metadata

    import importlib.util
    import os

    spec = importlib.util.find_spec("jax_triton")  # not imported: it refuses to without a GPU
    if spec is None:
        pytest.skip("jax-triton is not installed")
    with open(os.path.join(list(spec.submodule_search_locations)[0], "triton_lib.py")) as f:
        source = f.read()
    installed, pinned = importlib.metadata.version("jax-triton"), pinned_version("jax-triton")
    if installed != pinned:
        pytest.skip(f"the hook is written for jax-triton {pinned} (tools/constraints.txt), this is {installed}")
    assert T.signature_problems(source) == []
    broken = {
        "renamed": source.replace("def triton_kernel_call_lowering(", "def kernel_call_lowering("),
        "keyword": source.replace("    enable_fp_fusion,\n    input_output_aliases,",
                                  "    fp_fusion,\n    input_output_aliases,"),
        "to_proto": source.replace("kernel_call.to_proto(", "kernel_call.serialize("),
        "config": source.replace("backend_config=zlib.compress(call_proto)", "backend_config=call_proto"),
        "return": source.replace("  return rule(ctx, *array_args)", "  return rule(ctx, *array_args)[0]"),
        "registration": source.replace("functools.partial(triton_kernel_call_lowering, get_cuda_backend),\n"
                                       "    platform=\"cuda\"", "functools.partial(triton_kernel_call_lowering, "
                                       "get_cuda_backend),\n    platform=\"gpu\""),
    }
    for what, text in broken.items():
        assert text != source, f"the {what!r} edit no longer applies to this jax-triton's source"
        assert T.signature_problems(text), what


def test_the_switch_is_on():
    from qsa_jax import config

    assert config.jax_triton_images_from_triton_ptxas() is True


# ------------------------------------------------------------------------ GPU


def _hook_or_skip():
    T.install()
    if T.unavailable_reason() is not None:
        pytest.skip(f"the image hook is not installed here: {T.unavailable_reason()}")


@pytest.mark.gpu
def test_gpu_jax_route_carries_triton_assembled_images():
    """Every kernel of the Triton implementation's lowering (split and merge) carries an ELF image
    under its own name, and the launch agrees with the XLA reference. That the image equals the
    cubin Triton's launcher runs: tests/test_shim_direct.py, against the shim's torch route."""
    import jax
    import numpy as np

    import qsa_jax
    from qsa_testing import cases as C
    from qsa_testing.agreement import assert_fidelity

    _hook_or_skip()
    case = C.gpu_kernel_case(8, num_query_heads=24, num_kv_heads=2)
    args = (case.q, case.kv_cache, case.logical_indices, case.block_table, case.token_to_req, case.output_gate)
    run = jax.jit(lambda *a: qsa_jax.sparse_attention(*a, implementation="triton"))
    protos = [p for p in _custom_call_protos(run.lower(*args).compiler_ir("stablehlo"))
              if T.kernel_fields(p) is not None]
    assert len(protos) == 2, "expected the split and the merge kernel (8 rows split the selection)"
    for proto in protos:
        fields = T.kernel_fields(proto)
        image = {n: v for n, v, _ in T._fields(fields[T.KERNEL_MODULE_IMAGE])}
        assert image[T.IMAGE_OBJECT_FILE][:4] == b"\x7fELF" and len(image[T.IMAGE_OBJECT_FILE]) > 4096
        assert image[T.IMAGE_KERNEL_NAME] == fields[T.KERNEL_NAME]
        assert image.get(T.IMAGE_SHARED_MEM, 0) == fields.get(T.KERNEL_SHARED_MEM, 0)
    got = np.asarray(run(*args))
    want = np.asarray(qsa_jax.sparse_attention(*args, implementation="xla"))
    assert_fidelity(got, want, what="gpu triton with Triton-assembled images")


@pytest.mark.gpu
def test_gpu_jaxlib_launches_the_carried_image():
    """A wrong image (ELF magic, then no cubin) makes the launch fail: jaxlib loads the bytes the
    proto carries instead of assembling the PTX. store_cache_rows at a width used nowhere else,
    so that jaxlib has not cached an image of this kernel earlier in the process."""
    import functools

    import jax
    import jax.numpy as jnp
    from jax.interpreters import mlir
    from jax_triton import triton_lib as lib

    import qsa_jax
    from qsa_jax import config

    _hook_or_skip()
    installed = T.registered_rule(lib.triton_kernel_call_p, "cuda")
    original = functools.partial(lib.triton_kernel_call_lowering, lib.get_cuda_backend)
    mlir.register_lowering(lib.triton_kernel_call_p, T.with_images(
        original, enabled=lambda: config.jax_triton_images_from_triton_ptxas(),
        assemble=lambda ptx, cc, fusion: b"\x7fELF not a cubin"), platform="cuda")
    try:
        width = 328  # a row width no other test stores
        cache = jax.random.normal(jax.random.key(0), (4, 16, 1, width), jnp.float32).astype(jnp.bfloat16)
        rows = jax.random.normal(jax.random.key(1), (3, width), jnp.float32).astype(jnp.bfloat16)
        slots = jnp.array([1, 17, 40], jnp.int32)
        with pytest.raises(Exception, match="(?i)module|image"):
            jax.block_until_ready(qsa_jax.store_cache_rows(cache, slots, rows, implementation="triton"))
    finally:
        mlir.register_lowering(lib.triton_kernel_call_p, installed, platform="cuda")


def test_assembler_in_use_names_the_assembler(monkeypatch):
    """What the benchmark records: XLA's ptxas with the reason where the hook is not in place or
    switched off, Triton's ptxas (path and release) where it is."""
    from qsa_jax import config

    monkeypatch.setattr(T, "install", lambda: None)  # the real one would overwrite the patched reason
    monkeypatch.setattr(T, "_REASON", ["this jaxlib predates pre-assembled Triton images"])
    assert T.assembler_in_use() == "jaxlib's (XLA's ptxas): this jaxlib predates pre-assembled Triton images"
    monkeypatch.setattr(T, "_REASON", [None])
    monkeypatch.setattr(config, "jax_triton_images_from_triton_ptxas", lambda: False)
    assert "is off" in T.assembler_in_use()
    monkeypatch.setattr(config, "jax_triton_images_from_triton_ptxas", lambda: True)
    text = T.assembler_in_use()
    assert text.startswith("Triton's ptxas ") and "carried in the kernel protos" in text
    import re

    assert re.match(r"Triton's ptxas \d+\.\d+ \(", text), text  # the release ptxas reports


def test_bench_report_names_the_assembler():
    """The results header names the assembler where the run recorded it, and old results
    (without the field) render as before."""
    import dataclasses
    import pathlib

    from bench import report
    from bench.records import load

    repo = pathlib.Path(__file__).resolve().parents[1]
    run = load(repo / "bench/results/nvidia-h100_2026-12-06/session28/call_c/images/results.json")
    assert "assembled by" not in report.markdown(run)
    machine = {**run.machine, "jax_triton_assembler": "Triton's ptxas 12.8 (/x/ptxas), carried in the kernel protos"}
    md = report.markdown(dataclasses.replace(run, machine=machine))
    assert "- jax-triton kernels under JAX assembled by: Triton's ptxas 12.8 (/x/ptxas)" in md
