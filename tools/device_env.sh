# Sourced by the device recipes, from the repository root of a copy of the working tree (the
# device machine has torch and Triton but cannot fetch anything): installs the tree as the
# `replayssm` package (editable, no dependencies, no build isolation) and checks that
# `replayssm`, `replayssm.validators` and `replayssm.scenarios` import from this tree.  The tools
# import the installed package only: nothing goes on PYTHONPATH.
python -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 \
  || python -m pip install -q --no-deps -e . >/dev/null 2>&1
python - "$PWD" <<'PY' || { echo "device_env: replayssm does not import from $PWD (pip install -e . failed?)" >&2; exit 1; }
import pathlib, sys
import replayssm, replayssm.golden, replayssm.scenarios, replayssm.validators.engine.runner
root = pathlib.Path(sys.argv[1]).resolve()
for m in (replayssm, replayssm.validators, replayssm.scenarios):
    assert pathlib.Path(m.__file__).resolve().is_relative_to(root), f"{m.__name__} from {m.__file__}, not {root}"
print("replayssm from", pathlib.Path(replayssm.__file__).parent)
PY
# A device copy's git metadata can be older than its files (the session's first commit): its records would
# then name that commit and say dirty.  Set REPLAYSSM_COMMIT to the commit the copy's files are (clean by
# the caller's word, replayssm/records/provenance.py) before running anything that writes records.
if [ -z "${REPLAYSSM_COMMIT:-}" ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null | head -1)" ]; then
  echo "device_env: the copy differs from its git HEAD $(git rev-parse --short=12 HEAD 2>/dev/null); records will say dirty unless REPLAYSSM_COMMIT names the commit of these files" >&2
fi
