"""The operator and kernel contract shared by the CPU and Vulkan backends and the planners.

An ``OpSpec`` says what an operator computes (static shape inference and a numpy reference).
A ``Kernel`` is one way to compute it on one backend. Every kernel declares:
  * ``applies(layer)``: whether it can run this node;
  * ``transform(layer, raw)``: a *pure* function from raw constant inputs to the arrays it
    runs with (e.g. Winograd-domain weights), so the planners can decide to transform at load
    or to read post-transformed weights from the store;
  * ``transformed_nbytes`` and ``workspace_nbytes``: memory it needs, known before running;
  * ``run(layer, inputs, params, outputs)``: writes into preallocated ``outputs`` (arena views).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, Sequence

import numpy as np

from ..errors import KernelError, ShapeError
from ..ir import Graph, Node, TensorInfo


def raw_key(i: int) -> str:
    """Name of the raw constant at input position ``i`` in a layer's param dict."""
    return f"in{i}"


def raw_params(layer: "Layer", constants: Mapping[str, Any]) -> dict[str, Any]:
    """The layer's raw constant inputs from ``constants``, keyed by ``raw_key`` (what ``transform`` takes)."""
    return {raw_key(i): constants[layer.node.inputs[i]] for i in layer.const_inputs}


_new = object.__new__


@dataclass(frozen=True)
class Layer:
    """A node together with its static tensor information: all a kernel needs to plan or run."""

    node: Node
    inputs: tuple[TensorInfo | None, ...]
    outputs: tuple[TensorInfo, ...]
    const_inputs: tuple[int, ...]  # positions of inputs that are constants (weights, shapes)

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def const_names(self) -> list[str]:
        """The names of the constant inputs, in ``const_inputs``' order."""
        return [self.node.inputs[i] for i in self.const_inputs]

    @property
    def op(self) -> str:
        return self.node.op

    @property
    def attrs(self) -> dict[str, Any]:
        return self.node.attrs

    def attr(self, key: str, default: Any = None) -> Any:
        return self.node.attrs.get(key, default)

    def in_shape(self, i: int) -> tuple[int, ...]:
        info = self.inputs[i]
        assert info is not None, f"{self.name}: input {i} is absent"
        return info.shape

    def out_shape(self, i: int = 0) -> tuple[int, ...]:
        return self.outputs[i].shape

    def has_input(self, i: int) -> bool:
        return i < len(self.node.inputs) and bool(self.node.inputs[i])

    @staticmethod
    def of(node: Node, graph: Graph) -> "Layer":
        infos, constants = graph.infos, graph.constants
        # list comprehensions and the fields set directly (not the frozen dataclass's __init__, an
        # object.__setattr__ per field): a load makes one Layer per node before its first layer runs
        layer = _new(Layer)
        layer.__dict__.update(
            node=node, inputs=tuple([infos.get(i) if i else None for i in node.inputs]),
            outputs=tuple([infos[o] for o in node.outputs if o]),
            const_inputs=tuple([k for k, i in enumerate(node.inputs) if i and i in constants]))
        return layer


def weights_key(layer: Layer) -> tuple[Any, ...]:
    """``Kernel.transform_key`` of a kernel whose transform reads only the layer's constants (and attributes)."""
    return tuple((k, layer.inputs[k].shape) for k in layer.const_inputs if layer.inputs[k] is not None) + (
        str(layer.outputs[0].dtype) if layer.outputs else "",)


def full_inputs(layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray]) -> list[np.ndarray | None]:
    """Dynamic inputs with the raw constants put back at their positions (for untransformed kernels)."""
    return [params.get(raw_key(k)) if x is None else x for k, x in enumerate(inputs)]


#: the prefix of another domain's operators in the registry: the importer registers them as "<domain>.<op>"
#: (onnxruntime's com.microsoft transformer operators)
MS = "com.microsoft."


class Kernel:
    """One implementation of one or more ops on one backend. Stateless; one instance per class."""

    name: ClassVar[str] = "reference"
    ops: ClassVar[tuple[str, ...]] = ()
    backend: ClassVar[str] = "cpu"
    #: Lower is faster when several kernels apply (the default pick is the fastest warm kernel).
    priority: ClassVar[int] = 100
    #: Kernels that name the same form transform a layer's constants into the same arrays, so one's
    #: transformed weights serve the other (another input shape of a dynamic model choosing another kernel,
    #: a warm switch from the cold kernel).
    weights_form: ClassVar[str | None] = None
    #: Whether what preparing a layer makes can be stored and read back instead (its transformed weights); False
    #: where preparing builds what no store holds (a control-flow node's body executors): such a layer is always
    #: prepared at load, from its raw constants.
    storable: ClassVar[bool] = True
    #: Whether part of preparing a layer happens at its first run (an If builds its taken branch's executor then):
    #: that run, not the warm one, is what a cold load's execution of it costs.
    prepares_at_first_run: ClassVar[bool] = False

    def takes_weights_of(self, other: "Kernel") -> bool:
        """Whether ``other``'s transformed params serve this kernel as they are (one ``weights_form``)."""
        return self.weights_form is not None and self.weights_form == other.weights_form

    def applies(self, layer: Layer) -> bool:
        return True

    def preferred(self, layer: Layer) -> bool:
        """Shape-dependent refinement of ``priority``: an applicable kernel that is not preferred for
        this layer yields to the next one that is (measured rules, e.g. Winograd F(4,3) vs F(2,3))."""
        return True

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Raw constants (keyed by ``raw_key``) to the arrays ``run`` expects. Must be pure."""
        return dict(raw)

    def transformed_nbytes(self, layer: Layer) -> int:
        return sum(layer.inputs[k].nbytes for k in layer.const_inputs if layer.inputs[k] is not None)

    def transform_key(self, layer: Layer) -> tuple[Any, ...]:
        """What ``transform`` reads of the layer besides its constants' values and attributes. The same layer
        of two input shapes of a dynamic model shares one transformed copy of its weights when the keys are
        equal. By default every shape the layer sees: kernels whose transform reads only their constants
        say so with ``weights_key``."""
        return (tuple(t.shape if t is not None else None for t in layer.inputs), tuple(t.shape for t in layer.outputs))

    def workspace_nbytes(self, layer: Layer) -> int:
        return 0

    def native_scratch_nbytes(self, layer: Layer) -> int:
        """Bytes the kernel's native code allocates for itself while it runs (freed before it returns): memory
        beside the arena that a memory budget must leave room for (the streaming runtime counts its layers'
        largest)."""
        return 0

    def scratch_floats(self, layer: Layer) -> dict[int, int]:
        """Per-thread scratch slots ``run`` uses (slot -> float32 elements), so a loader can fault them in
        before the first run instead of the first run paying for it."""
        return {}

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        """Compute the layer into ``outputs``. This default runs the op's oracle (``OpSpec.reference``) and
        copies its results: the kernel of an op that is off every hot path is that oracle, and only declares
        ``name`` and ``ops``."""
        spec = op_spec(layer.op)
        assert spec is not None
        for o, r in zip(outputs, spec.reference(layer.node, full_inputs(layer, inputs, params))):
            np.copyto(o, r)

    def run_bounded(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
                    outputs: Sequence[np.ndarray]) -> list[tuple[int, ...]]:
        """A data-dependent op (``OpSpec.bounded``): write each output C-ordered at the start of its buffer
        (sized at the planned bound) and return the shapes this run gave. This default runs the op's oracle;
        ``write_bounded`` refuses what does not fit before writing anything."""
        spec = op_spec(layer.op)
        assert spec is not None
        return write_bounded(layer, outputs, spec.reference(layer.node, full_inputs(layer, inputs, params)))

    def bind_bounded(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
                     outputs: Sequence[np.ndarray]) -> Callable[[], list[tuple[int, ...]]] | None:
        """``run_bounded`` on these very arrays, pre-bound (as ``bind`` is for ``run``), or None."""
        return None

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        """A call that does what ``run`` does with these very arrays, or None.

        An executor whose buffers never move (the CPU arena, transformed weights) binds each step once at
        load; a kernel that can reduce its run to precomputed native calls returns them here, which saves
        the per-run argument plumbing (10-20 us a layer, as much as a small layer's compute)."""
        return None

    def __repr__(self) -> str:
        return f"<{self.backend} kernel {self.name} for {','.join(self.ops)}>"


class BoundKernel(Kernel):
    """A native kernel whose run() is its pre-bound call: it binds whenever it applies to contiguous tensors,
    which the arena's are."""

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        call = self.bind(layer, inputs, params, outputs)
        assert call is not None, f"{self.name} could not bind {layer.name}"
        call()


class BoundOrOracle(Kernel):
    """A kernel whose ``run`` is the call ``bind`` makes where that applies, else its ``oracle`` (no native build,
    a geometry or an activation the C does not take) copied into the output."""

    def oracle(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray]) -> np.ndarray:
        raise NotImplementedError

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        call = self.bind(layer, inputs, params, outputs)
        if call is not None:
            call()
        else:
            outputs[0][...] = self.oracle(layer, inputs, params)


class ContiguousOut:
    """An output as a C-contiguous ``dtype`` array a native kernel may write: the output buffer itself, or a
    temporary (the buffer is strided or of another type, or shares memory with ``avoid``, an input the kernel
    still reads while it writes) that ``close`` copies into it."""

    def __init__(self, out: np.ndarray, dtype: Any = np.float32, avoid: np.ndarray | None = None) -> None:
        self.out = out
        ok = out.flags.c_contiguous and out.dtype == dtype and (avoid is None or not np.shares_memory(avoid, out))
        self.y = out if ok else np.empty(out.shape, dtype)

    def close(self) -> None:
        if self.y is not self.out:
            np.copyto(self.out, self.y)


def write_bounded(layer: Layer, outputs: Sequence[np.ndarray], results: Sequence[np.ndarray]) -> list[tuple[int, ...]]:
    """Copy ``results`` into the first elements of their ``outputs`` buffers (C order); their shapes. KernelError,
    with nothing written, when one holds more elements than its buffer was planned for."""
    for o, r, name in zip(outputs, results, layer.node.outputs):
        if np.size(r) > o.size:
            raise KernelError(f"node {layer.name!r} ({layer.op}): output {name!r} has {np.size(r)} elements this run "
                              f"(shape {list(np.shape(r))}), more than the {o.size} its planned bound "
                              f"{list(o.shape)} holds; the request fails rather than write past its buffer")
    shapes = []
    for o, r in zip(outputs, results):
        r = np.asarray(r)
        if r.size:
            o.reshape(-1)[:r.size] = r.reshape(-1)
        shapes.append(tuple(int(d) for d in r.shape))
    return shapes


def run_at_run_shapes(node: Node, vals: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """``node`` on values whose shapes only this run tells (a control-flow body shaped at run time, a node reading
    a tensor shaped at run time), one result per declared output. The op's oracle, except for a data-dependent
    op (``OpSpec.bounded``: NonMaxSuppression, TopK with a run-time k, NonZero, ...), which runs its fastest CPU
    kernel through ``run_bounded`` at these shapes: those oracles are Python loops (NonMaxSuppression's is one
    numpy pass per kept box), and a detector's post-processing, which runs here, feeds them tens of thousands of
    boxes (Mask R-CNN's 1000 proposals x 91 classes: 5 minutes in the oracle, milliseconds natively)."""
    spec = op_spec(node.op)
    assert spec is not None, node.op
    if spec.bounded is None:
        return spec.reference(node, list(vals))
    try:
        layer = layer_at(node, vals)
    except ShapeError:
        # (a bound past INFERD_MAX_BOUND_ELEMS: the oracle sizes its results itself)
        return spec.reference(node, list(vals))
    k = choose_kernel(layer)
    bufs = [np.empty(t.shape, t.dtype) for t in layer.outputs]
    if spec.bounded(node, _small_values(node, vals)):
        got = iter([bounded_view(b, sh) for b, sh in zip(bufs, k.run_bounded(layer, list(vals), {}, bufs))])
    else:  # (TopK with a k known now: shaped exactly)
        k.run(layer, list(vals), {}, bufs)
        got = iter(bufs)
    return [next(got) if o else np.zeros(0, np.float32) for o in node.outputs]


def _small_values(node: Node, vals: Sequence[np.ndarray | None]) -> dict[str, np.ndarray]:
    """A node's small inputs this run (max_output_boxes_per_class, k, a Reshape's shape), as constants."""
    return {n: np.asarray(v) for n, v in zip(node.inputs, vals) if n and v is not None and np.size(v) <= 16}


def layer_at(node: Node, vals: Sequence[np.ndarray | None], const_inputs: tuple[int, ...] = (),
             consts: Mapping[str, np.ndarray] | None = None) -> Layer:
    """``node`` as a layer at the shapes of ``vals``, its values this run: the inputs' infos from them, the
    outputs' from the op's inference, which reads its small inputs and ``consts`` as constants (a data-dependent
    op's bounds follow from them). ``ShapeError`` where inference refuses them."""
    spec = op_spec(node.op)
    assert spec is not None, node.op
    infos = tuple(TensorInfo(n, tuple(np.shape(v)), np.asarray(v).dtype) if n and v is not None else None
                  for n, v in zip(node.inputs, vals))
    shaped = spec.infer(node, infos, {**_small_values(node, vals), **(consts or {})})
    outs = tuple(TensorInfo(o, tuple(int(d) for d in sh), np.dtype(dt))
                 for o, (sh, dt) in zip(node.outputs, shaped) if o)
    return Layer(node, infos, outs, const_inputs)


def bounded_view(buf: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """The run's value of a data-dependent output: the first ``prod(shape)`` elements of its bound buffer."""
    n = math.prod(shape)  # np.prod costs microseconds per call, more than the small ops it serves
    return buf.reshape(-1)[:n].reshape(tuple(shape))


@dataclass
class OpSpec:
    """What an operator computes, independent of how.

    ``infer(layer_node, in_infos, consts) -> list[(shape, dtype)]`` does static shape inference;
    ``reference(node, inputs: list[ndarray|None]) -> list[ndarray]`` is the numpy oracle used for
    constant folding and as the ground truth in tests. ``alias`` ops (Reshape, Flatten, ...)
    produce a view of their first input, so the memory planner gives them no buffer of their own.
    """

    op: str
    infer: Callable[[Node, list[TensorInfo | None], dict[str, np.ndarray]], list[tuple[tuple[int, ...], Any]]]
    reference: Callable[[Node, list[np.ndarray | None]], list[np.ndarray]]
    alias: bool = False
    min_opset: int = 1
    # Validates attribute values at import time; raises UnsupportedOpError for what is not handled.
    check: Callable[[Node, int], None] | None = None
    #: What the implementation does not cover (or covers in its own way), for ``inferd ops``' coverage table.
    notes: str = ""
    #: A data-dependent op (NonZero, NonMaxSuppression, ...): ``bounded(node, consts)`` says whether this node's
    #: outputs are sized at run time (given its constant inputs). ``infer`` then gives each output's *upper bound*,
    #: which the memory plan reserves; a run writes the values C-ordered at the start of that buffer
    #: (``Kernel.run_bounded``) and fails, naming the node, where they would not fit.
    bounded: Callable[[Node, Mapping[str, np.ndarray]], bool] | None = None


_OPS: dict[str, OpSpec] = {}
_KERNELS: dict[str, list[Kernel]] = {}


def register_op(spec: OpSpec) -> OpSpec:
    if spec.op in _OPS:
        raise RuntimeError(f"op {spec.op} registered twice")
    _OPS[spec.op] = spec
    return spec


def register_kernel(cls: type[Kernel]) -> type[Kernel]:
    inst = cls()
    for op in cls.ops:
        lst = _KERNELS.setdefault(op, [])
        if any(k.name == inst.name and k.backend == inst.backend for k in lst):
            raise RuntimeError(f"kernel {inst.name} ({inst.backend}) registered twice for {op}")
        lst.append(inst)
        lst.sort(key=lambda k: k.priority)
    return cls


def op_spec(op: str) -> OpSpec | None:
    return _OPS.get(op)


def kernels_for(op: str, backend: str = "cpu") -> list[Kernel]:
    return [k for k in _KERNELS.get(op, []) if k.backend == backend]


def applicable_kernels(layer: Layer, backend: str = "cpu") -> list[Kernel]:
    return [k for k in kernels_for(layer.op, backend) if k.applies(layer)]


def choose_kernel(layer: Layer, backend: str = "cpu", forced: str | None = None, check: bool = True) -> Kernel:
    """The kernel to run ``layer`` with: ``forced`` by name if given, else the fastest that applies. ``check``
    False: a ``forced`` kernel is taken without asking whether it applies (a stored plan's choice for this device)."""
    cands = kernels_for(layer.op, backend)
    if forced is not None:
        for k in cands:
            if k.name == forced:
                if check and not k.applies(layer):
                    raise KernelError(f"kernel {forced!r} does not apply to node {layer.name!r} ({layer.op}, "
                                      f"input shapes {[i.shape if i else None for i in layer.inputs]}, attrs {layer.attrs})")
                return k
        raise KernelError(f"no {backend} kernel named {forced!r} for op {layer.op} (node {layer.name!r}); "
                          f"known: {[k.name for k in cands]}")
    ok = [k for k in cands if k.applies(layer)]
    for k in ok:
        if k.preferred(layer):
            return k
    if ok:
        return ok[0]
    raise KernelError(f"no {backend} kernel applies to node {layer.name!r} ({layer.op})")


def registered_ops() -> dict[str, OpSpec]:
    return dict(_OPS)


def single_node_layer(op: str, inputs: Sequence[np.ndarray | None], attrs: dict[str, Any] | None = None,
                      const: Sequence[bool] | None = None, n_outputs: int = 1, name: str = "n0") -> Layer:
    """Build a ``Layer`` for one node from example arrays (tests and microbenchmarks use this).

    ``const[i]`` marks input ``i`` as a constant (a weight); by default every input after the
    first that is given as an array counts as constant, as weights do in exported models.
    """
    spec = op_spec(op)
    if spec is None:
        raise KeyError(f"op {op} is not registered")
    names = [f"x{i}" if a is not None else "" for i, a in enumerate(inputs)]
    node = Node(name, op, names, [f"y{i}" for i in range(n_outputs)], dict(attrs or {}))
    if const is None:
        const = [i > 0 for i in range(len(inputs))]
    infos = [TensorInfo(n, tuple(a.shape), np.dtype(a.dtype)) if a is not None else None for n, a in zip(names, inputs)]
    consts = {n: a for n, a, c in zip(names, inputs, const) if a is not None and c}
    outs = spec.infer(node, infos, consts)
    out_infos = tuple(TensorInfo(o, tuple(int(d) for d in s), np.dtype(dt)) for o, (s, dt) in zip(node.outputs, outs))
    return Layer(node, tuple(infos), out_infos, tuple(i for i, c in enumerate(const) if c and inputs[i] is not None))


def run_layer(kernel: Kernel, layer: Layer, inputs: Sequence[np.ndarray | None], bound: bool = False
              ) -> list[np.ndarray]:
    """Transform the layer's constants with ``kernel`` and run it once on fresh output buffers; with ``bound``,
    through the call ``kernel.bind`` returns (as the CPU executor does) where it returns one."""
    raw = {raw_key(k): np.asarray(inputs[k]) for k in layer.const_inputs}
    params = kernel.transform(layer, raw)
    dyn = [None if k in layer.const_inputs else x for k, x in enumerate(inputs)]
    outs = [np.empty(o.shape, o.dtype) for o in layer.outputs]
    call = kernel.bind(layer, dyn, params, outs) if bound else None
    if call is not None:
        call()
    else:
        kernel.run(layer, dyn, params, outs)
    return outs
