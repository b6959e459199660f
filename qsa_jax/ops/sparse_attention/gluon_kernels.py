"""Gluon split kernel of sparse paged attention for e4m3 caches at one warp (issue 13).

``sparse_attention_split_kernel_fp8_gluon`` computes what ``triton_kernels.
sparse_attention_split_kernel`` computes for an fp8 cache with k/v scales (one program per
(row, KV head, split), online softmax in base 2, the same partials and log-sum-exp or, with one
split, the gated bf16 row), with the same arguments, and is merged by the same merge kernel.
It exists for one reason: how the V tile reaches the P.V MMA.

P.V takes V as the MMA's second operand, which wants each thread to hold consecutive *tokens*
of one channel; the cache keeps each token's channels together, and sm_90 has a transposing
shared-memory load for 16-bit data only. So Triton's kernel (and vLLM 0.34.0's) reads its fp8
V tile out of shared memory one byte per element: 256 ``LDS.U8`` and ~250 packing
instructions per 32-token tile at one warp (notes/triton.md, session 19). Triton's language
has no say in register layouts; Gluon does. Here V never touches shared memory:

* each thread loads, straight from the cache, 4 consecutive channels (one 32-bit load) of the
  4 consecutive tokens it needs for the MMA, and of 8 channel groups (``_value_layouts``);
* the bytes are converted to fp16 where they are, then re-ordered inside the thread's
  registers so that each register pairs two tokens of one channel (no shuffles, no shared
  memory: the two layouts share their lanes);
* the channels are *relabelled* rather than moved: the tile enters the MMA with its channel
  axis in the order ``hi*32 + lo*8 + mid`` (channel ``c = hi*32 + mid*4 + lo``), for which the
  operand's lanes are exactly the lanes that loaded them. A column of the accumulator is then
  a permuted channel, which ``_to_real_order`` relabels back before the store. Each output
  channel's sum over tokens is the same products in the same MMA positions as Triton's
  kernel, whose operands have k-width 4 as here.

K goes through shared memory as in Triton's kernel (``cp.async``, 16 bytes per thread), but
double-buffered one tile ahead: the next tile's K is in flight while this tile computes
(Triton's pipeliner, at 2 stages, issues it after the tile's P.V and waits for it at the top
of the next iteration). q is staged once in shared memory and read per KC channels.

``V_SHARED`` (``config.triton_fp8_gluon_values_shared``; session 20, after the H100 run): V
through shared memory too, still without byte reads (32-bit reads in the load order above,
from a tile swizzled for them), with one K and one V buffer each refilled with the next tile
as soon as this tile has read it -- V's global latency, which the register path leaves in
front of every P.V, then overlaps P.V and the next q.K^T; the shared memory stays 24 KB.

Every other step is the Triton kernel's, in the same order and with the same constants (the
masked score -1e20, the normaliser's 1e-20 floor, 0.34.0's one reciprocal per row times the
output scale, the bf16 round before the gate), so the outputs are the same bits
(``tests/test_gluon.py``'s GPU cases: identical on an H100, session 20). Triton's interpreter
does not run Gluon: the CPU tests compile it for sm_90 and check what it compiled to.

Speed (H100, notes/triton.md "Session 20"): no faster than the Triton kernel at TP1, 5-6%
slower at TP4 -- there the fp8 kernels already run near copy bandwidth; off by default
(``config.triton_fp8_gluon_split``) until an H200 says otherwise.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

# The row and page decisions and the fp16 query are the Triton kernel's own functions (Triton
# code without layouts runs inside a Gluon kernel), so the two kernels cannot differ there.
from qsa_jax.ops.sparse_attention.triton_kernels import _f16_query, _pages_of_columns, _row_tiles

# The P.V and q.K^T operands' k-width: 4, as Triton lays out its kernel's dots (its TTGIR for
# the fp8 one-warp launches), so that the k elements sit in the same MMA positions.
K_WIDTH = gl.constexpr(4)
# q rows per program: the MMA's 16 (a group of G <= 16 query heads; rows past G are masked).
BLOCK_M = gl.constexpr(16)
# K tiles [BLOCK_N, D] bytes in shared memory, swizzled in 16-byte units by row: the K
# operand's 32-bit reads (8 tokens x 4 words per warp instruction, rows D bytes apart) land on
# 32 different banks (gl.bank_conflicts: 0; tests/test_gluon.py).
K_SHARED = gl.constexpr(gl.SwizzledSharedLayout(vec=16, per_phase=1, max_phase=8, order=[1, 0]))
# V tiles (V_SHARED): read 4 bytes per lane in ``_value_layouts``' load order, 8 lanes along a
# row's 32 bytes and 4 lanes across rows 4 apart; swizzled in 32-byte units by (row / 4) % 4,
# those 4 rows' 32 bytes fall on 4 different quarters of the banks (0 conflicts; K's swizzle
# would give 1, none 3).
V_SHARED_LAYOUT = gl.constexpr(gl.SwizzledSharedLayout(vec=32, per_phase=4, max_phase=4, order=[1, 0]))


@gluon.constexpr_function
def _value_layouts(block_n, d):
    """(load layout, operand-order layout) of a V tile's bytes ``[block_n, d]``, one warp.

    Both have the P.V operand's lanes (tokens +4, +8; channels +4, +8, +16 after the relabel
    of ``_to_operand_order``); they differ in register order only. Load order: channels +1,
    +2 first (one 32-bit load of 4 bytes), then tokens +1, +2. Operand order: tokens +1, +2
    first (a register holds two tokens of one channel), as ``DotOperandLayout(1, k_width=4)``
    holds them."""
    tok_high = [[1 << b, 0] for b in range(4, (block_n - 1).bit_length())]  # tokens +16, ...
    ch_high = [[0, 1 << b] for b in range(5, (d - 1).bit_length())]  # channels +32, ...
    lanes = [[4, 0], [8, 0], [0, 4], [0, 8], [0, 16]]
    load = gl.DistributedLinearLayout(reg_bases=[[0, 1], [0, 2], [1, 0], [2, 0]] + tok_high + ch_high,
                                      lane_bases=lanes, warp_bases=[], block_bases=[], shape=[block_n, d])
    pair = gl.DistributedLinearLayout(reg_bases=[[1, 0], [2, 0]] + tok_high + [[0, 1], [0, 2]] + ch_high,
                                      lane_bases=lanes, warp_bases=[], block_bases=[], shape=[block_n, d])
    return load, pair


@gluon.constexpr_function
def _output_layout(block_m, d):
    """The accumulator's lanes after ``_to_real_order``, each thread's 8 consecutive channels
    in consecutive registers (two 16-byte fp32 stores instead of eight 4-byte ones)."""
    row_high = [[1 << b, 0] for b in range(3, (block_m - 1).bit_length())]
    ch_high = [[0, 1 << b] for b in range(5, (d - 1).bit_length())]
    return gl.DistributedLinearLayout(reg_bases=[[0, 1], [0, 2], [0, 4]] + row_high + ch_high,
                                      lane_bases=[[0, 8], [0, 16], [1, 0], [2, 0], [4, 0]],
                                      warp_bases=[], block_bases=[], shape=[block_m, d])


@gluon.jit
def _to_operand_order(x, ROWS: gl.constexpr, D: gl.constexpr):
    """``[ROWS, D]`` with channel ``c = hi*32 + mid*4 + lo`` moved to column ``hi*32 + lo*8 + mid``
    (a relabel: no data moves when the lanes already hold it so)."""
    x = gl.reshape(x, [ROWS, D // 32, 8, 4])
    x = gl.permute(x, [0, 1, 3, 2])
    return gl.reshape(x, [ROWS, D])


@gluon.jit
def _to_real_order(x, ROWS: gl.constexpr, D: gl.constexpr):
    """The inverse of ``_to_operand_order``."""
    x = gl.reshape(x, [ROWS, D // 32, 4, 8])
    x = gl.permute(x, [0, 1, 3, 2])
    return gl.reshape(x, [ROWS, D])


@gluon.jit
def _tile_rows(idx_ptr, bt_ptr, idx_row_offset, bt_row_offset, tile, req_ok, n_tiles, num_pages, head_base,
               W: gl.constexpr, PAGE: gl.constexpr, BTW: gl.constexpr, BLOCK_N: gl.constexpr,
               STRIDE_PAGE: gl.constexpr, STRIDE_TOKEN: gl.constexpr, layout: gl.constexpr):
    """(cache offset of each selected token's K row, valid) for one tile, decided by the Triton
    kernel's own ``_pages_of_columns``; ``tile >= n_tiles`` (the prefetch past the last tile)
    selects nothing. An invalid entry's offset is page 0's (never loaded: masked)."""
    cols = tile * BLOCK_N + gl.arange(0, BLOCK_N, layout=layout)
    tok_in_page, page, ok = _pages_of_columns(idx_ptr, bt_ptr, idx_row_offset, bt_row_offset, cols, tile, req_ok,
                                              n_tiles, num_pages, W, PAGE, BTW)
    # 64-bit: page * STRIDE_PAGE overflows int32 past 2**31 bytes.
    base = gl.maximum(page, 0).to(gl.int64) * STRIDE_PAGE + (tok_in_page * STRIDE_TOKEN + head_base)
    return base, ok


@gluon.jit
def _tile_scores(q_smem, keys_t, row_down, scale_log2, s_ok, q_dtype: gl.constexpr, D: gl.constexpr,
                 KC: gl.constexpr, BLOCK_N: gl.constexpr, QK_FP16: gl.constexpr, a_op: gl.constexpr,
                 b_op: gl.constexpr, mma: gl.constexpr):
    """Masked scores in log2 units ``[BLOCK_M, BLOCK_N]``: q . K^T, KC channels at a time, from
    q and K (``keys_t``: ``[D, BLOCK_N]`` bytes) in shared memory (K: e4m3 -> fp16, exact, ->
    bf16 unless QK_FP16)."""
    scores = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=mma)
    for c in gl.static_range(0, D, KC):
        qa = q_smem.slice(c, KC, dim=1).load(a_op)  # [BLOCK_M, KC]
        kb = keys_t.slice(c, KC, dim=0).load(b_op)  # [KC, BLOCK_N] bytes
        kb = kb.to(gl.float8e4nv, bitcast=True).to(gl.float16).to(q_dtype)
        scores = mma_v2(qa, kb, scores)
    if QK_FP16:  # the scale-back is its own multiply, before the score scale (as Triton's)
        scores = (scores * row_down[:, None]) * scale_log2
    else:
        scores = scores * scale_log2
    # -1e20, finite: a tile with no valid entry gives exp2(max_old - max_new) = 1, not NaN.
    return gl.where(s_ok[None, :], scores, -1.0e20)


@gluon.jit
def _softmax_step(scores, s_ok, run_max):
    """(probabilities, the accumulator's rescale, the new running max) of one tile, base 2."""
    new_max = gl.maximum(run_max, gl.max(scores, axis=1))
    alpha = gl.exp2(run_max - new_max)
    probs = gl.where(s_ok[None, :], gl.exp2(scores - new_max[:, None]), 0.0)
    return probs, alpha, new_max


@gluon.jit
def _lazy_softmax_step(scores, s_ok, run_max, acc, norm, LAZY_RESCALE: gl.constexpr):
    """(probabilities, acc, norm, run_max) of one tile with lazy rescaling, base 2: the
    reference maximum moves, and acc and norm are rescaled, only when the tile raises some
    row's maximum by more than LAZY_RESCALE (triton_kernels._online_softmax_step says why)."""
    tile_max = gl.max(scores, axis=1)
    if gl.max(tile_max - run_max, axis=0) > LAZY_RESCALE:
        new_max = gl.maximum(run_max, tile_max)
        alpha = gl.exp2(run_max - new_max)
        acc = acc * alpha[:, None]
        norm = norm * alpha
        run_max = new_max
    probs = gl.where(s_ok[None, :], gl.exp2(scores - run_max[:, None]), 0.0)
    return probs, acc, norm + gl.sum(probs, axis=1), run_max


@gluon.jit
def _values_step(probs, alpha, v_raw, acc, BLOCK_N: gl.constexpr, D: gl.constexpr, v_pair: gl.constexpr,
                 a_op: gl.constexpr, b_op: gl.constexpr, RESCALE: gl.constexpr = True):
    """acc * alpha + P.V (RESCALE False: acc + P.V, ``alpha`` unused), V's bytes ``v_raw``
    ``[BLOCK_N, D]`` in the load layout."""
    # V: e4m3 -> fp16 in the load's registers, re-ordered in-thread, channels relabelled.
    values = v_raw.to(gl.float8e4nv, bitcast=True).to(gl.float16)
    values = gl.convert_layout(values, v_pair)
    values = gl.convert_layout(_to_operand_order(values, BLOCK_N, D), b_op)  # [BLOCK_N, D]
    # P.V on fp16 probabilities (the normaliser sums the fp32 ones).
    p16 = gl.convert_layout(probs.to(gl.float16), a_op)
    if RESCALE:
        acc = acc * alpha[:, None]
    return mma_v2(p16, values, acc)


@gluon.jit(do_not_specialize=["num_rows", "last_request"])
def sparse_attention_split_kernel_fp8_gluon(
    # inputs (as triton_kernels.sparse_attention_split_kernel's; the cache is e4m3 or its bytes)
    q_ptr, k_ptr, v_ptr, idx_ptr, bt_ptr, req_ptr, gate_ptr,
    scale_ptr,  # fp32 [score scale (log2 units), output scale]
    num_rows, last_request, num_pages,
    # outputs: NUM_SPLITS == 1 -> (out bf16 [R,H,D], unused); else (partials f32 [S,R,H,D], lse f32 [S,R,H])
    o_ptr, lse_ptr,
    W: gl.constexpr, PAGE: gl.constexpr, BTW: gl.constexpr, GROUP: gl.constexpr, HEADS: gl.constexpr,
    D: gl.constexpr, Q_ROW_STRIDE: gl.constexpr, Q_HEAD_STRIDE: gl.constexpr, Q_OFFSET: gl.constexpr,
    STRIDE_PAGE: gl.constexpr, STRIDE_TOKEN: gl.constexpr, STRIDE_HEAD: gl.constexpr, V_OFFSET: gl.constexpr,
    BLOCK_N: gl.constexpr, NUM_TILES: gl.constexpr, NUM_SPLITS: gl.constexpr,
    QK_FP16: gl.constexpr,  # q.K^T in fp16, q rescaled per row (triton_kernels._f16_query)
    F16_TOP_EXPONENT: gl.constexpr, F16_MAX_SHIFT: gl.constexpr,
    KC: gl.constexpr,  # channels of q.K^T per step (q and K read from shared memory KC at a time)
    V_SHARED: gl.constexpr,  # V through shared memory, K and V each re-issued as its buffer frees
    LAZY_RESCALE: gl.constexpr,  # > 0: lazy rescaling's threshold (base 2; _lazy_softmax_step); 0: off
):
    gl.static_assert(GROUP <= 16, "one MMA tile of 16 query rows")
    gl.static_assert((D >= 32) and (D <= 256) and (D & (D - 1) == 0), "D: a power of two in [32, 256]")
    gl.static_assert((BLOCK_N >= 16) and (BLOCK_N & (BLOCK_N - 1) == 0), "BLOCK_N: a power of two >= 16")
    gl.static_assert(gl.num_warps() == 1, "one warp")
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=K_WIDTH)
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=K_WIDTH)
    v_load: gl.constexpr = _value_layouts(BLOCK_N, D)[0]
    v_pair: gl.constexpr = _value_layouts(BLOCK_N, D)[1]
    out_l: gl.constexpr = _output_layout(BLOCK_M, D)
    # K rows: 16 contiguous bytes per thread per copy; q rows: 8 bf16 per thread per load.
    k_copy: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 16], threads_per_warp=[512 // D, D // 16],
                                            warps_per_cta=[1, 1], order=[1, 0])
    q_l: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[256 // D, D // 8],
                                         warps_per_cta=[1, 1], order=[1, 0])
    k_sh: gl.constexpr = K_SHARED
    v_sh: gl.constexpr = V_SHARED_LAYOUT
    q_sh: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
    tok_l: gl.constexpr = gl.BlockedLayout(size_per_thread=[1], threads_per_warp=[32], warps_per_cta=[1],
                                           order=[0])
    row_l: gl.constexpr = gl.SliceLayout(1, mma)
    col_l: gl.constexpr = gl.SliceLayout(0, mma)

    row = gl.program_id(0)
    kv_head = gl.program_id(1)
    split = gl.program_id(2)

    req_ok, bt_row_offset, idx_row_offset, n_tiles = _row_tiles(req_ptr, idx_ptr, row, last_request, W, BTW,
                                                                 BLOCK_N, NUM_TILES)
    # This split's share of the row's tiles: split, split + NUM_SPLITS, ...
    my_tiles = (gl.maximum(n_tiles - split, 0) + NUM_SPLITS - 1) // NUM_SPLITS
    first_head = kv_head * GROUP
    head_base = kv_head * STRIDE_HEAD

    # q [BLOCK_M, D] (rows past GROUP zero) into shared memory, once.
    qm = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, q_l))
    qd = gl.arange(0, D, layout=gl.SliceLayout(0, q_l))
    q_rows = (Q_OFFSET + row * Q_ROW_STRIDE + (first_head + qm) * Q_HEAD_STRIDE) * D
    query = gl.load(q_ptr + q_rows[:, None] + qd[None, :], mask=(qm < GROUP)[:, None], other=0.0)
    if QK_FP16:  # the Triton kernel's _f16_query: one power-of-two shift per row
        query, down = _f16_query(query, F16_TOP_EXPONENT, F16_MAX_SHIFT)
        row_down = gl.convert_layout(down, row_l)
    else:
        row_down = 1.0  # unused
    q_smem = gl.allocate_shared_memory(query.dtype, [BLOCK_M, D], q_sh, query)
    scale_log2 = gl.load(scale_ptr)
    output_scale = gl.load(scale_ptr + 1)
    run_max = gl.full([BLOCK_M], -1.0e20, gl.float32, layout=row_l)
    norm = gl.zeros([BLOCK_M], gl.float32, layout=row_l)
    acc = gl.zeros([BLOCK_M, D], gl.float32, layout=mma)  # columns in operand order

    k_bytes = k_ptr.to(gl.pointer_type(gl.uint8), bitcast=True)
    v_bytes = v_ptr.to(gl.pointer_type(gl.uint8), bitcast=True) + V_OFFSET
    k_cols = gl.arange(0, D, layout=gl.SliceLayout(0, k_copy))
    v_cols = gl.arange(0, D, layout=gl.SliceLayout(0, v_load))

    # The first tile's rows; an invalid entry's row is zero-filled by its copy, never read.
    base, ok = _tile_rows(idx_ptr, bt_ptr, idx_row_offset, bt_row_offset, split, req_ok, n_tiles, num_pages,
                          head_base, W, PAGE, BTW, BLOCK_N, STRIDE_PAGE, STRIDE_TOKEN, tok_l)
    tile = split
    if V_SHARED:
        # One K and one V buffer (the shared memory of the two K buffers below), each refilled
        # with the next tile as soon as this tile has read it: K's copy overlaps the softmax and
        # P.V, V's copy P.V and the next q.K^T. Commit order K0, V0, K1, V1, ...: wait_group(1) leaves
        # only the most recent copy in flight.
        k_smem = gl.allocate_shared_memory(gl.uint8, [BLOCK_N, D], k_sh)
        v_smem = gl.allocate_shared_memory(gl.uint8, [BLOCK_N, D], v_sh)
        copy_base = gl.convert_layout(base, gl.SliceLayout(1, k_copy))
        copy_ok = gl.convert_layout(ok, gl.SliceLayout(1, k_copy))
        async_copy.async_copy_global_to_shared(k_smem, k_bytes + copy_base[:, None] + k_cols[None, :],
                                               mask=copy_ok[:, None])
        async_copy.commit_group()
        async_copy.async_copy_global_to_shared(v_smem, v_bytes + copy_base[:, None] + k_cols[None, :],
                                               mask=copy_ok[:, None])
        async_copy.commit_group()
        for _ in range(0, my_tiles):
            s_ok = gl.convert_layout(ok, col_l)
            nxt = tile + NUM_SPLITS
            # (one token per lane until the copies need them: 64-bit offsets in the copies' layout,
            # 16 per thread, held across q.K^T spill)
            base, ok = _tile_rows(idx_ptr, bt_ptr, idx_row_offset, bt_row_offset, nxt, req_ok, n_tiles,
                                  num_pages, head_base, W, PAGE, BTW, BLOCK_N, STRIDE_PAGE, STRIDE_TOKEN, tok_l)
            async_copy.wait_group(1)  # this tile's K has landed (its V may still be in flight)
            gl.thread_barrier()
            scores = _tile_scores(q_smem, k_smem.permute([1, 0]), row_down, scale_log2, s_ok, query.dtype, D, KC,
                                  BLOCK_N, QK_FP16, a_op, b_op, mma)
            gl.thread_barrier()  # every lane done reading K: refill it with the next tile's
            copy_base = gl.convert_layout(base, gl.SliceLayout(1, k_copy))
            copy_ok = gl.convert_layout(ok, gl.SliceLayout(1, k_copy))
            async_copy.async_copy_global_to_shared(k_smem, k_bytes + copy_base[:, None] + k_cols[None, :],
                                                   mask=copy_ok[:, None])
            async_copy.commit_group()
            if LAZY_RESCALE > 0:
                probs, acc, norm, run_max = _lazy_softmax_step(scores, s_ok, run_max, acc, norm, LAZY_RESCALE)
                alpha = 1.0  # unused
            else:
                probs, alpha, run_max = _softmax_step(scores, s_ok, run_max)
                norm = norm * alpha + gl.sum(probs, axis=1)
            async_copy.wait_group(1)  # this tile's V has landed
            gl.thread_barrier()
            v_raw = v_smem.load(v_load)  # [BLOCK_N, D] bytes, 4 channels per 32-bit read
            gl.thread_barrier()  # every lane done reading V: refill it with the next tile's
            async_copy.async_copy_global_to_shared(v_smem, v_bytes + copy_base[:, None] + k_cols[None, :],
                                                   mask=copy_ok[:, None])
            async_copy.commit_group()
            acc = _values_step(probs, alpha, v_raw, acc, BLOCK_N, D, v_pair, a_op, b_op, LAZY_RESCALE == 0)
            tile = nxt
    else:
        # Two K buffers (the next tile's K in flight while this one computes); V from the cache
        # straight into registers.
        k_smem = gl.allocate_shared_memory(gl.uint8, [2, BLOCK_N, D], k_sh)  # [buffer, token, channel]
        k_base = gl.convert_layout(base, gl.SliceLayout(1, k_copy))
        k_ok = gl.convert_layout(ok, gl.SliceLayout(1, k_copy))
        async_copy.async_copy_global_to_shared(k_smem.index(0), k_bytes + k_base[:, None] + k_cols[None, :],
                                               mask=k_ok[:, None])
        async_copy.commit_group()
        for it in range(0, my_tiles):
            buf = it % 2
            v_base = gl.convert_layout(base, gl.SliceLayout(1, v_load))
            v_ok = gl.convert_layout(ok, gl.SliceLayout(1, v_load))
            s_ok = gl.convert_layout(ok, col_l)
            # The next tile's K into the other buffer (its last reader finished: barrier at the end).
            nxt = tile + NUM_SPLITS
            base, ok = _tile_rows(idx_ptr, bt_ptr, idx_row_offset, bt_row_offset, nxt, req_ok, n_tiles,
                                  num_pages, head_base, W, PAGE, BTW, BLOCK_N, STRIDE_PAGE, STRIDE_TOKEN, tok_l)
            k_base = gl.convert_layout(base, gl.SliceLayout(1, k_copy))
            k_ok = gl.convert_layout(ok, gl.SliceLayout(1, k_copy))
            async_copy.async_copy_global_to_shared(k_smem.index(1 - buf), k_bytes + k_base[:, None] + k_cols[None, :],
                                                   mask=k_ok[:, None])
            async_copy.commit_group()
            async_copy.wait_group(1)  # this tile's K has landed
            gl.thread_barrier()  # ... for every lane
            scores = _tile_scores(q_smem, k_smem.index(buf).permute([1, 0]), row_down, scale_log2, s_ok,
                                  query.dtype, D, KC, BLOCK_N, QK_FP16, a_op, b_op, mma)
            # V's bytes [BLOCK_N, D] straight into registers, under the entries' validity. Issued
            # here, not before q.K^T: held across it, the 64 registers spill (76 B at the TP1
            # launch), and that variant measured no faster on an H100 (notes/triton.md, session 20).
            v_raw = gl.load(v_bytes + v_base[:, None] + v_cols[None, :], mask=v_ok[:, None], other=0)
            if LAZY_RESCALE > 0:
                probs, acc, norm, run_max = _lazy_softmax_step(scores, s_ok, run_max, acc, norm, LAZY_RESCALE)
                acc = _values_step(probs, 1.0, v_raw, acc, BLOCK_N, D, v_pair, a_op, b_op, False)
            else:
                probs, alpha, run_max = _softmax_step(scores, s_ok, run_max)
                acc = _values_step(probs, alpha, v_raw, acc, BLOCK_N, D, v_pair, a_op, b_op)
                norm = norm * alpha + gl.sum(probs, axis=1)
            tile = nxt
            gl.thread_barrier()  # every lane done reading K[buf] before the next iteration refills it
    async_copy.wait_group(0)  # the copies past the last tile (masked: zero-filled, never read)

    has_values = norm > 0
    # 0.34.0: one reciprocal per row, times the output scale.
    out = gl.where(has_values[:, None], acc * (output_scale / gl.maximum(norm, 1.0e-20))[:, None], 0.0)
    out = gl.convert_layout(_to_real_order(out, BLOCK_M, D), out_l)
    om = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, out_l))
    od = gl.arange(0, D, layout=gl.SliceLayout(0, out_l))
    head_ok = om < GROUP
    if NUM_SPLITS == 1:
        qo = row * (HEADS * D) + (first_head + om[:, None]) * D + od[None, :]
        gate = gl.load(gate_ptr + qo, mask=head_ok[:, None], other=0.0).to(gl.float32)
        # bf16 round before the gate, as the originals; tl.sigmoid's formula.
        out = out.to(gl.bfloat16).to(gl.float32) * (1.0 / (1.0 + gl.exp(-gate)))
        gl.store(o_ptr + qo, out.to(gl.bfloat16), mask=head_ok[:, None])
    else:
        lse = gl.where(has_values, run_max + gl.log2(gl.maximum(norm, 1.0e-20)), -float("inf"))
        slab = (split * num_rows + row).to(gl.int64) * HEADS + first_head
        gl.store(o_ptr + (slab + om[:, None]) * D + od[None, :], out, mask=head_ok[:, None])
        lm = gl.arange(0, BLOCK_M, layout=row_l)
        gl.store(lse_ptr + slab + lm, lse, mask=lm < GROUP)
