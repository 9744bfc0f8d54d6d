"""From a teacher and a corpus to a model a user ships: ``raydistill distill``'s recipe and orchestration, the
output directory (sentence-transformers model, ONNX exports, model card), and serving it (Ray Serve).

This package sits above the jobs (it runs them) and below the command line, which only parses and calls it."""
