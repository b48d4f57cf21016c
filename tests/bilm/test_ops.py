"""elmo_fast.bilm.ops as a whole: the build (what a CPU-only build, or none, says when asked for what it
lacks), which training ops a build has, and the ops chained as the model chains them (opcheck with
gradients, torch.compile of forward and backward). Each op's own tests are in its room's files:
test_char_cnn.py, test_highway.py, test_lstm.py, test_linear.py and their *_cuda.py twins."""

import types

import pytest
import torch
from char_cnn_cases import TINY_FILTERS, elmo_ids, random_cnn
from cuda_targets import HAS_GPU
from grad_checks import leaves, poisoned
from highway_cases import gate_case, highway_case
from lstm_cases import differentiable, layer_case
from tolerances import assert_grad_close
from torch._inductor.utils import fresh_inductor_cache

from elmo_fast import ElmoEmbedder
from elmo_fast.bilm import ops
from elmo_fast.errors import ElmoFastError, ExtensionNotBuiltError

needs_extension = pytest.mark.skipif(
    not ops.HAS_EXTENSION, reason="elmo_fast._C not built: pip install --no-build-isolation -e ."
)


# --- the build ------------------------------------------------------------------------------------


def test_require_extension_says_how_to_build(monkeypatch):
    monkeypatch.setattr(ops, "HAS_EXTENSION", False)
    monkeypatch.setattr(ops, "EXTENSION_IMPORT_ERROR", "ImportError: no module named elmo_fast._C")
    with pytest.raises(ExtensionNotBuiltError, match=r"pip install --no-build-isolation -e \.") as info:
        ops.highway_gate(torch.randn(2, 4), torch.randn(2, 2))
    assert "no module named elmo_fast._C" in str(info.value)
    assert isinstance(info.value, ValueError)  # every ElmoFastError is a ValueError


@needs_extension
def test_extension_reports_cuda_build_flag():
    # A CPU build of torch can only produce a CPU extension, whatever the toolchain.
    assert isinstance(ops.HAS_CUDA_KERNELS, bool)
    if torch.version.cuda is None:
        assert not ops.HAS_CUDA_KERNELS


@pytest.mark.skipif(ops.HAS_CUDA_KERNELS, reason="this build has its CUDA kernels")
def test_cpu_only_build_says_how_to_get_cuda():
    with pytest.raises(ExtensionNotBuiltError) as info:
        ops.require_cuda_kernels()
    message = str(info.value)
    assert "pip install --no-build-isolation -e ." in message
    assert "nvcc" in message
    if torch.version.cuda is None:
        assert "CUDA build of torch" in message


def test_require_cuda_kernels_names_each_cause(monkeypatch):
    monkeypatch.setattr(ops, "HAS_EXTENSION", True)
    monkeypatch.setattr(ops, "HAS_CUDA_KERNELS", True)
    ops.require_cuda_kernels()  # nothing missing: no error
    monkeypatch.setattr(ops, "HAS_CUDA_KERNELS", False)
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(
        ExtensionNotBuiltError,
        match="CPU-only build.*CUDA build of torch.*nvcc.*"
        r"pip install --no-build-isolation -e \.",
    ):
        ops.require_cuda_kernels()
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    with pytest.raises(
        ExtensionNotBuiltError,
        match="no nvcc, or ELMO_FAST_SKIP_CUDA_BUILD=1.*"
        r"pip install --no-build-isolation -e \.",
    ):
        ops.require_cuda_kernels()
    monkeypatch.setattr(ops, "HAS_EXTENSION", False)
    with pytest.raises(ExtensionNotBuiltError, match=r"elmo_fast._C is not available.*pip install"):
        ops.require_cuda_kernels()
    assert issubclass(ExtensionNotBuiltError, ValueError)


@pytest.mark.skipif(HAS_GPU, reason="torch sees a GPU here")
def test_embedder_on_cuda_without_gpu_says_how(tiny_files):
    with pytest.raises(ElmoFastError, match="torch sees no CUDA GPU") as info:
        ElmoEmbedder(*tiny_files, device="cuda")
    if torch.version.cuda is None:
        assert "pip install --no-build-isolation -e ." in str(info.value)


@pytest.mark.skipif(not ops.HAS_EXTENSION, reason="elmo_fast._C not built")
def test_ops_on_cuda_tensors_without_kernels_say_how(monkeypatch):
    class FakeCudaTensor:  # a CPU-only torch cannot make a CUDA tensor; the wrappers only ask .is_cuda
        is_cuda = True

    monkeypatch.setattr(ops, "HAS_CUDA_KERNELS", False)
    with pytest.raises(ExtensionNotBuiltError, match=r"CUDA kernels are not available.*pip install"):
        ops.highway_gate(FakeCudaTensor(), FakeCudaTensor())
    with pytest.raises(ExtensionNotBuiltError, match=r"CUDA kernels are not available"):
        ops.highway(FakeCudaTensor(), [], [], FakeCudaTensor(), FakeCudaTensor())


@needs_extension
def test_no_cuda_backward_says_so(monkeypatch):
    fake_cuda = types.SimpleNamespace(is_cuda=True)
    monkeypatch.setattr(ops, "HAS_CUDA_BACKWARD", False)
    with pytest.raises(NotImplementedError, match="char_cnn has no CUDA backward in this build"):
        ops._no_cuda_backward("char_cnn", fake_cuda)
    with pytest.raises(NotImplementedError, match="lstm_layer has no CUDA kernel in this build"):
        ops._require_training_kernels("lstm_layer", fake_cuda)
    monkeypatch.setattr(ops, "HAS_CUDA_BACKWARD", True)  # a build with the CUDA training ops: no objection
    ops._no_cuda_backward("char_cnn", fake_cuda)
    ops._require_training_kernels("lstm_layer", fake_cuda)


@needs_extension
def test_cuda_backward_follows_the_build():
    """The CUDA training ops come with the CUDA kernels: a CPU-only build has neither."""
    assert ops.HAS_CUDA_BACKWARD == (
        ops.HAS_CUDA_KERNELS
        and all(
            torch._C._dispatch_has_kernel_for_dispatch_key(f"elmo_fast::{name}", "CUDA") for name in ops.TRAINING_OPS
        )
    )
    if not ops.HAS_CUDA_KERNELS:
        assert not ops.HAS_CUDA_BACKWARD


@needs_extension
def test_training_uses_the_cuda_ops_only_where_built():
    from elmo_fast.training.trainer import training_backend

    assert training_backend("fast", "cpu") == "fast"
    assert training_backend("fast", "cuda") == ("fast" if ops.HAS_CUDA_BACKWARD else "reference")


# --- the ops chained: opcheck with gradients, torch.compile ---------------------------------------


@needs_extension
@poisoned
@pytest.mark.parametrize("activation", ["relu", "tanh"])
@pytest.mark.slow
def test_char_cnn_and_highway_opcheck_with_gradients(activation):
    emb, ws, bs = random_cnn(TINY_FILTERS, 4, torch.float32, seed=1)
    ids = elmo_ids(9, seed=1)
    torch.library.opcheck(
        torch.ops.elmo_fast.char_cnn.default, (ids, *leaves([emb]), leaves(ws), leaves(bs), activation)
    )
    out = ops.char_cnn(ids, emb, ws, bs, activation)
    torch.library.opcheck(
        torch.ops.elmo_fast.char_cnn_backward.default, (torch.randn_like(out), ids, emb, ws, bs, activation)
    )
    x, *w = leaves(highway_case(6, 8, 4, 2, torch.float32, seed=2))
    torch.library.opcheck(torch.ops.elmo_fast.highway.default, (x, w[:2], w[2:4], w[4], w[5]))
    projected, x = leaves(gate_case(5, 7, torch.float32, seed=3, layout="sliced"))
    torch.library.opcheck(torch.ops.elmo_fast.highway_gate.default, (projected, x))
    torch.library.opcheck(
        torch.ops.elmo_fast.highway_gate_backward.default, (torch.randn(5, 7), projected.detach(), x.detach())
    )


@needs_extension
@poisoned
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # torch internals
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.slow
def test_torch_compile_forward_and_backward(dynamic):
    torch._dynamo.reset()
    case = layer_case(5, 7, 4, 6, torch.float32, seed=6, lengths=[7, 0, 3, 1, 6], junk=0.0)
    emb, ws, bs = random_cnn(TINY_FILTERS, 4, torch.float32, seed=6)
    ids = elmo_ids(11, seed=6)
    hw = highway_case(11, sum(n for _, n in TINY_FILTERS), 8, 1, torch.float32, seed=6)[1:]

    def f(xg, w_hh, w_proj, h0, c0, emb, w0, hw0, pw):
        y, h, c = ops.lstm_layer(xg, case[1], w_hh, w_proj, 3.0, 3.0, h0, c0)
        tokens = ops.highway(ops.char_cnn(ids, emb, [w0, *ws[1:]], bs), [hw0], hw[1:2], pw, hw[3])
        return (y * y).sum() + h.sum() + 0.5 * c.sum() + tokens.square().mean()

    compiled = torch.compile(f, fullgraph=True, dynamic=dynamic)
    inputs = [*differentiable(case), emb, ws[0], hw[0], hw[2]]
    a, b = leaves(inputs), leaves(inputs)
    # A cache of its own: inductor's on-disk cache (/tmp/torchinductor_$USER) does not key on a custom op's
    # schema, so code compiled by another checkout whose ops take other arguments would be reused here.
    with fresh_inductor_cache():
        got = torch.autograd.grad(compiled(*b), b)
    want = torch.autograd.grad(f(*a), a)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_grad_close(g, w, what=f"compiled input {i}")
