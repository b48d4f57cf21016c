"""The highway stack + projection op against highway_ref."""
import pytest
import torch

from elmo_fast import load_options, load_weights
from elmo_fast.bilm import ops
from elmo_fast.bilm.reference import highway_ref
from tolerances import TOL, assert_close

pytestmark = pytest.mark.skipif(not ops.HAS_EXTENSION, reason="elmo_fast._C not built: pip install --no-build-isolation -e .")


def make(n, f, p, layers, dtype=torch.float32, seed=0, sliced=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, f, generator=g, dtype=torch.float64) * 3  # char CNN output: relu'd, ~[0, 3]
    ws = [torch.randn(2 * f, f, generator=g, dtype=torch.float64) / f ** 0.5 for _ in range(layers)]
    bs = [torch.randn(2 * f, generator=g, dtype=torch.float64) for _ in range(layers)]
    pw = torch.randn(p, f, generator=g, dtype=torch.float64) / f ** 0.5
    pb = torch.randn(p, generator=g, dtype=torch.float64) * 0.1
    if sliced:  # x as columns of a wider buffer, the weights as every other row of taller ones
        x = torch.cat([torch.randn(n, 3, dtype=torch.float64), x, torch.randn(n, 2, dtype=torch.float64)], 1)[:, 3:3 + f]
        ws = [torch.stack([w, torch.randn_like(w)], 1).reshape(4 * f, f)[::2] for w in ws]
    return [t.to(dtype) if isinstance(t, torch.Tensor) else [u.to(dtype) for u in t] for t in (x, ws, bs, pw, pb)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("n,f,p,layers", [(0, 5, 3, 1), (1, 1, 1, 1), (7, 33, 5, 2), (129, 124, 16, 2), (3, 8, 4, 0)])
@pytest.mark.parametrize("sliced", [False, True])
def test_highway_matches_reference(n, f, p, layers, dtype, sliced):
    x, ws, bs, pw, pb = make(n, f, p, layers, dtype, seed=n + f, sliced=sliced)
    expected = highway_ref(*(t.double() if isinstance(t, torch.Tensor) else [u.double() for u in t]
                             for t in (x, ws, bs, pw, pb)))
    got = ops.highway(x, ws, bs, pw, pb)
    assert got.shape == (n, p) and got.dtype == dtype
    assert_close(got, expected.to(dtype), dtype=dtype, what=f"highway n={n} f={f} p={p} layers={layers}")


def test_highway_on_the_fixture_weights(tiny_files):
    w = load_weights(tiny_files[1], load_options(tiny_files[0]))
    x = torch.rand(57, w.options.n_filters) * 4
    got = ops.highway(x, w.highway_weights, w.highway_biases, w.proj_weight, w.proj_bias)
    want = highway_ref(x, w.highway_weights, w.highway_biases, w.proj_weight, w.proj_bias)
    assert_close(got, want, dtype=torch.float32, what="highway on bilm-tf tiny")


def test_highway_opcheck():
    x, ws, bs, pw, pb = make(6, 10, 4, 2)
    torch.library.opcheck(torch.ops.elmo_fast.highway.default, (x, ws, bs, pw, pb))


@pytest.mark.parametrize("change,match", [
    (lambda a: a.__setitem__(1, [a[1][0][:, :-1]] + a[1][1:]), r"highway_weights\[0\] must have shape"),
    (lambda a: a.__setitem__(2, a[2][:1]), "same length"),
    (lambda a: a.__setitem__(3, a[3][:, :-1]), "proj_weight must have shape"),
    (lambda a: a.__setitem__(4, a[4][:-1]), "proj_bias must have shape"),
    (lambda a: a.__setitem__(0, a[0][None]), "x must have 2 dims"),
    (lambda a: a.__setitem__(3, a[3].double()), "proj_weight"),
])
def test_highway_errors_name_the_argument(change, match):
    args = make(4, 6, 3, 2)
    change(args)
    with pytest.raises(RuntimeError, match=match):
        ops.highway(*args)
