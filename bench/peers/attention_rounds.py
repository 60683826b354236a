#!/usr/bin/env python3
"""splice's flash decode against its peers over alternating rounds at a few shapes.

A single run of the splice bench followed by a single run of the peers compares two processes
minutes apart; at points where the two sit within a fraction of a percent (issue 5's one-wave
256-unit grids), the card's drift between them decides the sign. This script reads R rounds of
both (the rounds alternate which process goes first: scripts/lib/attention_rounds.sh, run by
scripts/gpu-check at its table's misses and by dev/refresh_call.sh's `rounds` phase) and prints,
per shape, every round's splice time and best-peer time, the medians, the ratio of the medians
(> 1: splice faster) and each side's spread over the rounds, then a verdict:
  ahead   the ratio of medians >= 1
  level   behind, by less than the larger of the two sides' spreads (the method's noise: "a
          difference between versions smaller than the spread of one version is noise")
  behind  behind by more than that spread

Usage: attention_rounds.py --splice S1.json,S2.json,... --peers P1.json,P2.json,... [--json OUT]
  S*.json: flash_decode_cuda_bench --json output (rows: batch, num_qo_heads, num_kv_heads, k_len,
           head_dim, us); P*.json: attention_peers.py --json output (rows: the same keys and
           cudnn_us, flash_us, flashinfer_us).
       attention_rounds.py --misses COMBINED.json [--within PCT]
  prints the shapes of attention_peers.py's combined table where splice is behind the best peer,
  as 'B,Hq,Hkv,k_len,D;...' (empty when there are none): the shapes to run the rounds at. With
  --within, also those ahead by less than PCT percent (the points one pass cannot call: a
  one-pass table's 0.3% lead flipped with the card in runs 245-246).
"""
import argparse
import json
import statistics
import sys

PEERS = ("cudnn", "flash", "flashinfer")


def key_of(row):
    return (row["batch"], row["num_qo_heads"], row["num_kv_heads"], row["k_len"],
            row.get("head_dim", 128))


def load_rows(path):
    with open(path) as f:
        return {key_of(r): r for r in json.load(f)["rows"]}


def spread_pct(times):
    return 100.0 * (max(times) - min(times)) / statistics.median(times)


def summarize(splice_paths, peer_paths):
    """Per shape: {shape, splice_us[], peer_us[], peer_names[], medians, ratio, spreads, verdict}."""
    splice_rounds = [load_rows(p) for p in splice_paths]
    peer_rounds = [load_rows(p) for p in peer_paths]
    shapes = sorted(set.intersection(*(set(r) for r in splice_rounds + peer_rounds)),
                    key=lambda k: (k[0] * k[2] * k[3], k))
    out = []
    for shape in shapes:
        splice_us = [r[shape]["us"] for r in splice_rounds]
        peer_us, peer_names = [], []
        for rounds in peer_rounds:
            times = {name: rounds[shape].get(name + "_us") for name in PEERS}
            times = {name: t for name, t in times.items() if t is not None}
            if not times:
                break
            best = min(times, key=times.get)
            peer_us.append(times[best])
            peer_names.append(best)
        if len(peer_us) != len(peer_rounds):
            continue  # a round with no peer time at this shape: no verdict
        splice_median = statistics.median(splice_us)
        peer_median = statistics.median(peer_us)
        ratio = peer_median / splice_median
        noise = max(spread_pct(splice_us), spread_pct(peer_us))
        behind_pct = 100.0 * (1.0 - ratio)
        verdict = "ahead" if ratio >= 1.0 else ("level" if behind_pct < noise else "behind")
        out.append({"shape": shape, "splice_us": splice_us, "peer_us": peer_us,
                    "peer_names": peer_names, "splice_median_us": splice_median,
                    "peer_median_us": peer_median, "ratio": ratio,
                    "splice_spread_pct": spread_pct(splice_us),
                    "peer_spread_pct": spread_pct(peer_us), "verdict": verdict})
    return out


def table(rows):
    lines = ["%-20s %-32s %-32s %7s %13s %s" % (
        "B,Hq,Hkv,k_len,D", "splice us (rounds) median", "best peer us (rounds) median", "ratio",
        "spread s / p", "verdict")]
    for r in rows:
        names = sorted(set(r["peer_names"]))
        lines.append("%-20s %-32s %-32s %7.4f %5.2f / %5.2f%% %s" % (
            ",".join(str(x) for x in r["shape"]),
            " ".join("%.2f" % t for t in r["splice_us"]) + " | %.2f" % r["splice_median_us"],
            " ".join("%.2f" % t for t in r["peer_us"]) + " | %.2f" % r["peer_median_us"],
            r["ratio"], r["splice_spread_pct"], r["peer_spread_pct"],
            r["verdict"] + " (" + "/".join(names) + ")"))
    return "\n".join(lines)


def misses(combined_path, within_pct=0.0):
    """'B,Hq,Hkv,k_len,D;...' of the combined table's rows with splice behind the best peer, or
    ahead of it by less than within_pct percent."""
    with open(combined_path) as f:
        rows = json.load(f)["rows"]
    bound = 1.0 + within_pct / 100.0
    close = [r for r in rows if r.get("ratio_best_peer_over_splice") is not None
             and r["ratio_best_peer_over_splice"] < bound]
    return ";".join(",".join(str(x) for x in key_of(r)) for r in close)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--splice", help="comma-separated splice bench JSONs")
    parser.add_argument("--peers", help="comma-separated attention_peers JSONs")
    parser.add_argument("--json", help="write the summary here")
    parser.add_argument("--misses", help="a combined table JSON: print the shapes behind, and stop")
    parser.add_argument("--within", type=float, default=0.0,
                        help="with --misses: also the shapes ahead by less than this many percent")
    args = parser.parse_args()
    if args.misses:
        print(misses(args.misses, args.within))
        return 0
    if not args.splice or not args.peers:
        parser.error("--splice and --peers are required (or --misses)")
    splice_paths = [p for p in args.splice.split(",") if p]
    peer_paths = [p for p in args.peers.split(",") if p]
    if not splice_paths or len(splice_paths) != len(peer_paths):
        print("attention_rounds: need as many splice JSONs as peer JSONs (%d, %d)" % (
            len(splice_paths), len(peer_paths)), file=sys.stderr)
        return 2
    rows = summarize(splice_paths, peer_paths)
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{**r, "shape": list(r["shape"])} for r in rows], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
