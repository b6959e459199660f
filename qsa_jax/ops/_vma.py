"""Typing for calls inside a caller's ``jax.shard_map`` with ``check_vma=True`` (JAX's default).

There JAX types each array with the manual mesh axes it varies over ("vma"), and checks
that types line up: a loop's carries, a kernel's declared outputs, a ``custom_vjp``'s
cotangents. An operator's result varies over every axis one of its arguments varies over
(a replicated cache read by rows split over ``data`` gives rows split over ``data``), so:

- ``pallas_call`` declares a Pallas kernel's outputs as varying over the union of its
  inputs' axes (and casts the inputs: an output aliased to an input takes its type);
- ``like`` starts XLA loop carries with the axes of the loop's inputs;
- the operators' results are cast to the union of their arguments' axes (``uniform``,
  ``typed``): jax-triton declares none, an empty batch returns fresh zeros;
- a gradient goes back to each argument with the argument's own axes: where an argument
  is replicated over an axis that another one varies over, its cotangent is the sum over
  that axis of the per-shard ones (``missing``; ``_sharding._attention_local`` sums the
  cache's in fp32 and rounds once, as for row shards of a mesh).

Outside ``shard_map``, or with ``check_vma=False``, every array varies over nothing: each
cast returns its input unchanged, the kernels' output structs are rebuilt declaring no axes
(which Pallas then ignores), and the compiled program is the same as without this module.
Casts are ``jax.lax.pcast(..., to="varying")``, a no-op on the data. Public JAX API only
(``jax.typeof``, ``jax.lax.pcast``, ``jax.sharding.ManualAxisType``); tests/test_shard_map.py
runs the operators inside ``shard_map`` with the check on.
"""

from __future__ import annotations

import functools

import jax

from qsa_jax.ops._pallas_support import pl


def _axes_of(x) -> frozenset:
    return jax.typeof(x).manual_axis_type.varying if isinstance(x, jax.Array) else frozenset()


def varying(*trees) -> frozenset:
    """The union of the manual axes that the arrays among ``trees``' leaves vary over."""
    axes = frozenset()
    for leaf in jax.tree.leaves(trees):
        axes |= _axes_of(leaf)
    return axes


def _to(x, axes: frozenset):
    extra = tuple(sorted(axes - _axes_of(x))) if isinstance(x, jax.Array) else ()
    return jax.lax.pcast(x, extra, to="varying") if extra else x


def uniform(tree, axes: frozenset | None = None):
    """Every array of ``tree`` cast to vary over ``axes`` (default: the union over ``tree``)."""
    axes = varying(tree) if axes is None else axes
    return tree if not axes else jax.tree.map(lambda x: _to(x, axes), tree)


def like(tree, *refs):
    """``tree`` (e.g. a loop's initial carry) cast to vary over the axes of ``refs``."""
    return uniform(tree, varying(*refs))


def missing(x, axes: frozenset) -> tuple[str, ...]:
    """The axes of ``axes`` that ``x`` does not vary over (sorted): those to sum its
    cotangent over."""
    return tuple(sorted(axes - _axes_of(x)))


def _declared(out_shape, axes: frozenset):
    """``out_shape``'s ``ShapeDtypeStruct``s declared as varying over ``axes`` (with the check
    on, Pallas needs a declaration even for none; without it, it reads none)."""
    manual = jax.sharding.ManualAxisType(varying=axes)
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, manual_axis_type=manual), out_shape)


def pallas_call(kernel, *, out_shape, **kwargs):
    """``pl.pallas_call`` whose inputs (including in-place accumulators made here) and
    outputs vary over the union of its inputs' axes."""
    def call(*inputs):
        axes = varying(inputs)
        if axes and kwargs.get("interpret"):
            # jax 0.11's Pallas interpreter (CPU) evaluates the kernel with the inputs' types:
            # a gather of a varying ref at an invariant index (a program id) fails inside
            # XLA's lowering with a JAX error. tests/test_shard_map.py checks it still does.
            raise NotImplementedError(
                "Pallas's interpreter (CPU) cannot run inside jax.shard_map with check_vma=True "
                f"(manual axes {sorted(axes)}); pass check_vma=False to jax.shard_map, or use "
                "implementation='xla' on CPU (on a GPU the kernels lower to Triton with the check on)")
        return pl.pallas_call(kernel, out_shape=_declared(out_shape, axes), **kwargs)(*uniform(inputs, axes))

    return call


def typed(local):
    """Decorates an operator's per-shard body ``local(static, axes, *arrays)``: its results
    cast to the union of the arrays' axes. (Sparse attention's body types its own: its
    backward's sums leave some cotangents varying over fewer axes.)"""
    @functools.wraps(local)
    def body(static, axes, *arrays):
        return like(local(static, axes, *arrays), arrays)

    return body
