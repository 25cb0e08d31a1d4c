#!/usr/bin/env bash
# Install the fork on a CUDA machine WITHOUT network (with network, follow the README:
# `pip install sglang==0.5.17` then `python3 tools/fork.py install`).
#
#   bash tools/offline_packs.sh make [DEST]      # here, with network: DEST/pack-1..N (default build/packs)
#   bash tools/offline_packs.sh install PACK...  # there: each pack into $SITE (default /tmp/site)
#   export PYTHONPATH=$SITE                      # then run as usual
#
# The GPU machine is expected to have Python 3.12, torch 2.11.0+cu130 and triton 3.6.0
# (tools/offline_wheels.txt lists the rest: stock sglang 0.5.17 and its other
# dependencies). `make` downloads those wheels for cp312 manylinux x86_64, trims
# sglang-kernel to its Hopper (sm90) ops, adds the fork's changed files
# (`tools/fork.py overlay`, unpacked over stock sglang by `install`), and puts them in
# packs of at most PACK_MB (60) MB each, for transfers with a size limit.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cmd=${1:-}; shift || true
case "$cmd" in
make)
  dest=${1:-$root/build/packs}
  cache=${WHEEL_CACHE:-$HOME/.cache/offline-wheels}
  limit=$(( ${PACK_MB:-60} * 1000000 ))
  mkdir -p "$cache" "$dest"
  plat=(--python-version 3.12 --implementation cp --only-binary=:all:)
  for p in manylinux_2_34_x86_64 manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 any; do
    plat+=(--platform "$p")
  done
  grep -v '^#' "$root/tools/offline_wheels.txt" | grep -v '^$' > "$cache/want.txt"
  python3 -m pip download -q --no-deps "${plat[@]}" -d "$cache" -r "$cache/want.txt"
  kw=$(ls "$cache"/sglang_kernel-*.whl | head -1)
  if [ ! -f "$cache/sgl_kernel_sm90.tgz" ]; then  # flash_ops (1.1 GB), sm100, flashmla: unused by Gemma-4
    t=$(mktemp -d); (cd "$t" && unzip -q "$kw" -x 'sgl_kernel/flash_ops.abi3.so' 'sgl_kernel/infllm_ops*' \
        'sgl_kernel/flashmla_ops.abi3.so' 'sgl_kernel/sm100/*' && tar czf "$cache/sgl_kernel_sm90.tgz" .); rm -rf "$t"
  fi
  # The fork: its files over stock sglang, as a tarball of sglang/... (any interpreter).
  python3 "$root/tools/fork.py" overlay "$cache/overlay" >/dev/null
  tar czf "$cache/fork_overlay.tgz" -C "$cache/overlay" sglang
  rm -rf "$dest"/pack-*
  python3 - "$cache" "$dest" "$limit" <<'PY'
import os, shutil, sys
cache, dest, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
names = {l.split("==")[0].strip().lower().replace("-", "_") for l in open(os.path.join(cache, "want.txt"))}
files = [f for f in os.listdir(cache) if f.endswith(".whl") and f.split("-")[0].lower() in names
         and not f.startswith("sglang_kernel")] + ["sgl_kernel_sm90.tgz"]
files.sort(key=lambda f: -os.path.getsize(os.path.join(cache, f)))
packs = []
for f in files:  # first-fit decreasing
    size = os.path.getsize(os.path.join(cache, f))
    for p in packs:
        if p[0] + size <= limit:
            p[0] += size; p[1].append(f); break
    else:
        packs.append([size, [f]])
packs[-1][1].append("fork_overlay.tgz")  # last: installs over stock sglang
for i, (size, fs) in enumerate(packs, 1):
    d = os.path.join(dest, f"pack-{i}"); os.makedirs(d)
    for f in fs:
        shutil.copy(os.path.join(cache, f), d)
    print(f"{d}: {len(fs)} files, {size / 1e6:.1f} MB")
missing = names - {f.split("-")[0].lower() for f in files} - {"sglang_kernel"}
if missing:
    sys.exit(f"missing wheels: {sorted(missing)}")
PY
  echo "copy $dest and tools/offline_packs.sh to the GPU machine, then: bash tools/offline_packs.sh install $dest/pack-*"
  ;;
install)
  [ $# -ge 1 ] || { echo "usage: $0 install PACK_DIR..." >&2; exit 2; }
  site=${SITE:-/tmp/site}; mkdir -p "$site"
  for d in "$@"; do  # in order: the pack with fork_overlay.tgz comes last
    if ls "$d"/*.whl >/dev/null 2>&1; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$d"/*.whl
    fi
    for t in "$d"/*.tgz; do [ -f "$t" ] && tar xzf "$t" -C "$site"; done
    echo "installed $(ls "$d" | wc -l) files from $d into $site"
  done
  echo "export PYTHONPATH=$site"
  ;;
*)
  sed -n '2,14p' "$0"; [ "$cmd" = "-h" ] || [ "$cmd" = "--help" ]; exit $?
  ;;
esac
