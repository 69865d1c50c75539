"""Test configuration for every package.

Without a CUDA device the Triton kernels run through Triton's CPU interpreter: TRITON_INTERPRET
must be set before any kernel module (and so Triton) is imported, which is why this happens at the
top of the first conftest, before anything imports flashrt_kernels.
"""

import os

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

from flashrt_kernels.testing.profiles import default_profile, register_profiles  # noqa: E402

register_profiles()
settings.load_profile(default_profile())


def pytest_addoption(parser):
    parser.addoption(
        "--max-examples", type=int, default=None, help="hypothesis examples per property test"
    )


def pytest_configure(config):
    n = config.getoption("--max-examples")
    if n:
        settings.register_profile("cli", parent=settings(), max_examples=n)
        settings.load_profile("cli")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
