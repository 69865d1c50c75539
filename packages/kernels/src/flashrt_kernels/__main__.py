"""``python3 -m flashrt_kernels ...``: the ``flashrt`` command where it is not installed (the
workspace's ``packages/*/src`` on ``PYTHONPATH``, as on a GPU machine without uv)."""

import sys

from flashrt_kernels.cli import main

sys.exit(main())
