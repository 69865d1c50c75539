"""flashrt-kernels: realtime GPU inference kernels for small-batch, latency-bound models.

Every op is a plain function on torch tensors with ``out=`` buffers and a ``backend=`` argument,
also registered as a ``torch.library`` custom op under the ``flashrt`` namespace.
"""

from flashrt_kernels.backends import BACKENDS, available_backends, device_capability
from flashrt_kernels.norm import rms_norm

__version__ = "0.1.0"

__all__ = ["BACKENDS", "__version__", "available_backends", "device_capability", "rms_norm"]
