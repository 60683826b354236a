# Sourced by scripts/gpu-check and dev/refresh_call.sh: splice's flash-decode bench and the
# attention peers (bench/peers/attention_peers.py) timed in alternating processes at a few shapes,
# then bench/peers/attention_rounds.py's verdict per shape (ahead / level within the rounds'
# spread / behind). For the grid points where one pass of each finds the two within a fraction of
# a percent: there the card's drift between two processes minutes apart decides the sign of a
# single comparison (docs/decisions.md, session 58).
#
# attention_rounds BENCH SHAPES ROUNDS DIR
#   BENCH   the flash_decode_cuda_bench binary
#   SHAPES  'B,Hq,Hkv,k_len,D;...'
#   ROUNDS  rounds; odd rounds run splice first, even rounds the peers first
#   DIR     where each round's JSON and log go (rounds_{splice,peers}_R.{json,txt}) and the
#           summary (rounds.json); the verdict table goes to standard output
attention_rounds() {
  local bench=$1 shapes=$2 rounds=$3 dir=$4
  local here r side splice_json=() peer_json=()
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  mkdir -p "$dir"
  for r in $(seq 1 "$rounds"); do
    for side in $( ((r % 2)) && echo "splice peers" || echo "peers splice"); do
      if [[ $side == splice ]]; then
        timeout 150 "$bench" --no-variants --shapes "$shapes" --json "$dir/rounds_splice_$r.json" \
          >"$dir/rounds_splice_$r.txt" 2>&1 || echo "attention rounds: round $r, splice rc=$?"
      else
        PYTHONUNBUFFERED=1 timeout 240 python3 "$here/bench/peers/attention_peers.py" \
          --shapes "$shapes" --json "$dir/rounds_peers_$r.json" >"$dir/rounds_peers_$r.txt" 2>&1 ||
          echo "attention rounds: round $r, peers rc=$? ($(tail -1 "$dir/rounds_peers_$r.txt"))"
      fi
    done
    splice_json+=("$dir/rounds_splice_$r.json") peer_json+=("$dir/rounds_peers_$r.json")
  done
  python3 "$here/bench/peers/attention_rounds.py" --splice "$(IFS=,; echo "${splice_json[*]}")" \
    --peers "$(IFS=,; echo "${peer_json[*]}")" --json "$dir/rounds.json"
}
