# Sums kernel durations from an Nsight Compute CSV (ncu --metrics gpu__time_duration.sum --csv) by
# kernel name and prints the largest, divided by --steps: where a training step's time goes.
# Usage: python3 scripts/ncu_summary.py FILE.csv [--steps N] [--top K]
import argparse, csv, collections
p = argparse.ArgumentParser(); p.add_argument("csv"); p.add_argument("--steps", type=float, default=1)
p.add_argument("--top", type=int, default=25); a = p.parse_args()
total = collections.Counter(); count = collections.Counter()
with open(a.csv) as f:
    lines = [l for l in f if l.startswith('"')]
for row in csv.DictReader(lines):
    if row.get("Metric Name") != "gpu__time_duration.sum": continue
    name = row["Kernel Name"][:90]; v = float(row["Metric Value"].replace(",", ""))
    unit = row.get("Metric Unit", "ns"); v *= {"ns": 1e-6, "us": 1e-3, "usecond": 1e-3, "msecond": 1, "ms": 1, "nsecond": 1e-6}.get(unit, 1e-6)
    total[name] += v; count[name] += 1
all_ms = sum(total.values()) / a.steps
print(f"total kernel time per step: {all_ms:.1f} ms over {sum(count.values()) / a.steps:.0f} launches")
for name, ms in total.most_common(a.top):
    print(f"{ms / a.steps:9.2f} ms {count[name] / a.steps:6.0f}x  {name}")
