#!/bin/bash
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../../.."
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > $OUT/install.txt 2>&1 || { tail -5 $OUT/install.txt; exit 3; }
D=$PWD; cd /tmp
timeout 160 python3 $D/benchmarks/many_cores_16/diag/diag2.py 2>&1 | grep -v -i warn | tee $OUT/diag2.txt
