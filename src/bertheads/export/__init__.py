"""Models leaving bertheads, the library layer: `hf` (a transformers directory per head), `onnx` (one
ONNX graph for the encoder and every head, int8) and `onnx_runtime` (running that graph in place of
the torch model)."""
