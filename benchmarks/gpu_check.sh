#!/usr/bin/env bash
# The GPU check of popgrpo's CUDA path for language-model members, as one script for a CUDA
# machine that has no network: the policy tests on CUDA, then TRL's GRPOTrainer against a
# popgrpo member on the GPU (benchmarks/trl_throughput.py --device cuda). Run from the
# repository root:
#
#   bash benchmarks/gpu_check.sh
#
# It reads what the machine lacks from two folders made beforehand on a machine with network
# and kept out of git (.git/info/exclude: /.whl/ and /.gpu/); results: BENCHMARKS.md, "On one
# GPU: NVIDIA H200".
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
# shared_base (tests/policies/test_shared_base_policy.py in float32 and bfloat16, then
# benchmarks/shared_base.py on the qwen2.5-0.5b shape in bfloat16, written here: needs only .whl/;
# SB_MEMBERS, SB_REPEATS, SB_STEPS, SB_TIMEOUT set its size).
# Settings (environment): OUT (logs and JSON; default runs/gpu-check), DEVICE (cuda; cpu for a
# dry run), DTYPE (the models' weights in the tests and on both sides of the benchmark: float32,
# or bfloat16, what policy.causal_lm.dtype=auto picks on CUDA), PY (python3), INSTALL_WHEELS (1), ROUNDS (8), STEPS (3), BUDGET_S (200: no round is
# started that would end past it), BENCH_TIMEOUT (330), BENCH_ARGS (more benchmark arguments).
set -uo pipefail
OUT=${OUT:-runs/gpu-check}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-float32}
PY=${PY:-python3}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
step() { echo; echo "== $(date -u +%H:%M:%S) $*"; }
CHECKS=${CHECKS:-versions policies device trl shared_base}
want() { [[ " $CHECKS " == *" $1 "* ]]; }
status=0

step "wheels"
if [ "${INSTALL_WHEELS:-1}" = 1 ]; then
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
  step "shared base: tests/policies/test_shared_base_policy.py on $DEVICE in float32 and bfloat16"
  for dt in float32 bfloat16; do
    POPGRPO_TEST_DEVICE=$DEVICE POPGRPO_TEST_DTYPE=$dt timeout 240 "$PY" -m pytest -p no:cacheprovider -q -rs \
      tests/policies/test_shared_base_policy.py || status=1
  done
  step "shared base: benchmark on the qwen2.5-0.5b shape ($DEVICE, bfloat16)"
  "$PY" -c "from popgrpo.policies.causal_lm import build_shaped_causal_lm as b; b('qwen2.5-0.5b', '/tmp/q05', dtype='bfloat16')" || status=1
  timeout "${SB_TIMEOUT:-420}" "$PY" -m benchmarks.shared_base --model /tmp/q05 --device "$DEVICE" --dtype bfloat16 \
    --members "${SB_MEMBERS:-1,2,4,8}" --repeats "${SB_REPEATS:-2}" --steps "${SB_STEPS:-2}" --prompts 4 --group 8 \
    --tokens 32 --threads 4 --label qwen2.5-0.5b-shape --json "$OUT/shared_base_gpu.json" || status=1
}

if [ "$CHECKS" = "shared_base" ] || [ "$CHECKS" = "versions shared_base" ]; then
  want versions && versions
  shared_base
  step "done (status $status)"
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
exit $status
