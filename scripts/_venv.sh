# Shared by scripts/test and scripts/demo: create or update a virtualenv and install into it.
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
