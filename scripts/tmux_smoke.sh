#!/usr/bin/env bash
# Smoke test of `localspec chat` in a real terminal (tmux): start it, wait for the models, send a message,
# wait for the whole answer, turn on draft-token colours, capture the screen, quit. Also makes the text
# capture of docs/usage.md (the .ansi capture keeps the colours; the .txt one is plain).
#
# Usage: scripts/tmux_smoke.sh [CHAT FLAGS...]      e.g.  scripts/tmux_smoke.sh --pair demo
# Env:   MESSAGE (what to send), OUT (capture folder, default ./smoke-out), WIDTH/HEIGHT (120x36),
#        TIMEOUT (seconds per wait, 180), LOCALSPEC (the command, default: the repo's venv or PATH;
#        several words are fine, e.g. "python -m localspec").
#        Set LOCALSPEC_HOME to a scratch folder to keep the test chat out of your saved chats.
# Exit status: 0 when the answer streamed and the app quit cleanly; 1 otherwise (the screen is printed).
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
if [[ -z "${LOCALSPEC:-}" ]]; then
  if [[ -x "$here/.venv/bin/localspec" ]]; then LOCALSPEC="$here/.venv/bin/localspec"; else LOCALSPEC=localspec; fi
fi
MESSAGE="${MESSAGE:-Hi! In two sentences, what is speculative decoding?}"
OUT="${OUT:-$PWD/smoke-out}"
WIDTH="${WIDTH:-120}"
HEIGHT="${HEIGHT:-36}"
TIMEOUT="${TIMEOUT:-180}"
session="localspec-smoke-$$"

command -v tmux >/dev/null || { echo "tmux is not installed (apt-get install tmux / brew install tmux)" >&2; exit 1; }
mkdir -p "$OUT"

screen() { tmux capture-pane -t "$session" -p "$@"; }

cleanup() { tmux kill-session -t "$session" 2>/dev/null || true; }
trap cleanup EXIT

fail() {
  echo "FAIL: $1" >&2
  screen > "$OUT/failed.txt" 2>/dev/null && cat "$OUT/failed.txt" >&2
  exit 1
}

# wait_for PATTERN WHAT: poll the screen until PATTERN (grep -E) shows up.
wait_for() {
  local deadline=$((SECONDS + TIMEOUT))
  until screen | grep -Eq "$1"; do
    (( SECONDS < deadline )) || fail "no '$2' on screen after ${TIMEOUT}s"
    tmux has-session -t "$session" 2>/dev/null || fail "the app exited while waiting for '$2'"
    sleep 0.5
  done
}

read -ra launcher <<< "$LOCALSPEC"  # may be several words, e.g. "python -m localspec"
command -v "${launcher[0]}" >/dev/null || { echo "cannot run '${launcher[0]}': install localspec or set LOCALSPEC" >&2; exit 1; }
cmd=$(printf '%q ' "${launcher[@]}" chat "$@")
tmux new-session -d -s "$session" -x "$WIDTH" -y "$HEIGHT" \
  "TERM=xterm-256color COLORTERM=truecolor $cmd; echo \"localspec exited with \$?\"; sleep 30"

wait_for 'ready ·' "ready (models loaded)"
screen > "$OUT/loaded.txt"

tmux send-keys -t "$session" -l "$MESSAGE"
tmux send-keys -t "$session" Enter
wait_for 'generating|assistant' "the answer starting"
wait_for 'assistant · ' "the end of the answer"
wait_for 'ready ·' "ready again"
screen > "$OUT/answer.txt"
screen -e > "$OUT/answer.ansi"

tmux send-keys -t "$session" C-t
sleep 1
screen > "$OUT/draft-colours.txt"
screen -e > "$OUT/draft-colours.ansi"
grep -q 'draft token' "$OUT/draft-colours.txt" || fail "draft-token colours did not turn on"
grep -q 'acceptance' "$OUT/answer.txt" || fail "no acceptance in the stats panel"
grep -q 'tok/s' "$OUT/answer.txt" || fail "no tok/s in the stats panel"

tmux send-keys -t "$session" C-q
wait_for 'localspec exited with' "the app to quit"
status=$(screen | grep -Eo 'localspec exited with [0-9]+' | grep -Eo '[0-9]+$')
[[ "$status" == 0 ]] || fail "localspec exited with status $status"
screen | grep -q 'Traceback' && fail "a traceback was printed"

cat "$OUT/answer.txt"
echo "OK: captures in $OUT (answer.txt/.ansi, draft-colours.txt/.ansi, loaded.txt)"
