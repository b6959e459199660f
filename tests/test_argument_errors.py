"""Errors that name the argument, raised before anything is traced (cases a review helper found
failing inside JAX, naming nothing, or passing): torch tensors given to the JAX API, a config of
the wrong type, a traced use_prefill_config, a non-scalar traced scale, warmup's and
select_config's own arguments."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import qsa_jax
from qsa_testing import cases as C


def _case():
    rng = np.random.default_rng(4)
    return C.sparse_attention_case(rng, rows=3, num_query_heads=4, num_kv_heads=2, head_dim=16, page_size=8,
                                   selection_blocks=2, context_tokens=24)


def _args(case):
    return [jnp.asarray(x) for x in (case.q, case.kv_cache, case.logical_indices, case.block_table,
                                     case.token_to_req, case.output_gate)]


def test_a_torch_tensor_given_to_the_jax_api_is_named():
    torch = pytest.importorskip("torch")
    case = _case()
    args = _args(case)
    args[2] = torch.from_numpy(np.asarray(case.logical_indices))
    with pytest.raises(TypeError, match="logical_indices must be a JAX or NumPy array; got torch.Tensor"):
        qsa_jax.sparse_attention(*args, implementation="xla")
    cache = jnp.zeros((2, 4, 1, 8), jnp.bfloat16)
    with pytest.raises(TypeError, match="slot_mapping must be a JAX or NumPy array"):
        qsa_jax.store_cache_rows(cache, torch.zeros(2, dtype=torch.int32), np.ones((2, 8), np.float32))


@pytest.mark.parametrize("kw,exc,match", [
    (dict(config=5), TypeError, "config must be a tiling"),
    (dict(config=3.5), TypeError, "config must be a tiling"),
])
def test_sparse_attention_static_arguments(kw, exc, match):
    with pytest.raises(exc, match=match):
        qsa_jax.sparse_attention(*_args(_case()), implementation="xla", **kw)


def test_traced_flag_and_scales():
    case = _case()
    args = _args(case)
    with pytest.raises(TypeError, match="use_prefill_config must be a Python bool"):
        jax.jit(lambda flag: qsa_jax.sparse_attention(*args, use_prefill_config=flag,
                                                      implementation="xla"))(True)
    kv8 = jnp.asarray(np.asarray(case.kv_cache, np.float32)).astype(jnp.float8_e4m3fn)
    with pytest.raises(ValueError, match="k_scale must be a scalar; got shape \\(2,\\)"):
        jax.jit(lambda ks: qsa_jax.sparse_attention(args[0], kv8, *args[2:], implementation="xla", k_scale=ks,
                                                    v_scale=1.0))(jnp.ones(2))


@pytest.mark.parametrize("kw,match", [
    (dict(num_query_heads=3), "num_query_heads=3 is not a multiple of the cache's 2 KV heads"),
    (dict(num_query_heads=0), "num_query_heads must be an int >= 1"),
    (dict(selection_width=-5), "selection_width must be an int >= 1"),
    (dict(selection_width=20.0), "selection_width must be an int >= 1"),
])
def test_warmup_names_its_arguments(kw, match):
    case = _case()
    args = dict(num_query_heads=4, selection_width=11, row_counts=[1], implementation="xla",
                persistent_cache=False)
    with pytest.raises(ValueError, match=match):
        qsa_jax.warmup(case.kv_cache, case.block_table, **{**args, **kw})


@pytest.mark.parametrize("args,match", [
    ((None, 2, False, 2051), "num_rows must be an int; got None"),
    ((1.5, 2, False, 2051), "num_rows must be an int; got 1.5"),
    ((3, 2.0, False, 2051), "num_kv_heads must be an int"),
    ((3, 2, False, 2051.0), "num_columns must be an int"),
])
def test_select_config_takes_ints(args, match):
    with pytest.raises(TypeError, match=match):
        qsa_jax.select_config(*args)
    assert qsa_jax.select_config(np.int64(3), 2, False, 2051) == qsa_jax.select_config(3, 2, False, 2051)
