"""Public entry point: ``sparse_attention``."""

from __future__ import annotations

import functools
from typing import Sequence

import jax

from qsa_jax._implementations import REGISTRIES
from qsa_jax import config as _config
from qsa_jax.config import PallasLaunch, TritonLaunch, sparse_attention_order
from qsa_jax.ops import _sharding
from qsa_jax.ops._memo import memoised
from qsa_jax.ops.sparse_attention.backward import differentiable
from qsa_jax.ops.sparse_attention.base import (
    KVScales, SparseAttentionProblem, StridedQuery, check_sparse_attention_args, query_table, scale_operand)

_REGISTRY = REGISTRIES["sparse_attention"]
# The implementation each launch record is for.
_LAUNCH_IMPLEMENTATION = {PallasLaunch: "pallas", TritonLaunch: "triton"}


@memoised
def _plan(q, kv, logical_indices, block_table, token_to_req, output_gate, *,
          use_prefill_config, config, implementation,
          scales_given=(False, False), launch=None) -> tuple[SparseAttentionProblem, str]:
    """Checks + config + implementation choice: pure functions of static metadata."""
    problem = check_sparse_attention_args(
        q, kv, logical_indices, block_table, token_to_req, output_gate,
        use_prefill_config=use_prefill_config, config=config, scales_given=scales_given, launch=launch)
    launch_for = None if launch is None else _LAUNCH_IMPLEMENTATION[type(launch)]
    name = _REGISTRY.choose(implementation, order=sparse_attention_order(problem, launch_for))
    if launch is not None and launch_for != name:
        raise ValueError(f"sparse_attention: launch={launch!r} is for implementation "
                         f"{launch_for!r}, but this call runs {name!r}")
    if problem.is_fp8 and name in _config.TRITON_LOWERED and not _config.fp8_kernels_run_here():
        # Only an explicit request gets here: the default order leaves XLA alone.
        cap = _config.device_capability()
        raise NotImplementedError(
            f"sparse_attention: implementation {name!r} needs compute capability >= 8.9 for an "
            f"fp8 kv cache (this GPU: {cap[0]}.{cap[1]}); use implementation='xla' or None")
    return problem, name


@functools.partial(jax.jit, static_argnames=("problem", "implementation"))
def _run(q, kv_arrays, logical_indices, block_table, token_to_req, output_gate, scales=None, *,
         problem: SparseAttentionProblem, implementation: str):
    # A custom_vjp around the implementation's forward (gradients: backward.py, also with
    # vLLM 0.34's k/v scales and fp8 caches); on a mesh its forward and backward run one call
    # per shard (qsa_jax/ops/_sharding.py).
    return differentiable(problem, implementation, q, kv_arrays, logical_indices, block_table,
                          token_to_req, output_gate, scales)


def sparse_attention(
    q: jax.Array | StridedQuery,
    kv,
    logical_indices: jax.Array,
    block_table: jax.Array,
    token_to_req: jax.Array,
    output_gate: jax.Array,
    *,
    use_prefill_config: bool = False,
    config: Sequence[int] | str | None = None,
    implementation: str | None = None,
    k_scale=None,
    v_scale=None,
    scales: KVScales | None = None,
    launch: PallasLaunch | TritonLaunch | None = None,
) -> jax.Array:
    """Gated sparse GQA over a paged bf16 or fp8 K/V cache (QSA ``qsa_sparse_paged_attention``).

    Args:
      q: [R, H, D] bf16 queries, or a ``StridedQuery``: queries read in place from a
        larger array (e.g. the q columns of a fused qkv projection), without a copy.
      kv: the fused cache ``[NB, Hk, P, 2D]`` (vLLM's ``kv_cache``; K = first D
        channels, V = last D) or a pair ``(k_cache, v_cache)`` of ``[NB, P, Hk, D]``;
        bf16, or fp8 e4m3 as ``float8_e4m3fn`` or as its bytes in ``uint8``.
      logical_indices: [R, W+1] int32; columns ``< W`` are logical token ids
        (-1 = padding), column W is the row's valid count.
      block_table: [NR, BTW] int32 logical page -> physical page, per request.
      token_to_req: [R] int32 request of each row (out of range -> row outputs 0).
      output_gate: [R, H, D] bf16 (or fp16/fp32, read as fp32 like the originals); the
        output is multiplied by sigmoid(gate).
      use_prefill_config: picks the prefill tiling when R * Hk > 2048.
      config: explicit ``(block_n, num_warps, num_tiles, num_splits)``
        overriding ``select_config``, or the name of one of its tables
        ("vllm-0.30", "vllm-0.34"; None: its default for this device and dtype).
      implementation: "pallas", "triton", "xla" or None: the first that can run, in
        ``config.sparse_attention_order`` (GPU: Pallas, then jax-triton, then XLA;
        jax-triton first for an fp8 cache on Hopper where the measured table's entry names
        it -- every entry from 5 programs -- and at every size
        on 0.34.0's table there: ``config="vllm-0.34"``, or a Hopper of another SM count).
      k_scale, v_scale: vLLM 0.34.0's per-layer dequantisation scales (floats > 0),
        required for an fp8 cache: scores use D^-0.5 * k_scale, the output is
        scaled by v_scale. They are kernel operands, not compile-time constants: a
        new value does not recompile (host floats are checked and kept on the
        device per distinct value; traced values are used unchecked: a traced NaN, zero
        or negative scale gives zeros or a wrong finite output, not an error). Passing them
        with a bf16 cache selects 0.34.0's arithmetic but, as in 0.34.0, not their
        values; host values are still checked as for fp8 (see ``base``).
      scales: instead of k_scale and v_scale, the pair prepared on the host by
        ``qsa_jax.kv_scales(k_scale, v_scale, head_dim=D)``: traced inside a jit like a
        traced pair, but with 0.34.0's score multiplier bit for bit (a traced k_scale
        rounds D^-0.5 * k_scale in fp32: an ulp off for some values at D = 128).
      launch: launch knobs of the implementation that runs (the same arithmetic; on the
        GPU another warp count or merge block may change last bits):
        ``qsa_jax.PallasLaunch(...)`` or ``qsa_jax.TritonLaunch(...)`` (warps, stages,
        prefetch, merge block and warps); the fields it leaves None keep their
        defaults (``qsa_jax.config.pallas_launch`` / ``triton_launch``). It must match
        the implementation that runs, so pass ``implementation=`` with it.

    Returns:
      [R, H, D] bf16.
    """
    if isinstance(use_prefill_config, jax.core.Tracer):
        raise TypeError("sparse_attention: use_prefill_config must be a Python bool (it picks the tiling "
                        "when the call is traced); got a traced value")
    if not (config is None or isinstance(config, (str, Sequence))):
        raise TypeError(f"sparse_attention: config must be a tiling (block_n, num_warps, num_tiles, "
                        f"num_splits), a table name or None; got {type(config).__name__} {config!r}")
    if scales is not None and (k_scale is not None or v_scale is not None):
        given = " and ".join(n for n, v in (("k_scale", k_scale), ("v_scale", v_scale)) if v is not None)
        raise ValueError(f"sparse_attention: pass either scales (a KVScales) or k_scale and v_scale; "
                         f"got scales and {given}")
    scales_given = (True, True) if scales is not None else (k_scale is not None, v_scale is not None)
    problem, name = _plan(q, kv, logical_indices, block_table, token_to_req, output_gate,
                          use_prefill_config=bool(use_prefill_config),
                          config=config if config is None or isinstance(config, str) else tuple(config),
                          implementation=implementation,
                          scales_given=scales_given, launch=launch)
    kv_arrays = tuple(kv) if isinstance(kv, (tuple, list)) else (kv,)
    arrays = (query_table(q), kv_arrays, logical_indices, block_table, token_to_req, output_gate)
    _sharding.check_sparse_attention(problem, *arrays)
    return _run(*arrays, scale_operand(problem, k_scale, v_scale, scales), problem=problem,
                implementation=name)
