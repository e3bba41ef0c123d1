#!/usr/bin/env bash
# The two-GPU measurements (the device tool's nvidia-h200-x2, one call; carry .carry built by
# scripts/build_for_gpu.sh). Writes logs and JSON under $OUT and prints a summary:
#   1. data-parallel kiln train on 2 GPUs (NCCL) at --zero 0, 1 and 2 against 1 GPU on tiny-llama:
#      per-step losses within bf16 tolerance (2e-3 relative); a 2-rank --zero 1 checkpoint resumed on
#      1 rank ends within the same tolerance of the uninterrupted 2-rank run;
#   2. bench_train, llama-1b shape, 8 x 2048 tokens per GPU: 1 GPU, and 2 GPUs at --zero 0, 1, 2
#      (tokens/s, scaling, resident and peak memory per GPU);
#   3. the RL loop with its engine on GPU 1, its weights over NCCL (bench_rl --remote: the update's
#      time to the engine's acknowledgement) beside the loop in one process on GPU 0, and kiln rl
#      with --engines 1 --weight-transport nccl on the fixture model beside the same run in one
#      process (whether their rollouts are equal is printed: the remote engine may batch otherwise);
#   4. hf_bench.py's training figure on one GPU, as the reference.
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0): the device tool's KINDS.md says why.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-gpu}
OUT=${OUT:-/tmp/kiln-out}
LOGS=${LOGS:-/tmp/kiln-logs}
mkdir -p "$OUT" "$LOGS"
source scripts/gpu_env.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
[ "$gpus" -ge 2 ] || { echo "two GPUs are needed, this machine has $gpus"; exit 1; }
KILN="$BUILD/bin/kiln"
status=0

# 1. Equal losses on 1 and 2 GPUs; a 2-rank checkpoint resumed on 1.
python3 - > "$LOGS/dp.jsonl" <<'PY'
import json, random
random.seed(5)
for i in range(48):
    print(json.dumps({"input_ids": [3 + random.randrange(378) for _ in range(16 + random.randrange(48))]}))
PY
TRAIN="train --model testdata/tiny-llama --data $LOGS/dp.jsonl --device cuda --batch-size 8 --grad-accum 2 --steps 6 --lr 1e-3 --clip-norm 1.0 --shuffle --seed 3"
rm -rf "$LOGS"/dp_*
"$KILN" $TRAIN --output "$LOGS/dp_one" > "$LOGS/dp_one.log" 2>&1 || status=1
for z in 0 1 2; do
  mpirun -np 2 "$KILN" $TRAIN --zero $z --output "$LOGS/dp_two_$z" > "$LOGS/dp_two_$z.log" 2>&1 || { status=1; tail -5 "$LOGS/dp_two_$z.log"; }
done
mpirun -np 2 "$KILN" $TRAIN --zero 1 --save-every 3 --output "$LOGS/dp_cut" > "$LOGS/dp_cut.log" 2>&1 || status=1
"$KILN" $TRAIN --resume "$LOGS/dp_cut/checkpoint-3" --output "$LOGS/dp_resumed" > "$LOGS/dp_resumed.log" 2>&1 || status=1
python3 - "$LOGS" > "$OUT/two_gpu_equality.txt" <<'PY' || status=1
import json, sys
logs = sys.argv[1]
def losses(d):
    try:
        return [json.loads(l)["loss"] for l in open(f"{logs}/{d}/metrics.jsonl") if '"loss"' in l]
    except OSError:
        return []
ok, one = True, losses("dp_one")
for z in (0, 1, 2):
    two = losses(f"dp_two_{z}")
    worst = max((abs(a - b) / abs(a) for a, b in zip(one, two)), default=float("nan"))
    good = len(two) == len(one) == 6 and worst <= 2e-3
    ok &= good
    print(f"--zero {z}: 2 GPUs against 1, worst loss difference {worst:.2e} relative ({'ok' if good else 'FAILED'})")
cut, resumed = losses("dp_cut"), losses("dp_resumed")
worst = max((abs(a - b) / abs(a) for a, b in zip(cut[3:], resumed)), default=float("nan"))
good = len(resumed) == 3 and worst <= 2e-3
ok &= good
print(f"2-rank --zero 1 checkpoint resumed on 1 rank: steps 4-6 within {worst:.2e} of the 2-rank run ({'ok' if good else 'FAILED'})")
sys.exit(0 if ok else 1)
PY
cat "$OUT/two_gpu_equality.txt"

# 2. Training throughput and memory per GPU.
CFG=bench/configs/llama-1b-shape.config.json
rm -f "$OUT/bench_train_two_gpu.json"
timeout 300 "$BUILD/bin/bench_train" --config $CFG --batch 8x2048 >> "$OUT/bench_train_two_gpu.json" 2>> "$LOGS/bench_train.err" || status=1
for z in 0 1 2; do
  timeout 300 mpirun -np 2 "$BUILD/bin/bench_train" --config $CFG --batch 8x2048 --collectives nccl --zero $z \
    >> "$OUT/bench_train_two_gpu.json" 2>> "$LOGS/bench_train.err" || { status=1; tail -3 "$LOGS/bench_train.err"; }
done
python3 - "$OUT/bench_train_two_gpu.json" <<'PY'
import json, sys
text, dec, i, runs = open(sys.argv[1]).read(), json.JSONDecoder(), 0, []
while i < len(text):
    while i < len(text) and text[i].isspace(): i += 1
    if i >= len(text): break
    r, i = dec.raw_decode(text, i); runs.append(r["train"])
base = next((t for t in runs if t.get("ranks", 1) == 1), None)
for t in runs:
    scale = t["tok_s"] / base["tok_s"] if base and "tok_s" in t else float("nan")
    print(f"ranks {t.get('ranks', 1)} {t['collectives']} zero {t['zero']}: {t.get('tok_s', 0):.0f} tok/s ({scale:.2f}x one GPU), "
          f"resident {t['resident_bytes_before_steps'] / 1e9:.2f} GB, peak {t['peak_mem_gb']:.2f} GB per GPU {t.get('error', '')}")
PY

# 3. RL with the engine on its own GPU, beside the loop in one process.
RL_ARGS="--config $CFG --steps 4 --group-size 8 --prompts-per-step 8 --prompt-len 256 --max-tokens 128"
timeout 300 "$BUILD/bin/bench_rl" $RL_ARGS --device cuda:0 --work /tmp/kiln-rl-local > "$OUT/bench_rl_local.json" 2> "$LOGS/bench_rl_local.err" || status=1
timeout 300 mpirun -np 2 "$BUILD/bin/bench_rl" $RL_ARGS --device cuda --remote --weight-transport nccl --work /tmp/kiln-rl-remote \
  > "$OUT/bench_rl_remote.json" 2> "$LOGS/bench_rl_remote.err" || { status=1; tail -3 "$LOGS/bench_rl_remote.err"; }
python3 -c 'import json, sys
for f in sys.argv[1:]:
    try: r = json.load(open(f))
    except Exception as e: print(f, "unreadable:", e); continue
    print("engine", "on GPU 1" if r["remote_engine"] else "in-process", {k: round(v, 4) if isinstance(v, float) else v for k, v in r["grpo"].items()})' \
  "$OUT/bench_rl_local.json" "$OUT/bench_rl_remote.json"
python3 - > "$LOGS/rl_prompts.jsonl" <<'PY'
import json
for i in range(8):
    print(json.dumps({"messages": [{"role": "user", "content": f"What is {i}+1?"}], "answer": i + 1}))
PY
RL="rl --model testdata/tiny-chat --prompts $LOGS/rl_prompts.jsonl --device cuda --steps 4 --group-size 4
  --prompts-per-step 2 --max-tokens 12 --reward.kind regex --reward.pattern ."
rm -rf "$LOGS"/rl_one* "$LOGS"/rl_two*
timeout 300 "$KILN" $RL --output "$LOGS/rl_one" --dump-rollouts "$LOGS/rl_one.rollouts.jsonl" > "$LOGS/rl_one.log" 2>&1 || status=1
timeout 300 mpirun -np 2 "$KILN" $RL --output "$LOGS/rl_two" --dump-rollouts "$LOGS/rl_two.rollouts.jsonl" \
  --engines 1 --weight-transport nccl > "$LOGS/rl_two.log" 2>&1 || status=1
grep -E "engine on rank|done after|error" "$LOGS/rl_two.log" | head -5
if cmp -s "$LOGS/rl_one.rollouts.jsonl" "$LOGS/rl_two.rollouts.jsonl"; then
  echo "kiln rl: the rollouts with the engine on GPU 1 equal those of the run in one process"
else
  echo "kiln rl: the rollouts with the engine on GPU 1 differ from those of the run in one process"
fi

# 4. The reference: PyTorch's training figure on one GPU.
if [ -f .carry/hf_bench.py ]; then
  PYTHONUNBUFFERED=1 timeout 400 python3 .carry/hf_bench.py --config $CFG --skip static --contexts 1024 \
    --out "$OUT/hf_bench_train.json" > "$LOGS/hf_bench_train.log" 2>&1 || status=1
  cat "$OUT/hf_bench_train.json"
fi
exit $status
