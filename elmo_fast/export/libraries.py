"""The ``[onnx]`` extra's libraries (onnx, onnxruntime, onnxscript for torch's exporter): imported when
used, a one-line error naming the extra when missing, and their progress chatter kept off the console."""

from __future__ import annotations

import contextlib
import importlib
import logging
import warnings
from collections.abc import Iterator
from types import ModuleType

from ..errors import ElmoFastError

EXTRA = 'pip install "elmo-fast[onnx]"'


def require(name: str, what: str) -> ModuleType:
    """``import name``, or an :class:`ElmoFastError`: ``what`` needs the [onnx] extra."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        missing = (e.name or name).split(".")[0]
        raise ElmoFastError(f"{what} needs the [onnx] extra (missing: {missing}): {EXTRA}") from None


class _FromQuantizer(logging.Filter):
    """Records the quantizer logs on the root logger (``logging.warning``: advice, not problems)."""

    def filter(self, record: logging.LogRecord) -> bool:
        path = record.pathname.replace("\\", "/")
        return not ("/onnxruntime/" in path and "/quantization/" in path)


#: the loggers of progress notes, not problems: torch's exporter (optional torchvision ops it skips),
#: onnxscript's version converter (a fallback it takes); their children inherit the level
_CHATTY = ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript", "onnx_ir")


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """The exporter's and the quantizer's notes and warnings left out for the block (errors still raise)."""
    loggers = [logging.getLogger(name) for name in _CHATTY]
    levels = [logger.level for logger in loggers]
    root, advice = logging.getLogger(), _FromQuantizer()
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    root.addFilter(advice)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        root.removeFilter(advice)
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
