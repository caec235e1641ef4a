"""The trained head as an ONNX graph (built with the onnx package, a training-only extra).

Inputs `hidden` and `embed` (N, d) float32; outputs `logits` (N, V) over the reduced
vocabulary and `feature` (N, d), the predicted next hidden state the head chains on. The same
arithmetic as edge_spec.headtrain.train.forward, which a test checks through onnxruntime.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edge_spec.headtrain.train import Params

OPSET = 17


def export_onnx(params: Params, path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    d = params.W2.shape[1]
    n_vocab = params.Wout.shape[0]

    def const(name: str, value: np.ndarray | float) -> onnx.TensorProto:
        return numpy_helper.from_array(np.asarray(value, dtype=np.float32), name)

    nodes = [
        helper.make_node("Mul", ["hidden", "s_h"], ["hs"]),
        helper.make_node("Mul", ["embed", "s_e"], ["es"]),
        helper.make_node("Concat", ["hs", "es"], ["x"], axis=1),
        helper.make_node("Gemm", ["x", "W1", "b1"], ["a"]),
        helper.make_node("Sigmoid", ["a"], ["sg"]),
        helper.make_node("Mul", ["a", "sg"], ["z"]),
        helper.make_node("Gemm", ["z", "W2", "b2"], ["r"]),
        helper.make_node("Add", ["hidden", "r"], ["feature"]),
        helper.make_node("Gemm", ["feature", "Wout", "bout"], ["logits"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "edge_spec_draft_head",
        inputs=[
            helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["N", d]),
            helper.make_tensor_value_info("embed", TensorProto.FLOAT, ["N", d]),
        ],
        outputs=[
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", n_vocab]),
            helper.make_tensor_value_info("feature", TensorProto.FLOAT, ["N", d]),
        ],
        initializer=[
            const("s_h", params.s_h),
            const("s_e", params.s_e),
            *(const(name, value) for name, value in params.arrays().items()),
        ],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="edge_spec",
    )
    model.ir_version = 8  # readable by onnxruntime >= 1.10
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    onnx.save(model, str(tmp))
    tmp.replace(path)
