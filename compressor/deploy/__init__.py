"""Deploy: from a saved (pruned) model to production graphs.

Owns the engines (`engines`: one module per engine or runtime, registered with `compressor.core.runtimes`), the
export that has each engine build its variants, with ONNX's parity gate (`export`), int8 variants and their accuracy
gate and fp32 fallback (`quantize`), activation smoothing before int8 (`smoothing`) and ONNX Runtime inference
(`inference`).

May import `core`, `recipe`, `surgery` and `sources` (the model-input contract and batching).
"""
