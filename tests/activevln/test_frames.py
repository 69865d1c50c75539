"""The replay's frame loader (``frames.py``): frames loaded on its workers are the bytes
``load_frame`` gives (arrays and image files), ``prepare`` runs on them there, a frame never
wanted is loaded when taken, an index past the episode is ignored, and a bad frame's error
reaches ``take``."""

import numpy as np
import pytest
import torch

from flashrt_activevln.frames import FrameFeed, load_frame
from flashrt_activevln.runtime import Episode


def _episode(tmp_path, n=3):
    from PIL import Image

    g = np.random.default_rng(0)
    frames = [g.integers(0, 256, (30 + i, 40, 3), dtype=np.uint8) for i in range(n)]
    paths = []
    for i, f in enumerate(frames):
        paths.append(tmp_path / f"{i}.png")
        Image.fromarray(f).save(paths[-1])
    return Episode("a", "go", frames), Episode("b", "go", paths), frames


def test_loaded_frames_are_load_frames_bytes(tmp_path):
    arrays, files, frames = _episode(tmp_path)
    with FrameFeed() as feed:
        for ep in (arrays, files):
            feed.want(ep, 0)
            feed.want(ep, 2)
            feed.want(ep, 7)  # past the episode: ignored
            for i in (0, 2, 1):  # 1 was never wanted
                got = feed.take(ep, i)
                assert (got.height, got.width) == frames[i].shape[:2]
                assert np.array_equal(got.data, frames[i])
                assert np.array_equal(got.data, load_frame(ep.frames[i]))


def test_prepare_runs_on_the_workers(tmp_path):
    arrays, _, frames = _episode(tmp_path)
    with FrameFeed(prepare=lambda f: f.astype(np.int32).sum()) as feed:
        assert feed.take(arrays, 1).data == frames[1].astype(np.int32).sum()


def test_a_bad_frame_raises_at_take(tmp_path):
    ep = Episode("c", "go", [np.zeros((4, 4), dtype=np.uint8), tmp_path / "missing.png"])
    with FrameFeed() as feed:
        feed.want(ep, 0)
        with pytest.raises(ValueError, match="uint8 H x W x 3"):
            feed.take(ep, 0)
        with pytest.raises(FileNotFoundError):
            feed.take(ep, 1)


@pytest.mark.gpu
def test_pinned_frames(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    arrays, _, frames = _episode(tmp_path)
    with FrameFeed(pinned=True) as feed:
        got = feed.take(arrays, 0).data
        assert got.is_pinned() and torch.equal(got, torch.from_numpy(frames[0]))
