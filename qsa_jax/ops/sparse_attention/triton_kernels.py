"""Triton kernels of sparse paged attention (written for qsa-jax; launched by ``triton.py``).

Two kernels:

* ``sparse_attention_split_kernel`` — one program per (row, KV head, split).
  It walks the tiles dealt to its split (tiles ``split, split + S, ...``),
  gathers the selected K rows as a ``[D, BLOCK_N]`` tile (so ``q @ K`` needs no
  transpose of the gathered data) and the V rows as ``[BLOCK_N, D]``, and keeps
  an online softmax in base 2. With one split it finishes the row itself
  (bf16 round, sigmoid gate, bf16 store); otherwise it writes an fp32
  normalised partial and its base-2 log-sum-exp.
* ``sparse_attention_merge_kernel`` — one program per (row, query head, chunk
  of D): weights the partials by ``exp2(lse - max lse)`` and applies the gate.

Every launch parameter that depends on the deployment (widths, page size,
strides, tiling) is a compile-time constant; the three values that change with
the batch (rows, requests, cache pages) are runtime scalars so that a new
batch size does not compile a new kernel. The request count arrives as the
largest valid request id (``last_request`` = requests - 1), and rows and
``last_request`` are kept out of Triton's integer specialisation
(``do_not_specialize``, as vLLM's kernels keep rows and requests). Why: Triton's
JIT, and ``jax_triton.triton_call`` whatever a kernel lists, turn an integer
argument equal to 1 into a constant, and with one request as the constant
``num_requests == 1`` the split kernel spilled 308 B per thread at 0.30.0's
TP4 512-row launch (64-wide tiles, 4 splits, 2 warps; vLLM's kernel: 28 B) --
374 against 268 us on an H200 (session 13). ``last_request`` is 0 there (never
made a constant); a constant ``last_request == 1`` (two requests, through JAX)
compiles like any other count (``tools/sm90_split_kernel_ab.py``, no GPU needed).

Safety: an entry's K/V are loaded only under its validity mask, so the bytes
of unreferenced pages (garbage, NaN) never enter a register. Cache offsets are
64-bit (``page * page_stride`` overflows int32 past 2**31 elements).

The masked score (-1e20) is finite on purpose: a tile with no valid entry then
gives ``exp2(max_old - max_new) = 1`` instead of ``inf - inf = NaN``.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _row_tiles(req_ptr, idx_ptr, row, last_request, W: tl.constexpr, BTW: tl.constexpr,
               BLOCK_N: tl.constexpr, NUM_TILES: tl.constexpr):
    """A row's request check and offsets, and the tiles it consumes: (request valid,
    block-table row offset, selection row offset, tiles). A count <= 0 gives no tile; an
    invalid request id reads block-table row 0 or ``last_request`` (clamped) under a false
    ``req_ok``, so no entry of the row is valid. Also called by gluon_kernels' kernel."""
    req = tl.load(req_ptr + row)
    req_ok = (req >= 0) & (req <= last_request)
    bt_row_offset = tl.minimum(tl.maximum(req, 0), last_request) * BTW
    idx_row_offset = row * (W + 1)
    count = tl.minimum(tl.load(idx_ptr + idx_row_offset + W), W)
    n_tiles = tl.minimum(tl.maximum((count + BLOCK_N - 1) // BLOCK_N, 0), NUM_TILES)
    return req_ok, bt_row_offset, idx_row_offset, n_tiles


@triton.jit
def _selected_pages(idx_ptr, bt_ptr, idx_row_offset, bt_row_offset, tile, req_ok, n_tiles,
                    num_pages, W: tl.constexpr, PAGE: tl.constexpr, BTW: tl.constexpr,
                    BLOCK_N: tl.constexpr):
    """Tokens of one tile and their physical pages; (token, page, valid) per column.

    ``tile >= n_tiles`` (a prefetch past the split's last tile) loads nothing.
    """
    cols = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    return _pages_of_columns(idx_ptr, bt_ptr, idx_row_offset, bt_row_offset, cols, tile, req_ok, n_tiles,
                             num_pages, W, PAGE, BTW)


@triton.jit
def _pages_of_columns(idx_ptr, bt_ptr, idx_row_offset, bt_row_offset, cols, tile, req_ok, n_tiles, num_pages,
                      W: tl.constexpr, PAGE: tl.constexpr, BTW: tl.constexpr):
    """``_selected_pages`` for given selection columns ``cols`` of tile ``tile`` (the Gluon
    kernel passes them in the layout it wants)."""
    in_tile = (cols < W) & (tile < n_tiles)
    tok = tl.load(idx_ptr + idx_row_offset + cols, mask=in_tile, other=-1)
    safe_tok = tl.maximum(tok, 0)
    logical_page = safe_tok // PAGE
    ok = req_ok & (tok >= 0) & (logical_page < BTW)
    page = tl.load(bt_ptr + bt_row_offset + tl.minimum(logical_page, BTW - 1), mask=ok, other=-1)
    ok = ok & (page >= 0) & (page < num_pages)
    return safe_tok % PAGE, page, ok


@triton.jit
def _e4m3(tile, KV_BYTES: tl.constexpr):
    """A cache tile as e4m3 values: uint8 bytes are reinterpreted (exact, free)."""
    # One return: the compiler rejects returns of different types, even under a constexpr if.
    if KV_BYTES:
        tile = tile.to(tl.float8e4nv, bitcast=True)
    return tile


# PTX for 4 e4m3 bytes (one 32-bit register, element i in byte i) -> 4 fp16 (two registers,
# elements 0-1 and 2-3): two of sm_89+'s pair conversions, the instruction Triton itself emits
# for an e4m3 -> fp16 cast (F2FP.F16.E4M3.UNPACK_B), so the values are the same bits.
E4M3X4_TO_F16X4_PTX = tl.constexpr("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; "
                                   "cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }")


@triton.jit
def _f16_values_before_the_dot(values, KV_BYTES: tl.constexpr):
    """An e4m3 V tile ``[BLOCK_N, D]`` as fp16, converted in the layout it was loaded in.

    Why (V_F16_STAGED): P.V takes V as its second operand, which the MMA wants as pairs of
    consecutive tokens; the cache holds each token's D channels together, and sm_90 has no
    transposing shared-memory load for 8-bit data. Converted where Triton puts a plain
    ``.to(tl.float16)`` -- after reading the tile out of shared memory in the operand's layout
    -- that read is one byte per element (256 ``ld.shared.b8`` per thread per 32-token tile at
    one warp) plus the byte packing for the pair conversions. Converted here, in the load's
    layout (16 contiguous bytes per thread), Triton moves the fp16 tile into the operand's
    layout through shared memory with 16-byte stores and transposing ``ldmatrix`` loads.
    ``is_pure=False`` is what keeps the conversion here: a pure elementwise op is moved past
    the layout change into the operand's layout, the byte-wise reads again (checked on the
    sm_90 lowering). Costs 2 bytes per V element of shared memory (16 KB per 32-token tile),
    and from 32-token tiles Triton groups P.V's k differently (config's docstring: other fp32
    rounding, not other values of V). ``pack=4``: each thread's elements come in fours
    (16 contiguous bytes per thread here). Not available in Triton's interpreter:
    qsa_testing.triton_interpreter emulates it."""
    if KV_BYTES:
        raw = values
    else:
        raw = values.to(tl.uint8, bitcast=True)
    return tl.inline_asm_elementwise(E4M3X4_TO_F16X4_PTX, "=r,=r,r", [raw], dtype=tl.float16,
                                     is_pure=False, pack=4)


@triton.jit
def _kv_tile(k_ptr, v_ptr, tok_in_page, page, ok, d_idx, head_base, q_dtype: tl.constexpr,
             STRIDE_PAGE: tl.constexpr, STRIDE_TOKEN: tl.constexpr, V_OFFSET: tl.constexpr,
             FP8: tl.constexpr, KV_BYTES: tl.constexpr, V_F16_STAGED: tl.constexpr):
    """One tile's selected K rows as ``[D, BLOCK_N]`` and V rows as ``[BLOCK_N, D]``, loaded
    under the entries' validity (an invalid entry's bytes never enter a register)."""
    base = tl.maximum(page, 0).to(tl.int64) * STRIDE_PAGE + (tok_in_page * STRIDE_TOKEN + head_base)
    keys_t = tl.load(k_ptr + base[None, :] + d_idx[:, None], mask=ok[None, :], other=0.0)  # [D, BN]
    values = tl.load(v_ptr + V_OFFSET + base[:, None] + d_idx[None, :], mask=ok[:, None], other=0.0)
    if FP8:  # converted in registers after the masked load: exact for e4m3
        # V to fp16 for the fp16 P.V (V_F16_STAGED: where, see _f16_values_before_the_dot).
        if V_F16_STAGED:
            values = _f16_values_before_the_dot(values, KV_BYTES)
        else:
            values = _e4m3(values, KV_BYTES).to(tl.float16)
        # K through fp16 (e4m3 -> fp16 is the hardware conversion; fp16 -> bf16 is
        # exact here), as vLLM 0.34.0 does on the GPUs it supports; with QK_FP16 q_dtype is
        # fp16 and K stops there.
        keys_t = _e4m3(keys_t, KV_BYTES).to(tl.float16).to(q_dtype)
    return keys_t, values


@triton.jit
def _f16_query(query, TOP_EXPONENT: tl.constexpr, MAX_SHIFT: tl.constexpr):
    """(q * 2^shift as fp16 ``[BLOCK_M, D]``, 2^-shift ``[BLOCK_M]``), one power-of-two shift
    per query row that puts the row's largest |q| in [2^TOP_EXPONENT, 2^(TOP_EXPONENT + 1)).

    For q.K^T against an fp16 K (fp8 cache, QK_FP16): e4m3 -> fp16 is one conversion per
    pair, where a bf16 q needs K as bf16 (e4m3 -> fp16 -> fp32 -> bf16) in every tile; q is
    converted once per program instead. Every product is the bf16 path's exact product times
    2^shift (bf16 q within 2^-31 of its row's largest keeps all 8 significant bits in fp16;
    e4m3 -> fp16 is exact), so the scaled scores times 2^-shift are the bf16 path's scores
    when the fp16 and bf16 MMAs sum their exact products alike (``pallas._f16_query``: on the
    H200 the Pallas kernel's outputs were bit-identical, session 7). The scale-back is its
    own multiply, before the score scale: folded into the scale (as Pallas does) it is inexact
    where scale * 2^-shift falls below fp32's normal range."""
    qf = query.to(tl.float32)
    top = tl.max(tl.abs(qf), axis=1)
    exponent = ((top.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    shift = tl.minimum(tl.maximum(TOP_EXPONENT - exponent, -MAX_SHIFT), MAX_SHIFT)
    up = ((shift + 127) << 23).to(tl.float32, bitcast=True)  # 2^shift
    down = ((127 - shift) << 23).to(tl.float32, bitcast=True)  # 2^-shift
    return (qf * up[:, None]).to(tl.float16), down


@triton.jit
def _online_softmax_step(query, keys_t, values, ok, acc, norm, run_max, scale_log2, row_down,
                         QK_FP16: tl.constexpr, LAZY_RESCALE: tl.constexpr):
    """One tile of the online softmax in base 2: (acc, norm, run_max) after it.
    QK_FP16: ``query`` is ``_f16_query``'s and ``row_down`` its 2^-shift per row.

    LAZY_RESCALE > 0 (``config.triton_fp8_lazy_rescale``): ``run_max`` is a reference maximum that
    moves only when some row's tile maximum exceeds it by more than LAZY_RESCALE (base-2
    units), all rows at once; otherwise the tile skips rescaling the accumulator (BLOCK_M * D
    multiplies, 128 per thread at one warp, D = 256). Exact in real arithmetic: acc, norm and
    the lse all refer to the same stale maximum. The probabilities are then at most
    2^LAZY_RESCALE (8: 256, far inside fp16's and bf16's range); each is rounded to the P.V
    operand's type with the same relative error as below 1, and fewer of them fall into fp16's
    subnormals. Other fp32 sums than the eager form: the accuracy contract, not bits."""
    if QK_FP16:
        scores = (tl.dot(query, keys_t) * row_down[:, None]) * scale_log2
    else:
        scores = tl.dot(query, keys_t) * scale_log2
    scores = tl.where(ok[None, :], scores, -1.0e20)
    tile_max = tl.max(scores, axis=1)
    if LAZY_RESCALE > 0:
        # A uniform branch (one warp-wide decision): the first tile with any valid entry always
        # takes it (run_max starts at -1e20); a tile with no valid entry never does.
        if tl.max(tile_max - run_max, axis=0) > LAZY_RESCALE:
            new_max = tl.maximum(run_max, tile_max)
            alpha = tl.math.exp2(run_max - new_max)
            acc = acc * alpha[:, None]
            norm = norm * alpha
            run_max = new_max
        probs = tl.where(ok[None, :], tl.math.exp2(scores - run_max[:, None]), 0.0)
        acc = tl.dot(probs.to(values.dtype), values, acc=acc)
        norm = norm + tl.sum(probs, axis=1)
    else:
        new_max = tl.maximum(run_max, tile_max)
        alpha = tl.math.exp2(run_max - new_max)
        probs = tl.where(ok[None, :], tl.math.exp2(scores - new_max[:, None]), 0.0)
        # P.V on bf16 (fp8 cache: fp16) probabilities; the normaliser sums the fp32 ones.
        acc = tl.dot(probs.to(values.dtype), values, acc=acc * alpha[:, None])
        norm = norm * alpha + tl.sum(probs, axis=1)
        run_max = new_max
    return acc, norm, run_max


@triton.jit(do_not_specialize=["num_rows", "last_request"])
def sparse_attention_split_kernel(
    # inputs
    q_ptr, k_ptr, v_ptr, idx_ptr, bt_ptr, req_ptr, gate_ptr,
    scale_ptr,  # SCALED: fp32 [score scale (log2 units), output scale]; else unused
    num_rows, last_request, num_pages,  # last_request: the number of requests - 1
    # outputs: ONE_SPLIT -> (out bf16 [R,H,D], unused); else (partials f32 [S,R,H,D], lse f32 [S,R,H])
    o_ptr, lse_ptr,
    W: tl.constexpr,  # selection columns (the count sits in column W)
    PAGE: tl.constexpr,
    BTW: tl.constexpr,
    GROUP: tl.constexpr,
    HEADS: tl.constexpr,
    D: tl.constexpr,
    Q_ROW_STRIDE: tl.constexpr,  # q row (r, h) = Q_OFFSET + r*Q_ROW_STRIDE + h*Q_HEAD_STRIDE,
    Q_HEAD_STRIDE: tl.constexpr,  # in D-wide rows of q_ptr (StridedQuery; compact: HEADS, 1, 0)
    Q_OFFSET: tl.constexpr,
    STRIDE_PAGE: tl.constexpr,  # K/V element strides (same for both)
    STRIDE_TOKEN: tl.constexpr,
    STRIDE_HEAD: tl.constexpr,
    V_OFFSET: tl.constexpr,  # V's first channel inside v_ptr rows (D for the fused cache)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_TILES: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    PREFETCH: tl.constexpr,  # load the next tile's tokens/pages while this one computes
    TILE_INDUCTION: tl.constexpr,  # the tile loop's form (see the loop); never with PREFETCH
    SCALED: tl.constexpr,  # k/v scales given: vLLM 0.34.0's scale and normalisation
    FP8: tl.constexpr,  # e4m3 cache: K -> bf16 for q.K^T, V and P -> fp16 for P.V
    KV_BYTES: tl.constexpr,  # the e4m3 cache arrives as uint8 bytes
    QK_FP16: tl.constexpr,  # FP8 only: q.K^T in fp16, q rescaled per row (_f16_query)
    V_F16_STAGED: tl.constexpr,  # FP8 only: V converted before its layout change (_f16_values_before_the_dot)
    F16_TOP_EXPONENT: tl.constexpr,  # _f16_query's constants (base.F16_QUERY_*)
    F16_MAX_SHIFT: tl.constexpr,
    LAZY_RESCALE: tl.constexpr,  # > 0: _online_softmax_step's lazy rescaling threshold (base 2); 0: off
):
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    req_ok, bt_row_offset, idx_row_offset, n_tiles = _row_tiles(req_ptr, idx_ptr, row, last_request, W, BTW,
                                                                 BLOCK_N, NUM_TILES)

    m_idx = tl.arange(0, BLOCK_M)
    d_idx = tl.arange(0, D)
    head_ok = m_idx < GROUP
    first_head = kv_head * GROUP
    qo_offsets = row * (HEADS * D) + (first_head + m_idx[:, None]) * D + d_idx[None, :]
    q_offsets = (Q_OFFSET + row * Q_ROW_STRIDE + (first_head + m_idx[:, None]) * Q_HEAD_STRIDE) * D \
        + d_idx[None, :]
    query = tl.load(q_ptr + q_offsets, mask=head_ok[:, None], other=0.0)
    if QK_FP16:  # K then converts to fp16 only (_kv_tile takes query.dtype)
        query, row_down = _f16_query(query, F16_TOP_EXPONENT, F16_MAX_SHIFT)
    else:
        row_down = 1.0  # unused

    if SCALED:
        scale_log2 = tl.load(scale_ptr)
        output_scale = tl.load(scale_ptr + 1)
    else:
        scale_log2: tl.constexpr = (D ** -0.5) * 1.4426950408889634
    run_max = tl.full((BLOCK_M,), -1.0e20, tl.float32)
    norm = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D), tl.float32)
    head_base = kv_head * STRIDE_HEAD

    if TILE_INDUCTION:
        # The tile is the loop's induction variable: Triton's pipeliner derives every address
        # from it. Where a split walks at most two tiles (1-8 rows at vLLM's 64 splits) this
        # compiles as vLLM's loop does (sm_90, one row: 389 SASS instructions against 842 with
        # the counter below, vLLM's 383) and ran the split kernel 1.0-1.8 us faster on an H200;
        # with many tiles per split the counter compiled tighter for the one-warp fp8 launches
        # (+9-14% kernel time with this form at TP1 64-2048 rows; session 13, calls e and j).
        for tile in range(split, n_tiles, NUM_SPLITS):
            tok_in_page, page, ok = _selected_pages(idx_ptr, bt_ptr, idx_row_offset, bt_row_offset, tile,
                                                    req_ok, n_tiles, num_pages, W, PAGE, BTW, BLOCK_N)
            keys_t, values = _kv_tile(k_ptr, v_ptr, tok_in_page, page, ok, d_idx, head_base, query.dtype,
                                      STRIDE_PAGE, STRIDE_TOKEN, V_OFFSET, FP8, KV_BYTES,
                                      V_F16_STAGED)
            acc, norm, run_max = _online_softmax_step(query, keys_t, values, ok, acc, norm, run_max,
                                                      scale_log2, row_down, QK_FP16, LAZY_RESCALE)
    else:
        my_tiles = (tl.maximum(n_tiles - split, 0) + NUM_SPLITS - 1) // NUM_SPLITS
        tile = split
        tok_in_page, page, ok = _selected_pages(idx_ptr, bt_ptr, idx_row_offset, bt_row_offset, tile,
                                                req_ok, n_tiles, num_pages, W, PAGE, BTW, BLOCK_N)
        for _ in range(0, my_tiles):
            if not PREFETCH:
                tok_in_page, page, ok = _selected_pages(idx_ptr, bt_ptr, idx_row_offset, bt_row_offset,
                                                        tile, req_ok, n_tiles, num_pages, W, PAGE, BTW,
                                                        BLOCK_N)
            keys_t, values = _kv_tile(k_ptr, v_ptr, tok_in_page, page, ok, d_idx, head_base, query.dtype,
                                      STRIDE_PAGE, STRIDE_TOKEN, V_OFFSET, FP8, KV_BYTES,
                                      V_F16_STAGED)
            tile += NUM_SPLITS
            if PREFETCH:  # the next tile's tokens and pages, loaded while this one computes
                next_tok, next_page, next_ok = _selected_pages(idx_ptr, bt_ptr, idx_row_offset,
                                                               bt_row_offset, tile, req_ok, n_tiles,
                                                               num_pages, W, PAGE, BTW, BLOCK_N)
            acc, norm, run_max = _online_softmax_step(query, keys_t, values, ok, acc, norm, run_max,
                                                      scale_log2, row_down, QK_FP16, LAZY_RESCALE)
            if PREFETCH:
                tok_in_page, page, ok = next_tok, next_page, next_ok

    has_values = norm > 0
    if SCALED:  # 0.34.0: one reciprocal per row, times the output scale
        out = tl.where(has_values[:, None], acc * (output_scale / tl.maximum(norm, 1.0e-20))[:, None], 0.0)
    else:
        out = tl.where(has_values[:, None], acc / tl.maximum(norm, 1.0e-20)[:, None], 0.0)
    if NUM_SPLITS == 1:
        gate = tl.load(gate_ptr + qo_offsets, mask=head_ok[:, None], other=0.0).to(tl.float32)
        out = out.to(tl.bfloat16).to(tl.float32) * tl.sigmoid(gate)
        tl.store(o_ptr + qo_offsets, out.to(tl.bfloat16), mask=head_ok[:, None])
    else:
        lse = tl.where(has_values, run_max + tl.math.log2(tl.maximum(norm, 1.0e-20)), -float("inf"))
        slab = (split * num_rows + row).to(tl.int64) * HEADS + first_head
        tl.store(o_ptr + (slab + m_idx[:, None]) * D + d_idx[None, :], out, mask=head_ok[:, None])
        tl.store(lse_ptr + slab + m_idx, lse, mask=head_ok)


@triton.jit(do_not_specialize=["num_rows"])
def sparse_attention_merge_kernel(
    part_ptr, lse_ptr, gate_ptr,
    num_rows,
    out_ptr,
    HEADS: tl.constexpr,
    D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0)
    head = tl.program_id(1)
    d_idx = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    s_idx = tl.arange(0, BLOCK_S)
    s_ok = s_idx < NUM_SPLITS
    slab = (s_idx.to(tl.int64) * num_rows + row) * HEADS + head
    lse = tl.load(lse_ptr + slab, mask=s_ok, other=-float("inf"))
    lse_max = tl.max(lse, axis=0)
    any_values = lse_max > -float("inf")
    # Empty splits (lse = -inf) weigh 0; with no valid entry at all every weight is 0.
    shifted = tl.where(any_values, lse - lse_max, -float("inf"))
    weights = tl.math.exp2(tl.where(s_ok, shifted, -float("inf")))
    total = tl.sum(weights, axis=0)
    parts = tl.load(part_ptr + slab[:, None] * D + d_idx[None, :], mask=s_ok[:, None], other=0.0)
    merged = tl.sum(parts * weights[:, None], axis=0)
    merged = tl.where(total > 0, merged / total, 0.0)
    out_offsets = (row * HEADS + head) * D + d_idx
    gate = tl.load(gate_ptr + out_offsets).to(tl.float32)
    merged = merged.to(tl.bfloat16).to(tl.float32) * tl.sigmoid(gate)
    tl.store(out_ptr + out_offsets, merged.to(tl.bfloat16))
