"""ONNX Runtime's per-channel weight quantization, vectorized: the same bytes, in a fraction of the time.

``onnxruntime.quantization.quantize_dynamic(per_channel=True)`` quantizes each weight one output channel
at a time in a Python loop (its ``quantize_weight_per_channel_impl``): for the `original` model's 141,824
channels that is 20 of the 31 s its quantization takes on a 2-core AMD EPYC Zen 3.
:func:`vectorized_per_channel` puts in its place, for the block, a method that does the same arithmetic
(min and max per channel, ONNX Runtime's scale and zero point, its rounding and clipping) on all channels
at once, in numpy, and writes the same initializers under the same names: the quantized graph is the same
file, byte for byte (tests/export/test_per_channel.py compares it with ONNX Runtime's own on random
weights with channels all zero, all positive, all negative, tiny and huge, and on an exported biLM).

It takes over only the case it reproduces: 8-bit weights (``QUInt8``, ``QInt8``) with ONNX Runtime's
default symmetry for the type, no per-tensor overrides, no reduced range, no minimum range, finite
weights; and only where the installed ONNX Runtime agrees with it: its method has the signature this
module knows, and a probe (a small graph of such channels, quantized both ways, once per process) gives
the same bytes. Every other call goes to ONNX Runtime's own loop.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import threading
from collections.abc import Iterator

import numpy as np

from .. import durable

#: the parameters of ONNX Runtime's method that this module knows (onnxruntime 1.32)
_SIGNATURE = ("self", "weight_name", "weight_qType", "channel_axis", "reduce_range", "keep_float_weight")
_LOCK = threading.Lock()


@contextlib.contextmanager
def vectorized_per_channel() -> Iterator[None]:
    """ONNX Runtime's per-channel weight quantization vectorized for the block (see the module)."""
    from onnxruntime.quantization import base_quantizer

    cls = base_quantizer.BaseQuantizer
    original = cls.__dict__.get("quantize_weight_per_channel_impl")
    if original is None or tuple(inspect.signature(original).parameters) != _SIGNATURE:
        yield  # another ONNX Runtime: its own loop
        return

    def impl(self, weight_name, weight_qType, channel_axis, reduce_range=True, keep_float_weight=False):  # noqa: N803
        done = _quantize(self, weight_name, weight_qType, channel_axis, reduce_range, keep_float_weight)
        if done is None:
            return original(self, weight_name, weight_qType, channel_axis, reduce_range, keep_float_weight)
        return done

    with _LOCK:  # one block at a time puts it in place (the method it replaces computes the same)
        if not _agrees_with_onnx_runtime(cls, impl, original):
            yield  # an ONNX Runtime that computes otherwise: its own loop
            return
        cls.quantize_weight_per_channel_impl = impl
        try:
            yield
        finally:
            cls.quantize_weight_per_channel_impl = original


def _probe_channels(k: int = 7) -> np.ndarray:
    """A [k, 12] weight whose columns are the awkward kinds of channel (fixed values, no random state)."""
    tiny = float(np.finfo(np.float32).tiny)
    ramp = np.linspace(-1.0, 1.0, k) + np.linspace(0.0, 0.3, k) ** 2
    columns = [
        ramp,  # ordinary
        np.zeros(k),  # all zero: scale 1, zero point 0
        np.abs(ramp) + 0.5,  # all positive: the range stretched to 0
        -np.abs(ramp) - 0.5,  # all negative
        ramp * tiny * 3,  # a scale below float32's smallest normal
        ramp * 1e-30,  # small but normal
        ramp * 1e30,  # large
        np.full(k, 0.75),  # one value
        np.round(ramp * 8) / 2,  # on halves: rounding ties
        ramp * 2 + 1,  # lopsided
        np.sin(np.arange(k) * 1.7) / 3,
        np.cos(np.arange(k) * 0.9) * 7,
    ]
    return np.stack(columns, axis=1).astype(np.float32)


@functools.cache
def _probe_model():
    from onnx import TensorProto, helper, numpy_helper

    w = _probe_channels()
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", w.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", w.shape[1]])],
        [numpy_helper.from_array(w, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


_AGREES: dict[int, bool] = {}


def _agrees_with_onnx_runtime(cls, impl, original) -> bool:
    """Whether the probe model quantizes to the same bytes both ways, for both 8-bit weight types (once per
    process; the caller holds the lock)."""
    key = id(original)
    if key not in _AGREES:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        from .libraries import quiet

        def quantized(method, weight_type) -> bytes:
            cls.quantize_weight_per_channel_impl = method
            try:
                with quiet(), durable.scratch_dir(prefix="elmo-fast-probe-") as folder:
                    path = os.path.join(folder, "probe.onnx")
                    quantize_dynamic(_probe_model(), path, per_channel=True, weight_type=weight_type)
                    with open(path, "rb") as f:
                        return f.read()
            finally:
                cls.quantize_weight_per_channel_impl = original

        try:
            _AGREES[key] = all(
                quantized(impl, t) == quantized(original, t) for t in (QuantType.QUInt8, QuantType.QInt8)
            )
        except Exception:  # noqa: BLE001  (a probe that fails says only: not the arithmetic this module knows)
            _AGREES[key] = False
    return _AGREES[key]


def _quantize(quantizer, weight_name, weight_qtype, channel_axis, reduce_range, keep_float_weight):
    """The three names ONNX Runtime's method returns, its initializers added; None where it would do
    something else than the case this module reproduces."""
    import onnx
    import onnx.numpy_helper
    from onnxruntime.quantization.quant_utils import (
        TENSOR_NAME_QUANT_SUFFIX,
        find_by_name,
        get_qmin_qmax_for_qType,
        normalize_axis,
        tensor_proto_to_array,
    )

    initializer = find_by_name(weight_name, quantizer.model.initializer())
    if initializer is None or keep_float_weight or quantizer.min_real_range is not None:
        return None
    if weight_qtype not in (onnx.TensorProto.UINT8, onnx.TensorProto.INT8):
        return None
    weights = tensor_proto_to_array(initializer)
    valid, axis = normalize_axis(channel_axis, weights.ndim)
    if not valid or weights.dtype != np.float32 or weights.size == 0 or not np.isfinite(weights).all():
        return None
    overrides = quantizer.tensor_quant_overrides.get_per_channel_overrides(weight_name, default_val=[{"axis": axis}])
    if len(overrides) != 1 or set(overrides[0]) != {"axis"}:
        return None
    valid, override_axis = normalize_axis(overrides[0]["axis"], weights.ndim)
    if not valid or override_axis != axis or (quantizer.reduce_range and reduce_range):
        return None

    symmetric = quantizer.is_weight_symmetric(weight_qtype)
    qmin, qmax = get_qmin_qmax_for_qType(weight_qtype, False, symmetric=symmetric)
    others = tuple(d for d in range(weights.ndim) if d != axis)
    # compute_scale_zp, per channel: the range holds 0, symmetric if asked; the scale in float64, stored
    # as float32; a scale below float32's smallest normal gives scale 1 and zero point 0
    rmin = np.minimum(weights.min(axis=others), np.float32(0))
    rmax = np.maximum(weights.max(axis=others), np.float32(0))
    if symmetric:
        absmax = np.maximum(np.abs(rmin), np.abs(rmax))
        rmin, rmax = -absmax, absmax
    dq = np.float64(qmax) - np.float64(qmin)
    scale64 = (rmax.astype(np.float64) - rmin.astype(np.float64)) / dq
    degenerate = scale64 < np.finfo(np.float32).tiny
    if symmetric:
        zero_point = np.full(rmin.shape, np.round((qmin + qmax) / np.float64(2.0)), dtype=qmin.dtype)
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            zero_point = np.round(qmin - rmin / scale64).astype(qmin.dtype)
    scale = scale64.astype(np.float32)
    scale[degenerate] = np.float32(1.0)
    zero_point[degenerate] = 0

    # quantize_nparray: divide in float32, round half to even, add the zero point, clip to the type's range
    shape = [1] * weights.ndim
    shape[axis] = -1
    lo, hi = get_qmin_qmax_for_qType(weight_qtype, False, symmetric=False)
    values = np.round(weights / scale.reshape(shape)) + zero_point.reshape(shape)
    np.clip(values, lo, hi, out=values)
    quantized = values.astype(onnx.helper.tensor_dtype_to_np_dtype(weight_qtype))

    q_weight_name = weight_name + TENSOR_NAME_QUANT_SUFFIX
    zp_name, scale_name = weight_name + "_zero_point", weight_name + "_scale"
    dims = [initializer.dims[axis]]
    quantizer.model.initializer_extend(
        [
            onnx.helper.make_tensor(scale_name, initializer.data_type, dims, scale.tolist()),
            onnx.helper.make_tensor(zp_name, weight_qtype, dims, zero_point.tolist()),
        ]
    )
    quantizer.model.initializer_extend(
        [onnx.numpy_helper.from_array(quantized.reshape(initializer.dims), q_weight_name)]
    )
    return q_weight_name, zp_name, scale_name
