"""onnx-cinm: compile ONNX models for compute-in-memory and compute-near-memory devices."""
__version__ = "0.1.0"
