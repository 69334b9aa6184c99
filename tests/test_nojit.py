"""Run tests/test_kernels.py once with NUMBA_DISABLE_JIT=1 (stumpy's test.sh does the
same): the kernel bodies then run as plain Python, so coverage sees every line and a
kernel that only works compiled (or only interpreted) fails here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_kernels_pass_without_jit():
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(HERE / "test_kernels.py"),
         "-p", "no:cacheprovider", "-q", "-x", "-W", "ignore::RuntimeWarning"],
        cwd=HERE.parent, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout
