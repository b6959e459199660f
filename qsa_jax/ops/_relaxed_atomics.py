"""Atomic add with relaxed memory order for Pallas's Triton lowering (jax 0.11).

Why: ``jax.experimental.pallas.triton.atomic_add`` always lowers to ``tt.atomic_rmw``
with acquire-release order (the fixed default of the lowering's private
``_atomic_rmw``), and there is no public argument to ask for less. On sm_90 every
acq_rel atomic carries fences: the gradient's backward kernel took 19.6 ms with them
and 7.2 ms with relaxed order on an H200 (notes/backward.md, session 5).

What this module does, and the only place in the project that touches JAX internals
for it: a primitive of its own, ``relaxed_atomic_add_p``, that reuses Pallas's own
abstract evaluation, state discharge (interpret mode) and Triton lowering rule of
``atomic_rmw`` for an add, then rewrites the ``sem`` attribute of the one
``tt.atomic_rmw`` that rule emitted from acq_rel to relaxed. Nothing is patched
globally, so other Pallas kernels in the process keep their atomics as they were.
If a JAX upgrade moves or changes any of this, ``relaxed_atomic_add`` raises at
lowering time (not a silent acq_rel), and tests/test_relaxed_atomics.py fails on
CPU: it lowers a small kernel for sm_90 and reads the semantics in the Triton IR.

When relaxed order is sound: only for accumulations whose partial sums nobody reads
during the launch. Relaxed atomics are still atomic (no update is lost); they only
drop the ordering of *other* memory accesses around them. That matters when an
atomic publishes data (a flag or counter another program reads to decide that
some other memory is ready). The callers here publish nothing through the atomics,
and their result is read only by later XLA operations, after the kernel's launch
has completed (the launch boundary orders everything).
"""

from __future__ import annotations

from typing import Any

import jax

_SETUP_ERROR: Exception | None = None
try:
    from jax._src import core as _core
    from jax._src import tree_util as _tree_util
    from jax._src.lib.mlir import ir as _ir
    from jax._src.lib.triton import dialect as _tt
    from jax._src.pallas.triton import lowering as _lowering
    from jax._src.pallas.triton import primitives as _primitives
    from jax._src.state import discharge as _discharge
    from jax._src.state import primitives as _state_primitives

    _ADD = _primitives.AtomicOpType.ADD
    relaxed_atomic_add_p = _core.Primitive("qsa_relaxed_atomic_add")
    relaxed_atomic_add_p.def_effectful_abstract_eval(_primitives._atomic_abstract_eval)
    _discharge.register_discharge_rule(relaxed_atomic_add_p)(_primitives._atomic_rmw_discharge_rule)
except (ImportError, AttributeError) as exc:  # pragma: no cover -- a JAX without these internals
    _SETUP_ERROR = exc
    relaxed_atomic_add_p = None


def _semantic_attr(value) -> Any:
    return _ir.IntegerAttr.get(_ir.IntegerType.get_signless(32), int(value))


def _relaxed_lowering(ctx, *args_flat, args_tree, atomic_type):
    result = _primitives._atomic_lowering_rule(ctx, *args_flat, args_tree=args_tree, atomic_type=atomic_type)
    op = result.owner
    op = getattr(op, "operation", op)
    expected = _semantic_attr(_tt.MemSemantic.ACQUIRE_RELEASE)
    if op.name != "tt.atomic_rmw" or "sem" not in op.attributes or op.attributes["sem"] != expected:
        raise RuntimeError(
            f"Pallas's Triton lowering of atomic_add changed in jax {jax.__version__} (expected one "
            f"tt.atomic_rmw with acq_rel order, got {op.name}); update qsa_jax/ops/_relaxed_atomics.py")
    op.attributes["sem"] = _semantic_attr(_tt.MemSemantic.RELAXED)
    return result


if relaxed_atomic_add_p is not None:
    _lowering.register_lowering(relaxed_atomic_add_p)(_relaxed_lowering)


def relaxed_atomic_add(ref, idx, values, *, mask=None):
    """``ref[idx] += values`` atomically with relaxed memory order (see the module
    docstring for when that is sound); the same arguments as Pallas's ``atomic_add``."""
    if _SETUP_ERROR is not None:
        raise RuntimeError(
            f"relaxed atomics need JAX internals missing from jax {jax.__version__} ({_SETUP_ERROR}); "
            "update qsa_jax/ops/_relaxed_atomics.py") from _SETUP_ERROR
    x_ref, transforms = _state_primitives.get_ref_and_transforms(ref, idx, "atomic_rmw")
    args_flat, args_tree = _tree_util.tree_flatten((x_ref, transforms, values, mask))
    return relaxed_atomic_add_p.bind(*args_flat, args_tree=args_tree, atomic_type=_ADD)
