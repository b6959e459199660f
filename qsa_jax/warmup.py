"""Compile ahead of serving, and keep compiled code across processes.

JAX specialises a jitted function on every static shape, so unlike the
originals (whose Triton kernels take the row count at run time) each distinct
row count is its own executable. ``warmup`` therefore compiles, for a
deployment's cache and block table, every row count the server will use (by
default: every power of two up to ``arg_specs.MAX_WARMUP_ROWS`` (8192) and the smallest row count of every
config the table can pick) with both ``use_prefill_config`` values, by
running each once on empty selections (count 0: the kernels do no reads).
An fp8 cache (float8_e4m3fn, or its uint8 bytes: vLLM 0.34.0's warmup also
treats a uint8 cache as fp8) is warmed with fp8's table and with scales;
executables are per cache dtype, so warm the dtype the server will pass.
With ``enable_persistent_cache`` the executables also land in JAX's on-disk
compilation cache, so a second process starts warm.
"""

from __future__ import annotations

import operator
import os
import pathlib
import warnings
from typing import Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from qsa_jax.arg_specs import MAX_WARMUP_ROWS
from qsa_jax.config import TABLE_NAMES, PallasLaunch, TritonLaunch, first_rows, select_config
from qsa_jax.ops.sparse_attention.api import sparse_attention
from qsa_jax.ops.sparse_attention.base import GATE_DTYPES, as_kv_layout, check_tiling, kv_format, prefill_flag_selects

DEFAULT_CACHE_DIR = pathlib.Path(os.environ.get("QSA_JAX_CACHE_DIR", "~/.cache/qsa_jax/xla")).expanduser()


def enable_persistent_cache(path: str | os.PathLike | None = None) -> pathlib.Path:
    """Turn on JAX's persistent compilation cache (every executable, however fast to build)."""
    path = pathlib.Path(path or DEFAULT_CACHE_DIR)
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


def _powers_of_two(max_rows: int) -> list[int]:
    return [2**i for i in range(max_rows.bit_length())]


def default_row_counts(num_kv_heads: int, selection_width: int, max_rows: int = MAX_WARMUP_ROWS, *,
                       is_fp8: bool = False, table: str | None = None) -> list[int]:
    """Powers of two up to ``max_rows`` plus the first row count of every config."""
    return sorted(set(_powers_of_two(max_rows)) | set(first_rows(num_kv_heads, selection_width, max_rows, is_fp8=is_fp8,
                                        table=table).values()))


def warmup(
    kv,
    block_table,
    *,
    num_query_heads: int,
    selection_width: int,
    row_counts: Iterable[int] | None = None,
    implementation: str | None = None,
    persistent_cache: bool | str | os.PathLike = True,
    with_scales: bool | None = None,
    config: Sequence[int] | str | None = None,
    launch: PallasLaunch | TritonLaunch | None = None,
    gate_dtype=jnp.bfloat16,
    table: str | None = None,
) -> tuple[tuple[int, int, int], ...]:
    """Compile sparse attention for a deployment; return the warmed profiles.

    Args:
      kv: the deployment's cache (fused ``[NB, Hk, P, 2D]`` or a (k, v) pair).
      block_table: its block table (only the shape and dtype matter; its row count, the
        number of requests, is part of every executable, so pass the shape the calls will
        bring: a call with another row count compiles anew).
      num_query_heads, selection_width: H and W of the deployment.
      row_counts: row counts to compile (default ``default_row_counts``).
      implementation: as for ``sparse_attention``.
      persistent_cache: True (default folder), a folder, or False.
      with_scales: compile the variant with k/v scales (vLLM 0.34.0's arithmetic).
        Default: True for an fp8 cache (which needs them), False for bf16.
      config, launch: as the server will pass them to ``sparse_attention``: ``config``
        None (the default table), a table name ("vllm-0.30", "vllm-0.34") or an explicit
        ``(block_n, num_warps, num_tiles, num_splits)``; ``launch`` a ``PallasLaunch`` /
        ``TritonLaunch`` (pass ``implementation=`` with it). Executables are specialised on
        both, so a server call with another ``config``/``launch`` compiles anew.
      gate_dtype: the ``output_gate`` dtype the server passes (bf16, fp16 or fp32): another
        dtype is another executable.
      table: the old name of a table-name ``config`` (deprecated; not with ``config``).

    Returns:
      Sorted distinct ``(block_n, num_splits, num_warps)`` profiles, as the
      originals' warmup reports them: the tilings ``select_config`` chose (on the measured
      fp8 table Pallas launches its own split count at some of them, ``config.pallas_tiling``;
      its kernels are compiled all the same, by the calls that report these).
    """
    if table is not None:
        if config is not None:
            raise ValueError("warmup: pass the table as config= (table= is its deprecated name), not both")
        warnings.warn("warmup(table=) is deprecated: pass config=, as to sparse_attention",
                      DeprecationWarning, stacklevel=2)
        config = table
    # Checked as sparse_attention checks config= (errors name the field), before anything compiles.
    explicit = None if config is None or isinstance(config, str) else check_tiling(config, selection_width)
    if isinstance(config, str) and config not in TABLE_NAMES:
        raise ValueError(f"warmup: config must be a tiling (block_n, num_warps, num_tiles, num_splits), a "
                         f"table name {TABLE_NAMES} or None; got {config!r}")
    table = config if isinstance(config, str) else None
    if row_counts is not None:
        try:
            row_counts = [operator.index(r) for r in row_counts]
        except TypeError:
            raise TypeError(f"warmup: row_counts must be ints >= 0; got {row_counts!r}") from None
        if any(r < 0 for r in row_counts):
            raise ValueError(f"warmup: row_counts must be ints >= 0; got {row_counts!r}")
    layout, arrays = as_kv_layout(kv)
    hk, d = layout.num_kv_heads, layout.head_dim
    for name, value in (("num_query_heads", num_query_heads), ("selection_width", selection_width)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise ValueError(f"warmup: {name} must be an int >= 1; got {value!r}")
    if jnp.dtype(gate_dtype) not in GATE_DTYPES:
        raise TypeError(f"warmup: gate_dtype must be bfloat16, float16 or float32; got {gate_dtype}")
    if num_query_heads % hk:
        raise ValueError(f"warmup: num_query_heads={num_query_heads} is not a multiple of the cache's {hk} KV heads")
    is_fp8 = kv_format(arrays) != "bf16"
    with_scales = is_fp8 if with_scales is None else bool(with_scales)
    if is_fp8 and not with_scales:
        raise ValueError("with_scales=False: an fp8 kv cache is only ever called with k_scale and v_scale")
    # Values do not matter: the scales are operands of the compiled code, not constants.
    scales = dict(k_scale=1.0, v_scale=1.0) if with_scales else {}
    if persistent_cache:
        enable_persistent_cache(None if persistent_cache is True else persistent_cache)
    if row_counts is not None:
        rows_list = sorted(set(row_counts))
    elif explicit is not None:  # one tiling at every row count: the powers of two
        rows_list = _powers_of_two(MAX_WARMUP_ROWS)
    else:
        rows_list = default_row_counts(hk, selection_width, is_fp8=is_fp8, table=table)
    pages = jnp.asarray(block_table)
    profiles = set()
    for rows in rows_list:
        q = jnp.zeros((rows, num_query_heads, d), jnp.bfloat16)
        # All -1 with count 0: a real launch of every kernel that reads nothing.
        indices = jnp.full((rows, selection_width + 1), -1, jnp.int32).at[:, -1].set(0)
        req = jnp.zeros((rows,), jnp.int32)
        for flag in (False, True):
            if flag and (explicit is not None or not prefill_flag_selects(rows * hk, is_fp8, table)):
                continue  # the flag picks nothing here: the same executable as flag=False
            cfg = explicit or select_config(rows, hk, flag, selection_width, is_fp8, table=table)
            sparse_attention(q, kv, indices, pages, req, q.astype(gate_dtype), use_prefill_config=flag,
                             config=config if explicit is None else tuple(explicit),
                             implementation=implementation, launch=launch, **scales).block_until_ready()
            profiles.add((cfg.block_n, cfg.num_splits, cfg.num_warps))
    return tuple(sorted(profiles))
