# Shared by scripts/test and scripts/demo: the pinned Paddle/numpy pairs, and a function that
# creates or updates a virtualenv and installs into it.
PADDLE3="paddlepaddle==3.3.1"; NUMPY3="numpy>=2.4,<2.5"    # newest Paddle, newest numpy it was measured with
PADDLE26="paddlepaddle==2.6.2"; NUMPY26="numpy<2"          # Paddle 2.6 wheels are built against numpy 1.x

# usage: ensure_venv DIR PIP_ARGS...
ensure_venv() {
  local dir=$1; shift
  local py=${PYTHON:-python3}
  if [ ! -x "$dir/bin/python" ]; then
    echo "== creating $dir ($($py --version 2>&1))"
    "$py" -m venv "$dir"
  fi
  echo "== installing into $dir: $*"
  # pip's notes about absent local mirrors are noise here; errors still fail the step
  "$dir/bin/python" -m pip install --disable-pip-version-check -q --upgrade pip 2>&1 | grep -v "is ignored: it is neither" || true
  local log; log=$(mktemp)
  if ! "$dir/bin/python" -m pip install --disable-pip-version-check -q "$@" >"$log" 2>&1; then
    grep -v "is ignored: it is neither" "$log" >&2; rm -f "$log"; return 1
  fi
  rm -f "$log"
}
