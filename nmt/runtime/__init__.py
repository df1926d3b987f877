"""Translation on onnxruntime over a folder `nmt export --format onnx` wrote: numpy searches with the rules
of nmt.decode.search, SentencePiece, no torch (an import-linter contract checks that nothing here imports it)."""
