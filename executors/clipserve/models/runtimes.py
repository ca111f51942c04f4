"""The runtimes a model can run on, named once: the backends package builds one per name, and the command
line, the settings, the catalogue and bulk jobs offer exactly these names."""

BACKENDS = ('torch', 'onnx', 'openvino', 'tensorrt')  # CLIP-style encoders (and their rankers)
RERANK_BACKENDS = ('torch', 'onnx')  # cross-encoder rerankers
