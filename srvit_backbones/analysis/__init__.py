"""Looking at a model: FLOPs and their tables, benchmarks, ONNX export, the demo, router pictures and token-merging
fidelity."""
