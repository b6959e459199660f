"""The operators on a device mesh: tensor and data parallelism, per shard.

Mechanism: each operator's jitted body is a ``jax.experimental.custom_partitioning``
function. On one device (or inside a ``shard_map``, where the arrays are
already local) JAX inlines the plain implementation. On a mesh, XLA's
partitioner (Shardy) hands us the shardings it settled on for the arguments;
``_partition`` checks them against the operator's supported layouts, keeps them
exactly as they are (so XLA inserts no resharding around the call) and lowers
the implementation once more on the per-shard shapes, with the per-shard
problem (and tiling) derived from those shapes. A plain ``jax.jit`` over
sharded arrays, or an eager call with sharded arrays, then runs one local
kernel per device and nothing else -- except in the backward of sparse
attention with rows split, whose cache cotangent is summed over the row shards
(one all-reduce: ``_attention_local``).

Why not ``shard_map`` keyed on ``x.sharding``: inside a user's ``jax.jit`` the
arguments are tracers without a sharding (outside explicit-sharding mode), so a
wrapper could only see the layout of eager calls; custom_partitioning sees the
layout in both cases. Users who already work inside a ``shard_map`` need nothing:
there the operators see local arrays and run as plain local calls, bypassing the
partitioning wrappers (which would drop ``check_vma=True``'s types, typed by ``_vma``).

On meshes with ``Explicit`` axes (``jax.make_mesh``'s default) the shardings
are part of the types: the layout is checked at trace time and the shards run
under ``jax.shard_map`` with exactly those specs.

Layouts are described per argument dimension by a *role*: ``ROWS`` (tokens,
split for data parallelism), ``HEADS`` (query heads), ``KV_HEADS``, ``PAGES``
(cache pages) or a descriptive name of a dimension that must stay whole. Every
dimension of one role must be split over the same mesh axes, and each operator
says which roles may be split at all. Anything else raises ``MeshLayoutError``
naming the argument, its shape and sharding: for eager calls and Explicit
meshes before anything is traced; under ``jax.jit`` on Auto axes when XLA
partitions the program (the shardings exist only then).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from qsa_jax.ops import _vma


ROWS, HEADS, KV_HEADS, PAGES = "rows", "heads", "kv_heads", "pages"
SCALE_PAIR = "scale_pair"  # vLLM 0.34's (2,) k/v scale operand, whole on every device
_Tracer = jax.core.Tracer  # looked up once: jax.core's attribute access is slow on the eager path


class MeshLayoutError(ValueError):
    """The arguments' shardings are not a layout the operator can run per shard."""


@dataclasses.dataclass(frozen=True)
class Layout:
    """Which dimensions of one operator call may be split over a mesh (static, hashable).

    ``args``: (name, roles) for every array argument in flattening order, one
    role per dimension; ``out``: the roles of each result's dimensions;
    ``shardable``: the roles that may be split; ``ties``: (role, role, why)
    pairs that must be split over the same axes; ``why``: (argument or role,
    reason) pairs quoted when that argument or role is split anyway.
    """

    op: str
    args: tuple[tuple[str, tuple[str, ...]], ...]
    out: tuple[tuple[str, ...], ...]
    shardable: frozenset = frozenset()
    ties: tuple[tuple[str, str, str], ...] = ()
    why: tuple[tuple[str, str], ...] = ()
    # Roles a whole argument must not be cut to (``resolve``): the cache's KV heads, whose slice
    # a kernel's custom call would copy out of the whole cache on every call.
    no_adopt: frozenset = frozenset()
    # Per result, the argument (index in ``args``) whose type it must keep (a cotangent's primal);
    # empty where none must. An Explicit-mode call cuts a whole argument to its role's split (``resolve``);
    # such a cotangent is put back whole after the call (custom_vjp wants the primal's type).
    out_like: tuple = ()


def _axes(entry) -> tuple[str, ...]:
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def _spec_text(sharding) -> str:
    if isinstance(sharding, NamedSharding):
        return f"PartitionSpec{tuple(sharding.spec)} on mesh {dict(sharding.mesh.shape)}"
    return "replicated" if sharding is None else str(sharding)


def _dims(sharding, ndim: int, where: str, op: str) -> tuple[tuple[str, ...], ...]:
    """Mesh axes each dimension is split over (``()``: whole on every device)."""
    if isinstance(sharding, NamedSharding):
        spec = tuple(sharding.spec) + (None,) * (ndim - len(sharding.spec))
        return tuple(_axes(e) for e in spec)
    if sharding is None or sharding.is_fully_replicated:
        return ((),) * ndim
    raise MeshLayoutError(f"{op}: {where} has sharding {sharding}; only NamedSharding layouts run per shard")


def is_batch_role(role: str) -> bool:
    """Whether ``role`` is the leading dimension a ``jax.vmap`` added (``batched_layout``)."""
    return role.startswith("vmap")


def resolve(layout: Layout, shapes, shardings, mesh_shape) -> dict[str, tuple[str, ...]]:
    """Mesh axes of each split role; ``MeshLayoutError`` naming the argument that breaks the layout.

    A splittable dimension (rows, heads, KV heads, a vmap's batch) split on some arguments and
    whole on others takes the split: the whole ones are resharded to it, a local slice with no
    collective (session 31; before, only a vmap's batch did). Only from another argument of the
    same role: a tie (query heads, KV heads) split on one side only still raises (q's heads whole
    beside a split cache would give a result split where XLA expects it whole, and gather it),
    and never into a role of ``layout.no_adopt`` (the cache's KV heads): cutting a whole cache
    would copy a slice of it on every call."""
    op, found, first = layout.op, {}, {}
    whole: dict[str, list] = {}  # role -> (where, dim, size) of the arguments that hold it whole
    why = dict(layout.why)
    for (name, roles), shape, sharding in zip(layout.args, shapes, shardings):
        where = f"{name} (shape {tuple(shape)}, {_spec_text(sharding)})"
        for dim, (role, axes) in enumerate(zip(roles, _dims(sharding, len(shape), where, op))):
            if not axes and role in layout.shardable and role not in layout.no_adopt:
                whole.setdefault(role, []).append((where, dim, shape[dim]))
                continue
            if axes and role not in layout.shardable:
                reason = why.get(name) or why.get(role) or "this operator cannot split it without collectives"
                raise MeshLayoutError(
                    f"{op}: {where} is split along dimension {dim} ({role}) over mesh axes {axes}; that "
                    f"dimension must be whole on every device: {reason}")
            if role not in layout.shardable:
                continue
            n = math.prod(mesh_shape[a] for a in axes)
            if shape[dim] % n:
                raise MeshLayoutError(
                    f"{op}: {where}: dimension {dim} ({role}, size {shape[dim]}) does not divide into "
                    f"{n} equal shards over mesh axes {axes}" + (f"; {why[role]}" if role in why else ""))
            if role in found and found[role] != axes:
                raise MeshLayoutError(
                    f"{op}: {where} splits its {role} over mesh axes {axes} but {first[role]} splits them "
                    f"over {found[role]}; every {role} dimension must be split the same way")
            found.setdefault(role, axes)
            first.setdefault(role, where)
    for a, b, reason in layout.ties:
        if found.get(a, ()) != found.get(b, ()):
            raise MeshLayoutError(
                f"{op}: {a} are split over mesh axes {found.get(a, ())} ({first.get(a)}) but {b} over "
                f"{found.get(b, ())} ({first.get(b)}): {reason}")
    # The whole arguments of a split role are cut to it: each must divide into the shards.
    for role, holders in whole.items():
        axes = found.get(role)
        if not axes:
            continue
        n = math.prod(mesh_shape[a] for a in axes)
        for where, dim, size in holders:
            if size % n:
                raise MeshLayoutError(
                    f"{op}: {where} holds its {role} whole (dimension {dim}, size {size}) while {first[role]} "
                    f"splits them over mesh axes {axes}, into {n} shards that {size} does not divide into"
                    + (f"; {why[role]}" if role in why else ""))
    # One array cannot split two of its dimensions over one mesh axis (a vmap's batch over the
    # axis that splits, e.g., another argument's rows: every result carries both).
    for name, roles in tuple(layout.args) + tuple(("the result", r) for r in layout.out):
        used = [(a, role) for role in dict.fromkeys(roles) for a in found.get(role, ())]
        for axis in {a for a, _ in used}:
            both = [role for a, role in used if a == axis]
            if len(both) > 1:
                raise MeshLayoutError(
                    f"{op}: mesh axis {axis!r} splits both {both[0]} ({first.get(both[0])}) and {both[1]} "
                    f"({first.get(both[1])}), which {name} holds side by side: split them over "
                    f"different mesh axes")
    return {role: axes for role, axes in found.items() if axes}


def shard_index(axes: tuple[str, ...]):
    """This device's position along ``axes`` (major to minor), inside a per-shard function."""
    return jax.lax.axis_index(axes)


def _rule(layout: Layout) -> str:
    """Shardy rule: one factor per shardable role, a private factor for every other dimension.

    The shared factors let Shardy carry e.g. q's row split to logical_indices;
    the private ones keep it from splitting a dimension that must stay whole.
    """
    private = iter(range(10**6))

    def factors(roles):
        return " ".join(r if r in layout.shardable else f"u{next(private)}" for r in roles)

    return (", ".join(factors(roles) for _, roles in layout.args) + " -> "
            + ", ".join(factors(roles) for roles in layout.out))


def _whole(layout, local, static, *arrays):
    return local(static, {}, *arrays)


def _partition(layout, local, static, mesh, arg_shapes, result_shape):
    leaves = jax.tree.leaves(arg_shapes)
    axes = resolve(layout, [a.shape for a in leaves], [a.sharding for a in leaves], dict(mesh.shape))

    def named(roles):
        return NamedSharding(mesh, PartitionSpec(*(axes.get(r) for r in roles)))

    # The arguments keep exactly the shardings they came with (no resharding
    # around the call); the results take the matching split.
    args = jax.tree.unflatten(jax.tree.structure(arg_shapes), [named(r) for _, r in layout.args])
    outs = tuple(named(roles) for roles in layout.out)
    return (mesh, lambda *arrays: local(static, axes, *arrays),
            outs if isinstance(result_shape, (tuple, list)) else outs[0], tuple(args))


_call = custom_partitioning(_whole, static_argnums=(0, 1, 2))
_call.def_partition(_partition, sharding_rule=lambda layout, *_: _rule(layout))


@dataclasses.dataclass(frozen=True)
class _Vmapped:
    """``local`` batched by ``jax.vmap`` over ``in_axes`` (0 or None per array): the per-shard
    function of a batched call. Hashable, and equal from one trace to the next, as
    custom_partitioning's static arguments must be."""

    local: Callable
    in_axes: tuple

    def __call__(self, static, axes, *arrays):
        return jax.vmap(lambda *a: self.local(static, axes, *a), in_axes=self.in_axes)(*arrays)


def batched_layout(layout: Layout, batched) -> Layout:
    """``layout`` with a leading dimension on every batched argument (``batched``: one flag per
    array, in flattening order) and on every result: a role of its own, which may be split
    (each device then runs its share of the batch; nothing is exchanged)."""
    role = f"vmap{sum(map(is_batch_role, layout.shardable))}"  # nested vmaps: vmap0, vmap1, ...
    return dataclasses.replace(
        layout, args=tuple((name, (role,) * b + roles) for (name, roles), b in zip(layout.args, batched)),
        out=tuple((role,) + roles for roles in layout.out), shardable=layout.shardable | {role})


def _explicit_call(mesh, layout, local, static, *arrays):
    """Explicit-sharding mode: every value's type names its sharding at trace time, so the
    layout is checked now and the shards run under shard_map with exactly those specs
    (custom_partitioning's whole-array trace would fail here: the implementations' gathers
    cannot resolve sharded types)."""
    # An Auto axis of more than one device beside the Explicit ones: what is split over it is
    # not in the types, so the shard_map below (manual over every axis) would gather it -- the
    # whole cache to every device, silently. Refused.
    auto = [name for name, kind in zip(mesh.axis_names, mesh.axis_types)
            if kind == jax.sharding.AxisType.Auto and mesh.shape[name] > 1]
    if auto:
        raise MeshLayoutError(
            f"{layout.op}: the arguments' mesh {dict(mesh.shape)} mixes Explicit axes with Auto ones "
            f"({', '.join(auto)}), whose splits the arrays' types do not show; the operator would run "
            f"manual over every axis and gather whatever lies split over {', '.join(auto)}. Use a mesh whose "
            "axes are all Explicit or all Auto (axis_types=)")
    leaves = jax.tree.leaves(arrays)
    axes = resolve(layout, [x.shape for x in leaves], [jax.typeof(x).sharding for x in leaves],
                   dict(mesh.shape))

    def spec(roles):
        return PartitionSpec(*(axes.get(r) for r in roles))

    # An argument whole where its role is split (resolve) is cut to the split first: a local
    # slice, which shard_map's in_specs then match.
    specs = [spec(r) for _, r in layout.args]
    given = leaves
    leaves = [x if _dims(jax.typeof(x).sharding, x.ndim, "", layout.op) == _dims(
        NamedSharding(mesh, sp), x.ndim, "", layout.op) else jax.sharding.reshard(x, NamedSharding(mesh, sp))
        for x, sp in zip(leaves, specs)]
    arrays = jax.tree.unflatten(jax.tree.structure(arrays), leaves)
    in_specs = jax.tree.unflatten(jax.tree.structure(arrays), specs)
    outs = tuple(spec(roles) for roles in layout.out)
    result = jax.shard_map(functools.partial(local, static, axes), mesh=mesh, in_specs=in_specs,
                           out_specs=outs if len(outs) > 1 else outs[0], check_vma=False)(*arrays)
    if layout.out_like:
        single = len(outs) == 1
        results = [result] if single else list(result)
        for i, j in enumerate(layout.out_like):
            want = jax.typeof(given[j]).sharding
            if getattr(want.mesh, "empty", True):  # a primal on no mesh: its cotangent's type is free
                continue
            if results[i].shape == given[j].shape and jax.typeof(results[i]).sharding != want:
                results[i] = jax.sharding.reshard(results[i], want)
        result = results[0] if single else tuple(results)
    # Inside a caller's shard_map (check_vma=True) over some axes of this Explicit mesh, the
    # results vary over the caller's axes as the arguments do (_vma).
    return _vma.like(result, arrays)


def _explicit_mesh(leaves):
    """The mesh of the arguments' types when it has Explicit axes (then types carry the shardings)."""
    for x in leaves:
        mesh = getattr(jax.typeof(x).sharding, "mesh", None)
        if mesh is not None and not mesh.empty and jax.sharding.AxisType.Explicit in mesh.axis_types:
            return mesh
    return None


def _per_shard(layout, local, static, mesh, *arrays):
    """Per shard: by custom_partitioning, or with ``mesh`` (the arguments' Explicit mesh) by
    shard_map."""
    if mesh is None:
        return _call(layout, local, static, *arrays)
    return _explicit_call(mesh, layout, local, static, *arrays)


def _batchable(layout, local, static, mesh, *arrays):
    """``_per_shard`` that ``jax.vmap`` can batch. custom_partitioning has no batching rule,
    and shard_map's cannot batch the implementations over an Explicit batch split; this rule
    makes the batch a leading dimension of the layout, so a batched call on a mesh still runs
    per shard (the per-shard function batched by vmap), and as a plain vmap elsewhere."""

    @jax.custom_batching.custom_vmap
    def call(*xs):
        return _per_shard(layout, local, static, mesh, *xs)

    @call.def_vmap
    def _batched(axis_size, in_batched, *xs):
        del axis_size
        in_axes = jax.tree.map(lambda b: 0 if b else None, tuple(in_batched))
        out = _batchable(batched_layout(layout, jax.tree.leaves(tuple(in_batched))),
                         _Vmapped(local, in_axes), static, mesh, *xs)
        return out, jax.tree.map(lambda _: True, out)

    return call(*arrays)


def _differentiable(layout, local, static, mesh, *arrays):
    """``_batchable`` that JAX can differentiate: custom_partitioning has no differentiation
    rule, so a differentiated call (e.g. the backward of the XLA implementation under a
    second ``jax.grad``) runs the implementation whole, differentiated by JAX, as without a
    mesh (on an Explicit mesh: JAX differentiates the shard_map). First-order gradients never
    take this path: their ``custom_vjp`` calls the forward and backward steps undifferentiated."""

    @jax.custom_jvp
    def call(*xs):
        return _batchable(layout, local, static, mesh, *xs)

    @call.defjvp
    def _jvp(primals, tangents):
        if mesh is None:
            return jax.jvp(lambda *xs: local(static, {}, *xs), primals, tangents)
        return jax.jvp(lambda *xs: _explicit_call(mesh, layout, local, static, *xs), primals, tangents)

    return call(*arrays)


def run(layout: Layout, local: Callable, static, *arrays):
    """``local(static, axes, *arrays)`` on the whole arrays (one device, ``axes = {}``)
    or on each shard's arrays with ``axes`` = the mesh axes of every split role."""
    mesh = _explicit_mesh(jax.tree.leaves(arrays))
    context = jax.sharding.get_abstract_mesh()
    if mesh is None and (context.manual_axes or jax.sharding.AxisType.Explicit in context.axis_types):
        # Inside a caller's shard_map: the arrays are local (XLA partitions any Auto axis left
        # automatic), and the partitioning wrappers would drop their manual-axes types
        # (check_vma=True); JAX differentiates and batches ``local`` itself, which types its
        # results (_vma). Under an Explicit mesh context (jax.set_mesh) with no argument typed
        # on it, everything is whole: custom_partitioning would not lower there.
        return local(static, {}, *arrays)
    return _differentiable(layout, local, static, mesh, *arrays)


def maybe_on_mesh(first) -> bool:
    """Whether an eager call whose first array is ``first`` may be on a mesh.

    A tracer (inside the caller's jit: partitioning checks it), a host array or
    a one-device array says no (one jitted call cannot mix it with arrays on a
    mesh), so the common one-device call pays this one test.
    """
    # Exact type tests first: isinstance against jax.Array costs ~0.5 µs per call.
    sharding = getattr(first, "sharding", None)  # None for tracers and host arrays
    return sharding is not None and type(sharding) is not SingleDeviceSharding and not isinstance(first, _Tracer)


def check_layout(layout: Layout, *arrays) -> None:
    """Eager calls: check concrete arrays' shardings before anything is traced."""
    leaves = jax.tree.leaves(arrays)
    shardings = [getattr(x, "sharding", None) for x in leaves]
    meshes = [s.mesh for s in shardings if isinstance(s, NamedSharding) and s.mesh.size > 1]
    if meshes and not any(isinstance(x, _Tracer) for x in leaves):
        resolve(layout, [x.shape for x in leaves], shardings, dict(meshes[0].shape))


# --- sparse_attention ------------------------------------------------------

_KV_WHY = ("each device must hold the KV heads its query heads read: split q's and output_gate's heads "
           "and the cache's KV heads over the same mesh axes; with more head shards than KV heads, "
           "repeat each KV head (qsa_jax.repeat_kv_heads) so that every shard holds its own copy")


_GATE_VIEW_WHY = ("an output_gate that is neither [R, H, D] nor [R, H*D] is read as q's shape (vLLM's "
                  "view_as), which a split of heads would cut elsewhere: pass it as [R, H, D] to split heads, "
                  "or split only rows")
_STRIDED_WHY = ("a StridedQuery is addressed by row and head inside its whole table; pass a compact q "
                "to split rows or heads")


# The steps of a sparse-attention call that run per shard (``attention_step``): the
# forward (the call without differentiation), and under differentiation the forward that
# also returns the residuals and the backward. With k/v scales (vLLM 0.34's arithmetic)
# each step takes the (2,) scale pair last, whole on every device, and the backward also
# returns its cotangent (summed over the shards that split rows or heads).
STEPS = ("forward", "residuals", "backward")


@functools.lru_cache(maxsize=256)
def attention_layout(fused: bool, gate_ndim: int, strided_q: bool, step: str = "forward",
                     gate_like_q: bool = True, scaled: bool = False) -> Layout:
    """``gate_like_q``: the gate is [R, H, D] or [R, H * D]; else another view of R·H·D
    elements per row (vLLM's ``view_as``), split over rows only."""
    q = ("strided_q_rows", "head_dim") if strided_q else (ROWS, HEADS, "head_dim")
    kv = ((("kv_cache", ("pages", KV_HEADS, "page_size", "head_dim")),) if fused else
          (("k_cache", ("pages", "page_size", KV_HEADS, "head_dim")),
           ("v_cache", ("pages", "page_size", KV_HEADS, "head_dim"))))
    gate = (ROWS, HEADS, "head_dim")[:gate_ndim] if gate_like_q else (ROWS,) + ("gate_view",) * (gate_ndim - 1)
    args = (("q", q),) + kv + (("logical_indices", (ROWS, "selection")),
                               ("block_table", ("requests", "table_width")),
                               ("token_to_req", (ROWS,)),
                               ("output_gate", gate))
    out = ((ROWS, HEADS, "head_dim"),)
    if step == "residuals":  # + the ungated attention and the merged log-sum-exp
        out += ((ROWS, HEADS, "head_dim"), (ROWS, HEADS))
    elif step == "backward":  # cotangents of q (or its table), of each cache array and of the gate
        args += (("attention", (ROWS, HEADS, "head_dim")), ("lse", (ROWS, HEADS)),
                 ("d_out", (ROWS, HEADS, "head_dim")))
        out = (q,) + tuple(roles for _, roles in kv) + (gate,) + ((SCALE_PAIR,),) * scaled
    elif step != "forward":
        raise ValueError(f"attention_layout: step {step!r} is not one of {STEPS}")
    if scaled:
        args += (("scales", (SCALE_PAIR,)),)
    names = [name for name, _ in args]
    out_like = ((0,) + tuple(range(1, 1 + len(kv))) + (names.index("output_gate"),)
                + ((names.index("scales"),) if scaled else ())) if step == "backward" else ()
    return Layout(
        "sparse_attention", args, out,
        frozenset() if strided_q else frozenset({ROWS, HEADS, KV_HEADS} if gate_like_q else {ROWS}),
        ties=((HEADS, KV_HEADS, _KV_WHY),), out_like=out_like, no_adopt=frozenset({KV_HEADS}),
        why=(("q", _STRIDED_WHY),) * strided_q
        + (("pages", "the block table names pages of the whole cache, so every device needs every "
                       "page a row may read (independent per-device caches: call the operator inside "
                       "jax.shard_map)"),
             ("requests", "every row may belong to any request"),
             ("gate_view", _GATE_VIEW_WHY),
             (KV_HEADS, _KV_WHY))
        + ((ROWS, _STRIDED_WHY), (HEADS, _STRIDED_WHY)) * strided_q
        + ((HEADS, _GATE_VIEW_WHY), (KV_HEADS, _GATE_VIEW_WHY)) * (not gate_like_q))


def _attention_local(static, axes, q, kv_arrays, *rest):
    fn, fn_args, problem, step = static
    if any(not is_batch_role(r) for r in axes):
        # The shard is a smaller problem of its own; its tiling comes from its
        # own rows x KV heads (as on one GPU of that tensor-parallel size)
        # unless the caller fixed config=.
        problem = problem.for_shard(q.shape[0], q.shape[1], kv_arrays[0].shape[1 if problem.kv.fused else 2])
    # Inside a caller's shard_map with check_vma=True the results vary over every manual axis
    # an argument varies over, whatever the implementation declared (_vma); elsewhere a no-op.
    union = _vma.varying(q, kv_arrays, rest)
    if step != "backward":
        return _vma.uniform(fn(problem, *fn_args, q, kv_arrays, *rest), union)
    # Every row shard holds a gradient of the same cache rows (its KV heads): the
    # cache's cotangent is their sum, the one collective of a sharded backward (data
    # parallelism). Each shard returns it unrounded (fp32) and the sum is rounded
    # once, as the one-device backward rounds its own fp32 sum once. Inside a caller's
    # shard_map (check_vma=True) an argument replicated over a manual axis that another
    # argument varies over is such a sum too, over that axis (_vma.missing).
    row_axes = tuple(axes.get(ROWS, ()))
    kv_sums = [row_axes + _vma.missing(a, union) for a in kv_arrays]
    # An fp8 cache's cotangent comes (and stays) fp32: backward._bwd casts it (or drops it).
    wide = jnp.float32 if problem.is_fp8 else jnp.promote_types(kv_arrays[0].dtype, jnp.float32)
    kw = {"kv_dtype": jnp.dtype(wide)} if any(kv_sums) else {}
    d_q, d_kv, d_gate, *d_scales = _vma.uniform(fn(problem, *fn_args, q, kv_arrays, *rest, **kw), union)

    def summed(x, over, like, dtype=None):
        if not over:
            return x.astype(dtype or like.dtype)
        # q's and the gate's come rounded (replicated over an axis the cache or the metadata
        # varies on: rare); the sum still runs in fp32, rounded once more.
        return jax.lax.psum(x.astype(jnp.promote_types(x.dtype, jnp.float32)), over).astype(dtype or like.dtype)

    d_kv = tuple(summed(x, over, a, jnp.float32 if problem.is_fp8 else None)
                 for x, over, a in zip(d_kv, kv_sums, kv_arrays))
    output_gate = rest[3]
    results = (summed(d_q, _vma.missing(q, union), q), *d_kv,
               summed(d_gate, _vma.missing(output_gate, union), output_gate))
    if not d_scales:
        return results
    # The scale pair's cotangent is a sum over every (row, query head): the shards' partial
    # sums add up over the axes that split rows or heads. (Over a caller's shard_map axes
    # backward._bwd sums it, where its type says which.)
    split = tuple(dict.fromkeys(ax for role in (ROWS, HEADS, KV_HEADS) for ax in axes.get(role, ())))
    return results + (summed(d_scales[0], split, rest[-1]),)


def _attention_layout_of(problem, q, gate, step="forward") -> Layout:
    # q arrives as the query table: 2-D [N, D] for a StridedQuery (even one
    # whose table is exactly a compact q), 3-D [R, H, D] otherwise.
    # The gate as [R, H, D] or [R, H * D] splits like q; any other view of it by rows only.
    r, h, d = problem.num_rows, problem.num_query_heads, problem.head_dim
    return attention_layout(problem.kv.fused, gate.ndim, q.ndim == 2, step,
                            tuple(gate.shape) in ((r, h, d), (r, h * d)), problem.scaled)


def sparse_attention(run_impl, problem, q, kv_arrays, logical_indices, block_table, token_to_req,
                     output_gate, scales=None):
    """``run_impl(problem, q, kv_arrays, ...[, scales])`` (an implementation's ``run``), per
    shard on a mesh; ``scales``: vLLM 0.34's (2,) scale pair, whole on every device."""
    rest = (logical_indices, block_table, token_to_req, output_gate) + (() if scales is None else (scales,))
    return attention_step("forward", run_impl, (), problem, q, kv_arrays, *rest)


def attention_step(step: str, fn, fn_args: tuple, problem, q, kv_arrays, logical_indices, block_table,
                   token_to_req, output_gate, *extra):
    """``fn(problem, *fn_args, q, kv_arrays, logical_indices, ..., output_gate, *extra)``, per
    shard on a mesh; ``step`` (one of ``STEPS``) names the extra arguments and results.

    ``fn_args``: static arguments of ``fn`` (e.g. an implementation's name), passed apart
    rather than bound with ``functools.partial``, whose objects compare unequal from one
    trace to the next. ``"backward"``: ``fn`` returns (d_q, d_kv_arrays, d_gate) and takes
    ``kv_dtype=``; the result is flat, ``(d_q, *d_kv_arrays, d_gate)`` (partitioning maps one
    sharding to each result), the cache cotangents summed over row shards."""
    arrays = (q, tuple(kv_arrays), logical_indices, block_table, token_to_req, output_gate, *extra)
    if step == "backward" and _explicit_mesh(jax.tree.leaves(arrays)) is not None:
        union = _vma.varying(arrays)
        if any(_vma.missing(x, union) for x in (q, *kv_arrays, output_gate)):
            # The per-shard backward below runs in a shard_map of its own, which cannot see
            # the caller's manual axes to sum over them (and JAX would refuse the cotangents'
            # types).
            raise NotImplementedError(
                "sparse_attention: no gradient inside a jax.shard_map with check_vma=True that leaves "
                "Explicit mesh axes to the operator, for an argument replicated over the shard_map's "
                f"manual axes {sorted(union)}: use an Auto mesh, or a shard_map manual over every axis")
    return run(_attention_layout_of(problem, q, output_gate, step), _attention_local,
               (fn, fn_args, problem, step), *arrays)


def check_sparse_attention(problem, q, kv_arrays, logical_indices, block_table, token_to_req,
                           output_gate) -> None:
    if maybe_on_mesh(q):
        check_layout(_attention_layout_of(problem, q, output_gate), q, tuple(kv_arrays), logical_indices,
                     block_table, token_to_req, output_gate)


def repeat_kv_heads(kv, repeats: int):
    """A cache whose KV heads are each repeated ``repeats`` times, in place of each.

    Same result for the same q: query head j of G = H / Hk per KV head reads KV
    head j // G; with every KV head repeated r times, G / r query heads share each
    copy and head j reads copy j // (G / r), a copy of KV head j // G. Use it to
    split H query heads over more devices than there are KV heads (TP4 of the
    24 / 2-head model: repeats=2, then split the KV-head axis over the same 4
    devices as the query heads).
    """
    if isinstance(kv, (tuple, list)):
        return tuple(jnp.repeat(x, repeats, axis=2) for x in kv)
    return jnp.repeat(kv, repeats, axis=1)


# --- compress_groups_with_ratio ------------------------------------------

_RAW_WHY = ("a row's group reads up to compress_ratio - 1 earlier raw rows, which may sit on another "
            "device: keep raw_keys and raw_positions whole and split only the per-row metadata "
            "(token_to_req, logical_positions, compressed_slots)")
_RING_WHY = "any row may read any request's ring block"


@functools.lru_cache(maxsize=16)
def compress_layout(with_rope: bool) -> Layout:
    ring = ("ring_blocks", "ring_slots", "one", "head_dim")
    args = (("raw_keys", ("raw_rows", "one", "head_dim")),
            ("raw_positions", ("raw_rows", "one", "three")),
            ("compressor_state_cache", ring),
            ("compressor_state_block_table", ("requests", "columns")),
            ("token_to_req", (ROWS,)),
            ("query_start_loc", ("requests",)),
            ("logical_positions", (ROWS,)),
            ("compressed_slots", (ROWS,)))
    if with_rope:
        args += (("rope_cache", ring[:3] + ("three",)),)
    return Layout("compress_groups_with_ratio", args, ((ROWS, "one", "head_dim"), (ROWS, "three")),
                  frozenset({ROWS}),
                  why=(("raw_keys", _RAW_WHY), ("raw_positions", _RAW_WHY),
                       ("compressor_state_cache", _RING_WHY), ("rope_cache", _RING_WHY),
                       ("requests", "every row may belong to any request")))


@_vma.typed
def _compress_local(static, axes, raw_keys, raw_positions, ring, block_table, token_to_req,
                    query_start_loc, logical_positions, compressed_slots, *rope):
    run_impl, problem = static
    rope_cache = rope[0] if rope else None
    if ROWS not in axes:
        return run_impl(problem, raw_keys, raw_positions, ring, block_table, token_to_req,
                        query_start_loc, logical_positions, compressed_slots, rope_cache)
    # This shard's rows are global rows [offset, offset + n). Their groups read
    # raw rows back to offset - (C - 1), so the kernel runs on a window that
    # starts up to C - 1 rows earlier: the extra rows serve only as group
    # members (their metadata marks them invalid) and their outputs are dropped.
    # query_start_loc is shifted so window row i stands for global row start + i.
    n, total = token_to_req.shape[0], raw_keys.shape[0]
    halo = min(problem.compress_ratio - 1, total - n)
    offset = shard_index(axes[ROWS]) * n
    start = jnp.maximum(offset - halo, 0)
    lead = offset - start

    def window(x):
        return jax.lax.dynamic_slice_in_dim(x, start, n + halo)

    def widen(x, fill):
        return jax.lax.dynamic_update_slice_in_dim(jnp.full((n + halo,), fill, x.dtype), x, lead, 0)

    pooled, first = run_impl(
        dataclasses.replace(problem, num_rows=n + halo), window(raw_keys), window(raw_positions), ring,
        block_table, widen(token_to_req, -1), query_start_loc - start.astype(query_start_loc.dtype),
        widen(logical_positions, 0), widen(compressed_slots, -1), rope_cache)
    return (jax.lax.dynamic_slice_in_dim(pooled, lead, n), jax.lax.dynamic_slice_in_dim(first, lead, n))


def _compress_arrays(arrays):
    *tensors, rope_cache = arrays
    return tuple(tensors) + (() if rope_cache is None else (rope_cache,))


def compress_groups(run_impl, problem, *arrays):
    """The compress implementation ``run_impl``, per shard on a mesh (rows split, the rest whole)."""
    return run(compress_layout(problem.with_rope), _compress_local, (run_impl, problem),
               *_compress_arrays(arrays))


def check_compress_groups(problem, *arrays) -> None:
    if maybe_on_mesh(arrays[0]):
        check_layout(compress_layout(problem.with_rope), *_compress_arrays(arrays))


# --- store_cache_rows ------------------------------------------------------

_STORE_WHY = ("a row may target any page, so every device must see every (slot, row) pair and keep those "
              "that land in its own pages; split rows would leave each device's pages (or each copy of "
              "a whole cache) without the rows held elsewhere")


@functools.lru_cache(maxsize=16)
def store_layout(rows_ndim: int) -> Layout:
    page = (PAGES, "page_size", "one", "width")
    return Layout("store_cache_rows",
                  (("cache", page), ("slot_mapping", ("slots",)),
                   ("rows", ("slots", "one", "width") if rows_ndim == 3 else ("slots", "width"))),
                  (page,), frozenset({PAGES}),
                  why=(("slot_mapping", _STORE_WHY), ("rows", _STORE_WHY)))


@_vma.typed
def _store_local(static, axes, cache, slot_mapping, rows):
    run_impl, problem = static
    if PAGES in axes:
        # Slots are global; this shard owns pages [i * pages, (i + 1) * pages).
        # Shifted slots outside that range are skipped by the store like any
        # out-of-range slot (int32 wrap-around of very negative slots lands
        # past the end too: the whole cache has < 2**31 slots).
        pages = cache.shape[0]
        first_slot = shard_index(axes[PAGES]) * (pages * problem.page_size)
        slot_mapping = slot_mapping.reshape(-1).astype(jnp.int32) - first_slot
        problem = dataclasses.replace(problem, num_pages=pages)
    return run_impl(problem, cache, slot_mapping, rows)


def store_cache_rows(run_impl, problem, cache, slot_mapping, rows):
    """The store implementation ``run_impl``, per shard on a mesh (pages split, rows whole)."""
    return run(store_layout(rows.ndim), _store_local, (run_impl, problem), cache, slot_mapping, rows)


def check_store_cache_rows(cache, slot_mapping, rows) -> None:
    if maybe_on_mesh(cache):
        check_layout(store_layout(rows.ndim), cache, slot_mapping, rows)
