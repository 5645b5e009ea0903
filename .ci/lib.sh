# shellcheck shell=bash
# Shell functions shared by .ci/run (the tests) and ./quickstart (first contact); sourced, not run.
# They expect `set -euo pipefail` and the checkout as the working directory.

DOCKERD_LOG=/var/log/kernel-sandbox-ci-dockerd.log

phase() {
    local name=$1 start=$SECONDS
    shift
    echo "=== ${name} ..."
    "$@"
    echo "=== ${name}: $((SECONDS - start)) s"
}

# at_once NAME FUNCTION [NAME FUNCTION ...]: each FUNCTION as a phase of its own, all in the
# background at the same time; each one's output is printed whole when it ends, in the order given.
# Fails (with the first failing status) when any of them fails, after all have ended.
at_once() {
    local dir pids=() names=() status=0 index=0 code
    dir=$(mktemp -d)
    while [ $# -gt 0 ]; do
        names+=("$1")
        (phase "$1" "$2") >"${dir}/${#pids[@]}" 2>&1 &
        pids+=($!)
        shift 2
    done
    for index in "${!pids[@]}"; do
        code=0
        wait "${pids[${index}]}" || code=$?
        cat "${dir}/${index}"
        if [ "${code}" -ne 0 ]; then
            echo "=== ${names[${index}]} failed (exit code ${code})" >&2
            [ "${status}" -ne 0 ] || status=${code}
        fi
    done
    rm -rf "${dir}"
    return "${status}"
}

CONTAINERD_PID=/var/run/docker/containerd/containerd.pid

alive() {
    local pid=$1 name=$2
    [ -n "${pid}" ] && [ "$(cat "/proc/${pid}/comm" 2>/dev/null)" = "${name}" ] \
        && ! grep -q ') Z' "/proc/${pid}/stat" 2>/dev/null
}

wait_for_engine() {
    local pid=$1 deadline=$((SECONDS + 90))
    until docker info >/dev/null 2>&1; do
        if ! alive "${pid}" dockerd || [ $SECONDS -ge $deadline ]; then
            return 1
        fi
        sleep 1
    done
}

stop_engine_leftovers() {
    local pid
    for pid in "$(cat /var/run/docker.pid 2>/dev/null)" "$(cat "${CONTAINERD_PID}" 2>/dev/null)"; do
        if alive "${pid}" dockerd || alive "${pid}" containerd; then
            kill -9 "${pid}" 2>/dev/null || true
        fi
    done
    sleep 1
    rm -f /var/run/docker.pid "${CONTAINERD_PID}"
}

# gVisor for the isolation tests, which run on runc and runsc: Debian's runsc, registered with
# dockerd under the name runsc. Debian's runsc needs --network=none to start a container that has
# no network (as every kernel container has); the merge keeps whatever else daemon.json holds.
register_runsc() {
    command -v runsc >/dev/null || apt_install runsc
    local wanted
    wanted=$(python3 - "$(command -v runsc)" <<'PY'
import json, os, sys
path = "/etc/docker/daemon.json"
config = json.load(open(path)) if os.path.exists(path) and os.path.getsize(path) else {}
entry = {"path": sys.argv[1], "runtimeArgs": ["--network=none"]}
if config.get("runtimes", {}).get("runsc") != entry:
    config.setdefault("runtimes", {})["runsc"] = entry
    os.makedirs("/etc/docker", exist_ok=True)
    with open(path + ".tmp", "w") as handle:
        json.dump(config, handle, indent=2)
    os.replace(path + ".tmp", path)
    print("reload")
PY
)
    if [ "${wanted}" = "reload" ]; then
        echo "registered runsc in /etc/docker/daemon.json; reloading dockerd (SIGHUP)"
        kill -HUP "$(cat /var/run/docker.pid)"
        local deadline=$((SECONDS + 30))
        until docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q runsc; do
            [ $SECONDS -lt $deadline ] || { echo "dockerd did not pick up runsc" >&2; exit 1; }
            sleep 1
        done
    fi
    docker info --format 'runtimes: {{json .Runtimes}}'
}

start_docker_engine() {
    if docker info >/dev/null 2>&1; then
        echo "the Docker engine is running"
        return
    fi
    if [ "$(id -u)" -ne 0 ]; then
        echo "the Docker engine does not answer, and starting it needs root; \`kernel-sandbox doctor\` says why" >&2
        exit 1
    fi
    local pid attempt
    pid=$(cat /var/run/docker.pid 2>/dev/null || true)
    if alive "${pid}" dockerd; then
        echo "dockerd (pid ${pid}) is running but not answering yet; waiting for it"
        if wait_for_engine "${pid}"; then
            docker version --format 'engine {{.Server.Version}} ready'
            return
        fi
    fi
    for attempt in 1 2; do
        echo "clearing what an earlier dockerd left (its pid files, a dying containerd)"
        stop_engine_leftovers
        echo "starting dockerd, attempt ${attempt} (log: ${DOCKERD_LOG})"
        nohup dockerd >"${DOCKERD_LOG}" 2>&1 &
        pid=$!
        if wait_for_engine "${pid}"; then
            docker version --format 'engine {{.Server.Version}} ready'
            return
        fi
        echo "dockerd did not become ready (or exited); its log:" >&2
        tail -n 30 "${DOCKERD_LOG}" >&2
        kill -9 "${pid}" 2>/dev/null || true
    done
    exit 1
}

PODMAN_LOG=/var/log/kernel-sandbox-ci-podman.log

# Podman's API socket: root's (/run/podman/podman.sock) or this user's ($XDG_RUNTIME_DIR/podman/),
# as kernel_sandbox.docker.containers.podman_address finds it.
podman_socket() {
    if [ -n "${CONTAINER_HOST:-}" ]; then
        echo "${CONTAINER_HOST#unix://}"
    elif [ "$(id -u)" -eq 0 ]; then
        echo /run/podman/podman.sock
    else
        echo "${XDG_RUNTIME_DIR:-/run/user/$(id -u)}/podman/podman.sock"
    fi
}

podman_answers() {
    timeout 10 podman --remote --url "unix://$1" version >/dev/null 2>&1
}

# Starts `podman system service` on its socket when Podman is installed and nothing answers there
# (a rootless user's socket needs its runtime directory). Without Podman it says so and goes on.
start_podman_socket() {
    local socket pid deadline
    if ! command -v podman >/dev/null; then
        echo "podman is not installed (as root: apt-get install podman catatonit); the Podman tests need it"
        return
    fi
    socket=$(podman_socket)
    if podman_answers "${socket}"; then
        echo "Podman's API socket answers at ${socket}"
        return
    fi
    mkdir -p "$(dirname "${socket}")"
    # crun, Podman's first choice when installed, refuses a host on cgroup v1 or hybrid cgroups
    # ("cgroups in hybrid mode not supported"); runc, which docker.io brings, runs there
    local runtime=()
    if [ ! -f /sys/fs/cgroup/cgroup.controllers ] && command -v runc >/dev/null; then
        runtime=(--runtime runc)
    fi
    echo "starting podman ${runtime[*]} system service at ${socket} (log: ${PODMAN_LOG})"
    # CONTAINER_HOST would make this podman a client of that socket
    nohup env -u CONTAINER_HOST podman "${runtime[@]}" system service --time=0 "unix://${socket}" >>"${PODMAN_LOG}" 2>&1 &
    pid=$!
    deadline=$((SECONDS + 60))
    until podman_answers "${socket}"; do
        if ! kill -0 "${pid}" 2>/dev/null || [ $SECONDS -ge $deadline ]; then
            echo "Podman's API socket did not answer; its log:" >&2
            tail -n 30 "${PODMAN_LOG}" >&2
            exit 1
        fi
        sleep 1
    done
    podman version --format 'podman {{.Server.Version}} ready'
}

# Copies the kernel image from Docker's store into Podman's when Podman's has another (or none):
# no registry is needed, and the same image runs on both engines. Seconds when they match.
load_image_into_podman() {
    local image=kernel-sandbox-python:latest docker_id podman_id
    command -v podman >/dev/null || return 0
    docker_id=$(docker image inspect --format '{{.Id}}' "${image}")
    podman_id=$(podman image inspect --format '{{.Id}}' "${image}" 2>/dev/null || true)
    if [ "${docker_id#sha256:}" = "${podman_id#sha256:}" ]; then
        echo "Podman's store has ${image} (${podman_id:0:12})"
        return
    fi
    docker save "${image}" | podman load
}

# apt-get install, with an apt-get update first when the package lists do not have the packages.
apt_install() {
    apt-get install -y -q "$@" || { apt-get update -q && apt-get install -y -q "$@"; }
}

# True when use_venv can work: a virtual environment is active or made, or python3 can make one.
venv_possible() {
    [ -n "${VIRTUAL_ENV:-}" ] || .venv/bin/python -c "import pip" 2>/dev/null \
        || python3 -c 'import ensurepip' 2>/dev/null
}

# Sets PYTHON to the interpreter to install into: the active virtual environment's, else that of
# .venv/ in this checkout, made (or completed: a `python3 -m venv` that stopped for want of
# ensurepip leaves one without pip) when it has no pip. Never the system's Python.
use_venv() {
    if [ -n "${VIRTUAL_ENV:-}" ]; then
        PYTHON="${VIRTUAL_ENV}/bin/python"
        return
    fi
    PYTHON=.venv/bin/python
    "${PYTHON}" -c "import pip" 2>/dev/null || python3 -m venv .venv
}
