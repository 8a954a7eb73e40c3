#!/usr/bin/env bash
# Side-by-side measurement (issue 56's and 57's goals): the filing head (9369fe7) and this session's head,
# cold caches for the quick preset (the README's first command), warm for eagle3,rheo --budget 60 --depth 6.
set -u
. /work/venv/bin/activate
export HF_HUB_OFFLINE=1
M=/work/measure
rm -rf /tmp/cache_cur /tmp/cache_fil
cd /tmp
echo "== A: current, quick preset, cold caches $(date)"
SPECDEC_CACHE=/tmp/cache_cur python $M/timed.py $M/A_cur_quick_cold.log specdec bench --out $M/cur_quick
echo "== E: filing head, quick preset, cold caches $(date)"
SPECDEC_CACHE=/tmp/cache_fil PYTHONPATH=/work/filing/src python $M/timed.py $M/E_fil_quick_cold.log specdec bench --out $M/fil_quick
echo "== C: filing head, eagle3,rheo budget 60 depth 6, warm $(date)"
SPECDEC_CACHE=/tmp/cache_fil PYTHONPATH=/work/filing/src python $M/timed.py $M/C_fil_e3r.log specdec bench --methods eagle3,rheo --budget 60 --depth 6 --out $M/fil_e3r
echo "== D: current, eagle3,rheo budget 60 depth 6, warm $(date)"
SPECDEC_CACHE=/tmp/cache_cur python $M/timed.py $M/D_cur_e3r.log specdec bench --methods eagle3,rheo --budget 60 --depth 6 --out $M/cur_e3r
echo "== done $(date)"
