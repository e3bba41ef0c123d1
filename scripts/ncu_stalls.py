# Where one kernel's warps wait, by instruction: reads Nsight Compute's source page of a report
# (ncu -i REPORT --page source --csv --print-source sass > FILE.csv; the report made with --set full
# or --section SourceCounters) and prints the stall reasons summed over the kernel, then the
# instructions with the most warp-state samples, each with its two largest reasons and how often it
# ran. Usage: python3 scripts/ncu_stalls.py FILE.csv [--top K]
import argparse, csv

p = argparse.ArgumentParser()
p.add_argument("csv")
p.add_argument("--top", type=int, default=30)
a = p.parse_args()
with open(a.csv) as f:
    rows = [r for r in csv.reader(f)]
head = next(i for i, r in enumerate(rows) if r and r[0] == "Address")  # a kernel-name line comes first
hdr, data = rows[head], [r for r in rows[head + 1:] if len(r) == len(rows[head])]
col = {h: i for i, h in enumerate(hdr)}
reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
samples = col["Warp Stall Sampling (All Samples)"]
count = lambda r, c: int(r[c] or 0) if r[c].strip().lstrip("-").isdigit() else 0
total = sum(count(r, samples) for r in data)
print(f"{total} warp-state samples over {len(data)} instructions")
by_reason = sorted(((sum(count(r, col[s]) for r in data), s[6:]) for s in reasons), reverse=True)
print("by reason: " + ", ".join(f"{s} {n / max(total, 1):.0%}" for n, s in by_reason if n > 0))
for r in sorted(data, key=lambda r: -count(r, samples))[: a.top]:
    n = count(r, samples)
    if n == 0:
        break
    top2 = sorted(((count(r, col[s]), s[6:]) for s in reasons), reverse=True)[:2]
    why = ", ".join(f"{s} {k}" for k, s in top2 if k > 0)
    print(f"{n:6d} {n / total:5.1%} {r[0][-6:]} {r[1].strip()[:64]:64s} ran {r[col['Instructions Executed']]:>7s}  {why}")
