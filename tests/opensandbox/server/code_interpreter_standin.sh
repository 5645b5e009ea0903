#!/bin/sh
# STAND-IN for the code-interpreter image's entrypoint (upstream
# sandboxes/code-interpreter/scripts/code-interpreter.sh): a real jupyter_server on
# 127.0.0.1:${JUPYTER_PORT:-44771} with token ${JUPYTER_TOKEN}, reachable from outside only
# through execd's /proxy/<port>/ reverse proxy.
: "${JUPYTER_TOKEN:?JUPYTER_TOKEN must be set}"
exec jupyter server --ServerApp.ip=127.0.0.1 --ServerApp.port="${JUPYTER_PORT:-44771}" \
    --ServerApp.port_retries=0 --ServerApp.open_browser=False \
    --IdentityProvider.token="${JUPYTER_TOKEN}" --ServerApp.root_dir="${HOME}"
