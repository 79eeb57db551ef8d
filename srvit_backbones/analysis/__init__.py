"""Looking at a model: FLOPs, benchmarks, ONNX export, the demo, router pictures, merging fidelity."""
