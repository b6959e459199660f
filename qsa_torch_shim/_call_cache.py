"""One dictionary lookup per repeated sparse-attention call: checks and imports cached.

A serving loop passes the same buffers step after step (the KV cache, the metadata
buffers, often q, the gate and ``out``). For such a call the shim's per-call Python --
the originals' checks (~6 µs on the H200's host) and seven cached-import lookups
(2-6 µs each: a memory-view key, a dict, a weakref per tensor) -- recomputes what the
previous call already knew. This cache keys the whole call on its arguments' memory
views and keeps what they determine:

* the checks' verdict: they read only shapes, strides, dtypes, devices and the scale
  values, all of which the key holds (a device is implied by the data pointer of a
  live root, see below), so a key seen before passed them;
* the JAX arguments of the jitted call (``_eager.sparse_inputs``): the imports alias
  the key's memory views, so they stay right while the tensors the views belong to
  live -- the rule of ``_interop.PersistentImports``, which made them.

Validity: an entry also holds a weakref to the root tensor object (``view_root``) of
each argument whose import owns its memory; a hit needs each to be alive and to be
the argument's root now (so another tensor that reuses freed memory at the same
address misses), and a root's death drops the entry (its imports hold the storage:
keeping them would pin memory the user freed). q and the gate are new objects every
step in vLLM: their imports own nothing (``_interop.ActivationImports``) and are valid
for any tensor with the key's memory view, so they take no weakref (the key holds
their devices, which a live root would otherwise imply). A call that copied an
argument is not cached (the copy is this call's data). ``clear_import_cache()`` clears it. What is not cached: the
stream fence (fresh per call), the route for ``out`` and the jitted call's static
arguments (the fence mode and tiling table may change between calls).
"""

from __future__ import annotations

import weakref

import torch

from qsa_torch_shim import _interop
from qsa_torch_shim._private_api import view_root


def _view(t: torch.Tensor) -> tuple:
    return t.data_ptr(), t.shape, t.stride(), t.dtype


_PLAIN_SCALES = (type(None), float, int)


def sparse_key(q, k_cache, v_cache, logical_indices, block_table, token_to_req, out,
               output_gate, k_scale, v_scale, surface: str) -> tuple | None:
    """Everything the checks and the imports of one sparse call depend on; None (do not
    cache) when a scale is not a plain number: a tensor or other object hashes by
    identity, so a changed value would not change the key."""
    if type(k_scale) not in _PLAIN_SCALES or type(v_scale) not in _PLAIN_SCALES:
        return None
    return (_view(q), q.device, _view(k_cache), _view(v_cache), _view(logical_indices),
            _view(block_table), _view(token_to_req), _view(output_gate), output_gate.device,
            None if out is None else _view(out), k_scale, v_scale, surface)


class CallCache(_interop.BoundedEntries):
    """``key -> (root weakrefs, scales, JAX arguments)``, bounded, dropped with any root."""

    def __init__(self, max_entries: int = 256):
        super().__init__(max_entries)

    def get(self, key: tuple, tensors: tuple):
        """(scales, JAX arguments) of ``key`` if the entry's roots are still those of
        ``tensors`` (the call's tensors, in the order given to ``put``), else None."""
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        refs, scales, args = entry
        for i, ref in refs:
            if ref() is not view_root(tensors[i]):
                self.misses += 1
                return None
        self.hits += 1
        return scales, args

    def put(self, key: tuple, tensors: tuple, checked: tuple, scales, args) -> None:
        """Cache ``args`` for ``key``, valid while ``tensors[i]``'s roots for ``i`` in
        ``checked`` live and stay the arguments' roots."""
        def _drop(_ref, key=key, entries=self._entries):
            entries.pop(key, None)

        refs = tuple((i, weakref.ref(view_root(tensors[i]), _drop)) for i in checked)
        self._store(key, (refs, scales, args))


SPARSE_CALLS = CallCache()
_interop.DEPENDENT_CACHES.append(SPARSE_CALLS)
