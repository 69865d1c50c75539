"""Image preprocessing == transformers' slow (PIL) Qwen2VLImageProcessor, bit for bit, on random
frames of many sizes; the torch port (gpu_preprocess, run here on CPU tensors) likewise."""

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from flashrt_activevln.config import tiny
from flashrt_activevln.processor import ActiveVLNProcessor, smart_resize

pil_proc = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")


def _frame(h, w, seed, kind):
    rng = np.random.default_rng(seed)
    if kind == "noise":
        return rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    if kind == "binary":  # 0/255 edges: the most overshoot the bicubic lobes can make
        return (rng.integers(0, 2, (h, w, 3)) * 255).astype(np.uint8)
    yy, xx = np.mgrid[0:h, 0:w]
    return np.stack([(yy * 7) % 256, (xx * 3) % 256, (yy + xx) % 256], -1).astype(np.uint8)


@pytest.fixture(scope="module")
def procs():
    cfg = tiny()
    ours = ActiveVLNProcessor(tokenizer=None, cfg=cfg)
    ref = pil_proc.Qwen2VLImageProcessorPil(
        min_pixels=ours.min_pixels, max_pixels=ours.max_pixels, patch_size=14, merge_size=2
    )
    return ours, ref


@given(
    h=st.integers(8, 720),
    w=st.integers(8, 720),
    seed=st.integers(0, 2**16),
    kind=st.sampled_from(["noise", "binary", "ramp"]),
)
@example(h=480, w=640, seed=0, kind="noise")
@example(h=224, w=308, seed=1, kind="binary")  # already the target size: no resize pass
@example(h=16, w=16, seed=2, kind="noise")  # upscaled to min_pixels
@example(h=479, w=641, seed=3, kind="ramp")
def test_processor_matches_transformers_bitwise(procs, h, w, seed, kind):
    ours, ref = procs
    frame = _frame(h, w, seed, kind)
    want = ref(images=[frame], return_tensors="np")
    cpu, grid = ours.preprocess_cpu(frame)
    assert list(grid) == want["image_grid_thw"][0].tolist()
    assert cpu.dtype == torch.float32
    assert np.array_equal(cpu.numpy().view(np.int32), want["pixel_values"].view(np.int32))
    dev, grid2 = ours.gpu_preprocess(torch.from_numpy(frame))
    assert grid2 == grid
    assert torch.equal(dev.view(torch.int32), cpu.view(torch.int32))


def test_smart_resize_r2r_geometry():
    assert smart_resize(480, 640) == (224, 308)
    with pytest.raises(ValueError):
        smart_resize(1, 500)


def test_gpu_preprocess_batch_is_the_frames_one_by_one(procs):
    ours, _ = procs
    frames = [_frame(480, 640, s, k) for s, k in ((4, "noise"), (5, "ramp"), (6, "binary"))]
    many, grid = ours.gpu_preprocess_batch(torch.from_numpy(np.stack(frames)))
    one = [ours.gpu_preprocess(torch.from_numpy(f)) for f in frames]
    assert all(g == grid for _, g in one)
    assert torch.equal(many.view(torch.int32), torch.cat([pv for pv, _ in one]).view(torch.int32))
    with pytest.raises(ValueError, match=r"uint8 \[n, H, W, 3\]"):
        ours.gpu_preprocess_batch(torch.from_numpy(frames[0]))


@given(
    h=st.integers(1, 40),
    w=st.integers(1, 40),
    out_h=st.integers(1, 48),
    out_w=st.integers(1, 48),
    seed=st.integers(0, 2**16),
    kind=st.sampled_from(["noise", "binary", "ramp"]),
)
@example(h=40, w=40, out_h=40, out_w=40, seed=0, kind="noise")  # no pass: the table alone
@example(h=40, w=31, out_h=14, out_w=31, seed=1, kind="binary")  # one pass, vertical
@example(h=12, w=40, out_h=28, out_w=9, seed=2, kind="ramp")  # up one side, down the other
def test_resize_kernel_is_the_torch_port(h, w, out_h, out_w, seed, kind):
    """The Triton resize + normalize (here through the interpreter) gives the torch port's bits:
    shrinking and growing, either pass order, sides that keep their size, strided (HWC) input."""
    from flashrt_activevln.resize import pillow_bicubic_resize, rescale_normalize
    from flashrt_activevln.resize_kernel import resize_normalize

    frames = torch.from_numpy(np.stack([_frame(h, w, seed + i, kind) for i in range(2)]))
    chw = frames.permute(0, 3, 1, 2)
    want = rescale_normalize(pillow_bicubic_resize(chw, out_h, out_w))
    got = resize_normalize(chw, out_h, out_w)
    assert got.shape == want.shape and got.dtype == torch.float32
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_resize_kernel_rejects_bad_frames():
    from flashrt_activevln.resize_kernel import resize_normalize

    with pytest.raises(ValueError, match=r"uint8 \[N, 3, H, W\]"):
        resize_normalize(torch.zeros(1, 4, 8, 8, dtype=torch.uint8), 4, 4)


@pytest.mark.gpu
def test_gpu_preprocess_on_the_gpu_is_the_torch_port(procs):
    """On a CUDA device the batch goes through the Triton kernel: the torch port's bits (run on
    the CPU tensors), at the replay's 640x480 and at other sizes. The port is compared with
    Pillow 13 through transformers above; ``preprocess_cpu`` runs the installed Pillow, which on
    the GPU machine is 12.3 (whose bytes the port is not written for)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    ours, _ = procs
    for h, w, kinds in ((480, 640, ("noise", "binary", "ramp", "noise")), (479, 641, ("ramp",)),
                        (16, 16, ("noise",)), (720, 200, ("binary", "noise"))):  # fmt: skip
        frames = torch.from_numpy(np.stack([_frame(h, w, s, k) for s, k in enumerate(kinds)]))
        dev, grid = ours.gpu_preprocess_batch(frames.cuda())
        port, port_grid = ours.gpu_preprocess_batch(frames)
        assert grid == port_grid
        assert torch.equal(dev.cpu().view(torch.int32), port.view(torch.int32)), (h, w)
