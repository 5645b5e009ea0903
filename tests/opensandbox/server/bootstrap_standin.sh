#!/bin/sh
# STAND-IN for OpenSandbox's bootstrap.sh (upstream components/execd/bootstrap.sh): start execd in
# the background, then run the sandbox's entrypoint in its place (its exit code is the container's).
EXECD="${EXECD:-/opt/opensandbox/execd}"
"$EXECD" &
if [ $# -eq 0 ]; then
    exec sh
fi
exec "$@"
