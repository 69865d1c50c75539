"""The GPU code of every kernel compiles with the installed Triton (for sm_90, no GPU needed).

CI runs the kernels through the interpreter, which never compiles their GPU branches (``UPCAST``
off, native conversions, tensor descriptors as TMA): a frontend error there would only show on a
GPU machine. This compiles the first small examples of every registered property in a process
without the interpreter (``flashrt_kernels.testing.compile_only``)."""

import os
import subprocess
import sys

SCRIPT = """
from flashrt_kernels.testing import compile_only
compile_only.install()
failures = compile_only.compile_properties()
kernels = sorted({name for name, _ in compile_only.COMPILED})
print("compiled:", ", ".join(kernels))
for name, err in failures:
    print("FAILED", name, err[:2000])
"""


def test_gpu_code_of_every_property_compiles():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         env=env, timeout=1200)  # fmt: skip
    assert res.returncode == 0, res.stderr[-4000:]
    assert "FAILED" not in res.stdout, res.stdout
    compiled = res.stdout.split("compiled:")[1].splitlines()[0]
    for kernel in ("gqa_tile_kernel", "gqa_invariant_kernel", "_few_rows_kernel", "_w4a8_kernel",
                   "_fp8_linear_kernel", "_rms_norm_kernel", "segmented_attention_kernel"):  # fmt: skip
        assert kernel in compiled, compiled


CAP_SCRIPT = """
import torch
from flashrt_kernels.testing import compile_only
compile_only.install()
from flashrt_kernels.attention import segmented as sg
t, h, d = 2 * 720, 4, 72
q = torch.empty(t, h, d, dtype=torch.bfloat16)
cu = torch.arange(0, t + 1, 720, dtype=torch.int32)
ptx = {}
for cap in (None, sg.register_cap(720)):
    sg.register_cap = lambda max_seqlen, cap=cap: cap
    compile_only.COMPILED.clear()
    sg.launch_segmented(q, q, q, torch.empty_like(q), cu, 720, 0.1)
    ptx[cap] = compile_only.COMPILED[-1][1].asm["ptx"]
a, b = ptx.values()
print("cap line:", ".maxnreg" in b and ".maxnreg" not in a)
strip = lambda p: [ln for ln in p.splitlines() if ".maxnreg" not in ln]
print("same:", strip(a) == strip(b))
"""


def test_vision_register_cap_changes_no_instruction(tmp_path):
    """The segmented tiles' register cap depends on the batch's longest segment; it keeps a
    segment's bits independent of the batch only because it changes nothing but ptxas's
    ``.maxnreg``: the PTX is otherwise identical. Both compile fresh (a Triton cache of its
    own): a kernel cached from another checkout of the sources names that checkout's paths in
    its debug lines."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    res = subprocess.run([sys.executable, "-c", CAP_SCRIPT], capture_output=True, text=True,
                         env=env, timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stderr[-4000:]
    assert "cap line: True" in res.stdout and "same: True" in res.stdout, res.stdout
