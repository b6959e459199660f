"""The operators inside a caller's ``jax.shard_map`` (qsa_jax/ops/_vma.py).

Forced host devices are process-wide, so the checks run in one subprocess
(qsa_testing/shard_map_checks.py, its docstring lists them): results and gradients bit
for bit against the shards' one-device calls with JAX's default ``check_vma=True``, the
replicated cache's cotangent summed in fp32, per-device problems of all three operators,
the results' types, Pallas lowered for CUDA, and the CPU interpreter's refusal.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from qsa_testing.sharding_checks import run_with_forced_devices


@pytest.fixture(scope="module")
def results():
    return {r["name"]: r for r in run_with_forced_devices("qsa_testing.shard_map_checks")}


def test_every_case_passes(results):
    failed = {name: r["problem"] for name, r in results.items() if r["problem"]}
    assert not failed, json.dumps(failed, indent=1)


@pytest.mark.parametrize("name", [
    *(f"sparse_attention/xla/{layout}/{kv}/check_vma=True" for layout in ("heads", "rows", "rows2xheads2")
      for kv in ("fused", "split")),
    "sparse_attention/xla/rows/split/check_vma=False", "sparse_attention/xla/rows2xheads2/fp8-scaled",
    "sparse_attention/xla/fp8-scaled-grad/manual/check_vma=True",
    "sparse_attention/xla/fp8-scaled-grad/manual/check_vma=False",
    "sparse_attention/xla/fp8-scaled-grad/explicit-partly-manual",
    "sparse_attention/xla/out_specs-refused", "sparse_attention/xla/empty-batch-typed",
    "compress/xla/empty-batch-typed", "store/xla/empty-batch-typed",
    "per-device/sparse_attention/xla", "per-device/compress/xla", "per-device/store/xla",
    "per-device/sparse_attention/xla/shared-queries-vjp", "per-device/compress/xla/shared-state-cache",
    "per-device/store/xla/shared-cache",
    "second-order/xla/rows",
    "sparse_attention/xla/partly-automatic/heads-over-nothing/rows-split/check_vma=True",
    *(f"sparse_attention/xla/partly-automatic/heads-over-model/{run}" for run in
      ("rows-split/check_vma=True", "rows-split/check_vma=False", "rows-whole/check_vma=True")),
    *(f"sparse_attention/xla/explicit-partly-manual/{run}" for run in
      ("check_vma=True", "check_vma=False", "out_specs-refused", "vjp-refused")),
    "pallas/interpreter-refused", "pallas/jax-interpreter-limitation-still-present",
    "pallas/cuda-lowering/sparse_attention-rows2xheads2", "pallas/cuda-lowering/out_specs-refused",
    "pallas/cuda-lowering/indexer-operators",
    "pallas/cuda-lowering/aliased-input-typed",
])
def test_case_ran(results, name):
    assert name in results, f"{name} did not run"


def test_jax_triton_outputs_typed(results):
    traced = {n: r for n, r in results.items() if n.startswith("triton/")}
    skipped = [r["skipped"] for r in traced.values() if r.get("skipped")]
    if skipped:
        pytest.skip(skipped[0])
    assert {"triton/traced/sparse_attention-rows", "triton/traced/store-out_specs-refused"} <= set(traced)


@pytest.mark.gpu
@pytest.mark.parametrize("implementation", ["pallas", "triton"])
def test_kernels_inside_shard_map_gpu(implementation):
    """On the GPU the kernels run inside shard_map with the check on (jax-triton's outputs typed
    by the operator): the forward and the vjp on a one-device mesh equal the plain calls (bit
    for bit but dq, whose splits add atomically)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    import qsa_jax
    from qsa_testing.cases import gpu_kernel_case

    if jax.default_backend() != "gpu":
        pytest.skip("needs a GPU")
    case = gpu_kernel_case(64, num_query_heads=24, num_kv_heads=2)
    args = tuple(jnp.asarray(x) for x in (case.q, case.kv_cache, case.logical_indices, case.block_table,
                                          case.token_to_req, case.output_gate))
    d_out = jnp.asarray(np.random.default_rng(1).standard_normal(case.q.shape), jnp.bfloat16)
    mesh = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))

    def call(q, kv, g, li, bt, t2r):
        return qsa_jax.sparse_attention(q, kv, li, bt, t2r, g, implementation=implementation)

    mapped = jax.shard_map(call, mesh=mesh, in_specs=(P("data"), P(), P("data"), P("data"), P(), P("data")),
                           out_specs=P("data"))
    q, kv, li, bt, t2r, g = args

    def vjp(fn):
        out, pull = jax.vjp(lambda q, kv, g: fn(q, kv, g, li, bt, t2r), q, kv, g)
        return (out, *pull(d_out))

    got, want = vjp(mapped), vjp(call)
    for label, a, b in zip(("output", "dq", "dkv", "dgate"), got, want):
        if label == "dq":  # atomics across splits: the same sums in a possibly different order
            np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=2e-2, atol=1e-3)
        else:
            np.testing.assert_array_equal(np.asarray(a).view(np.uint16), np.asarray(b).view(np.uint16), label)
