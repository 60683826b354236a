#!/usr/bin/env python3
"""bench/peers/attention_rounds.py's verdicts on rounds with known times (no GPU needed).

Writes R rounds of splice-bench and peer JSON for shapes whose times are chosen to land in each
verdict (ahead, level within the rounds' spread, behind beyond it), plus a shape a peer round
lacks and a round whose best peer is not cuDNN, runs the script as a process and checks its JSON
summary; then checks --misses (and --within) on a combined table. Exit 0 when every check holds, 1 otherwise.
"""
import json
import os
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "peers",
                      "attention_rounds.py")

# shape -> (splice us per round, per-round peer times {name: us or None})
AHEAD = (1, 32, 8, 1024, 128)
LEVEL = (32, 32, 8, 16384, 128)
BEHIND = (8, 32, 32, 65536, 128)
FLASH_BEST = (128, 64, 8, 4096, 128)
MISSING = (32, 64, 8, 65536, 128)
CASES = {
    # median 101 against the best peer's 103: ahead
    AHEAD: ([100.0, 101.0, 102.0], [{"cudnn_us": 103.0}, {"cudnn_us": 102.0}, {"cudnn_us": 104.0}]),
    # splice's own rounds spread 1% (100.0 .. 101.0); behind by 0.2% (100.5 against 100.3): level
    LEVEL: ([100.0, 100.5, 101.0], [{"cudnn_us": 100.2}, {"cudnn_us": 100.4}, {"cudnn_us": 100.3}]),
    # each side within 0.1%, behind by ~1%: behind
    BEHIND: ([100.0, 100.1, 100.05], [{"cudnn_us": 99.0}, {"cudnn_us": 99.05}, {"cudnn_us": 99.1}]),
    # cuDNN absent in round 2 and slower elsewhere: the best peer is FA2 in every round
    FLASH_BEST: ([50.0, 50.0, 50.0], [{"cudnn_us": 60.0, "flash_us": 55.0},
                                      {"cudnn_us": None, "flash_us": 54.0},
                                      {"cudnn_us": 61.0, "flash_us": 56.0}]),
    # no peer time at all in round 3: no verdict
    MISSING: ([10.0, 10.0, 10.0], [{"cudnn_us": 11.0}, {"cudnn_us": 11.0}, {"cudnn_us": None}]),
}


def row_of(shape, **times):
    b, hq, hkv, n, d = shape
    return {"batch": b, "num_qo_heads": hq, "num_kv_heads": hkv, "k_len": n, "head_dim": d,
            **times}


def main():
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        splice_paths, peer_paths = [], []
        for r in range(3):
            splice = [row_of(s, us=times[r]) for s, (times, _) in CASES.items()]
            peers = [row_of(s, **peer[r]) for s, (_, peer) in CASES.items()]
            splice_paths.append(os.path.join(tmp, "s%d.json" % r))
            peer_paths.append(os.path.join(tmp, "p%d.json" % r))
            with open(splice_paths[-1], "w") as f:
                json.dump({"rows": splice}, f)
            with open(peer_paths[-1], "w") as f:
                json.dump({"info": {}, "rows": peers}, f)
        summary_path = os.path.join(tmp, "rounds.json")
        run = subprocess.run([sys.executable, SCRIPT, "--splice", ",".join(splice_paths),
                              "--peers", ",".join(peer_paths), "--json", summary_path],
                             capture_output=True, text=True)
        check(run.returncode == 0, "rounds run exit %d: %s" % (run.returncode, run.stderr))
        with open(summary_path) as f:
            by_shape = {tuple(r["shape"]): r for r in json.load(f)}
        check(set(by_shape) == {AHEAD, LEVEL, BEHIND, FLASH_BEST},
              "verdict shapes %s (the one missing a peer round must have none)" % sorted(by_shape))
        expected = {AHEAD: "ahead", LEVEL: "level", BEHIND: "behind", FLASH_BEST: "ahead"}
        for shape, verdict in expected.items():
            got = by_shape.get(shape, {}).get("verdict")
            check(got == verdict, "%s: verdict %s, expected %s" % (shape, got, verdict))
        level = by_shape.get(LEVEL, {})
        check(abs(level.get("ratio", 0) - 100.3 / 100.5) < 1e-9, "level ratio %s" % level.get("ratio"))
        check(abs(level.get("splice_spread_pct", 0) - 100.0 / 100.5) < 1e-9,
              "level splice spread %s" % level.get("splice_spread_pct"))
        flash = by_shape.get(FLASH_BEST, {})
        check(flash.get("peer_names") == ["flash"] * 3 and flash.get("peer_us") == [55.0, 54.0, 56.0],
              "best peer per round: %s %s" % (flash.get("peer_names"), flash.get("peer_us")))
        check("behind (cudnn)" in run.stdout and "level (cudnn)" in run.stdout,
              "table verdicts: %s" % run.stdout)

        combined = os.path.join(tmp, "combined.json")
        with open(combined, "w") as f:
            json.dump({"rows": [row_of(LEVEL, ratio_best_peer_over_splice=0.991),
                                row_of(AHEAD, ratio_best_peer_over_splice=1.8),
                                row_of(BEHIND, ratio_best_peer_over_splice=0.9986),
                                row_of(MISSING, ratio_best_peer_over_splice=None),
                                row_of(FLASH_BEST, ratio_best_peer_over_splice=1.0)]}, f)
        run = subprocess.run([sys.executable, SCRIPT, "--misses", combined], capture_output=True,
                             text=True)
        check(run.returncode == 0 and run.stdout.strip() == "32,32,8,16384,128;8,32,32,65536,128",
              "--misses printed %r" % run.stdout)
        # --within 0.5: also FLASH_BEST (level: 1.0) but not AHEAD (1.8).
        run = subprocess.run([sys.executable, SCRIPT, "--misses", combined, "--within", "0.5"],
                             capture_output=True, text=True)
        check(run.returncode == 0 and run.stdout.strip() ==
              "32,32,8,16384,128;8,32,32,65536,128;128,64,8,4096,128",
              "--misses --within 0.5 printed %r" % run.stdout)
        run = subprocess.run([sys.executable, SCRIPT, "--splice", splice_paths[0]],
                             capture_output=True, text=True)
        check(run.returncode != 0, "--splice without --peers was accepted")

    for failure in failures:
        print("FAIL:", failure)
    print("attention_rounds: %d checks failed" % len(failures) if failures else "attention_rounds: ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
