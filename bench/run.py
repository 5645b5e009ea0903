"""Run every benchmark in one go and print each table: ``python bench/run.py [--quick]``.

Needs the Docker engine and the kernel image (bench_execution and bench_scale); ``--quick``
lowers rounds and kernels for a smoke run whose numbers are not worth quoting.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import warnings

import bench_execution
import bench_launcher
import bench_relay
import bench_scale


def main() -> int:
    """Run bench_execution, bench_launcher, bench_relay and bench_scale in turn; the exit code is bench_scale's."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few rounds and kernels: a smoke run")
    quick = parser.parse_args().quick
    warnings.simplefilter("ignore")
    print("== bench_execution: execution API on Docker vs a local ipykernel ==", flush=True)
    asyncio.run(bench_execution.main(10 if quick else bench_execution.ROUNDS))
    print("\n== bench_launcher: the launcher's argv and provisioner paths vs a local ipykernel ==", flush=True)
    asyncio.run(bench_launcher.main(20 if quick else bench_launcher.ROUNDS))
    print("\n== bench_relay: OpenSandbox relay vs direct execd (fakes on 127.0.0.1) ==", flush=True)
    asyncio.run(bench_relay.main(20 if quick else bench_relay.ROUNDS))
    print("\n== bench_scale: many Docker kernels at once ==", flush=True)
    return asyncio.run(bench_scale.main(4 if quick else bench_scale.KERNELS))


if __name__ == "__main__":
    sys.exit(main())
