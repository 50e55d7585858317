# Sourced by the device recipes once OUT is set: everything after goes to the terminal and to
# $OUT/log.txt; `stamp MSG` prints MSG with the seconds since this point; the log starts with the
# commit (REPLAYSSM_COMMIT: the device copy has no .git), the GPU and the Python, torch and Triton
# versions.
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
echo "commit ${REPLAYSSM_COMMIT:-unknown}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
