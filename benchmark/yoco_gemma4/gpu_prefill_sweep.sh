#!/usr/bin/env bash
# The prefill sweep on the GPU machine: `bench.py prefill` (off, on-all, ceiling) at
# 1024x8, 4096x1 and 8000x8, E4B then E2B, run 1 then run 2 back to back, each into
# $OUT/prefill_<variant>_run<N>.{json,log}; then a compact summary of what is in $OUT.
#
#   bash benchmark/yoco_gemma4/gpu_prefill_sweep.sh            # runs 1 and 2
#   RUNS=2 bash benchmark/yoco_gemma4/gpu_prefill_sweep.sh     # run 2 alone (another device call)
#   bash benchmark/yoco_gemma4/gpu_prefill_sweep.sh --summary DIR...   # summary of earlier JSON
#
# Needs the fork installed into $SITE (default /tmp/site: tools/offline_packs.sh install, see
# ../shared/device/README.md). Env: VARIANTS ("e4b e2b"), POINTS, RUNS ("1 2"), REPEATS (5),
# EXTRA (more bench.py arguments), RUN_TIMEOUT (seconds per bench.py call, default 900).
# A device call has a time limit: split runs over calls with RUNS, on the same warm machine.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)

summary() {  # per variant, run and point: on-all's share of the ceiling by median and min, spreads, flag
  python3 - "$@" <<'PY'
import glob, json, os, re, sys
for d in sys.argv[1:]:
    for path in sorted(glob.glob(os.path.join(d, "prefill_*_run*.json"))):
        m = re.match(r"prefill_(.+)_run(\d+)\.json$", os.path.basename(path))
        data = json.load(open(path))
        for row in data.get("table", []):
            pct = lambda k: f"{100 * row[k]:.1f} %" if row.get(k) is not None else "-"
            spreads = " ".join(f"{m_}={pct('spread_' + m_)}" for m_ in ("on_all", "ceiling", "off"))
            print(f"SWEEP {m.group(1)} run{m.group(2)} {row['len']}x{row['batch']}: share {pct('share_of_ceiling_on_all')}"
                  f" (min {pct('share_of_ceiling_on_all_min')}), spread {spreads}"
                  f"{' UNSTABLE' if row.get('unstable') else ''}"
                  f"{'' if data.get('reportable', True) else ' (not reportable)'}")
PY
}

if [ "${1:-}" = "--summary" ]; then
  shift
  summary "$@"
  exit 0
fi

: "${OUT:?OUT: the folder for the JSON and logs (the device sets it)}"
SITE=${SITE:-/tmp/site}
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
if ! python3 -c "import sglang.srt.layers.kv_sharing_fast_prefill" 2>/dev/null; then
  echo "the fork is not importable from $SITE (install it first: tools/offline_packs.sh install)" >&2
  exit 2
fi
mkdir -p "$OUT"
status=0
for run in ${RUNS:-1 2}; do
  for v in ${VARIANTS:-e4b e2b}; do
    name="prefill_${v}_run${run}"
    echo "[$(date +%H:%M:%S)] $name"
    # shellcheck disable=SC2086  # EXTRA is a list of arguments
    timeout "${RUN_TIMEOUT:-900}" python3 "$here/bench.py" prefill "$OUT/$name.json" --variant "$v" \
      --points "${POINTS:-1024x8,4096x1,8000x8}" --repeats "${REPEATS:-5}" ${EXTRA:-} > "$OUT/$name.log" 2>&1
    rc=$?
    if [ $rc -ne 0 ]; then
      echo "$name failed (exit $rc); the end of its log:"
      tail -n 20 "$OUT/$name.log"
      status=1
    fi
  done
done
echo "[$(date +%H:%M:%S)] done"
summary "$OUT"
exit $status
