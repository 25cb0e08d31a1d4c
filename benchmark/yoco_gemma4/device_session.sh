#!/usr/bin/env bash
# The GPU runs of the YOCO benchmark issues, as run on the two-GPU H200 machine
# (device tool, kind nvidia-h200-x2). Each stage fits one device call (< 10 min);
# independent jobs run side by side, one per GPU. Results: $OUT/<stage>.tgz
# (raw JSON and logs) and SUMMARY/ROW lines on stdout.
#
#   bash benchmark/yoco_gemma4/device_session.sh A   # parity + MTP parity | prefill sweep E4B, E2B
#   bash benchmark/yoco_gemma4/device_session.sh B   # served E4B          | MTP parity, served under MTP
#   bash benchmark/yoco_gemma4/device_session.sh P   # which forwards run YOCO under MTP (debug log)
# More stages (what each run found: the .humanize/ results files; what is left: next-gpu-session.md):
#   D  served under MTP, YOCO off and on (summ, chat)
#   E  concurrency sweep, YOCO off and on
#   F  short prompts on a quiet machine, eager and with the off side's default prefill graph
#   G  parity under --enable-deterministic-inference (batch-invariant kernels in both modes)
#   H  G on GPU 0 | E2B short-prompt profile then D on GPU 1 (one call on the two-GPU kind)
#   F2 short prompts E2B/E4B with the ceiling, alone
#   I  short prompts, one forward pass timed without a server (forward_bench.py)
#   J  deterministic parity under MTP | verify-kernel bench, MTP step profile, E4B short-prompt profile
#   K  split-KV verify: parity vs extend verify, E4B step times | 31B step times (FROZEN_KV_MTP issue)
#   L  served E4B chat: no speculation vs MTP vs MTP + split-KV verify (+ 80 running requests)
#   M  text-only E4B with a prefill CUDA graph on both sides (YOCO keeps it below the threshold)
#   N  served E4B summ and chat with the min-tokens threshold (eager prefill, as run 3)
#   O  concurrency sweep with the threshold, then the E2B one-pass ceiling
#   Q  what run 12 left: concurrency c8/c32 with YOCO on; the released multimodal layout
#   S1/S2  the released multimodal layout served in full (summ, chat, 80 prompts): E4B / E2B
#   S1on   S1's YOCO-on server alone (run 13: S1 ran out of time there)
#   V1/V2  the min-tokens default chosen at start-up (patch 0019), served: E4B multimodal
#          chat at 80, 1 and 8 concurrent, YOCO off (V1) / on with min-tokens unset (V2)
#   T1 back-half CUDA graphs: E2B graph vs eager vs off vs ceiling with parity
#   T2 back-half CUDA graphs: E4B parity (200 prompts, up to 8000 tokens)
#   U1 FROZEN_KV_MTP with --speculative-adaptive: served chat-80 and chat-c8, adaptive vs no speculation
#   U2 greedy parity MTP vs MTP + adaptive (200 prompts); served chat-c8 without adaptive
#   W1/W2 patches 0022-0024 (window translate without a device sync; no K/V gather of
#         KV-shared layers under chain verify; FROZEN_KV_MTP's WAR barrier on the verify's
#         read-done event), A/B: W1 serves with
#         .device/overlay-base (main's overlay, no 0022-0024) copied over, W2 with this overlay:
#         chat-80 and chat-c8, no speculation and MTP + adaptive
#   G1/G2 grouped chain verify (patch 0025, SGLANG_CHAIN_VERIFY_GROUPED=1):
#         kernel bench e4b/31b and E4B step times (G1); 31B step times, 220 vs 2048 (G2)
#   WW/GG the same on the two-GPU kind, side by side: WW runs W1 (GPU 1, main's files in a
#         second site dir) and W2 (GPU 0) at once, so both see the same host load; GG runs
#         G1 (GPU 0) and G2 (GPU 1) at once
#   WP greedy outputs of two code versions at once: .device/overlay-base (GPU 1) against this
#         overlay (GPU 0), mtp_check.py --yoco off on each (run A extend verify, run B split-KV
#         verify one row per draft token), then compare_outputs.py
#   GT grouped-verify launch alternatives at small batches (verify_kernel_bench --grouped-alt)
#   UB UA's first order alone (GPU 0) | 31B step times with the grouped verify at 220 and 2460 keys (GPU 1)
#   PS short prefill passes (64-1024 tokens, batch 1 and 8) with the back-half graphs, E4B | E2B
#   PE E4B 256 tokens at batch 1 and 8, 15 repeats (GPU 0) | E2B fast path vs ceiling at 1024 x 8 with
#      the back-half graphs, profiled (GPU 1); `PE seq`: both on GPU 0, one after the other
#   PA E4B 256 tokens, off and on-all engines alternately (two each), host sampled every 2 s
#   G3 31B draft step at 220 and 2460 keys, batch 8, three repeats; `G3 JSON` adds Engine kwargs
#      (e.g. '{"triton_attention_num_kv_splits": 16}')
#   PB batch 1 at 1k-8k tokens against the ceiling, one forward with the back-half graphs, E4B then E2B
#   PF E4B 4096 x 1 against the ceiling, profiled | adaptive MTP greedy parity under deterministic inference
#   PY E4B 1024 / 2048 x 1, one forward, off and on-all processes in both orders
#   PZ patch 0029 (no device sync in the fast-prefill plan): E4B 4096 / 8000 x 1 and E2B 1024 / 2048 x 8
#      against the ceiling, one forward, back half in its graphs
#   PZ2 [e4b|e2b] patch 0029 and the graphs' lazy staging against the legacy plan (bench hook) and the
#      ceiling, one call per model, processes alternated (forward_bench --rounds 2)
#   PW E2B then E4B 4096 x 1 against the ceiling with the current plan, three processes per mode
#   PE2 E2B 1024 / 2048 x 8 against the ceiling, engine-level (prefill_bench), the current plan
#   PK  E2B 4096 x 1 with 64 KV splits for the decode kernel (the back half's attention) against the default 8
#   PF2 E2B 4096 x 1 profiled, on-all against the ceiling (next-GPU item 19)
#   PS2 0030 on short host-bound passes: E4B 64 / 256 x 1 before and after, alternated
#   PQ2 0030's speed: before (.device/overlay-base) and after, engine-level E2B batch 8, processes alternated
#   PQ patch 0030 exactness: YOCO-on outputs with .device/overlay-base (before 0030) against this overlay,
#      compare_outputs.py --run on_a (then call PE2 for its speed)
#   PX E4B short passes as one forward without a server, with the back-half graphs (forward_bench --graphs)
#   MK/MKbase patch 0027 A/B at E4B chat 80 (stock adaptive MTP, an empty Triton cache per server,
#      compiles logged): MK no speculation + MTP with 0027, then MKbase MTP without it
#   MT patch 0028 A/B at E4B chat 80, stock adaptive MTP with the one-node greedy verify tail off
#      (-stocktail) and on, and no speculation; `MT MODES` another order
#   MQ E4B chat 80, no speculation and stock adaptive MTP (0 steps at batch 80), 20 steps of each
#      measured pass profiled on the GPU 2 s after all 80 run: the 0-step round against a decode step;
#      each server's Python GC pauses logged (gc_MODE.log, summed per pass in the ROW lines);
#      `MQ MODES 2 cpu` records the host too, with Python stacks
#   MG E4B chat 80, no speculation and stock adaptive MTP, unprofiled, each server's GC pauses logged;
#      `MG freeze` calls each server's /freeze_gc after its warm-up
#   MP adaptive MTP greedy parity, 0028's tail off (run A) against on (run B), deterministic inference
#   MV one-step and stock adaptive MTP at chat 80 on GPU 0 alone, host load / clocks / CPU affinity
#      sampled every 5 s (host.log)
#   D4/D2  E4B / E2B multimodal, uncached chat, chat-c1, chat-c8, off (GPU 0) and on (GPU 1) at
#          once, min-tokens unset: the start-up default as it works since 6ee0f71 (server log at info);
#          `D4 off` / `D4 on` (and `PS e4b` / `PS e2b`): one side per call on GPU 0, for the one-GPU kind
#   Z1/Z2  uncached chat at TP=2, E4B multimodal, off (Z1) / on (Z2); then run.py --merge here
#   Y1/Y2  served at TP=2 (both GPUs), E4B multimodal, summ and chat, YOCO off (Y1) / on (Y2)
#   UA FROZEN_KV_MTP adaptive with 1 draft step from batch 64 (serve_mtp mode
#         mtp-splitkv-mrr80-adaptive1) against no speculation, chat-80, both orders, one per GPU
#   R  served chat-80 no-spec vs MTP + split-KV alone (FROZEN_KV_MTP); E2B fast path vs ceiling, profiled
#   bash benchmark/yoco_gemma4/device_session.sh C   # TP=2: parity and prefill timing
#
# Before stage A, in the same call: bash .device/install_pack.sh .device/packs/pack-3
# (packs 1 and 2 in the two calls before), see ../shared/device/README.md.
set -uo pipefail
stage=$1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
cp -r .device/overlay/sglang/* /tmp/site/sglang/   # the fork's changed files over stock 0.5.17
res=/tmp/res-$stage
mkdir -p "$res"
B=benchmark/yoco_gemma4
gpu() { local g=$1; shift; CUDA_VISIBLE_DEVICES=$g YOCO_CKPT_DIR=/tmp/ckpt$g "$@"; }
# GPU of a two-job stage's job: the first job 0, the other 1; 0 when the stage's second
# argument picks one job per call (the one-GPU kind): side_gpu FIRST JOB "${2:-}"
side_gpu() { [ "$2" = "$1" ] || [ -n "$3" ] && echo 0 || echo 1; }
# a second site dir with main's files before 0022 (.device/overlay-base), for A/B stages
base_site() { rm -rf /tmp/site-base && cp -a /tmp/site /tmp/site-base && cp -r .device/overlay-base/sglang/* /tmp/site-base/sglang/; }
# Which fork each site runs for the 0030 stages: 1 with 0030 (/tmp/site), 0 before it (/tmp/site-base)
has_0030() { grep -c "def per_layer_inputs_for_plan" /tmp/site/sglang/srt/layers/kv_sharing_fast_prefill.py \
  /tmp/site-base/sglang/srt/layers/kv_sharing_fast_prefill.py; }
# base_new_rounds SCRIPT NAME ARGS...: SCRIPT with the fork before 0030, then with this one, twice over (each
# process runs at its own speed): $res/NAME_{base,new}_r{1,2}.{json,log}
base_new_rounds() {
  local script=$1 name=$2 r; shift 2
  for r in 1 2; do
    PYTHONPATH=/tmp/site-base gpu 0 timeout 140 python3 $B/$script $res/${name}_base_r$r.json "$@" \
      > $res/${name}_base_r$r.log 2>&1
    gpu 0 timeout 140 python3 $B/$script $res/${name}_new_r$r.json "$@" > $res/${name}_new_r$r.log 2>&1
  done
}

host_sampler() {
  # every $1 s: host load, GPU clocks, and each SGLang process's allowed CPUs and the CPU it last ran on
  while sleep "$1"; do
    echo "== $(date +%T) $(date +%s.%N | cut -c1-14) load $(cut -d' ' -f1-3 /proc/loadavg)"
    nvidia-smi --query-gpu=index,clocks.sm,clocks.mem,utilization.gpu,power.draw --format=csv,noheader
    for p in $(pgrep -f "sglang::|sglang.launch_server"); do
      echo "$p $(cat /proc/$p/comm) $(taskset -pc $p 2>/dev/null | cut -d: -f2) cpu $(ps -o psr= -p $p)"
    done
  done > $res/host.log 2>&1
}

case $stage in
A)
  ( gpu 0 timeout 320 python3 $B/parity_check.py $res/parity_e4b.json --variant e4b --prompts 240 --max-new 16 \
      > $res/parity.log 2>&1
    gpu 0 timeout 250 python3 $B/mtp_check.py $res/mtp_parity_e4b.json --variant e4b --prompts 200 --max-len 4000 \
      > $res/mtp_parity.log 2>&1 ) &
  ( gpu 1 timeout 400 python3 $B/run.py $res/prefill_e4b --variant e4b --skip-serving --port 31000 \
      > $res/prefill_e4b.log 2>&1
    gpu 1 timeout 150 python3 $B/prefill_bench.py $res/prefill_e2b.json --variant e2b \
      --points 256x8,1024x8,8000x8,32000x1 > $res/prefill_e2b.log 2>&1 ) &
  wait
  ;;
B)
  ( gpu 0 timeout 540 python3 $B/run.py $res/serve_e4b --variant e4b --skip-prefill --port 30000 \
      > $res/serve_e4b.log 2>&1 ) &
  ( gpu 1 timeout 250 python3 $B/mtp_check.py $res/mtp_parity_e4b.json --variant e4b --prompts 200 --max-len 4000 \
      > $res/mtp_parity.log 2>&1
    gpu 1 timeout 290 python3 $B/run.py $res/serve_e4b_mtp --variant e4b --skip-prefill --mtp \
      --workloads summ,chat --port 31000 > $res/serve_e4b_mtp.log 2>&1 ) &
  wait
  ;;
P)
  gpu 0 timeout 150 python3 $B/mtp_check.py $res/mtp_phases.json --phases > $res/mtp_phases.log 2>&1
  grep -o "KV-sharing fast prefill: [a-z ]*[0-9]* of [0-9]* tokens ([A-Z_]*)\|KV-sharing fast prefill: full pass ([^)]*)" \
    $res/mtp_phases.log | sed 's/on [0-9]* of [0-9]* tokens/on N of M tokens/' | sort | uniq -c > $res/mtp_phases.counts
  ;;
C)
  gpu 0,1 timeout 300 python3 $B/parity_check.py $res/parity_e4b_tp2.json --variant e4b --tp 2 --prompts 120 \
    --max-new 16 > $res/parity_tp2.log 2>&1
  gpu 0,1 timeout 230 python3 $B/prefill_bench.py $res/prefill_e4b_tp2.json --variant e4b --tp 2 \
    --points 1024x8,8000x8,32000x1 > $res/prefill_tp2.log 2>&1
  ;;
D)
  gpu 0 timeout 560 python3 $B/run.py $res/serve_e4b_mtp --variant e4b --skip-prefill --mtp \
    --workloads summ,chat > $res/serve_e4b_mtp.log 2>&1
  ;;
E)
  gpu 0 timeout 560 python3 $B/run.py $res/serve_e4b_conc --variant e4b --skip-prefill \
    --workloads chat-c1,chat-c8,chat-c32,chat-c80 > $res/serve_e4b_conc.log 2>&1
  ;;
F)
  for v in e4b e2b; do
    gpu 0 timeout 130 python3 $B/prefill_bench.py $res/prefill_${v}_short.json --variant $v \
      --points 64x1,64x8,256x1,256x8,1024x1,1024x8,2048x1 --repeats 5 --profile-point 64x8 \
      > $res/prefill_${v}_short.log 2>&1
  done
  gpu 0 timeout 300 python3 $B/prefill_bench.py $res/prefill_e4b_graphs.json --variant e4b --serving-graphs \
    --points 64x8,256x8,1024x8,8000x8 --repeats 5 > $res/prefill_e4b_graphs.log 2>&1
  ;;
H)
  # both GPUs: deterministic parity (no timing) | E2B short-prompt profile, then MTP served
  ( gpu 0 timeout 570 python3 $B/parity_check.py $res/parity_e4b_deterministic.json --variant e4b --prompts 200 \
      --max-new 16 --extra '{"enable_deterministic_inference": true}' > $res/parity_deterministic.log 2>&1 ) &
  ( gpu 1 timeout 130 python3 $B/prefill_bench.py $res/prefill_e2b_profile.json --variant e2b \
      --points 64x8,256x8 --modes off,on --repeats 5 --profile-point 64x8 > $res/prefill_e2b_profile.log 2>&1
    gpu 1 timeout 430 python3 $B/run.py $res/serve_e4b_mtp --variant e4b --skip-prefill --mtp \
      --workloads summ,chat --port 31000 > $res/serve_e4b_mtp.log 2>&1 ) &
  wait
  ;;
F2)
  # alone on one GPU: short prompts, E2B and E4B
  # on = default --kv-sharing-fast-prefill-min-tokens (4096), on-all = 0 (every pass)
  for v in e2b e4b; do
    gpu 0 timeout 260 python3 $B/prefill_bench.py $res/prefill_${v}_short.json --variant $v \
      --points 64x1,64x8,256x8,512x8,1024x4,2048x1,2048x2,4096x1,1024x8,8000x1 --modes off,on,on-all,ceiling \
      --repeats 7 > $res/prefill_${v}_short.log 2>&1
  done
  ;;
I)
  # one forward pass timed without a server (bench_one_batch), short prompts, E2B and E4B
  for v in e2b e4b; do
    gpu 0 timeout 240 python3 $B/forward_bench.py $res/forward_${v}.json --variant $v \
      --modes off,on-all,ceiling --batches 1,8 --lens 64,256,512,1024,2048 --repeats 5 > $res/forward_${v}.log 2>&1
  done
  ;;
J)
  # two GPUs: deterministic MTP parity (no timing) | FROZEN_KV_MTP diagnosis, then one profiled E4B pass per mode
  F=benchmark/frozen_kv_mtp
  ( gpu 0 timeout 540 python3 $B/mtp_check.py $res/mtp_parity_e4b_deterministic.json --variant e4b --prompts 200 \
      --max-len 4000 --extra '{"enable_deterministic_inference": true}' > $res/mtp_parity_deterministic.log 2>&1 ) &
  ( for s in e4b 31b; do
      gpu 1 timeout 60 python3 $F/verify_kernel_bench.py $res/verify_kernel_$s.json --shape $s \
        --batches 1,8 --contexts 220,1024,2460 > $res/verify_kernel_$s.log 2>&1
    done
    FKV_CKPT_DIR=/tmp/fkv1 gpu 1 timeout 300 python3 $F/profile_draft.py $res/draft_e4b --target e4b --batches 8 \
      --contexts 220,2460 --profile --profile-point 8x2460 > $res/draft_e4b.log 2>&1
    for m in off on-all; do
      SGLANG_TORCH_PROFILER_DIR=$res/prof_fwd_$m gpu 1 timeout 90 python3 $B/forward_bench.py $res/fwd_prof_$m.json \
        --variant e4b --modes $m --batches 8 --lens 64 --repeats 2 --extra "--profile --profile-stage prefill" \
        > $res/fwd_prof_$m.log 2>&1
    done ) &
  wait
  ;;
K)
  F=benchmark/frozen_kv_mtp
  ( gpu 0 timeout 300 python3 $B/mtp_check.py $res/mtp_parity_splitkv.json --variant e4b --prompts 200 \
      --max-len 4000 --yoco off --b-extra '{"triton_attention_split_kv_verify": true}' > $res/mtp_parity_splitkv.log 2>&1
    FKV_CKPT_DIR=/tmp/fkv0 gpu 0 timeout 270 python3 $F/profile_draft.py $res/draft_e4b --target e4b --batches 1,8 \
      --contexts 220,2460 --modes off,mtp,mtp-splitkv > $res/draft_e4b.log 2>&1 ) &
  ( FKV_CKPT_DIR=/tmp/fkv1 gpu 1 timeout 570 python3 $F/profile_draft.py $res/draft_31b --target 31b --batches 8 \
      --contexts 2048 --out-len 64 --repeats 1 --modes off,mtp,mtp-splitkv > $res/draft_31b.log 2>&1 ) &
  wait
  ;;
G1)
  # grouped chain verify (branch chain-verify-grouped): kernel times against the per-row
  # split-KV decode rows, then E4B step times per-row vs grouped
  F=benchmark/frozen_kv_mtp
  for s in e4b 31b; do
    gpu 0 timeout 90 python3 $F/verify_kernel_bench.py $res/verify_kernel_grouped_$s.json --shape $s \
      --batches 1,8 --contexts 220,1024,2460 > $res/verify_kernel_grouped_$s.log 2>&1
  done
  grep -h RESULT $res/verify_kernel_grouped_*.log | cut -c1-400
  FKV_CKPT_DIR=/tmp/fkv0 gpu 0 timeout 400 python3 $F/profile_draft.py $res/draft_e4b_grouped --target e4b \
    --batches 8 --contexts 220,2460 --modes mtp-splitkv,mtp-splitkv-grouped > $res/draft_e4b_grouped.log 2>&1
  ;;
G2)
  # the same on the 31B shape (the issue's step-growth target: 1.15x from 220 to 2048)
  FKV_CKPT_DIR=/tmp/fkv0 gpu 0 timeout 570 python3 benchmark/frozen_kv_mtp/profile_draft.py $res/draft_31b_grouped \
    --target 31b --batches 8 --contexts 220,2048 --out-len 64 --repeats 1 --max-running-requests 8 \
    --modes mtp-splitkv,mtp-splitkv-grouped > $res/draft_31b_grouped.log 2>&1
  ;;
G3)
  # the 31B step growth from 220 to 2460 keys at batch 8 (run 18: 1.153x from one repeat; run 27: five);
  # G3 [ENGINE_KWARGS_JSON] [REPEATS, default 3]
  FKV_CKPT_DIR=/tmp/fkv0 gpu 0 timeout 540 python3 benchmark/frozen_kv_mtp/profile_draft.py $res/draft_31b_g3 \
    --target 31b --batches 8 --contexts 220,2460 --out-len 64 --repeats ${3:-3} --max-running-requests 8 \
    --modes mtp-splitkv-grouped --extra "${2:-{\}}" > $res/draft_31b_g3.log 2>&1
  ;;
L)
  # served E4B chat | 31B step times (8 running requests: the SWA pool cap at the default 48 does not fit)
  ( gpu 0 timeout 580 python3 benchmark/frozen_kv_mtp/serve_mtp.py $res/serve_mtp --workloads chat \
      --modes nospec,mtp,mtp-splitkv,mtp-splitkv-mrr80 > $res/serve_mtp.log 2>&1 ) &
  ( FKV_CKPT_DIR=/tmp/fkv1 gpu 1 timeout 570 python3 benchmark/frozen_kv_mtp/profile_draft.py $res/draft_31b \
      --target 31b --batches 8 --contexts 220,2048 --out-len 64 --repeats 1 --max-running-requests 8 \
      --modes off,mtp,mtp-splitkv > $res/draft_31b.log 2>&1 ) &
  wait
  ;;
M)
  # both sides capture the prefill graph up to 3840 tokens (YOCO's cap below 4096; a
  # 16384-token capture alone took over 90 s): short prompts must match exactly
  G='{"disable_prefill_cuda_graph": false, "cuda_graph_max_bs_prefill": 3840, "kv_sharing_fast_prefill_min_tokens": 4096}'
  gpu 0 timeout 200 python3 $B/parity_check.py $res/parity_graphs_short.json --variant e4b --prompts 96 \
    --max-len 120 --max-new 16 --extra "$G" > $res/parity_graphs_short.log 2>&1
  P=64x1,64x8,256x8,1024x2,1024x8,4096x8
  gpu 0 timeout 220 python3 $B/prefill_bench.py $res/prefill_e4b_graphs.json --variant e4b --serving-graphs \
    --extra '{"cuda_graph_max_bs_prefill": 3840}' --modes off,on --points $P --repeats 5 \
    > $res/prefill_e4b_graphs.log 2>&1
  gpu 0 timeout 110 python3 $B/prefill_bench.py $res/prefill_e4b_eager.json --variant e4b --modes off \
    --points $P --repeats 5 > $res/prefill_e4b_eager.log 2>&1
  ;;
N)
  gpu 0 timeout 575 python3 $B/run.py $res/serve_e4b --variant e4b --skip-prefill --workloads summ,chat \
    > $res/serve_e4b.log 2>&1
  ;;
O)
  gpu 0 timeout 420 python3 $B/run.py $res/serve_e4b_conc --variant e4b --skip-prefill \
    --workloads chat-c1,chat-c8,chat-c32 > $res/serve_e4b_conc.log 2>&1
  gpu 0 timeout 140 python3 $B/forward_bench.py $res/forward_e2b.json --variant e2b --modes off,on-all,ceiling \
    --batches 8 --lens 512,1024,2048 --repeats 5 > $res/forward_e2b.log 2>&1
  ;;
Q)
  gpu 0 timeout 250 python3 $B/run.py $res/serve_e4b_conc_on --variant e4b --skip-prefill --modes on \
    --workloads chat-c8,chat-c32 > $res/serve_e4b_conc_on.log 2>&1
  gpu 0 timeout 320 python3 $B/run.py $res/serve_e4b_mm --variant e4b --skip-prefill --multimodal --quick \
    --workloads summ,chat > $res/serve_e4b_mm.log 2>&1
  ;;
R)
  gpu 0 timeout 330 python3 benchmark/frozen_kv_mtp/serve_mtp.py $res/serve_mtp_chat80 --workloads chat \
    --modes nospec,mtp-splitkv-mrr80 > $res/serve_mtp_chat80.log 2>&1
  gpu 0 timeout 220 python3 $B/prefill_bench.py $res/prefill_e2b_profile.json --variant e2b --modes on-all,ceiling \
    --points 1024x8,2048x8 --repeats 5 --profile-point 1024x8 > $res/prefill_e2b_profile.log 2>&1
  ;;
S1|S2|S1on)
  v=$([ $stage = S2 ] && echo e2b || echo e4b)
  modes=off,on t=400
  [ $stage = S1on ] && modes=on t=300
  gpu 0 timeout $t python3 $B/run.py $res/serve_${v}_mm --variant $v --skip-prefill --multimodal \
    --modes $modes --workloads summ,chat > $res/serve_${v}_mm.log 2>&1
  ;;
V1|V2)
  modes=$([ $stage = V1 ] && echo off || echo on)
  gpu 0 timeout 560 python3 $B/run.py $res/serve_e4b_mm_$modes --variant e4b --skip-prefill --multimodal \
    --modes $modes --workloads chat,chat-c1,chat-c8 > $res/serve_e4b_mm_$modes.log 2>&1
  ;;
U1)
  gpu 0 timeout 580 python3 benchmark/frozen_kv_mtp/serve_mtp.py $res/serve_adaptive --workloads chat,chat-c8 \
    --modes mtp-splitkv-mrr80-adaptive,nospec > $res/serve_adaptive.log 2>&1
  ;;
U2)
  gpu 0 timeout 300 python3 $B/mtp_check.py $res/mtp_parity_adaptive.json --yoco off --prompts 200 --max-len 4000 \
    --max-new 16 --b-extra '{"speculative_adaptive": true}' > $res/mtp_parity_adaptive.log 2>&1
  gpu 0 timeout 240 python3 benchmark/frozen_kv_mtp/serve_mtp.py $res/serve_fixed --workloads chat-c8 \
    --modes mtp-splitkv-mrr80 > $res/serve_fixed.log 2>&1
  ;;
W1)
  cp -r .device/overlay-base/sglang/* /tmp/site/sglang/   # main's files: stock window translate
  grep -c translate_window_in_place /tmp/site/sglang/srt/layers/attention/triton_backend.py
  gpu 0 timeout 580 python3 benchmark/frozen_kv_mtp/serve_mtp.py $res/serve_base --workloads chat,chat-c8 \
    --modes nospec,mtp-splitkv-mrr80-adaptive > $res/serve_base.log 2>&1
  ;;
W2)
  grep -c translate_window_in_place /tmp/site/sglang/srt/layers/attention/triton_backend.py
  gpu 0 timeout 580 python3 benchmark/frozen_kv_mtp/serve_mtp.py $res/serve_nosync --workloads chat,chat-c8 \
    --modes nospec,mtp-splitkv-mrr80-adaptive > $res/serve_nosync.log 2>&1
  ;;
WW)
  # W1 and W2 at the same time, one GPU each: an A/B under the same host load
  base_site
  grep -c translate_window_in_place /tmp/site/sglang/srt/layers/attention/triton_backend.py \
    /tmp/site-base/sglang/srt/layers/attention/triton_backend.py
  ( gpu 0 timeout 565 python3 benchmark/frozen_kv_mtp/serve_mtp.py $res/serve_nosync --workloads chat,chat-c8 \
      --modes nospec,mtp-splitkv-mrr80-adaptive > $res/serve_nosync.log 2>&1 ) &
  ( PYTHONPATH=/tmp/site-base gpu 1 timeout 565 python3 benchmark/frozen_kv_mtp/serve_mtp.py $res/serve_base \
      --workloads chat,chat-c8 --modes nospec,mtp-splitkv-mrr80-adaptive --port 33000 > $res/serve_base.log 2>&1 ) &
  wait
  ;;
GG)
  # G1 on GPU 0 and G2 on GPU 1 at once (kernel and step times; the 31B checkpoint needs the disk)
  rm -rf /tmp/ckpt0 /tmp/ckpt1 /tmp/site-base
  F=benchmark/frozen_kv_mtp
  ( for s in e4b 31b; do
      gpu 0 timeout 80 python3 $F/verify_kernel_bench.py $res/verify_kernel_grouped_$s.json --shape $s \
        --batches 1,8 --contexts 220,1024,2460 > $res/verify_kernel_grouped_$s.log 2>&1
    done
    FKV_CKPT_DIR=/tmp/fkv0 gpu 0 timeout 390 python3 $F/profile_draft.py $res/draft_e4b_grouped --target e4b \
      --batches 8 --contexts 220,2460 --modes mtp-splitkv,mtp-splitkv-grouped > $res/draft_e4b_grouped.log 2>&1 ) &
  ( FKV_CKPT_DIR=/tmp/fkv1 gpu 1 timeout 560 python3 $F/profile_draft.py $res/draft_31b_grouped \
      --target 31b --batches 8 --contexts 220,2048 --out-len 64 --repeats 1 --max-running-requests 8 \
      --modes mtp-splitkv,mtp-splitkv-grouped > $res/draft_31b_grouped.log 2>&1 ) &
  wait
  grep -h RESULT $res/verify_kernel_grouped_*.log | cut -c1-400
  ;;
SG)
  # E2B served in the released layout (S2) | greedy parity: extend verify vs grouped split-KV verify
  ( gpu 0 timeout 420 python3 $B/run.py $res/serve_e2b_mm --variant e2b --skip-prefill --multimodal \
      --modes off,on --workloads summ,chat > $res/serve_e2b_mm.log 2>&1 ) &
  ( SGLANG_CHAIN_VERIFY_GROUPED=1 gpu 1 timeout 400 python3 $B/mtp_check.py $res/mtp_parity_grouped.json --yoco off \
      --prompts 200 --max-len 4000 --b-extra '{"triton_attention_split_kv_verify": true}' \
      > $res/mtp_parity_grouped.log 2>&1 ) &
  wait
  ;;
UA)
  ( gpu 0 timeout 560 python3 benchmark/frozen_kv_mtp/serve_mtp.py $res/serve_a1_first_nospec --workloads chat \
      --modes nospec,mtp-splitkv-mrr80-adaptive1 > $res/serve_a1_first_nospec.log 2>&1 ) &
  ( gpu 1 timeout 560 python3 benchmark/frozen_kv_mtp/serve_mtp.py $res/serve_a1_first_mtp --workloads chat \
      --modes mtp-splitkv-mrr80-adaptive1,nospec --port 33000 > $res/serve_a1_first_mtp.log 2>&1 ) &
  wait
  ;;
UB)
  # UA's first order alone (GPU 0) | 31B grouped verify, batch 8, 220 vs 2460 keys (GPU 1)
  rm -rf /tmp/ckpt1 /tmp/site-base /tmp/res-Y1 /tmp/res-Y2   # disk for the 31B checkpoint
  ( gpu 0 timeout 560 python3 benchmark/frozen_kv_mtp/serve_mtp.py $res/serve_a1 --workloads chat \
      --modes nospec,mtp-splitkv-mrr80-adaptive1 > $res/serve_a1.log 2>&1 ) &
  ( FKV_CKPT_DIR=/tmp/fkv1 gpu 1 timeout 560 python3 benchmark/frozen_kv_mtp/profile_draft.py $res/draft_31b_2460 \
      --target 31b --batches 8 --contexts 220,2460 --out-len 64 --repeats 1 --max-running-requests 8 \
      --modes mtp-splitkv-grouped,mtp-splitkv > $res/draft_31b_2460.log 2>&1 ) &
  wait
  ;;
PS)
  # short passes with the back half in CUDA graphs, E4B (GPU 0) and E2B (GPU 1): what min-tokens 0 serves;
  # on the one-GPU kind one variant per call on GPU 0 (PS e4b, PS e2b)
  for v in ${2:-e4b e2b}; do
    g=$(side_gpu e4b $v "${2:-}")
    ( gpu $g timeout 400 python3 $B/prefill_bench.py $res/prefill_${v}_short.json --variant $v \
        --modes off,on-all,ceiling --points 64x1,64x8,256x1,256x8,1024x1 --repeats 5 \
        > $res/prefill_${v}_short.log 2>&1 ) &
  done
  wait
  grep -h "^ROW" $res/prefill_*_short.log
  ;;
PE)
  # run 19's one 1.00x point again with 15 repeats | where E2B's last 7 % against the ceiling goes;
  # `PE seq`: both on GPU 0, one after the other (short passes are host-bound: run 20's side-by-side
  # call slowed the E4B off side while the E2B job loaded)
  g1=$([ "${2:-}" = seq ] && echo 0 || echo 1)
  ( gpu 0 timeout 250 python3 $B/prefill_bench.py $res/prefill_e4b_256.json --variant e4b \
      --modes off,on-all --points 256x1,256x8 --repeats 15 > $res/prefill_e4b_256.log 2>&1 ) &
  [ $g1 = 0 ] && wait
  ( gpu $g1 timeout 250 python3 $B/prefill_bench.py $res/prefill_e2b_profile.json --variant e2b \
      --modes on-all,ceiling --points 1024x8,2048x8 --repeats 5 --profile-point 1024x8 \
      > $res/prefill_e2b_profile.log 2>&1 ) &
  wait
  grep -h "^ROW" $res/prefill_*.log
  ;;
PA)
  # run 20's E4B 256 x 1 read 30 ms with YOCO on in one call and 54 ms in the next: off and on-all engines
  # alternately, twice each, with the host sampled every 2 s (is the slow mode the engine's or the host's?)
  host_sampler 2 &
  sampler=$!
  gpu 0 timeout 540 python3 $B/prefill_bench.py $res/prefill_e4b_alternate.json --variant e4b \
    --modes off,on-all,off,on-all --points 256x1,256x8 --repeats 15 > $res/prefill_e4b_alternate.log 2>&1
  kill $sampler
  grep -h "^ROW" $res/prefill_e4b_alternate.log
  ;;
PZ)
  # patch 0029: the points where the plan's sync left the GPU idle before layer 0 (run 22's trace) and the
  # two closest to 95 % of the ceiling: E4B 4096 x 1 (91.5 %, run 22), E2B 1024 x 8 (94.9 %, run 20)
  gpu 0 timeout 280 python3 $B/forward_bench.py $res/forward_e4b_batch1.json --variant e4b \
    --modes on-all,ceiling --batches 1 --lens 4096,8000 --repeats 10 --graphs > $res/forward_e4b_batch1.log 2>&1
  gpu 0 timeout 280 python3 $B/forward_bench.py $res/forward_e2b_batch8.json --variant e2b \
    --modes on-all,ceiling --batches 8 --lens 1024,2048 --repeats 10 --graphs > $res/forward_e2b_batch8.log 2>&1
  grep -h "^ROW" $res/forward_*.log
  ;;
PZ2)
  # patch 0029 + the graphs' lazy staging, A/B in one call: on-all against on-all-legacy (the plan's
  # host work as before both, bench hook legacy_plan_site/) and the ceiling, processes alternated
  # over two rounds. `PZ2 e4b`: E4B 4096 / 8000 x 1; `PZ2 e2b`: E2B 1024 / 2048 x 8
  v=${2:-e4b}
  if [ "$v" = e4b ]; then pts="--batches 1 --lens 4096,8000"; else pts="--batches 8 --lens 1024,2048"; fi
  gpu 0 timeout 560 python3 $B/forward_bench.py $res/forward_${v}_ab.json --variant $v \
    --modes on-all,on-all-legacy,ceiling $pts --repeats 6 --rounds 2 --graphs > $res/forward_${v}_ab.log 2>&1
  grep -h "^ROW\|BENCH_YOCO_LEGACY_PLAN" $res/forward_${v}_ab.log | sort | uniq -c
  ;;
PW)
  # batch 1 at 4096 tokens with the current plan, three processes per mode alternated: E2B (90.5 % in run 22,
  # before 0029) then E4B (94.4 % in run 24 from two processes per mode that differed by up to 2.5 ms)
  for v in e2b e4b; do
    gpu 0 timeout 280 python3 $B/forward_bench.py $res/forward_${v}_4096.json --variant $v \
      --modes on-all,ceiling --batches 1 --lens 4096 --repeats 6 --rounds 3 --graphs > $res/forward_${v}_4096.log 2>&1
  done
  grep -h "^ROW" $res/forward_*_4096.log
  ;;
PQ)
  # patch 0030 (the back half's per-layer inputs on its rows only) must keep YOCO's outputs to the bit:
  # YOCO on, default mode (back half in its graphs), 200 prompts up to 8000 tokens, with .device/overlay-base
  # (the fork before 0030) and then with this overlay, both on GPU 0. Its speed is PE2's call, a call of its
  # own: with it, one call can pass the device tool's 600 s on a fresh machine
  base_site
  has_0030
  PYTHONPATH=/tmp/site-base gpu 0 timeout 240 python3 $B/parity_check.py $res/parity_on_base.json --variant e4b \
    --prompts 200 --max-len 8000 --on-only > $res/parity_on_base.log 2>&1
  gpu 0 timeout 240 python3 $B/parity_check.py $res/parity_on_new.json --variant e4b \
    --prompts 200 --max-len 8000 --on-only > $res/parity_on_new.log 2>&1
  python3 benchmark/frozen_kv_mtp/compare_outputs.py $res/parity_on_base.json $res/parity_on_new.json --run on_a
  ;;
PQ2)
  # 0030's speed against the fork before it (.device/overlay-base), engine-level as PE2, processes alternated
  # base, new, base, new (each process runs at its own speed), then the ceiling once
  base_site
  has_0030
  base_new_rounds prefill_bench.py prefill_e2b --variant e2b --modes on-all --points 1024x8,2048x8 --repeats 5
  gpu 0 timeout 140 python3 $B/prefill_bench.py $res/prefill_e2b_ceiling.json --variant e2b \
    --modes ceiling --points 1024x8,2048x8 --repeats 5 > $res/prefill_e2b_ceiling.log 2>&1
  for f in $res/prefill_e2b_*.log; do echo "$(basename $f) $(grep -h '^RESULT' $f | python3 -c '
import json, sys
print(" ".join("%dx%d %.2f" % (r["len"], r["batch"], 1e3 * r["median_s"]) for r in map(json.loads, (l[7:] for l in sys.stdin))))')"; done
  ;;
PS2)
  # 0030 on short, host-bound passes: it trades a copy at back-half time for a second per-layer-input
  # combine and two row gathers before layer 0 (about six more launches on the host's path). E4B 64 / 256 x 1,
  # one forward per pass, back half in its graphs, the fork before 0030 (.device/overlay-base) and with it,
  # alternated twice
  base_site
  has_0030
  base_new_rounds forward_bench.py forward_e4b_short --variant e4b --modes on-all --batches 1 --lens 64,256 \
    --repeats 10 --graphs
  for f in $res/forward_e4b_short_*.log; do echo "$(basename $f) $(grep -h '^ROW' $f | tr '\n' ' ')"; done
  ;;
PE2)
  # E2B 1024 / 2048 x 8 engine-level (as served) with the current plan: run 20 read 94.9 % / 95.9 % there
  gpu 0 timeout 280 python3 $B/prefill_bench.py $res/prefill_e2b_batch8.json --variant e2b \
    --modes on-all,ceiling --points 1024x8,2048x8 --repeats 5 > $res/prefill_e2b_batch8.log 2>&1
  ;;
PB)
  # 95 % of the ceiling at batch 1 from 1k tokens (run 3 read 91 % at 4096 x 1 beside another job; 1k-2k x 1
  # were host-bound there): one forward per pass, back half in its graphs, E4B then E2B
  for v in e4b e2b; do
    gpu 0 timeout 280 python3 $B/forward_bench.py $res/forward_${v}_batch1.json --variant $v \
      --modes off,on-all,ceiling --batches 1 --lens 1024,2048,4096,8000 --repeats 10 --graphs \
      > $res/forward_${v}_batch1.log 2>&1
  done
  grep -h "^ROW" $res/forward_*_batch1.log
  ;;
PF)
  # PB (run 22): E4B 4096 x 1 at 91.5 % of the ceiling, 8000 x 1 at 96.7 %: where the extra ~5 ms go, profiled
  # with the engine as served | stock adaptive MTP against fixed 3 steps, greedy, under deterministic inference
  gpu 0 timeout 260 python3 $B/prefill_bench.py $res/prefill_e4b_4k_profile.json --variant e4b \
    --modes on-all,ceiling --points 4096x1,8000x1 --repeats 5 --profile-point 4096x1 > $res/prefill_e4b_4k_profile.log 2>&1
  grep -h "^ROW" $res/prefill_e4b_4k_profile.log
  gpu 0 timeout 300 python3 $B/mtp_check.py $res/mtp_parity_adaptive_det.json --yoco off --prompts 200 --max-len 4000 \
    --max-new 16 --extra '{"enable_deterministic_inference": true}' --b-extra '{"speculative_adaptive": true}' \
    > $res/mtp_parity_adaptive_det.log 2>&1
  tail -4 $res/mtp_parity_adaptive_det.log | cut -c1-300
  ;;
PF2)
  # E2B 4096 x 1 at 90.6 % of the ceiling (runs 22, 25), unmoved by the host-side changes: where the 2.7 ms go,
  # one profiled pass per mode with the engine as served (afterwards, here: trace_diff.py CEILING ON --gpu)
  gpu 0 timeout 420 python3 $B/prefill_bench.py $res/prefill_e2b_4k_profile.json --variant e2b \
    --modes on-all,ceiling --points 4096x1 --repeats 5 --profile-point 4096x1 > $res/prefill_e2b_4k_profile.log 2>&1
  grep -h "^ROW" $res/prefill_e2b_4k_profile.log
  ;;
PK)
  # PF2 (run 25): at E2B 4096 x 1 the back half's one-row decode attention is 0.53 ms of GPU time, 8 CTAs per
  # layer under the default 8 KV splits. The same forward with --triton-attention-num-kv-splits 64 (the server
  # flag; the back half's private backend reads it too), then with the default (run 25's PW: 28.97 ms)
  gpu 0 timeout 160 python3 $B/forward_bench.py $res/forward_e2b_splits64.json --variant e2b --modes on-all \
    --batches 1 --lens 4096 --repeats 6 --graphs --extra "--triton-attention-num-kv-splits 64" \
    > $res/forward_e2b_splits64.log 2>&1
  gpu 0 timeout 75 python3 $B/forward_bench.py $res/forward_e2b_splits8.json --variant e2b --modes on-all \
    --batches 1 --lens 4096 --repeats 6 --graphs > $res/forward_e2b_splits8.log 2>&1
  grep -h "^ROW" $res/forward_e2b_splits*.log
  ;;
PY)
  # PB (run 22) read E4B on-all at 0.75x / 0.97x at 1024 / 2048 x 1 where run 21's PX read 1.33x at 1024 x 1:
  # the same forward with the two modes' processes in both orders (each process runs at one of two speeds)
  for order in off,on-all on-all,off; do
    mkdir -p $res/$order
    gpu 0 timeout 240 python3 $B/forward_bench.py $res/$order/forward_e4b.json --variant e4b --modes $order \
      --batches 1 --lens 1024,2048 --repeats 10 --graphs > $res/$order/forward_e4b.log 2>&1
  done
  grep -h "^ROW" $res/*/forward_e4b.log
  ;;
PX)
  # run 20's E4B 256 x 1 (0.88x through Engine.generate, yet a shorter profiled forward): the forward alone
  gpu 0 timeout 400 python3 $B/forward_bench.py $res/forward_e4b_graphs.json --variant e4b --modes off,on-all \
    --batches 1,8 --lens 64,256,1024 --repeats 10 --graphs > $res/forward_e4b_graphs.log 2>&1
  grep -h "^ROW\|back half" $res/forward_e4b_graphs.log
  ;;
MV)
  # one-step and stock adaptive MTP at chat 80, alone on GPU 0, with the host sampled every 5 s
  # (load, GPU clocks, each SGLang process's allowed CPUs): why one-step MTP varied 0.94-1.10x;
  # `MV nospec,mtp-splitkv-mrr80-adaptive1`: other serve_mtp modes; `MV MODES 1.65`: another simulated accept length;
  # `MV MODES 2.1 80`: warm-up passes of 80 prompts (reach the adaptive 0-step state before the measured pass).
  # Server logs at info since run 20: the prefill batches of MTP and no-spec servers, compared
  host_sampler 5 &
  sampler=$!
  gpu 0 timeout 560 python3 benchmark/frozen_kv_mtp/serve_mtp.py $res/serve_mv --workloads chat \
    --modes ${2:-mtp-splitkv-mrr80-adaptive1,mtp-splitkv-mrr80-adaptive} ${3:+--accept-len $3} ${4:+--warmup-prompts $4} \
    --server-extra '{"log_level": "info"}' > $res/serve_mv.log 2>&1
  grep -c "Prefill batch" $res/serve_mv.log
  kill $sampler
  ;;
MT)
  # patch 0028 (0-step rounds of all-greedy batches skip the stock tree sampling), E4B chat 80, stock adaptive
  # MTP (0 steps at batch 80): tail off / on against no speculation, one server after the other on GPU 0
  host_sampler 5 &
  sampler=$!
  gpu 0 timeout 570 python3 benchmark/frozen_kv_mtp/serve_mtp.py $res/serve_mt --workloads chat \
    --modes ${2:-nospec,mtp-splitkv-mrr80-adaptive-stocktail,mtp-splitkv-mrr80-adaptive} \
    --server-extra '{"log_level": "info"}' > $res/serve_mt.log 2>&1
  grep -h "^ROW" $res/serve_mt.log | cut -c1-400
  kill $sampler
  ;;
MQ)
  # where the 0-step round still loses to a decode step: GPU-only profile of 20 steady steps at batch 80
  # (the trace export stalls each pass for a moment, so this call's tok/s are not comparable)
  modes=${2:-nospec,mtp-splitkv-mrr80-adaptive}  # the first two are diffed, A then B
  gpu 0 timeout 570 python3 benchmark/frozen_kv_mtp/serve_mtp.py $res/serve_mq --workloads chat \
    --modes $modes --profile-at ${3:-2} --profile-steps 20 --gc-log \
    $([ "${4:-}" = cpu ] && echo --profile-cpu) > $res/serve_mq.log 2>&1
  grep -h "^ROW\|profil" $res/serve_mq.log | cut -c1-900
  ma=${modes%%,*}; mb=${modes#*,}; mb=${mb%%,*}
  ta=$(ls -t $res/serve_mq/trace_${ma}_chat/*.trace.json* 2>/dev/null | head -1)
  tb=$(ls -t $res/serve_mq/trace_${mb}_chat/*.trace.json* 2>/dev/null | head -1)
  [ -n "$ta" ] && [ -n "$tb" ] && python3 $B/trace_diff.py "$ta" "$tb" --gpu --steps ArgMaxOps --top 40 \
    | cut -c1-240 | tee $res/mq_gpu_diff.txt
  [ -n "$ta" ] && cp $ta $OUT/mq_$ma.trace.json.gz; [ -n "$tb" ] && cp $tb $OUT/mq_$mb.trace.json.gz
  ;;
MG)
  # the 0-step round's late graph launches (run 26, MQ): GC pauses per server process during the pass
  gpu 0 timeout 570 python3 benchmark/frozen_kv_mtp/serve_mtp.py $res/serve_mg --workloads chat \
    --modes nospec,mtp-splitkv-mrr80-adaptive --gc-log $([ "${2:-}" = freeze ] && echo --freeze-gc) > $res/serve_mg.log 2>&1
  grep -h "^ROW" $res/serve_mg.log | cut -c1-900
  ;;
MP)
  # patch 0028's tail must not change a token: adaptive MTP, real acceptance, 200 prompts to 4000 tokens,
  # tail off (run A) vs on (run B), same batch mix, under deterministic inference
  gpu 0 env SGLANG_ONE_NODE_GREEDY_VERIFY=0 timeout 400 python3 $B/mtp_check.py $res/mtp_parity_tail.json --yoco off \
    --prompts 200 --max-len 4000 --max-new 32 \
    --extra '{"enable_deterministic_inference": true, "speculative_adaptive": true, "log_level": "info"}' \
    --b-env '{"SGLANG_ONE_NODE_GREEDY_VERIFY": "1"}' > $res/mtp_parity_tail.log 2>&1
  grep -c "Switch adaptive runtime state: steps [0-9]* -> 0" $res/mtp_parity_tail.log
  tail -3 $res/mtp_parity_tail.log | cut -c1-400
  ;;
MK|MKbase)
  # patch 0027 (spec decode kernels compiled at start-up), E4B chat 80, stock adaptive MTP, every
  # server on an empty Triton cache with its compiles logged (jit_MODE.log): MK no speculation and
  # MTP with 0027; MKbase MTP without it (a second call: three servers overrun one)
  host_sampler 5 &
  sampler=$!
  modes=$([ $stage = MK ] && echo nospec,mtp-splitkv-mrr80-adaptive || echo mtp-splitkv-mrr80-adaptive)
  gpu 0 timeout 570 python3 benchmark/frozen_kv_mtp/serve_mtp.py $res/serve_mk --workloads chat \
    --modes $modes --fresh-triton-cache --jit-log $([ $stage = MKbase ] && echo --no-kernel-warmup) \
    --server-extra '{"log_level": "info"}' > $res/serve_mk.log 2>&1
  grep -h "Warmed spec decode kernels" $res/serve_mk.log | cut -c1-300
  grep -h "^ROW" $res/serve_mk.log | cut -c1-400
  rm -rf $res/serve_mk/triton_cache_*   # not in the tgz: megabytes of cubins
  kill $sampler
  ;;
D4|D2)
  # uncached chat, c1, c8 with min-tokens unset (0 since 6ee0f71): off on GPU 0, on on GPU 1 at once;
  # on the one-GPU kind one side per call on GPU 0 (D4 off, then D4 on), merged here afterwards
  v=$([ $stage = D4 ] && echo e4b || echo e2b)
  for m in ${2:-off on}; do
    g=$(side_gpu off $m "${2:-}")
    ( gpu $g timeout 560 python3 $B/run.py $res/serve_${v}_mm_$m --variant $v --skip-prefill --multimodal \
        --modes $m --port $((31000 + 10 * g)) --workloads chat,chat-c1,chat-c8 \
        --server-extra '{"log_level": "info"}' > $res/serve_${v}_mm_$m.log 2>&1 ) &
  done
  wait
  grep -h "every prefill pass takes the fast path" $res/*.log | head -2
  [ -n "${2:-}" ] || python3 $B/run.py $res/merged --merge $res/serve_${v}_mm_off,$res/serve_${v}_mm_on > /dev/null
  ;;
Y1|Y2|Z1|Z2)
  # TP=2 (both GPUs), one side per call: Y summ and chat, Z uncached chat alone; 1 off, 2 on
  modes=$([ ${stage:1} = 1 ] && echo off || echo on)
  wl=$([ ${stage:0:1} = Y ] && echo summ,chat || echo chat)
  out=serve_e4b_mm_tp2_$([ ${stage:0:1} = Z ] && echo chat_)$modes
  gpu 0,1 timeout 570 python3 $B/run.py $res/$out --variant e4b --skip-prefill --multimodal \
    --tp 2 --modes $modes --workloads $wl > $res/$out.log 2>&1
  ;;
WP)
  base_site
  # run A: extend verify (0022, 0024); run B: split-KV verify one row per draft token (0022-0024),
  # on both sides: the grouped kernel (0025) is not in the base
  export SGLANG_CHAIN_VERIFY_GROUPED=0
  kv='{"triton_attention_split_kv_verify": true}'
  ( gpu 0 timeout 540 python3 $B/mtp_check.py $res/mtp_new.json --yoco off --prompts 200 --max-len 4000 \
      --b-extra "$kv" > $res/mtp_new.log 2>&1 ) &
  ( PYTHONPATH=/tmp/site-base gpu 1 timeout 540 python3 $B/mtp_check.py $res/mtp_base.json --yoco off \
      --prompts 200 --max-len 4000 --b-extra "$kv" > $res/mtp_base.log 2>&1 ) &
  wait
  for r in off on; do
    python3 benchmark/frozen_kv_mtp/compare_outputs.py $res/mtp_base.json $res/mtp_new.json --run $r
  done
  ;;
GT)
  for s in e4b 31b; do
    gpu 0 timeout 120 python3 benchmark/frozen_kv_mtp/verify_kernel_bench.py $res/verify_kernel_alt_$s.json \
      --shape $s --batches 1,2,4,8 --contexts 220,1024 --grouped-alt h1,h2,s16 > $res/verify_kernel_alt_$s.log 2>&1
  done
  grep -h RESULT $res/verify_kernel_alt_*.log | cut -c1-400
  ;;
T1)
  gpu 0 timeout 540 python3 $B/prefill_bench.py $res/prefill_e2b_graph.json --variant e2b \
    --modes off,on-all,on-all-eager,ceiling --points 64x8,256x8,1024x8,2048x8 --repeats 5 --parity 48 \
    > $res/prefill_e2b_graph.log 2>&1
  grep -h "PARITY" $res/prefill_e2b_graph.log
  ;;
T2)
  gpu 0 timeout 560 python3 $B/parity_check.py $res/parity_e4b_graph.json --variant e4b --prompts 200 \
    --max-len 8000 --max-new 16 > $res/parity_e4b_graph.log 2>&1
  ;;
G)
  gpu 0 timeout 560 python3 $B/parity_check.py $res/parity_e4b_deterministic.json --variant e4b --prompts 120 \
    --max-new 16 --extra '{"enable_deterministic_inference": true}' > $res/parity_deterministic.log 2>&1
  ;;
esac
find "$res" -name "ckpt-*" -prune -o -type f -print | sed "s|$res/||" | sort > $res/files.txt
# profiler traces travel as separate files (the archive must stay under 16 MiB)
for t in $(find "$res" -name "*.trace.json.gz" | head -4); do
  cp "$t" "$OUT/$(basename "$(dirname "$t")" | tr -c 'A-Za-z0-9._\n-' _)-$(basename "$t" | tr -c 'A-Za-z0-9._\n-' _ | tail -c 40)"
done
tar czf "$OUT/$stage.tgz" --exclude='ckpt-*' --exclude='*.trace.json.gz' -C "$res" .
grep -h "SUMMARY\|^ROW\|^RESULT\|Traceback\|Error\|rc=" $res/*.log | grep -v "Ignore import error\|UserWarning" | tail -40
cat $res/*/results.md $res/mtp_phases.counts 2>/dev/null
