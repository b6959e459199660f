"""Gradients of ``sparse_attention``: the ``custom_vjp`` and the XLA backward.

What is differentiated (the gradient contract)
---------------------------------------------
The exact function of the selected entries, per row r and query head j:

    A[r, j] = sum_n p_n V_n,   p = softmax over the valid entries n of D^-0.5 q.K_n
    out[r, j] = A[r, j] * sigmoid(gate[r, j])

"Valid entries" are exactly the ones the forward attends to (same tile/count
rule, -1 padding, request, block-table and page checks; duplicated indices count
once per occurrence). The forward's bf16 roundings (the probabilities before
P.V, the attention before the gate, the output) are treated as the identity
(straight-through): the backward is the derivative of the exact function,
evaluated at the forward's operands. Cotangents: q, the K/V cache (either
layout; rows that no valid entry selects get exactly 0) and output_gate, in the
inputs' dtype with fp32 accumulation; the integer metadata gets none (float0).

With vLLM 0.34's k/v scales (the scale operand of ``base.scale_operand``: a score multiplier
m in log2 units and an output scale v) the function is the same with scores m ln(2) q.K_n
and A = v sum_n p_n V_n, K and V the cache's decoded e4m3 values (exact in bf16; a bf16
cache with scales has m = D^-0.5 log2(e), v = 1 whatever the values, as in 0.34.0). The
scale pair gets a cotangent too, which reaches traced k_scale/v_scale: sum over (row,
head) of q.dq / m, and of dA.A / v. An fp8 cache's cotangent is computed in fp32 and
converted to ``float8_e4m3fn`` as ``astype`` does (``cache_cotangent``); uint8 bytes, an
integer input, get none.

Residuals. The forward, run under differentiation, also returns the base-2
log-sum-exp of the merged softmax per (row, query head) [R, H] fp32 -- the
statistics it already forms (the one-split kernel's running max + log2 of its
normaliser; the merge's max LSE + log2 of its weight sum) -- and the ungated
attention rounded to bf16 [R, H, D]. The gated output is computed exactly as
without them, so the forward is bit-identical with and without ``jax.grad``.
With them the backward needs no softmax statistics pass:
p_n = exp2(log2(e) D^-0.5 q.K_n - lse), and, as in flash attention, a pre-pass
delta = rowsum(dA * A) with dA = dO * sigmoid(gate) gives
dS_n = p_n (dA.V_n - delta), dq = D^-0.5 sum_n dS_n K_n, dK_n = D^-0.5 dS_n q,
dV_n = p_n dA, dgate = dO * A * sigmoid'(gate).

Implementations: ``xla_backward`` (this module; every backend, any float dtype
including float64 -- the oracle of the tests) and the Pallas kernel
(``backward_pallas.py``). ``implementation="xla"`` differentiates with the XLA
backward, "pallas" with the Pallas one; "triton" keeps its own output and takes
the residuals from a Pallas forward (one extra forward) and the Pallas backward --
or, where Pallas cannot run (a JAX without its Triton backend), from the XLA ones.

Transformations: ``jit`` as usual. ``vmap`` over a leading batch of any arguments
batches the custom VJP's forward and backward rule: the XLA parts batch natively,
and ``pallas_call``'s batching rule adds a grid dimension (which the Triton lowering
folds into its 3-D launch grid), so each batch element keeps its own cache, config
and results -- the same values as unbatched calls (tests/test_backward.py; lowered
for sm_90 there too).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from qsa_jax.ops import _sharding, _vma
from qsa_jax.ops.sparse_attention.base import (
    LOG2_E, SparseAttentionProblem, as_e4m3, entry_rows, head_row_stride)

# Columns per step of the XLA backward's scan: bounds its gathered K/V to
# rows x 128 x Hk x D at a time.
XLA_CHUNK = 128


def _registry():
    from qsa_jax._implementations import REGISTRIES

    return REGISTRIES["sparse_attention"]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def differentiable(problem: SparseAttentionProblem, implementation: str, q, kv_arrays,
                   logical_indices, block_table, token_to_req, output_gate, scales):
    """``implementation``'s forward, with the gradient contract of this module (on a mesh the
    forward, the residual forward and the backward each run per shard: qsa_jax/ops/_sharding.py).
    ``scales``: None, or vLLM 0.34's (2,) fp32 operand (``base.scale_operand``)."""
    return _sharding.sparse_attention(_registry().run(implementation), problem, q, kv_arrays,
                                      logical_indices, block_table, token_to_req, output_gate, scales)


def gradient_implementation(implementation: str) -> str:
    """The implementation whose residual forward and backward differentiate
    ``implementation``: itself, but for "triton" (its kernels keep no residuals) Pallas, or
    XLA where Pallas cannot run."""
    if implementation != "triton":
        return implementation
    return "pallas" if _registry().why_not("pallas") is None else "xla"


def forward_with_residuals(problem, implementation, q, kv_arrays, logical_indices, block_table,
                           token_to_req, output_gate, *scales):
    """(output, ungated attention bf16 [R,H,D], merged base-2 LSE [R,H] fp32); ``scales``:
    nothing, or the scale operand."""
    args = (problem, q, kv_arrays, logical_indices, block_table, token_to_req, output_gate, *scales)
    residuals = gradient_implementation(implementation)
    if residuals != implementation:  # triton: see the docstring
        out = _registry().run(implementation)(*args)
        return (out,) + _registry().run(residuals)(*args, residuals=True)[1:]
    return _registry().run(implementation)(*args, residuals=True)


def _fwd(problem, implementation, q, kv_arrays, logical_indices, block_table, token_to_req,
         output_gate, scales):
    extra = () if scales is None else (scales,)
    out, attention, lse = _sharding.attention_step(
        "residuals", forward_with_residuals, (implementation,), problem, q, kv_arrays,
        logical_indices, block_table, token_to_req, output_gate, *extra)
    return out, (q, kv_arrays, logical_indices, block_table, token_to_req, output_gate, scales,
                 attention, lse)


def _bwd(problem, implementation, residuals, d_out):
    q, kv_arrays, logical_indices, block_table, token_to_req, output_gate, scales, attention, lse = residuals
    if gradient_implementation(implementation) == "xla":
        backward = xla_backward
    else:
        from qsa_jax.ops.sparse_attention.backward_pallas import pallas_backward as backward
    extra = () if scales is None else (scales,)
    # Per shard on a mesh; the step's result is flat: (dq, *dkv_arrays, dgate[, dscales]).
    dq, *rest = _sharding.attention_step(
        "backward", backward, (), problem, q, kv_arrays, logical_indices, block_table, token_to_req,
        output_gate, attention, lse, d_out, *extra)
    dkv, dgate = rest[:len(kv_arrays)], rest[len(kv_arrays)]
    d_scales = None
    if scales is not None:
        # Inside a caller's shard_map (check_vma=True) the pair (a layer's scalars, replicated)
        # has per-shard partial cotangents over the caller's manual axes that split rows or
        # heads: their sum is its cotangent (as for any argument replicated there).
        d_scales = rest[-1]
        over = _vma.missing(scales, _vma.varying(d_scales))
        d_scales = jax.lax.psum(d_scales, over) if over else d_scales
    return (dq, tuple(cache_cotangent(x, a) for x, a in zip(dkv, kv_arrays)), None, None, None, dgate,
            d_scales)


differentiable.defvjp(_fwd, _bwd)


def cache_cotangent(d_cache, cache):
    """A cache array's cotangent in its own dtype: as computed for bf16 (or float64); for
    ``float8_e4m3fn`` the fp32 cotangent converted as ``astype`` converts (what JAX's own
    autodiff of a dequantising function returns: beyond +-464 that is NaN, e4m3fn having
    no infinity); None (a zero cotangent) for an integer cache, i.e. uint8 e4m3 bytes."""
    if jnp.issubdtype(cache.dtype, jnp.integer):
        return None
    return d_cache.astype(cache.dtype)


def gate_pre_pass(output_gate, attention, d_out, compute_dtype, *, delta_dtype=None):
    """Elementwise part of the backward, over [R, H, D] only.

    dA = dO * sigmoid(gate) (cotangent of the ungated attention), delta =
    rowsum(dA * A) [R, H] (flash attention's pre-pass: sum_n p_n dA.V_n without
    revisiting the entries) and dgate = dO * A * sigmoid'(gate). ``delta_dtype``:
    round dA to it inside delta, for a kernel whose dA.V dots take dA in that
    dtype -- then dS = p (dA.V - delta) cancels consistently (for a single
    entry, exactly).
    """
    gate = output_gate.astype(compute_dtype).reshape(attention.shape)
    a = attention.astype(compute_dtype)
    do = d_out.astype(compute_dtype)
    sig = jax.nn.sigmoid(gate)
    d_attention = do * sig
    rounded = d_attention if delta_dtype is None else d_attention.astype(delta_dtype).astype(compute_dtype)
    delta = jnp.sum(rounded * a, axis=-1)
    d_gate = do * a * sig * (1 - sig)
    return d_attention, delta, d_gate.reshape(output_gate.shape).astype(output_gate.dtype)


def consumed_end(problem: SparseAttentionProblem, logical_indices):
    """Per row [R], the end of the columns the forward consumes: whole tiles of block_n
    up to the count, at most num_tiles of them (0 for a count <= 0). Not clamped to W."""
    bn, w = problem.config.block_n, problem.selection_width
    count = jnp.minimum(logical_indices[:, w], w)
    return jnp.clip((count + bn - 1) // bn, 0, problem.config.num_tiles) * bn


def used_columns(problem: SparseAttentionProblem, logical_indices, columns):
    """Whether each column (int array [C]) lies in a tile the forward consumes, per row [R, C]."""
    return columns[None, :] < consumed_end(problem, logical_indices)[:, None]


def q_rows(problem: SparseAttentionProblem):
    """[R, H] rows of the query table holding q (compact or ``StridedQuery``)."""
    return problem.queries.row(jnp.arange(problem.num_rows)[:, None],
                               jnp.arange(problem.num_query_heads)[None, :])


def dq_to_table(problem: SparseAttentionProblem, q_table, dq):
    """Cotangent of the query table from dq [R, H, D]: a reshape for a compact q, a
    scatter into zeros for a ``StridedQuery`` (table rows that are not q get 0)."""
    if problem.q_layout is None:
        return dq.reshape(q_table.shape).astype(q_table.dtype)
    d = problem.head_dim
    table = jnp.zeros(q_table.shape, dq.dtype).reshape(-1, d)
    return table.at[q_rows(problem).reshape(-1)].add(dq.reshape(-1, d)).reshape(
        q_table.shape).astype(q_table.dtype)


def kv_cotangent(problem: SparseAttentionProblem, kv_arrays, d_k_rows, d_v_rows, dtype=None):
    """dK, dV as [N, D] rows of ``KVLayout.rows_view`` -> cotangents in ``kv_arrays``' layout,
    in ``dtype`` (None: the cache's own)."""
    def like(x, a):
        return x.reshape(a.shape).astype(a.dtype if dtype is None else dtype)

    if problem.kv.fused:
        return (like(jnp.stack([d_k_rows, d_v_rows], axis=1), kv_arrays[0]),)  # [N, 2, D] = a fused row
    return like(d_k_rows, kv_arrays[0]), like(d_v_rows, kv_arrays[1])


def xla_backward(problem: SparseAttentionProblem, q, kv_arrays, logical_indices, block_table,
                 token_to_req, output_gate, attention, lse, d_out, scales=None, *, chunk: int = XLA_CHUNK,
                 kv_dtype=None):
    """Cotangents (dq table, dkv_arrays, dgate[, dscales with ``scales``]) of the exact
    function, in plain XLA; the cache's in ``kv_dtype`` (None: the cache's own, fp32 for an
    fp8 cache; a mesh sums row shards' fp32 ones).

    Accumulates in float32 (float64 when the inputs are float64: the oracle of the
    tests); a ``lax.scan`` walks the selection ``chunk`` columns at a time, and dK/dV
    are scatter-added into cache-sized accumulators (duplicates add up; invalid
    entries are sent out of bounds and dropped).
    """
    p = problem
    rows, heads, d = p.num_rows, p.num_query_heads, p.head_dim
    hk, g, w = p.num_kv_heads, p.group_size, p.selection_width
    kv = p.kv
    dtype = jnp.float64 if q.dtype == jnp.float64 else jnp.float32
    kv_dtype = kv_dtype or (jnp.float32 if p.is_fp8 else None)
    d_attention, delta, d_gate = gate_pre_pass(output_gate, attention.reshape(rows, heads, d),
                                               d_out, dtype)
    k_rows, v_rows = kv.rows_view(kv_arrays)
    k_half, v_half = kv.halves
    n = kv.num_rows
    zero_kv = jnp.zeros((n, d), dtype)
    if rows == 0:
        return with_scale_cotangent(p, (dq_to_table(p, q, jnp.zeros((0, heads, d), dtype)), kv_cotangent(
            p, kv_arrays, zero_kv, zero_kv, kv_dtype), d_gate), q, jnp.zeros((0, heads, d), dtype),
            d_attention, attention, scales)

    qg = q.reshape(-1, d)[q_rows(p)].astype(dtype).reshape(rows, hk, g, d)
    da = d_attention.reshape(rows, hk, g, d)
    delta = delta.reshape(rows, hk, g)
    lse = lse.reshape(rows, hk, g).astype(dtype)
    chunk = max(1, min(chunk, w))
    steps = -(-w // chunk)
    tokens = jnp.pad(logical_indices[:, :w], ((0, 0), (0, steps * chunk - w)), constant_values=-1)
    columns = jnp.arange(steps * chunk, dtype=jnp.int32)
    row0, valid = entry_rows(p, tokens, block_table, token_to_req)
    valid &= used_columns(p, logical_indices, columns)
    head_offsets = jnp.arange(hk, dtype=jnp.int32) * head_row_stride(kv)
    score_scale, scale, value_scale = gradient_scales(p, scales, dtype)
    hi = lax.Precision.HIGHEST  # the oracle: no reduced-precision dots on any backend

    def step(carry, xs):
        dq, dk, dv = carry
        row_c, valid_c = xs  # [R, C]
        r = row_c[..., None] + head_offsets  # [R, C, Hk]
        vmask = valid_c[..., None, None]
        # where, never a multiply: unreferenced pages may hold NaN. fp8: decoded (exactly).
        keys = jnp.where(vmask, as_e4m3(k_rows[r, k_half]).astype(dtype), 0)  # [R, C, Hk, D]
        values = jnp.where(vmask, as_e4m3(v_rows[r, v_half]).astype(dtype), 0)
        s = jnp.einsum("rkgd,rckd->rkgc", qg, keys, precision=hi) * score_scale
        smask = valid_c[:, None, None, :]
        probs = jnp.where(smask, jnp.exp2(jnp.where(smask, s - lse[..., None], 0.0)), 0.0)
        dp = jnp.einsum("rkgd,rckd->rkgc", da, values, precision=hi) * value_scale
        ds = probs * (dp - delta[..., None])
        dq = dq + jnp.einsum("rkgc,rckd->rkgd", ds, keys, precision=hi) * scale
        dk_e = jnp.einsum("rkgc,rkgd->rckd", ds, qg, precision=hi) * scale
        dv_e = jnp.einsum("rkgc,rkgd->rckd", probs, da, precision=hi) * value_scale
        target = jnp.where(vmask[..., 0], r, n).reshape(-1)  # row n: dropped
        dk = dk.at[target].add(dk_e.reshape(-1, d), mode="drop")
        dv = dv.at[target].add(dv_e.reshape(-1, d), mode="drop")
        return (dq, dk, dv), None

    xs = (jnp.moveaxis(row0.reshape(rows, steps, chunk), 1, 0),
          jnp.moveaxis(valid.reshape(rows, steps, chunk), 1, 0))
    # Inside a caller's shard_map the carries vary as the inputs do (a loop's types must match).
    init = _vma.like((jnp.zeros((rows, hk, g, d), dtype), zero_kv, zero_kv), q, kv_arrays, logical_indices,
                     block_table, token_to_req, output_gate, attention, lse, d_out)
    (dq, dk, dv), _ = lax.scan(step, init, xs)
    dq = dq.reshape(rows, heads, d)
    return with_scale_cotangent(p, (dq_to_table(p, q, dq), kv_cotangent(p, kv_arrays, dk, dv, kv_dtype), d_gate),
                                q, dq, d_attention, attention, scales)


def gradient_scales(problem: SparseAttentionProblem, scales, dtype):
    """(score multiplier in log2 units as the forward used it, its natural-log value c -- the
    factor of dq and dK -- and the output scale, 1 without ``scales``), in ``dtype``.
    Without scales the first two are D^-0.5 log2(e) and D^-0.5 as Python floats, as before
    the scales existed; with them c = multiplier / log2(e): p = exp2(m q.K - lse) has
    derivative ln(2) m p with respect to q.K."""
    d = problem.head_dim
    if scales is None:
        return d ** -0.5 * LOG2_E, d ** -0.5, 1.0
    multiplier = scales[0].astype(dtype)
    return multiplier, multiplier / LOG2_E, scales[1].astype(dtype)


def with_scale_cotangent(problem: SparseAttentionProblem, cotangents, q_table, dq, d_attention, attention,
                         scales):
    """``cotangents`` plus, with ``scales``, the scale pair's: for the multiplier m,
    sum over (row, head) of q.dq / m (dq = c sum_n dS_n K_n, and each score is linear in m);
    for the output scale v, sum of dA.A / v (A is linear in v). ``dq`` unrounded [R, H, D]."""
    if scales is None:
        return cotangents
    dtype = dq.dtype
    q_rows_ = q_table.reshape(-1, problem.head_dim)[q_rows(problem)].astype(dtype)  # [R, H, D]
    d_multiplier = jnp.sum(q_rows_ * dq) / scales[0].astype(dtype)
    d_output = jnp.sum(d_attention.astype(dtype) * attention.reshape(d_attention.shape).astype(dtype)) \
        / scales[1].astype(dtype)
    return cotangents + (jnp.stack([d_multiplier, d_output]).astype(scales.dtype),)


def exact_forward(problem: SparseAttentionProblem, q, kv_arrays, logical_indices, block_table,
                  token_to_req, output_gate, scales=None):
    """The function the backward differentiates, in the inputs' dtype with no rounding:
    (output, attention, base-2 LSE). Dense over the selection: small cases only (tests).
    ``scales``: None or the (2,) scale operand (score multiplier in log2 units, output
    scale); an fp8 cache is decoded to q's dtype (exact)."""
    p = problem
    rows, heads, d = p.num_rows, p.num_query_heads, p.head_dim
    hk, g, w = p.num_kv_heads, p.group_size, p.selection_width
    kv = p.kv
    tokens = logical_indices[:, :w]
    row0, valid = entry_rows(p, tokens, block_table, token_to_req)
    valid &= used_columns(p, logical_indices, jnp.arange(w, dtype=jnp.int32))
    r = row0[..., None] + jnp.arange(hk, dtype=jnp.int32) * head_row_stride(kv)
    k_rows, v_rows = kv.rows_view(kv_arrays)
    vmask = valid[..., None, None]
    decode = (lambda x: as_e4m3(x).astype(q.dtype)) if p.is_fp8 else (lambda x: x)
    keys = jnp.where(vmask, decode(k_rows[r, kv.halves[0]]), 0)
    values = jnp.where(vmask, decode(v_rows[r, kv.halves[1]]), 0)
    qg = q.reshape(-1, d)[q_rows(p)].reshape(rows, hk, g, d)
    hi = lax.Precision.HIGHEST
    _, scale, value_scale = gradient_scales(p, scales, q.dtype)
    s = jnp.einsum("rkgd,rckd->rkgc", qg, keys, precision=hi) * scale
    smask = valid[:, None, None, :]
    s = jnp.where(smask, s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    safe_m = jnp.where(jnp.isfinite(m), m, 0.0)
    e = jnp.where(smask, jnp.exp(s - safe_m), 0.0)
    total = jnp.sum(e, axis=-1, keepdims=True)
    attention = jnp.einsum("rkgc,rckd->rkgd", e / jnp.where(total > 0, total, 1.0), values,
                           precision=hi).reshape(rows, heads, d) * value_scale
    lse = jnp.where(total > 0, (safe_m + jnp.log(jnp.where(total > 0, total, 1.0))) * LOG2_E,
                    -jnp.inf)
    out = attention * jax.nn.sigmoid(output_gate.reshape(rows, heads, d))
    return out, attention, lse.reshape(rows, heads)
