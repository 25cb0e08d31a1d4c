#!/usr/bin/env bash
# The PD pair on the GPU machine (gpu_pair.py), with mooncake carried in.
#
#   bash benchmark/pd_disaggregation/gpu_run.sh make [build/pdpack.tgz]   # here, with network
#   bash benchmark/pd_disaggregation/gpu_run.sh run ARGS...               # there, after the fork's packs
#   bash benchmark/pd_disaggregation/gpu_run.sh faults ARGS...            # gpu_faults.py instead
#
# Calls carry at most 64 MiB: the pack (26 MB) goes with the fork's pack-3, the router's wheel
# (build/pdrouter.whl, 31 MB, for `run ... --router`) with the run itself.
#
# make: mooncake-transfer-engine 0.3.13.post1 (its CUDA build) trimmed to the transfer
# engine, libcudart.so.12 (nvidia-cuda-runtime-cu12; the machine has CUDA 13), and
# libibverbs/libmlx5/libnl/libnuma (Debian debs), about 26 MB; and beside it sglang-router
# 0.3.2's wheel (SGLang's router, PD mode; its Python dependencies are sglang's own).
# run: unpacks it into /tmp/pdpack once (the router's wheel too where carried), checks that
# the engine loads, then
# `gpu_pair.py $WORK ARGS...` (faults: gpu_faults.py; WORK=/tmp/pdwork: it keeps the JSON
# across calls on a warm machine), and copies the JSON and the servers' logs (logs.tgz) to $OUT.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
case "${1:-}" in
make)
  dest=$(realpath -m "${2:-build/pdpack.tgz}")
  t=$(mktemp -d); mkdir -p "$t/pdpack/site/mooncake" "$t/pdpack/lib" "$t/dl"
  plat=(--python-version 3.12 --implementation cp --only-binary=:all: --platform manylinux_2_28_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
  python3 -m pip download -q --no-deps "${plat[@]}" -d "$t/dl" mooncake-transfer-engine==0.3.13.post1 nvidia-cuda-runtime-cu12
  (cd "$t/dl" && unzip -q mooncake_transfer_engine-*.whl 'mooncake/*' 'mooncake_transfer_engine.libs/*' -d x \
     && unzip -q nvidia_cuda_runtime_cu12-*.whl -d rt)
  cp -r "$t/dl/x/mooncake_transfer_engine.libs" "$t/pdpack/site/"
  cp "$t/dl/x/mooncake/"{engine.so,libasio.so,libetcd_wrapper.so} "$t/dl/x/mooncake/"*.py "$t/pdpack/site/mooncake/"
  cp "$(find "$t/dl/rt" -name libcudart.so.12)" "$t/pdpack/lib/"
  (cd "$t/dl" && apt-get download libibverbs1 ibverbs-providers libnl-3-200 libnl-route-3-200 libnuma1 >/dev/null \
     && for d in *.deb; do dpkg-deb -x "$d" debs; done)
  find "$t/dl/debs" -maxdepth 4 -name '*.so.*' -exec cp -L {} "$t/pdpack/lib/" \;
  tar czf "$dest" -C "$t" pdpack
  python3 -m pip download -q --no-deps "${plat[@]}" -d "$t/router" sglang-router==0.3.2
  cp "$t"/router/sglang_router-*.whl "$(dirname "$dest")/pdrouter.whl" && rm -rf "$t"
  ls -la "$dest" "$(dirname "$dest")/pdrouter.whl"
  ;;
run|faults)
  script=$([ "$1" = faults ] && echo gpu_faults.py || echo gpu_pair.py)
  shift
  : "${OUT:?OUT: the folder for the JSON and logs (the device sets it)}"
  [ -d /tmp/pdpack ] || tar xzf "${PDPACK:-build/pdpack.tgz}" -C /tmp
  router=${PDROUTER:-build/pdrouter.whl}
  if [ -f "$router" ] && [ ! -d /tmp/pdpack/site/sglang_router ]; then
    python3 -m zipfile -e "$router" /tmp/pdpack/site
  fi
  export PYTHONPATH="${SITE:-/tmp/site}:/tmp/pdpack/site"
  export LD_LIBRARY_PATH="/tmp/pdpack/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if ! python3 -c "from mooncake.engine import TransferEngine"; then
    ldd /tmp/pdpack/site/mooncake/engine.so | grep "not found"
    exit 2
  fi
  work=${WORK:-/tmp/pdwork}
  mkdir -p "$work"
  timeout "${RUN_TIMEOUT:-570}" python3 "$here/$script" "$work" "$@"
  rc=$?
  cp "$work"/*.json "$OUT"/ 2>/dev/null
  (cd "$work" && tar czf "$OUT/logs.tgz" ./*.log)  # one file: a call returns at most 8
  exit $rc
  ;;
*)
  sed -n 2,18p "$0"
  exit 2
  ;;
esac
