"""Named Qwen3.8-Flash-Next shapes shared by tests, benchmarks and warmup.

Per tensor-parallel rank: 24 query heads and 2 KV heads in all, head dim 256;
the selection is 512 blocks of 4 tokens plus up to 3 tail tokens (W = 2051).
"""

from __future__ import annotations

from typing import NamedTuple

HEAD_DIM = 256
SELECTION_BLOCKS = 512  # top-k compressed blocks per row
TOKENS_PER_BLOCK = 4  # compress ratio C of the indexer
MAX_TAIL = TOKENS_PER_BLOCK - 1
SELECTION_WIDTH = SELECTION_BLOCKS * TOKENS_PER_BLOCK + MAX_TAIL  # W = 2051

INDEXER_HEAD_DIM = 128  # Dk of the indexer keys
INDEXER_RING = 4  # compressor ring slots (8 with speculative decoding)
INDEXER_RING_SPECULATIVE = 8
INDEXER_ROW_WIDTH = 140  # 128 bf16 keys + 3 int64 rope positions as 12 bf16 slots


class AttentionGeometry(NamedTuple):
    name: str
    num_query_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    page_size_no_spec: int

    @property
    def group_size(self) -> int:
        return self.num_query_heads // self.num_kv_heads


TP1 = AttentionGeometry("TP1", 24, 2, HEAD_DIM, 1600, 1568)
TP2 = AttentionGeometry("TP2", 12, 1, HEAD_DIM, 1600, 1568)
TP4 = AttentionGeometry("TP4", 6, 1, HEAD_DIM, 800, 784)
GEOMETRIES = {g.name: g for g in (TP1, TP2, TP4)}

# Row counts of the benchmark grid: decode batches up to prefill chunks.
BENCH_ROWS = tuple(2**i for i in range(13))  # 1 .. 4096
MAX_WARMUP_ROWS = 8192
