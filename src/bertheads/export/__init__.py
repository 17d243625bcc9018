"""Models leaving bertheads, the library layer: `hf` (a transformers directory per head), `onnx` (one
ONNX graph for the encoder and every head, int8), the runtimes that run a saved model (`torch_runtime`,
`onnx_runtime`, `openvino_runtime`: each one `Runtime`, registered here in `base.runtimes.RUNTIMES`,
in the order `auto` breaks ties by), the modes `auto` picks from and the gate."""

from bertheads.base.runtimes import register
from bertheads.export.onnx_runtime import ONNX
from bertheads.export.openvino_runtime import OPENVINO
from bertheads.export.torch_runtime import TORCH

for _runtime in (TORCH, ONNX, OPENVINO):
    register(_runtime)
