"""The vectorized per-channel weight quantization (elmo_fast/export/per_channel.py) writes ONNX Runtime's
own file, byte for byte: on graphs whose weights have every awkward kind of channel (both weight types), on
a real exported biLM (the loop over time is a subgraph); and it hands what it does not reproduce back to
ONNX Runtime, as it does everything where the installed ONNX Runtime computes otherwise."""

import contextlib

import numpy as np
import pytest
from onnx_graphs import require_onnx_extra

from elmo_fast.export import quantize


@pytest.fixture(scope="module", autouse=True)
def _onnx_extra():
    require_onnx_extra()


def _graph(rng: np.random.Generator, k: int, channels: list[np.ndarray]):
    """x [N, k] @ W [k, C] (W's columns: ``channels``) @ W2 [C, 5] (fresh random): an fp32 ONNX model."""
    from onnx import TensorProto, helper, numpy_helper

    w = np.stack(channels, axis=1).astype(np.float32)
    w2 = rng.standard_normal((w.shape[1], 5)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("MatMul", ["h", "w2"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 5])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(w2, "w2")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _awkward_channels(rng: np.random.Generator, k: int) -> list[np.ndarray]:
    tiny = np.finfo(np.float32).tiny
    return [
        rng.standard_normal(k),  # ordinary
        np.zeros(k),  # all zero: scale 1, zero point 0
        np.abs(rng.standard_normal(k)) + 0.5,  # all positive (the range is stretched to 0)
        -np.abs(rng.standard_normal(k)) - 0.5,  # all negative
        rng.standard_normal(k) * tiny * 3,  # a scale below float32's smallest normal
        rng.standard_normal(k) * 1e-30,  # small but normal
        rng.standard_normal(k) * 1e30,  # large
        np.full(k, 0.75),  # one value
        np.round(rng.standard_normal(k) * 4) / 2,  # values on halves: rounding ties
        rng.uniform(-1, 3, k),  # lopsided
    ]


def _both_ways(model, tmp_path, mode: str, monkeypatch) -> tuple[bytes, bytes]:
    """(ONNX Runtime's own file, the vectorized one's) for ``quantize_int8(model, mode)``."""
    quantize.quantize_int8(model, tmp_path / f"fast-{mode}.onnx", mode)
    with monkeypatch.context() as m:
        m.setattr(quantize, "vectorized_per_channel", contextlib.nullcontext)
        quantize.quantize_int8(model, tmp_path / f"own-{mode}.onnx", mode)
    return (tmp_path / f"own-{mode}.onnx").read_bytes(), (tmp_path / f"fast-{mode}.onnx").read_bytes()


@pytest.mark.parametrize("mode", ["int8", "int8-vnni"])
def test_awkward_channels_quantize_to_onnx_runtimes_bytes(mode, tmp_path, monkeypatch):
    rng = np.random.default_rng()
    for k in (1, 2, 7, 64):
        model = _graph(
            rng, k, _awkward_channels(rng, k) + [rng.standard_normal(k) for _ in range(int(rng.integers(1, 40)))]
        )
        own, fast = _both_ways(model, tmp_path, mode, monkeypatch)
        assert own == fast, f"k={k}: the vectorized quantization wrote another file than ONNX Runtime's"


@pytest.mark.slow
def test_an_exported_bilm_quantizes_to_onnx_runtimes_bytes(random_models, onnx_graphs, tmp_path, monkeypatch):
    """The `small` preset's graph (random weights whose cells and projections reach their clips), the
    recurrent MatMuls inside the loop over time included (the weight types differ only in the arithmetic
    the awkward channels above cover)."""
    import onnx

    fp32 = onnx.load(str(onnx_graphs(*random_models("small", exercise_clips=True))))
    own, fast = _both_ways(fp32, tmp_path, "int8", monkeypatch)
    assert own == fast


def test_what_it_does_not_reproduce_goes_to_onnx_runtime(tmp_path, monkeypatch):
    """Reduced range, a minimum real range, non-finite weights: ONNX Runtime's own loop, its own result."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from elmo_fast.export import per_channel

    calls = []
    real = per_channel._quantize
    monkeypatch.setattr(per_channel, "_quantize", lambda *a: calls.append(real(*a)) or calls[-1])
    rng = np.random.default_rng()
    cases = {
        "reduce_range": (_graph(rng, 8, _awkward_channels(rng, 8)), {"reduce_range": True}),
        "MinimumRealRange": (
            _graph(rng, 8, _awkward_channels(rng, 8)),
            {"extra_options": {"MinimumRealRange": 1e-4}},
        ),
    }
    for name, (model, options) in cases.items():
        outputs = []
        for vectorized in (True, False):
            path = tmp_path / f"{name}-{vectorized}.onnx"
            with per_channel.vectorized_per_channel() if vectorized else contextlib.nullcontext():
                quantize_dynamic(
                    model,
                    str(path),
                    op_types_to_quantize=["MatMul"],
                    per_channel=True,
                    weight_type=QuantType.QUInt8,
                    **options,
                )
            outputs.append(path.read_bytes())
        assert outputs[0] == outputs[1], name
    assert calls and all(c is None for c in calls)  # each was handed back


def test_an_onnx_runtime_that_computes_otherwise_keeps_its_own_loop(tmp_path, monkeypatch):
    """Where the probe (a small graph quantized both ways) finds other bytes than ONNX Runtime's, the block
    leaves ONNX Runtime's method in place: the file is ONNX Runtime's own."""
    from onnx import numpy_helper

    from elmo_fast.export import per_channel

    real = per_channel._quantize

    def off_by_one(quantizer, *args):  # what an ONNX Runtime rounding otherwise would make of one weight
        names = real(quantizer, *args)
        if names is not None:
            weight = next(t for t in quantizer.model.initializer() if t.name == names[0])
            values = numpy_helper.to_array(weight).copy()
            values.flat[0] ^= 1
            weight.CopyFrom(numpy_helper.from_array(values, names[0]))
        return names

    monkeypatch.setattr(per_channel, "_quantize", off_by_one)
    monkeypatch.setattr(per_channel, "_AGREES", {})
    rng = np.random.default_rng()
    model = _graph(rng, 16, _awkward_channels(rng, 16))
    own, fast = _both_ways(model, tmp_path, "int8", monkeypatch)
    assert own == fast and list(per_channel._AGREES.values()) == [False]
