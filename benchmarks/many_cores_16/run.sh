#!/bin/bash
# the device run of benchmarks/many_cores.py (run from anywhere): install hogkit against the image's packages, then the parts
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > $OUT/install.txt 2>&1 || {
  echo "editable install failed"; tail -5 $OUT/install.txt; exit 3; }
python3 -c "import numba, numpy, torch, hogkit.kernels, sys; print(sys.version.split()[0], numba.__version__, numpy.__version__, torch.__version__)"
nproc; lscpu | grep -i "model name"
timeout 520 python3 -m benchmarks.many_cores $OUT "$@" 2>&1 | tee $OUT/log.txt
echo "rc=${PIPESTATUS[0]}"
