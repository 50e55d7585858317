# Sourced by the device recipes that run the adapters (the GPU machine has no package index):
#   adapter_sources LOG   installs the carried wheels of SGLang and FLA (.whl/sglang/sglang-*.whl,
#   .whl/fla_core-*.whl) into /tmp/site and puts it on PYTHONPATH, unpacks the carried mamba_ssm
#   sdist (REPLAYSSM_MAMBA_SSM_SRC) and points REPLAYSSM_VLLM_SRC at a carried .peers/vllm-replayssm;
#   each only where it was carried (carry [".whl/sglang", ".whl/fla_core-0.6.0-py3-none-any.whl",
#   ".peers/vllm-replayssm"]: 39.3 + 1.1 + 0.8 MB).  pip's output goes to LOG; returns 1 when the
#   install failed (the rest is still set up).
adapter_sources() {
  local log=$1 wheels=() rc=0
  for w in .whl/sglang/sglang-*.whl .whl/fla_core-*.whl; do [ -e "$w" ] && wheels+=("$w"); done
  if [ ${#wheels[@]} -gt 0 ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "${wheels[@]}" \
      >> "$log" 2>&1 || { echo "adapter_sources: pip install of ${wheels[*]} failed" >> "$log"; rc=1; }
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  if [ -f .whl/sglang/mamba_ssm-2.3.2.post1.tar.gz ]; then
    mkdir -p /tmp/mamba_ssm_src && tar -xzf .whl/sglang/mamba_ssm-2.3.2.post1.tar.gz -C /tmp/mamba_ssm_src \
      && export REPLAYSSM_MAMBA_SSM_SRC=/tmp/mamba_ssm_src/mamba_ssm-2.3.2.post1
  fi
  if [ -d .peers/vllm-replayssm ]; then export REPLAYSSM_VLLM_SRC=$PWD/.peers/vllm-replayssm; fi
  return $rc
}
