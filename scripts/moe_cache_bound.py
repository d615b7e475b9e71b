#!/usr/bin/env python3
"""How many expert reads a decode needs at best: a route trace replayed against Belady's MIN.

MIN (evict the entry whose next use is farthest away) reads the fewest experts any cache of
that many slots can read on that sequence of routes, with or without prefetching (a prefetch
is a read made earlier; it can only add reads). So for a cache of S slots it gives the highest
hit rate, and the fewest bytes read per token, that any eviction or prediction policy could
reach: a bound, not a policy (it needs the future). LRU is replayed beside it for scale.

The routes come from a `--trace` of mollm (`run` or `bench`): every MoE layer's span carries
the experts its step needed (`route`). The routes do not depend on the cache (greedy decode,
exact kernels), so one trace serves every cache size.

    mollm bench -m MOE.gguf -p 0 -n 64 -r 1 --warmup 1 -t 2 --trace /tmp/t.json
    scripts/moe_cache_bound.py /tmp/t.json --model MOE.gguf --pct 5,10,25,50 [--disk-gbps 1.6]

Slots per cache size: `--pct` of all routed expert bytes over one expert's bytes (gate, up
and down of one expert, the mean over the layers), with no alignment or repack room: more
slots than mollm's cache makes of those bytes (`bench --json`'s `slots`, which `--slots`
takes instead), so the bound holds for any cache of that many bytes. Hits are counted over
the decode steps after the first half of them (the first half fills the cache, as `bench`'s
warm-up run does). With `--disk-gbps`, the bytes a token
must read at least become a time a token at that read speed: a floor on decode time that no
policy beats with that cache.
"""
import argparse
import json
import sys


def load_routes(path):
    """[(layer, [experts], decode)] of every MoE layer span, in trace order."""
    with open(path) as f:
        ev = json.load(f)
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    spans = [e for e in ev if e.get("cat") == "layer" and e.get("name", "").startswith("moe L")]
    spans.sort(key=lambda e: e["ts"])
    out = []
    for e in spans:
        a = e.get("args", {})
        if "route" not in a:
            sys.exit(f"{path}: a MoE layer span without its route (a trace of an older mollm)")
        out.append((int(e["name"][len("moe L"):]), [int(x) for x in a["route"]], bool(a.get("decode"))))
    return out


def passes(routes):
    """Groups consecutive layer spans into passes (a layer at or before the previous one
    starts a new pass, as the cache counts them)."""
    ps, cur, last = [], [], None
    for layer, route, decode in routes:
        if last is not None and layer <= last:
            ps.append(cur)
            cur = []
        cur.append((layer, route, decode))
        last = layer
    if cur:
        ps.append(cur)
    return ps


def replay(seq, slots, policy, count_from):
    """Hits and misses (the missed keys) of `seq` ((layer, expert) accesses, grouped per layer
    step) through `slots` entries; only accesses from index `count_from` on are counted. A
    step's experts are pinned while it runs (the cache never evicts what the running layer
    holds)."""
    flat = [x for step in seq for x in step]
    n = len(flat)
    nxt = [0] * n  # where each access's key is used next (n + 1: never)
    seen = {}
    for i in range(n - 1, -1, -1):
        nxt[i] = seen.get(flat[i], n + 1)
        seen[flat[i]] = i
    cache = {}  # key -> next use (MIN) or last use (LRU)
    hits, misses = 0, []
    i = 0
    for step in seq:
        pinned = set(step)
        for key in step:
            counted = i >= count_from
            if key in cache:
                hits += counted
            else:
                if counted:
                    misses.append(key)
                if len(cache) >= slots:
                    cand = [k for k in cache if k not in pinned]
                    if not cand:
                        i += 1
                        continue  # the cache holds less than this step: no room kept
                    if policy == "min":
                        victim = max(cand, key=lambda k: cache[k])
                    else:
                        victim = min(cand, key=lambda k: cache[k])
                    del cache[victim]
            cache[key] = nxt[i] if policy == "min" else i
            i += 1
    return hits, misses


def expert_sizes(model):
    """(bytes of all routed experts, number of experts over all layers, bytes of one expert
    of each layer)."""
    import gguf  # PyPI gguf, as scripts/bench-moe.sh uses

    r = gguf.GGUFReader(model)
    per_layer = {}
    n_expert = None
    for t in r.tensors:
        if "_exps." not in t.name:
            continue
        layer = int(t.name.split(".")[1])
        n_expert = int(t.shape[-1])
        per_layer.setdefault(layer, []).append(int(t.n_bytes) // n_expert)
    total = sum(sum(v) * n_expert for v in per_layer.values())
    return total, n_expert * len(per_layer), {l: sum(v) for l, v in per_layer.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--model", help="the MoE GGUF (the experts' bytes, per layer)")
    ap.add_argument("--pct", default="5,10,25,50", help="cache sizes, percent of the routed expert bytes")
    ap.add_argument("--slots", help="cache sizes in slots instead of --pct")
    ap.add_argument("--disk-gbps", type=float, help="read speed for the time floor, GB/s")
    a = ap.parse_args()
    routes = load_routes(a.trace)
    dec = [p for p in passes(routes) if all(d for _, _, d in p)]
    if len(dec) < 4:
        sys.exit(f"{a.trace}: {len(dec)} decode passes; trace a longer decode")
    seq = [[(layer, x) for x in route] for p in dec for layer, route, _ in p]
    per_pass = [sum(len(r) for _, r, _ in p) for p in dec]
    half = len(dec) // 2
    count_from = sum(per_pass[:half])
    measured = len(dec) - half
    uses = sum(per_pass[half:])
    total = n_all = layer_bytes = None
    if a.model:
        total, n_all, layer_bytes = expert_sizes(a.model)
    if a.slots:
        sizes = [(f"{s} slots", int(s)) for s in a.slots.split(",")]
    else:
        if not a.model:
            sys.exit("--pct needs --model (or give --slots)")
        sizes = [(f"{p}%", int(float(p) / 100 * n_all)) for p in a.pct.split(",")]
    print(f"{a.trace}: {len(dec)} decode passes, counted over the last {measured} "
          f"({uses} expert uses, {uses / measured:.1f} a token)")
    if a.model:
        print(f"{a.model}: {n_all} routed experts, {total / 2**20:.0f} MiB, {total / n_all / 2**20:.2f} MiB each")
    head = "| cache | slots | MIN hit rate | LRU hit rate | MIN reads / token |"
    if layer_bytes:
        head += " MIN MB / token |"
    if layer_bytes and a.disk_gbps:
        head += f" floor s / token at {a.disk_gbps} GB/s | ceiling tokens/s |"
    print()
    print(head)
    print("|" + " --- |" * (head.count("|") - 1))
    for label, s in sizes:
        hm, missed = replay(seq, s, "min", count_from)
        hl, lru_missed = replay(seq, s, "lru", count_from)
        mm, ml = len(missed), len(lru_missed)
        line = f"| {label} | {s} | {100 * hm / (hm + mm):.1f}% | {100 * hl / (hl + ml):.1f}% | {mm / measured:.1f} |"
        if layer_bytes:
            mb = sum(layer_bytes[layer] for layer, _ in missed) / measured / 1e6
            line += f" {mb:.0f} |"
            if a.disk_gbps:
                t = mb / 1e3 / a.disk_gbps
                line += f" {t:.3f} | {1 / t:.2f} |" if t > 0 else " 0 | - |"
        print(line)


if __name__ == "__main__":
    main()
