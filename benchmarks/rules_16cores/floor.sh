#!/bin/bash
# the device run of benchmarks/rules_floor.py on a lent 16-core machine (run from anywhere)
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
command -v g++ || { echo "no g++ here"; exit 3; }
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > $OUT/install.txt 2>&1 || {
  echo "editable install failed"; tail -5 $OUT/install.txt; exit 3; }
nproc; lscpu | grep -E -i "model name|L2 cache|L3 cache"
timeout 120 python3 -m benchmarks.rules_floor --json $OUT/rules_floor.json 2>&1 | tee $OUT/floor_log.txt
