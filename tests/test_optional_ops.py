"""Optional, OptionalHasElement and OptionalGetElement (issue 18): models as exporters write them (also inside an
If body) against onnxruntime, the import-time lowering (no optional op is left to run), and the refusals where an
empty optional would have to exist at run time. The official node tests test_optional_* run in
tests/test_onnx_backend.py."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from ortutil import ort_session

import inferd
import inferd.vulkan
from inferd.errors import InferdError, ModelFormatError, UnsupportedOpError
from inferd.frontend import import_model
from inferd.ir import Node
from inferd.ops.base import kernels_for, op_spec
from inferd.ops.control import OPTIONAL_OPS

F, B = TensorProto.FLOAT, TensorProto.BOOL
FLOAT_TYPE = helper.make_tensor_type_proto(F, None)


def _model(nodes: Sequence[onnx.NodeProto], inputs: Sequence[onnx.ValueInfoProto], outputs: Sequence[str],
           opset: int = 18) -> onnx.ModelProto:
    g = helper.make_graph(list(nodes), "opt", list(inputs), [onnx.ValueInfoProto(name=o) for o in outputs])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _x(name: str = "x") -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, F, [2, 3])


def _optional_x(name: str = "x") -> onnx.ValueInfoProto:
    return helper.make_value_info(name, helper.make_optional_type_proto(helper.make_tensor_type_proto(F, [2, 3])))


def _body(nodes: Sequence[onnx.NodeProto], outputs: Sequence[str], name: str) -> onnx.GraphProto:
    return helper.make_graph(list(nodes), name, [], [helper.make_tensor_value_info(o, F, None) for o in outputs])


def _devices() -> list[str]:
    return ["cpu", "vulkan"] if inferd.vulkan.available() else ["cpu"]


def _same(m: onnx.ModelProto, feeds: dict[str, np.ndarray], device: str = "cpu") -> dict[str, np.ndarray]:
    """Runs ``m`` on inferd (``device``) and onnxruntime; asserts equal outputs (shape, dtype, values)."""
    got = inferd.load(m, device=device).run(feeds)
    want = ort_session(m).run(None, feeds)
    for o, w in zip(m.graph.output, want):
        assert got[o.name].shape == w.shape and got[o.name].dtype == w.dtype, (o.name, got[o.name], w)
        np.testing.assert_allclose(got[o.name], w, rtol=1e-6, err_msg=o.name)
    return got


def _ops_left(m: onnx.ModelProto) -> set[str]:
    g = import_model(m)
    return {n.op for n in g.nodes} | {n.op for n in g.nodes for b in n.bodies.values() for n in b.nodes}


X = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5


@pytest.mark.parametrize("opset", [15, 18])
def test_present_optional_is_its_tensor(opset: int) -> None:
    m = _model([helper.make_node("Optional", ["x"], ["o"]),
                helper.make_node("OptionalHasElement", ["o"], ["h"]),
                helper.make_node("OptionalGetElement", ["o"], ["g"]),
                helper.make_node("Relu", ["g"], ["y"])], [_x()], ["h", "y"], opset)
    got = _same(m, {"x": X})
    assert bool(got["h"]) is True and got["y"].max() > 0
    assert not _ops_left(m) & set(OPTIONAL_OPS)


def test_empty_optional_and_no_input_are_false_plain_tensor_true() -> None:
    m = _model([helper.make_node("Optional", [], ["e"], type=FLOAT_TYPE),
                helper.make_node("OptionalHasElement", ["e"], ["h_empty"]),
                helper.make_node("OptionalHasElement", [], ["h_none"]),
                helper.make_node("OptionalHasElement", ["x"], ["h_tensor"]),
                helper.make_node("OptionalGetElement", ["x"], ["g"])], [_x()], ["h_empty", "h_none", "h_tensor", "g"])
    got = _same(m, {"x": X})
    assert [bool(got[k]) for k in ("h_empty", "h_none", "h_tensor")] == [False, False, True]
    g = import_model(m)
    assert all(o in g.constants for o in ("h_empty", "h_none", "h_tensor"))  # folded at import


def test_optional_graph_input_is_a_present_tensor() -> None:
    m = _model([helper.make_node("OptionalHasElement", ["x"], ["h"]),
                helper.make_node("OptionalGetElement", ["x"], ["g"]),
                helper.make_node("Add", ["g", "g"], ["y"])], [_optional_x()], ["h", "y"])
    got = _same(m, {"x": X})
    assert bool(got["h"]) and np.array_equal(got["y"], 2 * X)
    assert [t.name for t in import_model(m).inputs] == ["x"]


def _if_model(empty_default: bool) -> onnx.ModelProto:
    """As torch.jit.script writes ``if opt is not None: y = relu(opt) else: y = -x``: the test of the optional in
    the graph, its unwrapping in a value-dependent If's branch. ``empty_default``: the else branch also asks
    whether an empty optional has an element (a constant False, multiplied in)."""
    then = _body([helper.make_node("OptionalGetElement", ["o"], ["t0"]), helper.make_node("Relu", ["t0"], ["t1"]),
                  helper.make_node("Mul", ["t1", "gate"], ["t_out"])], ["t_out"], "then")
    else_nodes = [helper.make_node("Neg", ["x"], ["e_out"])]
    if empty_default:
        else_nodes = [helper.make_node("OptionalHasElement", ["none"], ["eh"]),
                      helper.make_node("Cast", ["eh"], ["ef"], to=F),
                      helper.make_node("Add", ["ef", "one"], ["es"]),
                      helper.make_node("Neg", ["x"], ["en"]),
                      helper.make_node("Mul", ["en", "es"], ["e_out"])]
    els = _body(else_nodes, ["e_out"], "else")
    nodes = [helper.make_node("Constant", [], ["one"], value=helper.make_tensor("one", F, [], [1.0])),
             helper.make_node("Optional", ["x"], ["o"]),
             helper.make_node("Optional", [], ["none"], type=FLOAT_TYPE),
             helper.make_node("OptionalHasElement", ["o"], ["has"]),
             helper.make_node("Cast", ["has"], ["gate"], to=F),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=els)]
    return _model(nodes, [_x(), helper.make_tensor_value_info("c", B, [])], ["y"])


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("empty_default", [False, True])
def test_optionals_inside_a_value_dependent_if(empty_default: bool, device: str) -> None:
    m = _if_model(empty_default)
    for c in (True, False):
        got = _same(m, {"x": X, "c": np.array(c)}, device)
        assert np.array_equal(got["y"], np.maximum(X, 0) if c else -X)
    g = import_model(m)
    (node,) = [n for n in g.nodes if n.op == "If"]  # stays dynamic; its bodies no longer read the empty optional
    assert "none" not in node.inputs and not _ops_left(m) & set(OPTIONAL_OPS)


# ------------------------------------------------------------------------------------------ refusals

def _refused(m: onnx.ModelProto, *words: str, error: type[InferdError] = UnsupportedOpError) -> str:
    with pytest.raises(error) as e:
        import_model(m)
    msg = str(e.value)
    for w in words:
        assert w in msg, (w, msg)
    return msg


def test_get_element_of_an_empty_optional_is_refused_naming_the_node() -> None:
    m = _model([helper.make_node("Optional", [], ["e"], type=FLOAT_TYPE),
                helper.make_node("OptionalGetElement", ["e"], ["y"], name="unwrap")], [], ["y"])
    _refused(m, "OptionalGetElement", "unwrap", "empty optional", "run time")


def test_absent_optional_needed_at_run_time_is_refused() -> None:
    empty = helper.make_node("Optional", [], ["e"], type=FLOAT_TYPE, name="mk")
    # read by a tensor op
    _refused(_model([empty, helper.make_node("Identity", ["e"], ["y"], name="pass")], [], ["y"]),
             "Identity", "pass", "'e'", "empty optional")
    # a graph output
    _refused(_model([empty, helper.make_node("Relu", ["x"], ["y"])], [_x()], ["y", "e"]), "graph output", "'e'")
    # a branch that gives an empty optional: whether the If's output is present is decided at run time
    then = _body([helper.make_node("Optional", ["x"], ["t"])], ["t"], "then")
    els = _body([helper.make_node("Optional", [], ["n"], type=FLOAT_TYPE)], ["n"], "else")
    m = _model([helper.make_node("If", ["c"], ["o"], then_branch=then, else_branch=els, name="branchy"),
                helper.make_node("OptionalHasElement", ["o"], ["h"])],
               [_x(), helper.make_tensor_value_info("c", B, [])], ["h"])
    _refused(m, "branchy.else_branch", "'n'", "empty optional")


def test_optional_of_a_sequence_input_is_refused() -> None:
    seq = helper.make_optional_type_proto(helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, [2])))
    m = _model([helper.make_node("OptionalHasElement", ["s"], ["h"])], [helper.make_value_info("s", seq)], ["h"])
    _refused(m, "graph input 's'", "optional of a sequence", error=ModelFormatError)
    plain = helper.make_value_info("s", helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, [2])))
    _refused(_model([helper.make_node("OptionalHasElement", ["s"], ["h"])], [plain], ["h"]),
             "graph input 's'", "sequence, not a tensor", error=ModelFormatError)


def test_missing_inputs_are_refused_by_opset() -> None:
    _refused(_model([helper.make_node("OptionalHasElement", [], ["h"], name="ask")], [], ["h"], opset=15),
             "OptionalHasElement", "ask", "before opset 18")
    _refused(_model([helper.make_node("Optional", [], ["e"], name="untyped"),
                     helper.make_node("OptionalHasElement", ["e"], ["h"])], [], ["h"]), "untyped", "'type'")


# ------------------------------------------------------------------------------------------ registry and oracle

def test_registered_with_oracles_and_a_cpu_kernel() -> None:
    for op in OPTIONAL_OPS:
        spec = op_spec(op)
        assert spec is not None and spec.min_opset == 15 and spec.notes and kernels_for(op, "cpu"), op
    has = op_spec("OptionalHasElement").reference  # type: ignore[union-attr]
    get = op_spec("OptionalGetElement").reference  # type: ignore[union-attr]
    n_has, n_get = Node("h", "OptionalHasElement", ["o"], ["y"]), Node("g", "OptionalGetElement", ["o"], ["y"])
    assert has(n_has, [None])[0].item() is False and has(n_has, [X])[0].item() is True
    assert np.array_equal(get(n_get, [X])[0], X)
    with pytest.raises(InferdError, match="'g'.*empty"):
        get(n_get, [None])


def test_loop_carrying_an_optional_tensor() -> None:
    """A Loop whose carried value is typed optional(tensor) (scripted ``Optional[Tensor]`` state): the body's
    optional input is taken as the tensor its node passes, which is never an empty optional (that is refused)."""
    opt = helper.make_optional_type_proto(helper.make_tensor_type_proto(F, [2, 3]))
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("OptionalGetElement", ["acc_in"], ["a"]),
         helper.make_node("Add", ["a", "x"], ["s"]),
         helper.make_node("Optional", ["s"], ["acc_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond_in", B, []),
         helper.make_value_info("acc_in", opt)],
        [helper.make_tensor_value_info("cond_out", B, []), helper.make_value_info("acc_out", opt)])
    m = _model([helper.make_node("Constant", [], ["n"], value=helper.make_tensor("n", TensorProto.INT64, [], [3])),
                helper.make_node("Optional", ["x"], ["o"]),
                helper.make_node("Loop", ["n", "", "o"], ["acc"], body=body),
                helper.make_node("OptionalGetElement", ["acc"], ["y"])], [_x()], ["y"])
    got = _same(m, {"x": X})
    assert np.array_equal(got["y"], 4 * X)
    empty = onnx.ModelProto()
    empty.CopyFrom(m)
    empty.graph.node[1].CopyFrom(helper.make_node("Optional", [], ["o"], type=FLOAT_TYPE))
    _refused(empty, "Loop", "'o'", "empty optional")
