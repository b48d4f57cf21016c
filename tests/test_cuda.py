"""The CUDA kernels against their references, and the CPU-only build's error for device cuda.

GPU tests skip, saying why, without a GPU or without the CUDA kernels built in; the build tests at
the top run everywhere. Every GPU test runs with TF32 off (the fp32 bar is 1e-5), compares with
the reference on the CPU in float64 (the op's own error) and, where it says so, with the
reference on the same device in the same dtype.
"""
import pytest
import torch

from elmo_fast import ElmoEmbedder, ops
from elmo_fast.errors import ElmoFastError, ExtensionNotBuiltError

HAS_GPU = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(
    not (HAS_GPU and ops.HAS_CUDA_KERNELS),
    reason=("no CUDA GPU visible to torch" if not HAS_GPU else
            f"elmo_fast._C has no CUDA kernels: {ops.cuda_kernels_missing_reason()}"))


# --- the build: runs on every machine ------------------------------------------------------------


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
    with pytest.raises(ExtensionNotBuiltError, match="CPU-only build.*CUDA build of torch.*nvcc.*"
                                                     r"pip install --no-build-isolation -e \."):
        ops.require_cuda_kernels()
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    with pytest.raises(ExtensionNotBuiltError, match="no nvcc, or ELMO_FAST_SKIP_CUDA_BUILD=1.*"
                                                     r"pip install --no-build-isolation -e \."):
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
