# Sourced by the device recipes that run nox sessions (the GPU machine has no package index):
#   nox_wheels WHO MODULE...   imports MODULE... or installs the wheels of $NOX_WHEELS (default
#   .whl/nox: nox, its dependencies, pytest-split) into /tmp/nox-site and puts it on PYTHONPATH;
#   returns 1 with one line naming WHO when neither works.
nox_wheels() {
  local who=$1; shift
  local imports; imports=$(IFS=,; echo "$*")
  python -c "import $imports" 2>/dev/null && return 0
  python -m pip install -q --no-index --no-deps --no-compile --target /tmp/nox-site "${NOX_WHEELS:-.whl/nox}"/*.whl \
    || { echo "$who: $* not installed and no wheels in ${NOX_WHEELS:-.whl/nox}"; return 1; }
  export PYTHONPATH=/tmp/nox-site${PYTHONPATH:+:$PYTHONPATH}
}
