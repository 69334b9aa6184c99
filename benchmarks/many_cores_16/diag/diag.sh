#!/bin/bash
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../../.."
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > $OUT/install.txt 2>&1 || { tail -5 $OUT/install.txt; exit 3; }
lscpu | grep -E "Model name|L1d|L2|L3|Flags" | cut -c1-300
cat /sys/devices/system/clocksource/clocksource0/current_clocksource
cd /tmp
timeout 100 python3 $OLDPWD/benchmarks/many_cores_16/diag/lanevar.py 2>&1 | tee $OUT/lanevar.txt
timeout 100 python3 $OLDPWD/benchmarks/many_cores_16/diag/batchrate.py 2>&1 | tee $OUT/batchrate.txt
