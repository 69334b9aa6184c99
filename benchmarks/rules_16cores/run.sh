#!/bin/bash
# the device run of `hogkit bench rules` (issue 26, item 3) on a lent 16-core machine (run
# from anywhere): install hogkit against the image's packages, a cold numba cache, then the
# whole scenario (mf and logreg, live and one worker) and mf's repeat part
export PYTHONUNBUFFERED=1 NUMBA_CACHE_DIR=/tmp/hogkit_numba_cache
cd "$(dirname "$0")/../.."
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > $OUT/install.txt 2>&1 || {
  echo "editable install failed"; tail -5 $OUT/install.txt; exit 3; }
python3 -c "import numba, numpy, torch, hogkit.kernels, sys; print(sys.version.split()[0], numba.__version__, numpy.__version__, torch.__version__)"
nproc; lscpu | grep -E -i "model name|L2 cache|L3 cache"
s=$SECONDS
timeout 330 python3 -m hogkit.cli bench rules --json $OUT/rules.json 2>&1 | tee $OUT/log.txt
echo "rules rc=${PIPESTATUS[0]} $((SECONDS - s)) s" | tee -a $OUT/log.txt
s=$SECONDS
timeout 200 python3 -m hogkit.cli bench rules --only repeat --workload mf \
  --json $OUT/rules_repeat_mf.json 2>&1 | tee -a $OUT/log.txt
echo "repeat mf rc=${PIPESTATUS[0]} $((SECONDS - s)) s" | tee -a $OUT/log.txt
