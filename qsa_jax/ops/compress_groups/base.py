"""compress_groups_with_ratio: argument checks (static shapes and dtypes)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from qsa_jax.ops._arrays import require_arrays


def _shape(x) -> tuple[int, ...]:
    return tuple(int(s) for s in np.shape(x))


@dataclasses.dataclass(frozen=True)
class CompressProblem:
    num_rows: int
    head_dim: int  # Dk
    compress_ratio: int  # C
    ring_size: int  # S: slots of the per-request ring
    num_ring_blocks: int  # Bs
    num_requests: int  # len(query_start_loc) - 1
    with_rope: bool  # first positions from rope_cache / raw_positions, else (e-C+1)x3


def check_compress_args(raw_keys, raw_positions, compressor_state_cache,
                        compressor_state_block_table, token_to_req, query_start_loc,
                        logical_positions, compressed_slots, compress_ratio,
                        rope_cache) -> CompressProblem:
    """The originals' checks, with the offending argument named."""
    require_arrays(raw_keys=raw_keys, raw_positions=raw_positions, compressor_state_cache=compressor_state_cache,
                   compressor_state_block_table=compressor_state_block_table, token_to_req=token_to_req,
                   query_start_loc=query_start_loc, logical_positions=logical_positions,
                   compressed_slots=compressed_slots, **({} if rope_cache is None else {"rope_cache": rope_cache}))
    rows = int(np.size(token_to_req))
    # bool is an int to Python; True as a ratio is a caller's slip, not 1.
    if not isinstance(compress_ratio, (int, np.integer)) or isinstance(compress_ratio, bool) or compress_ratio <= 0:
        raise ValueError(f"compress_ratio must be a positive int; got {compress_ratio!r}")
    if _shape(token_to_req) != (rows,):
        raise ValueError(f"token_to_req must be [rows]; got {_shape(token_to_req)}")
    rk = _shape(raw_keys)
    if len(rk) != 3 or rk[:2] != (rows, 1):
        raise ValueError(f"raw_keys must be [rows={rows}, 1, head_dim]; got {rk}")
    if _shape(raw_positions) != (rows, 1, 3):
        raise ValueError(f"raw_positions must be [rows={rows}, 1, 3]; got {_shape(raw_positions)}")
    if not jnp.issubdtype(raw_positions.dtype, jnp.integer):
        raise TypeError(f"raw_positions must be integer (int64 in vLLM); got {raw_positions.dtype}")
    if _shape(logical_positions) != (rows,) or _shape(compressed_slots) != (rows,):
        raise ValueError(
            f"logical_positions and compressed_slots must be [rows={rows}]; got "
            f"{_shape(logical_positions)} and {_shape(compressed_slots)}")
    cs = _shape(compressor_state_cache)
    if len(cs) != 4 or cs[2] != 1:
        raise ValueError(f"compressor_state_cache must be [blocks, ring, 1, head_dim]; got {cs}")
    # The ring holds more than one group so that speculative rows cannot
    # overwrite committed members of the group still being collected.
    if cs[1] < compress_ratio:
        raise ValueError(f"compressor_state_cache ring size {cs[1]} is smaller than compress_ratio {compress_ratio}")
    if cs[3] != rk[2]:
        raise ValueError(f"compressor_state_cache head_dim {cs[3]} != raw_keys head_dim {rk[2]}")
    if compressor_state_cache.dtype != raw_keys.dtype:
        raise TypeError(f"compressor_state_cache dtype {compressor_state_cache.dtype} != raw_keys dtype {raw_keys.dtype}")
    bt = _shape(compressor_state_block_table)
    if len(bt) != 2 or bt[1] < 1:
        raise ValueError(f"compressor_state_block_table must be [requests, >=1]; got {bt}")
    qsl = _shape(query_start_loc)
    if len(qsl) != 1 or qsl[0] < 2:
        raise ValueError(f"query_start_loc must be [requests + 1] with requests >= 1; got {qsl}")
    num_requests = qsl[0] - 1
    if bt[0] < num_requests:
        raise ValueError(f"compressor_state_block_table has {bt[0]} rows for {num_requests} requests")
    if rope_cache is not None:
        rc = _shape(rope_cache)
        if len(rc) != 4 or rc[:3] != cs[:3] or rc[3] != 3:
            raise ValueError(f"rope_cache must be [{cs[0]}, {cs[1]}, 1, 3]; got {rc}")
        if not jnp.issubdtype(rope_cache.dtype, jnp.integer):
            raise TypeError(f"rope_cache must be integer (int64 in vLLM); got {rope_cache.dtype}")
    if rows and (not all(cs) or not all(bt)):
        raise ValueError("compressor_state_cache and compressor_state_block_table must be nonempty")
    for name, arr in (("token_to_req", token_to_req), ("query_start_loc", query_start_loc),
                      ("logical_positions", logical_positions), ("compressed_slots", compressed_slots),
                      ("compressor_state_block_table", compressor_state_block_table)):
        if not jnp.issubdtype(arr.dtype, jnp.integer):
            raise TypeError(f"{name} must be an integer array; got {arr.dtype}")
    return CompressProblem(rows, rk[2], int(compress_ratio), cs[1], cs[0], num_requests,
                           rope_cache is not None)


def row_metadata(p: CompressProblem, token_to_req, query_start_loc, logical_positions,
                 compressed_slots, block_table):
    """Per-row (valid, request start, chunk start, end position, ring block, ring block ok).

    A row is valid iff its request is in range, the row lies inside that
    request's rows, its end position completes a group (e >= C-1) and it has a
    compressed slot. Shared by the XLA and kernel implementations' wrappers.
    """
    rows = jnp.arange(p.num_rows, dtype=jnp.int32)
    req = token_to_req.astype(jnp.int32)
    req_ok = (req >= 0) & (req < p.num_requests)
    safe_req = jnp.clip(req, 0, p.num_requests - 1)
    start = jnp.where(req_ok, query_start_loc[safe_req], 0).astype(jnp.int32)
    end = jnp.where(req_ok, query_start_loc[safe_req + 1], 0).astype(jnp.int32)
    e = logical_positions.astype(jnp.int32)
    chunk_start = e - (rows - start)
    block = jnp.where(req_ok, block_table[safe_req, 0], -1).astype(jnp.int32)
    block_ok = (block >= 0) & (block < p.num_ring_blocks)
    valid = (req_ok & (rows >= start) & (rows < end) & (e >= p.compress_ratio - 1)
             & (compressed_slots >= 0))
    return valid, start, chunk_start, e, jnp.where(block_ok, block, 0), block_ok


def group_mean(acc, compress_ratio: int):
    """fp32 ``acc / C`` as a true division. XLA's simplifier rewrites a division by a
    broadcast scalar (constant or not) into a multiplication by its reciprocal: one fp32 ulp
    apart when C is not a power of two. The originals divide (Triton's ``/``), and so must
    every implementation (pooled = bf16(fp32 sum / C)): the divisor is a whole array behind
    an optimisation barrier, which XLA cannot see as a broadcast. Checked against the
    originals in Triton's CPU interpreter (IEEE division); on a GPU Triton's fp32 ``/`` may be
    the approximate ``div.full.f32``, so there the XLA implementation at a C that is not a
    power of two is unverified (vLLM's C is 4: exact either way)."""
    return acc / jax.lax.optimization_barrier(jnp.full(acc.shape, compress_ratio, jnp.float32))
