# Sums kernel durations from an Nsight Compute CSV (ncu --metrics gpu__time_duration.sum[,dram__bytes_read.sum,
# dram__bytes_write.sum] --csv) by kernel name and prints the largest, divided by --steps: where a step's
# time goes, and with the DRAM metrics each kernel's achieved bandwidth (bytes moved / its duration).
# Usage: python3 scripts/ncu_summary.py FILE.csv [--steps N] [--top K]
import argparse, csv, collections
p = argparse.ArgumentParser(); p.add_argument("csv"); p.add_argument("--steps", type=float, default=1)
p.add_argument("--top", type=int, default=25); a = p.parse_args()
total = collections.Counter(); count = collections.Counter(); dram = collections.Counter()
TIME = {"ns": 1e-6, "us": 1e-3, "usecond": 1e-3, "msecond": 1, "ms": 1, "nsecond": 1e-6}
BYTES = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}
with open(a.csv) as f:
    lines = [l for l in f if l.startswith('"')]
has_dram = False
for row in csv.DictReader(lines):
    metric = row.get("Metric Name"); name = row["Kernel Name"][:90]
    v = float(row["Metric Value"].replace(",", "")); unit = row.get("Metric Unit", "")
    if metric == "gpu__time_duration.sum":
        total[name] += v * TIME.get(unit, 1e-6); count[name] += 1
    elif metric in ("dram__bytes_read.sum", "dram__bytes_write.sum"):
        dram[name] += v * BYTES.get(unit, 1); has_dram = True
all_ms = sum(total.values()) / a.steps
line = f"total kernel time per step: {all_ms:.3f} ms over {sum(count.values()) / a.steps:.0f} launches"
if has_dram: line += f", {sum(dram.values()) / a.steps / 1e9:.3f} GB of DRAM traffic"
print(line)
for name, ms in total.most_common(a.top):
    bw = f" {dram[name] / (ms * 1e-3) / 1e12:5.2f} TB/s {dram[name] / a.steps / 1e6:8.2f} MB" if has_dram and ms > 0 else ""
    print(f"{ms / a.steps:9.4f} ms {count[name] / a.steps:6.0f}x{bw}  {name}")
