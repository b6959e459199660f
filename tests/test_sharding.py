"""The operators on a device mesh (qsa_jax/ops/_sharding.py).

The checks need 8 devices; forcing host devices is a process-wide XLA flag,
so they run in one subprocess (qsa_testing/sharding_checks.py) and the rest of
the suite keeps its single device. Each supported layout at 2, 4 and 8 devices
must be bit-identical to the one-device call with the shard's tiling and
compile to a program without collectives; each unsupported layout must raise
naming the argument. Gradients (jax.vjp) and fp8 calls with k/v scales on a mesh
must equal the shards' own one-device calls, the cache cotangent summed over row
shards by the program's one collective, an all-reduce (which also sums the scales'
cotangents over row and head shards).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from qsa_testing.sharding_checks import ROOT, forced_devices_env, run_with_forced_devices


@pytest.fixture(scope="module")
def results():
    return run_with_forced_devices("qsa_testing.sharding_checks", "--pallas", timeout=600)


def test_every_case_passes(results):
    failed = {r["name"]: r["problem"] for r in results if r["problem"]}
    assert not failed, json.dumps(failed, indent=1)


@pytest.mark.parametrize("prefix", [
    *(f"sparse_attention/xla/{n}dev/" for n in (2, 4, 8)),
    *(f"compress/xla/{n}dev/" for n in (2, 4, 8)),
    *(f"store/xla/{n}dev/" for n in (2, 4, 8)),
    "sparse_attention/pallas/", "compress/pallas/", "store/pallas/", "bad/",
    *(f"vmap/xla/{x}" for x in ("heads", "batch2xheads2", "batch2xheads2/explicit", "batch4/explicit",
                                "rows2xheads2", "nested-2x2/heads", "store/pages-split", "compress/rows-split",
                                "StridedQuery/batch2", "batch-split-on-some", "gate-view-RDH/rows2",
                                "batch-and-rows-on-one-axis")),
    "bad/heads split, gate viewed as [R, D, H]/", "bad/mixed Explicit/Auto mesh/",
    *(f"whole-beside-split/{x}/{kind}/" for x in ("rows split, metadata and gate whole", "heads split, gate whole",
                                                  "rows and heads split, metadata and gate whole") for kind in ("auto", "explicit")),
    "bad/heads split, cache whole (KV heads dividing)/",
])
def test_layouts_covered(results, prefix):
    assert any(r["name"].startswith(prefix) for r in results), f"no case ran for {prefix}"


# The interpreter is slow: no Explicit mesh for pallas.
@pytest.mark.parametrize("implementation, suffix", [
    ("xla", "/vjp"), ("xla", "/vjp/explicit"), ("xla", "/fp8-scaled"), ("xla", "/fp8-scaled/explicit"),
    ("xla", "/fp8-scaled-vjp"), ("xla", "/fp8-scaled-vjp/explicit"),
    ("pallas", "/vjp"), ("pallas", "/fp8-scaled"), ("pallas", "/fp8-scaled-vjp")])
def test_gradient_and_scaled_cases_ran(results, implementation, suffix):
    """Mesh gradients and fp8 scaled calls ran with rows split (the all-reduce) and heads split."""
    names = [r["name"] for r in results if r["name"].startswith(f"sparse_attention/{implementation}/")
             and r["name"].endswith(suffix)]
    assert names, f"no {implementation} case ending in {suffix}"
    if suffix == "/vjp":
        assert any("/heads/" in n for n in names) and any("rows" in n for n in names), names


def test_set_mesh_cases_ran(results):
    names = {r["name"] for r in results}
    assert {"set_mesh/explicit/arguments-on-no-mesh", "set_mesh/auto/arguments-on-no-mesh"} <= names


def test_mesh_gradient_edge_layouts_ran(results):
    """Rows over two mesh axes with a flat gate (Auto and Explicit: the fp32 psum in the traced
    program), Pallas with split caches, a StridedQuery's vjp (its check runs the vjp too)."""
    names = {r["name"] for r in results}
    assert {"sparse_attention/xla/8dev/rows2x2xheads2-gate2d/fused/vjp",
            "sparse_attention/xla/8dev/rows2x2xheads2-gate2d/fused/vjp/explicit",
            "sparse_attention/pallas/2dev/heads/split/vjp",
            "sparse_attention/xla/2dev/StridedQuery-replicated"} <= names


def test_all_supported_attention_layouts_ran(results):
    names = {r["name"] for r in results}
    for layout in ("heads", "rows", "rows2xheads2", "rows4xheads2", "rows2xheads4"):
        assert any(f"/{layout}/" in n for n in names), layout
    assert {"compress/xla/4dev/rows4/explicit", "store/xla/4dev/pages-split/explicit"} <= names
    assert any(n.startswith("sparse_attention/") and n.endswith("/explicit") for n in names)
    assert any("/split" in n for n in names) and any("/fused" in n for n in names)


def test_multi_gpu_script_on_forced_cpu_devices(tmp_path):
    """tools/multi_gpu.py at reduced sizes on 4 host devices: runs, agrees, writes its report."""
    env = forced_devices_env(4)
    proc = subprocess.run([sys.executable, "tools/multi_gpu.py", "--small", "--rows", "1,8", "--out",
                           str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "multi_gpu.json").read_text())
    ran = [r for r in report["results"] if "skipped" not in r]
    assert report["devices"] == 4
    assert {r["mesh"] for r in ran if r["op"] == "sparse_attention"} == {"2x2", "1x4"}
    assert {r["op"] for r in ran} == {"sparse_attention", "sparse_attention vjp", "compress_groups_with_ratio",
                                      "store_cache_rows"}
    assert all(r["bit_identical"] for r in ran)
    # The vjp with rows split sums the cache cotangent over row shards: one all-reduce, nothing else.
    assert {r["mesh"]: r["collectives"] for r in ran if r["op"] == "sparse_attention vjp"} == {
        "2x2": ["all-reduce"], "1x4": []}
    # ... and its cache cotangent is the row shards' fp32 ones summed, rounded once.
    assert all(r["dkv_rel_diff"] == 0 for r in ran if r["op"] == "sparse_attention vjp" and r["mesh"] == "2x2")
    assert not any(r["collectives"] for r in ran if r["op"] != "sparse_attention vjp")
    assert (tmp_path / "multi_gpu.md").read_text().startswith("# Sharded operators on 4")


def test_a_shard_takes_the_tiling_of_its_own_shape():
    """Per shard: rows, heads, KV heads and the tiling come from the shard's shapes (prefill flag
    included); an explicit config= stays as given. Runs the per-shard step on stand-ins."""
    import jax
    import jax.numpy as jnp

    from qsa_jax.config import select_config
    from qsa_jax.ops import _sharding
    from qsa_jax.ops.sparse_attention.base import check_sparse_attention_args

    def arrays(rows, heads, kv_heads):
        s = jax.ShapeDtypeStruct
        return (s((rows, heads, 256), jnp.bfloat16), (s((40, kv_heads, 1600, 512), jnp.bfloat16),),
                s((rows, 2052), jnp.int32), s((8, 6), jnp.int32), s((rows,), jnp.int32),
                s((rows, heads, 256), jnp.bfloat16))

    # The prefill flag reaches the shard (4096 rows x 1 KV head: its tiling differs from the
    # decode one), and a decode batch whose shard's table entry differs from the whole's (a
    # shard that kept the global tiling passed the prefill case alone: there both are equal).
    assert select_config(4096, 1, True, 2051) != select_config(4096, 1, False, 2051)
    assert select_config(512, 2, False, 2051) != select_config(128, 1, False, 2051)
    for (rows, local_rows), prefill in (((8192, 4096), True), ((512, 128), False)):
        local = arrays(local_rows, 12, 1)
        for explicit in (None, (64, 4, 33, 2)):
            q, (kv,), *rest = arrays(rows, 24, 2)
            problem = check_sparse_attention_args(q, kv, *rest, use_prefill_config=prefill, config=explicit)
            seen = []
            _sharding._attention_local((lambda p, *a: seen.append(p), (), problem, "forward"),
                                       {"rows": ("data",), "heads": ("model",), "kv_heads": ("model",)}, *local)
            (p,) = seen
            assert (p.num_rows, p.num_query_heads, p.kv.num_kv_heads) == (local_rows, 12, 1)
            assert tuple(p.config) == (tuple(explicit) if explicit
                                       else tuple(select_config(local_rows, 1, prefill, 2051)))


def test_vmap_of_the_forward_still_batches():
    """custom_partitioning has no batching rule (ours, _sharding._batchable, adds one): a
    vmapped call on one device must run the implementation batched, equal to the calls one by
    one (sparse_attention over q/gate, store over caches). On a mesh: sharding_checks.vmap_checks."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import qsa_jax
    from qsa_testing.cases import store_case
    from qsa_testing.sharding_checks import attention_case, bits

    c = attention_case(2)
    kv, li, bt, t2r = (jnp.asarray(x) for x in (c.kv_cache, c.logical_indices, c.block_table, c.token_to_req))

    def attend(q, g):
        return qsa_jax.sparse_attention(q, kv, li, bt, t2r, g, implementation="xla")

    qs = jnp.stack([c.q, c.q[::-1]])
    gs = jnp.stack([c.output_gate, c.output_gate[::-1]])
    got = jax.vmap(attend)(qs, gs)
    assert all(np.array_equal(bits(got[i]), bits(attend(qs[i], gs[i]))) for i in range(2))
    sc = store_case(np.random.default_rng(0), n=8, pages=8, page_size=4, width=24)
    caches = jnp.stack([jnp.asarray(sc.cache), -jnp.asarray(sc.cache)])
    stored = jax.vmap(lambda cache: qsa_jax.store_cache_rows(cache, sc.slot_mapping, sc.rows,
                                                             implementation="xla"))(caches)
    for i in range(2):
        one = qsa_jax.store_cache_rows(caches[i], sc.slot_mapping, sc.rows, implementation="xla")
        assert np.array_equal(bits(stored[i]), bits(one))
