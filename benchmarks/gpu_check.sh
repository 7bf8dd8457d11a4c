#!/usr/bin/env bash
# The GPU check of popgrpo's CUDA path for language-model members, as one script for a CUDA
# machine that has no network: the policy tests on CUDA, then TRL's GRPOTrainer against a
# popgrpo member on the GPU (benchmarks/trl_throughput.py --device cuda). Run from the
# repository root:
#
#   bash benchmarks/gpu_check.sh
#
# It reads what the machine lacks from two folders made beforehand on a machine with network
# and kept out of git (.git/info/exclude: /.whl/ and /.gpu/); results: docs/benchmarks/lm.md, "On one
# GPU: NVIDIA H200", and docs/benchmarks/shared-base.md.
#   .whl/  wheels for Python 3.12 of what popgrpo needs and the machine lacks, installed into
#          /tmp/site and put on PYTHONPATH. For the lent machines' image (2026-11): pip download
#          --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform
#          manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl pydantic==2.14.4
#          pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
#          typing-extensions==4.16.0 ribs==0.12.0 numpy-groupies==0.16.0 array-api-compat==1.16.0
#          simpy==4.1.2 pyseccomp==0.1.2 trl==1.16.0 datasets==5.2.0 dill==0.4.1
#          multiprocess==0.70.19
#   .gpu/  program-lm/ (popgrpo lm pretrain's output without checkpoints/), minilm-q8/
#          (python -m benchmarks.embedder_q8 pack .gpu/minilm-q8) and the Debian packages of
#          bubblewrap and libseccomp2 (cd .gpu && apt-get download bubblewrap libseccomp2),
#          unpacked into /tmp/bw when bwrap or libseccomp is missing.
#
# CHECKS (default: all) picks the parts, by name: versions, policies (the policy tests on the
# device), device (tests/runtime/test_device.py), trl (the TRL benchmark, which needs .gpu/),
# shared_base (below: needs only .whl/).
# Settings (environment): OUT (logs and JSON; default runs/gpu-check), DEVICE (cuda; cpu for a
# dry run), DTYPE (the models' weights in the tests and on both sides of the benchmark: float32,
# or bfloat16, what policy.causal_lm.dtype=auto picks on CUDA), PY (python3), INSTALL_WHEELS (1; 0
# with DEVICE=cpu), ROUNDS (8), STEPS (3), BUDGET_S (200: no round is started that would end past
# it), BENCH_TIMEOUT (330), BENCH_ARGS (more benchmark arguments).
#
# shared_base (issue 45; CHECKS=shared_base runs it alone, in 10 minutes at most on an H200):
#
#   step                                              expected   limit
#   tests/policies/test_shared_base_policy.py float32   ~30 s     50 s  (H200, 2026-11-28: 18 s of tests;
#   the same in bfloat16                                ~30 s     50 s   SB_TEST_TIMEOUT)
#   lm init --shape qwen2.5-0.5b (bfloat16, /tmp/q05)   ~15 s     40 s
#   benchmarks/shared_base.py, budgeted                 ~390 s   420 s  (SB_BUDGET 390: no run starts
#                                                                        with < 20 s left, none outlasts it)
#   the targets, log and JSON copied                     ~2 s     20 s
#   total                                               ~8 min   ~9.7 min
#
# The benchmark: the qwen2.5-0.5b shape in bfloat16, M = 1, 4, 8, 16 in that order (SB_MEMBERS),
# one repeat of one timed step after one warm-up (SB_REPEATS, SB_STEPS), a member step 4 prompts ×
# 8 completions × 32 tokens (SB_PROMPTS, SB_GROUP, SB_TOKENS), 4 torch threads (SB_THREADS). Each M
# runs the shared side, then at M = 8 and 16 (SB_GRAPHS) the shared side with graph decoding (static
# KV cache, decoding step compiled with CUDA graphs: torch.compile backend SB_GRAPHS_BACKEND,
# inductor where a C compiler is found for Triton, else dynamo's cudagraphs backend), then the
# separate side (--separate-last: the costly, known side is what the budget cuts). At M = 1, 8 and
# 16 (SB_DIAGNOSE) each side profiles one more step: the GPU busy share of each phase, flagged
# launch-bound under 50%. Estimated from the H200 run of 2026-11-28 (~16 s to start a process,
# load and warm up; ~1.7 s a separate member step) and a guess of ~60 s for graph decoding's
# compilation in a process: M = 1 ~40 s, M = 4 ~55 s, M = 8 ~160 s, M = 16's shared sides
# ~105 s; 16 separate members (~2 min) then get what is left of the budget, likely too little
# (recorded as cut). Then the three targets, each met / not met with its number
# (benchmarks.shared_base --targets): tokens/s at M = 8 ≥ 3× eight separate members', peak GPU
# memory at M = 8 ≤ 1.5× one member's, ≥ 2,000 tokens/s end to end (the shared side's best M). The
# log, the JSON and the targets are copied to SB_DATA (benchmarks/data/gpu/, to commit).
#
# Dry run on the CPU (DEVICE=cpu CHECKS=shared_base, ~1 min on 2 cores): the same steps on a
# qwen2 model shrunk to 2 layers of width 64 and a 512-token vocabulary, M = 1 and 8 (so that the
# targets have their numbers), a member step 1 prompt × 2 completions × 4 tokens, graph decoding at
# M = 8 recorded "skipped: needs CUDA", the diagnosis "not applicable on the CPU"; its files go to
# $OUT/data, not benchmarks/data/gpu.
set -uo pipefail
OUT=${OUT:-runs/gpu-check}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-float32}
PY=${PY:-python3}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
step() { echo; echo "== $(date -u +%H:%M:%S) (+${SECONDS} s) $*"; }
CHECKS=${CHECKS:-versions policies device trl shared_base}
want() { [[ " $CHECKS " == *" $1 "* ]]; }
status=0
SB_LOG_COPY=""
# The shared-base part's copy of this log, once the script's output has reached it (tee is a
# separate process: give it a moment).
finish_log() { if [ -n "$SB_LOG_COPY" ]; then sleep 1; cp "$OUT/gpu_check.log" "$SB_LOG_COPY"; fi; }

step "wheels"
if [ "${INSTALL_WHEELS:-$([ "$DEVICE" = cpu ] && echo 0 || echo 1)}" = 1 ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi

versions() {
step "machine and versions"
nvidia-smi || echo "no nvidia-smi"
"$PY" - <<'EOF'
import importlib.metadata as md, platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("gpu", torch.cuda.get_device_name(), "bf16", torch.cuda.is_bf16_supported())
for name in ("transformers", "peft", "trl", "accelerate", "datasets", "sentence-transformers", "pydantic", "pyarrow", "numpy", "ray", "vllm"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, "not installed")
EOF
}

shared_base() {
  local cpu=0 json log targets stamp backend
  [ "$DEVICE" = cpu ] && cpu=1
  local members=${SB_MEMBERS:-$([ $cpu = 1 ] && echo 1,8 || echo 1,4,8,16)}
  local graphs=${SB_GRAPHS-$([ $cpu = 1 ] && echo 8 || echo 8,16)}
  local diagnose=${SB_DIAGNOSE-$([ $cpu = 1 ] && echo 1,8 || echo 1,8,16)}
  local budget=${SB_BUDGET:-$([ $cpu = 1 ] && echo 150 || echo 390)}
  local test_limit=${SB_TEST_TIMEOUT:-$([ $cpu = 1 ] && echo 120 || echo 50)}
  local data=${SB_DATA:-$([ $cpu = 1 ] && echo "$OUT/data" || echo benchmarks/data/gpu)}
  stamp=$(date -u +%Y-%m-%d_%H%M)
  json="$OUT/shared_base_$DEVICE.json"
  targets="$OUT/shared_base_targets.txt"
  rm -f "$json" "$targets"  # a result of an earlier run in $OUT is not this one's
  step "shared base: tests/policies/test_shared_base_policy.py on $DEVICE in float32 and bfloat16"
  for dt in float32 bfloat16; do
    POPGRPO_TEST_DEVICE=$DEVICE POPGRPO_TEST_DTYPE=$dt timeout "$test_limit" "$PY" -m pytest -p no:cacheprovider -q -rs \
      tests/policies/test_shared_base_policy.py || status=1
  done
  step "shared base: the qwen2.5-0.5b shape in bfloat16$([ $cpu = 1 ] && echo ', shrunk for the dry run')"
  local model=/tmp/q05 shape_args="" label=qwen2.5-0.5b-shape
  if [ $cpu = 1 ]; then
    model="$OUT/q05-tiny" label="qwen2.5-0.5b-shape shrunk (dry run)"
    shape_args="num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1, vocab_size=512"
  fi
  timeout 40 "$PY" -c "from popgrpo.policies.causal_lm import build_shaped_causal_lm as b; b('qwen2.5-0.5b', '$model', dtype='bfloat16', $shape_args)" || status=1
  backend=${SB_GRAPHS_BACKEND:-}
  if [ -z "$backend" ]; then  # inductor's Triton kernels need a C compiler at run time
    if command -v "${CC:-gcc}" >/dev/null || command -v cc >/dev/null; then backend=inductor; else backend=cudagraphs; fi
  fi
  step "shared base: benchmark, M = $members, graph decoding ($backend) at M = ${graphs:-none}, diagnosis at M = ${diagnose:-none}, ${budget} s budget"
  # shellcheck disable=SC2046  # the optional flags: words
  timeout $((budget + 30)) "$PY" -m benchmarks.shared_base --model "$model" --device "$DEVICE" --dtype bfloat16 \
    --members "$members" --repeats "${SB_REPEATS:-1}" --steps "${SB_STEPS:-1}" \
    --prompts "${SB_PROMPTS:-$([ $cpu = 1 ] && echo 1 || echo 4)}" --group "${SB_GROUP:-$([ $cpu = 1 ] && echo 2 || echo 8)}" \
    --tokens "${SB_TOKENS:-$([ $cpu = 1 ] && echo 4 || echo 32)}" --threads "${SB_THREADS:-$([ $cpu = 1 ] && echo 1 || echo 4)}" \
    --budget-s "$budget" --separate-last --graphs-backend "$backend" \
    $([ -n "$graphs" ] && echo --decode-graphs "$graphs") $([ -n "$diagnose" ] && echo --diagnose "$diagnose") \
    --label "$label" --json "$json" || status=1
  step "shared base: the targets"
  if [ -f "$json" ]; then
    timeout 20 "$PY" -m benchmarks.shared_base --targets "$json" | tee "$targets" || status=1
  else
    echo "no results: $json was not written" | tee "$targets"; status=1
  fi
  mkdir -p "$data"
  log="$data/shared_base_${DEVICE}_${stamp}.log"
  [ -f "$json" ] && cp "$json" "$data/shared_base_${DEVICE}_${stamp}.json"
  cp "$targets" "$data/shared_base_${DEVICE}_${stamp}_targets.txt"
  echo "copied to $data: $(basename "$log") (this log, at the end), the JSON and the targets"
  SB_LOG_COPY=$log
}

if [ "$CHECKS" = "shared_base" ] || [ "$CHECKS" = "versions shared_base" ]; then
  want versions && versions
  shared_base
  step "done (status $status)"
  finish_log
  exit $status
fi

step "bubblewrap and libseccomp"
if ! command -v bwrap >/dev/null; then
  rm -rf /tmp/bw && for f in .gpu/*.deb; do dpkg -x "$f" /tmp/bw; done
  export PATH=/tmp/bw/usr/bin:$PATH
fi
if [ -z "$("$PY" -c 'import ctypes.util; print(ctypes.util.find_library("seccomp") or "")')" ]; then
  [ -d /tmp/bw ] || for f in .gpu/*.deb; do dpkg -x "$f" /tmp/bw; done
  export LD_LIBRARY_PATH=/tmp/bw/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
command -v bwrap && bwrap --version
SANDBOX=$("$PY" -c 'from popgrpo.envs.sandbox import bwrap_problem; print(bwrap_problem() or "ok")' 2>&1 | tail -1)
echo "sandbox (bubblewrap + seccomp): $SANDBOX"

versions

step "tests: tests/policies with POPGRPO_TEST_DEVICE=$DEVICE POPGRPO_TEST_DTYPE=$DTYPE"
POPGRPO_TEST_DEVICE=$DEVICE POPGRPO_TEST_DTYPE=$DTYPE timeout 180 "$PY" -m pytest -p no:cacheprovider -q -rs \
  tests/policies/test_causal_lm.py tests/policies/test_engines.py || status=1

step "tests: tests/runtime/test_device.py without Ray (its conftest needs Ray)"
timeout 90 "$PY" -m pytest -p no:cacheprovider --noconftest -m "not ray" -q -rs tests/runtime/test_device.py || status=1

step "embedding model"
rm -rf /tmp/minilm && cp -r .gpu/minilm-q8 /tmp/minilm && "$PY" -m benchmarks.embedder_q8 unpack /tmp/minilm || exit 1

step "benchmark: TRL GRPOTrainer vs a popgrpo member on $DEVICE in $DTYPE"
if [ "$SANDBOX" != ok ]; then
  echo "not run: the rewards run programs in the sandbox, which cannot run here ($SANDBOX)"
  exit 3
fi
# shellcheck disable=SC2086  # BENCH_ARGS: words
timeout "${BENCH_TIMEOUT:-330}" "$PY" -m benchmarks.trl_throughput --model .gpu/program-lm --device "$DEVICE" --dtype "$DTYPE" \
  --steps "${STEPS:-3}" --rounds "${ROUNDS:-8}" --budget-s "${BUDGET_S:-200}" --population 0 \
  --set policy.causal_lm.overlap=true --set policy.causal_lm.merged_generation=true \
  --set env.text.embedding_model=/tmp/minilm ${BENCH_ARGS:-} --out /tmp/bench-gpu || status=1
cp /tmp/bench-gpu/trl_throughput.json "$OUT/" || status=1
want shared_base && shared_base
step "done (status $status)"
finish_log
exit $status
