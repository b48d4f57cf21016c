"""ONNX Runtime's per-channel weight quantization, vectorized: the same bytes, in a fraction of the time.

``onnxruntime.quantization.quantize_dynamic(per_channel=True)`` quantizes each weight one output channel
at a time in a Python loop (its ``quantize_weight_per_channel_impl``): for the `original` model's 141,824
channels that is over half a minute on a 2-core machine, most of an export with ``--quantize``.
:func:`vectorized_per_channel` puts in its place, for the block, a method that does the same arithmetic
(min and max per channel, ONNX Runtime's scale and zero point, its rounding and clipping) on all channels
at once, in numpy, and writes the same initializers under the same names: the quantized graph is the same
file, byte for byte (tests/export/test_onnx_export.py compares it with ONNX Runtime's own on random
weights with channels all zero, all positive, all negative and tiny).

It takes over only the case it reproduces: 8-bit weights (``QUInt8``, ``QInt8``) with ONNX Runtime's
default symmetry for the type, no per-tensor overrides, no reduced range, no minimum range, finite
weights, and an ONNX Runtime whose method has the signature it was checked against; every other call
goes to ONNX Runtime's own loop.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Iterator

import numpy as np

#: the parameters of ONNX Runtime's method that this module was checked against (1.2x releases)
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
        cls.quantize_weight_per_channel_impl = impl
        try:
            yield
        finally:
            cls.quantize_weight_per_channel_impl = original


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
    quantized = values.astype(lo.dtype)

    q_weight_name = weight_name + TENSOR_NAME_QUANT_SUFFIX
    zp_name, scale_name = weight_name + "_zero_point", weight_name + "_scale"
    dims = [initializer.dims[axis]]
    quantizer.model.initializer_extend(
        [
            onnx.helper.make_tensor(scale_name, initializer.data_type, dims, scale.tolist()),
            onnx.helper.make_tensor(zp_name, weight_qtype, dims, zero_point.tolist()),
        ]
    )
    quantized = np.asarray(quantized, dtype=onnx.helper.tensor_dtype_to_np_dtype(weight_qtype))
    quantizer.model.initializer_extend(
        [onnx.numpy_helper.from_array(quantized.reshape(initializer.dims), q_weight_name)]
    )
    return q_weight_name, zp_name, scale_name
