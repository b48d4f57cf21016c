"""Export: the stateless biLM outside PyTorch (``elmo-fast export onnx``).

* :mod:`~elmo_fast.export.contract`        the graph's inputs and outputs, and the check of a file against them
* :mod:`~elmo_fast.export.stateless_bilm`  the reference path as one traceable module (the LSTM as a scan)
* :mod:`~elmo_fast.export.onnx_file`       export_onnx: trace, check, write (the ``[onnx]`` extra);
                                           quantize_onnx: an exported fp32 graph quantized
* :mod:`~elmo_fast.export.quantize`        ONNX Runtime's dynamic int8 quantization of a written graph
* :mod:`~elmo_fast.export.libraries`       the extra's libraries: imported on use, quiet, or a one-line error
"""

__all__ = ["export_onnx", "quantize_onnx"]


def __getattr__(name: str):
    # ``from elmo_fast.export import export_onnx``, imported on first use: torch's exporter is heavy
    if name in ("export_onnx", "quantize_onnx"):
        from . import onnx_file

        return getattr(onnx_file, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
