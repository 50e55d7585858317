# Sourced by the device scripts (run from the repository root of a copy of the tree): makes
# `import replayssm` (with replayssm.validators / replayssm.scenarios) work on a machine that cannot
# fetch anything -- an editable install without dependencies when pip can, else the two package
# directories linked into replayssm/ -- and puts the tree on PYTHONPATH (scripts import each other).
pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
python -c "import replayssm.validators.runner" 2>/dev/null || {
  ln -sfn ../validators replayssm/validators; ln -sfn ../scenarios replayssm/scenarios; }
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
