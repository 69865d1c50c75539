"""The step's single upload: mixed dtypes and shapes come back with the same contents, the
buffers are reused across steps, and a host tensor is required."""

import pytest
import torch

from flashrt_activevln.staging import Staging, layout, pack, views


def _inputs(seed: int, q: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "ids": torch.randint(0, 1000, (3, q), generator=g),
        "pos": torch.randint(0, 1000, (3, 3, q), generator=g),
        "lengths": torch.randint(0, 50, (3,), generator=g),
        "vis": torch.rand(3, q, q, generator=g) < 0.5,
        "img": torch.rand(3, q, generator=g) < 0.5,
        "empty": torch.zeros(0, dtype=torch.long),
    }


def test_cpu_device_returns_the_tensors():
    host = _inputs(0, 5)
    out = Staging("cpu").upload(host)
    assert all(out[k] is host[k] for k in host)


def test_packed_bytes_view_back_exactly():
    """The byte layout the GPU path uses, checked on host buffers: aligned offsets, and views of
    a copy of the packed buffer equal to the inputs (dtypes, shapes, contents)."""
    for q in (1, 5, 33):
        host = _inputs(q, q)
        spans, total = layout(host)
        assert all(s % 16 == 0 for s in spans) and total >= sum(
            t.numel() * t.element_size() for t in host.values()
        )
        buf = torch.full((total + 7,), 0xAB, dtype=torch.uint8)
        pack(buf, host, spans)
        out = views(buf.clone(), host, spans)
        for k, t in host.items():
            assert out[k].dtype == t.dtype and out[k].shape == t.shape, k
            assert torch.equal(out[k], t), (q, k)


@pytest.mark.gpu
def test_one_upload_round_trips_and_reuses_its_buffers():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    st = Staging("cuda")
    for step, q in enumerate((5, 7, 300, 3)):  # grows once, then reuses
        host = _inputs(step, q)
        out = st.upload(host)
        for k, t in host.items():
            assert out[k].device.type == "cuda" and out[k].dtype == t.dtype, k
            assert out[k].shape == t.shape, k
            assert torch.equal(out[k].cpu(), t), (step, k)


def test_device_tensors_are_refused():
    with pytest.raises(ValueError, match="host tensor"):
        Staging("cpu").upload({"x": torch.zeros(2, device="meta")})


@pytest.mark.gpu
def test_upload_into_a_destination_buffer():
    """``dest``: the bytes land in the caller's buffer (a graph's static inputs) at the layout's
    offsets, the same every time for the same inputs; a buffer too small is refused."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    st = Staging("cuda")
    host = _inputs(0, 9)
    spans, total = layout(host)
    dest = torch.zeros(total, dtype=torch.uint8, device="cuda")
    for seed in (1, 2):
        host = _inputs(seed, 9)
        out = st.upload(host, dest=dest)
        want = views(dest, host, spans)
        for k, t in host.items():
            assert out[k].data_ptr() == want[k].data_ptr(), k
            assert torch.equal(want[k].cpu(), t), (seed, k)
    with pytest.raises(ValueError, match="at least"):
        st.upload(host, dest=dest[: total - 16])
