#!/usr/bin/env python3
"""Time from start to first token, cold (page cache dropped) and warm: mollm and llama.cpp.

Protocol: per model and engine, --rounds times alternating the engines: `sync`, drop the page
cache (`/proc/sys/vm/drop_caches`, needs root; without it the script says so and stops), then
the wall time of one process that loads the model, reads a 1-token prompt and prints one token:
`mollm run -m M -p Hello -n 1 -t T` and llama.cpp's `llama-simple -m M -n 1 Hello` (its
smallest complete program; `-t` is not an option there, it uses its default threads). Then the
same once more without dropping the cache (warm). Medians of the rounds, in seconds.

Usage: scripts/cold_start.py --model A.gguf [--model B.gguf ...] [--rounds 3] [--threads 2]
       [--llama-simple PATH]
mollm is target/release/mollm (or $CARGO_TARGET_DIR/release/mollm); llama-simple is
--llama-simple, then PATH, then ~/.cache/mollm/llama.cpp-build/bin/llama-simple.
"""
import argparse, os, shutil, statistics, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mollm_exe():
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
    return os.path.join(target, "release", "mollm")


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def timed(cmd):
    t = time.monotonic()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    dt = time.monotonic() - t
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr[-500:]}")
    return dt


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", action="append", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--llama-simple")
    a = p.parse_args()
    try:
        drop_caches()
    except OSError as e:
        sys.exit(f"cannot drop the page cache ({e}): run as root for cold-start times")
    simple = a.llama_simple or shutil.which("llama-simple") or os.path.expanduser(
        "~/.cache/mollm/llama.cpp-build/bin/llama-simple")
    engines = [("mollm", lambda m: [mollm_exe(), "run", "-m", m, "-p", "Hello", "-n", "1",
                                    "-t", str(a.threads)])]
    if os.path.exists(simple):
        engines.append(("llama.cpp", lambda m: [simple, "-m", m, "-n", "1", "Hello"]))
    else:
        print(f"llama-simple not found ({simple}): mollm only")
    print(f"start to first token, {a.rounds} rounds, medians in seconds; cold = page cache dropped")
    print()
    print("| model | size MB | engine | cold s | warm s |")
    print("|---|---:|---|---:|---:|")
    for m in a.model:
        cold = {e: [] for e, _ in engines}
        warm = {e: [] for e, _ in engines}
        for _ in range(a.rounds):
            for name, cmd in engines:
                drop_caches()
                cold[name].append(timed(cmd(m)))
                warm[name].append(timed(cmd(m)))
        size = os.path.getsize(m) / 1e6
        for name, _ in engines:
            print(f"| {os.path.basename(m)} | {size:.0f} | {name} | "
                  f"{statistics.median(cold[name]):.2f} | {statistics.median(warm[name]):.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
