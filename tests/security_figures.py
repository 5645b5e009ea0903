"""The figures of SECURITY.md, from a real test run: what the tests tried and how it ended.

Mark a test, a class or a module (``pytestmark = ...``) with what it tries::

    @pytest.mark.security("attack", "channel")
    def test_kernel_symlink_in_its_dir_is_never_followed(...):
        \"\"\"A kernel plants symlinks where the host would connect.\"\"\"

* kind: ``attack`` (an attacker's move that must be blocked), ``fault`` (a failure the project must
  survive or refuse cleanly: engine gone, kernel or owner killed, a launch that fails, a wrong
  option), ``load`` (a volume held with nothing left behind), ``fuzz`` (generated inputs that must
  be handled);
* layer: a key of :data:`LAYERS`.

A test's first docstring line (else its name) says what it tries; each collected case (each
parameter) counts as one attempt. A test that tries several things in one case says how many with
``record_property("cases", n)``; a hypothesis test counts the inputs it generated. Any other
``record_property(name, value)`` (JSON values) is kept with the test's entry, e.g. the load tests'
counts before and after.

``pytest -m security`` runs every test the figures count. Every run that ran a marked test merges its entries (by test id) into
``test-artifacts/security-figures.json`` (``--security-figures PATH`` to choose). Render the table
into SECURITY.md with ``python tests/security_figures.py`` (``--check`` to only compare).

``--full-size`` runs the load and fuzz tests at their full size (see tests/load/README.md); the
default run uses a reduced size. Under ``--full-size`` hypothesis tests run with the ``full-size``
profile (:data:`FULL_SIZE_EXAMPLES` examples) unless they set ``max_examples`` themselves.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_JSON = ROOT / "test-artifacts" / "security-figures.json"
SECURITY_MD = ROOT / "SECURITY.md"
BEGIN, END = "<!-- security-figures:begin -->", "<!-- security-figures:end -->"
FULL_SIZE_EXAMPLES = 2000

KINDS = {
    "attack": "Attacks blocked",
    "fault": "Faults survived",
    "load": "Loads held",
    "fuzz": "Fuzzed inputs handled",
}
LAYERS = {
    "container": "Container hardening",
    "channel": "Kernel channel (host <-> kernel)",
    "policy": "Output policy (browser)",
    "results": "Results decoded on the host",
    "opensandbox": "OpenSandbox relay and clients",
    "lab": "Locked-down lab server",
    "options": "Options and limits (bad input)",
    "sessions": "Sessions and kernel lifecycle",
}

# Tests that were on main before the marker existed, classified here until their owners mark
# them (then the entry goes): test id prefix -> (kind, layer); the first matching prefix wins.
_DK = "tests/docker_kernel/test_docker_kernel.py::test_"
_OC = "tests/opensandbox/test_opensandbox_client.py::test_"
_OE = "tests/opensandbox/test_opensandbox_events.py::test_"
_ET = "tests/execution/test_exec_tools.py::test_"
_ES = "tests/execution/test_exec_sandbox.py::test_"
UNMARKED: dict[str, tuple[str, str]] = {
    **dict.fromkeys([f"{_DK}the_sandbox_is_locked_down", f"{_DK}host_environment_does_not_leak",
                     f"{_DK}fork_loop_is_stopped_by_pids_limit", f"{_DK}memory_hog_is_reported_out_of_memory",
                     f"{_DK}network_option_gives_a_network_and_publishes_nothing",
                     f"{_DK}mounts_are_read_only_unless_asked"], ("attack", "container")),
    f"{_DK}root_or_malformed_user_is_refused": ("attack", "options"),
    **dict.fromkeys([f"{_DK}bad_mount_is_refused_and_leaves_nothing",
                     "tests/docker_kernel/test_cli.py::test_install_refuses_an_option_the_provisioner_lacks",
                     "tests/docker_kernel/test_cli.py::test_mount_specs_are_checked"], ("fault", "options")),
    **dict.fromkeys([f"{_DK}failed_launch_removes_container_and_private_dir",
                     f"{_DK}kernel_is_removed_when_its_owner_dies",
                     "tests/docker_kernel/test_cli.py::test_gc_removes_stopped_kernel_containers"], ("fault", "sessions")),
    f"{_DK}ten_concurrent_kernels_leave_nothing": ("load", "sessions"),
    "tests/execution/test_exec_unpickler.py": ("attack", "results"),
    **dict.fromkeys([f"tests/execution/test_exec_framing.py::test_{name}" for name in (
        "tampered_frame_fails_its_digest", "printed_frames_are_ignored_and_two_frames_are_refused",
        "channel_frames_check_marker_count_length_and_digest", "confine_refuses_paths_outside")], ("attack", "results")),
    **dict.fromkeys([f"{_ET}{name}" for name in (
        "agent_state_of_an_unlisted_class_is_refused", "pickle_reaching_for_os_system",
        "printed_fake_marker_does_not_replace_the_result", "forged_frame_with_the_real_marker_is_detected",
        "text_frame_with_the_real_marker", "payload_that_fails_its_digest_is_not_unpickled",
        "tool_printing_100_mb_is_capped")], ("attack", "results")),
    **dict.fromkeys([f"{_ES}{name}" for name in (
        "output_cap_keeps_host_memory_bounded", "paths_outside_the_work_dir_are_refused_on_the_host",
        "symlink_escapes_are_refused_in_the_kernel")], ("attack", "results")),
    **dict.fromkeys([f"{_ET}tool_that_never_returns_hits_the_timeout",
                     f"{_ES}timeout_restarts_a_kernel_that_ignores_interrupts",
                     f"{_ES}kernel_death_is_reported_and_recovered",
                     f"{_ES}nothing_is_left_behind_by_failures"], ("fault", "sessions")),
    "tests/execution/test_exec_skills_pool.py::test_pool_gives_20_concurrent_callers_clean_kernels": ("load", "sessions"),
    "tests/policy/test_policy_hostile.py::test_generated_": ("fuzz", "policy"),
    "tests/policy/test_policy_hostile.py": ("attack", "policy"),
    **dict.fromkeys([f"tests/policy/test_policy_real_outputs.py::test_{name}" for name in (
        "widget_with_esm_is_refused_and_says_so", "html_widgets_and_html_descriptions_are_sanitized",
        "unknown_comm_updates_are_policed_blind", "buffers_on_checked_fields_drop_the_message")], ("attack", "policy")),
    "tests/policy/test_policy_jupyterlab.py": ("attack", "policy"),
    "tests/opensandbox/test_opensandbox_hostile.py::test_connection_errors_reach_the_user": ("fault", "opensandbox"),
    "tests/opensandbox/test_opensandbox_hostile.py": ("attack", "opensandbox"),
    f"{_OC}fuzz_": ("fuzz", "opensandbox"),
    **dict.fromkeys([f"{_OC}{name}" for name in (
        "ids_are_encoded_and_cannot_change_the_path", "a_created_id_that_would_change_the_path",
        "context_ids_are_encoded", "endpoint_of_the_wrong_shape_is_refused", "create_answers_of_the_wrong_shape",
        "other_wrong_shapes_raise_the_clients_error", "answers_over_the_cap_are_refused", "compressed_answers_are_refused",
        "error_is_terminal_and_nothing_after_it_counts", "events_after_execution_complete_are_ignored",
        "a_stream_without_a_terminal_event_is_a_dropped_connection", "stream_over_byte_cap_aborts",
        "call_deadline_is_per_call_not_per_read")], ("attack", "opensandbox")),
    **dict.fromkeys([f"{_OC}{name}" for name in (
        "delete_retries_transient_failures_with_backoff", "keep_alive_survives_any_error",
        "keep_alive_reports_once_when_renewal_fails", "run_once_keeps_its_result_when_delete_fails",
        "transport_errors_never_have_an_empty_message")], ("fault", "opensandbox")),
    f"{_OE}fuzz_": ("fuzz", "opensandbox"),
    **dict.fromkeys([f"{_OE}{name}" for name in (
        "junk_and_control_lines_are_skipped", "deep_nesting_is_junk_not_a_recursion_error",
        "lone_surrogates_and_nuls_are_replaced", "non_string_mime_values_are_kept_only_for_json_types",
        "tracebacks_are_capped_keeping_the_end", "events_after_the_terminal_one_change_nothing",
        "accumulation_is_linear", "byte_garbage_is_skipped_or_cleaned")], ("attack", "opensandbox")),
    "tests/opensandbox/test_opensandbox_translate.py::test_fuzz_": ("fuzz", "opensandbox"),
    **dict.fromkeys([f"tests/opensandbox/test_opensandbox_translate.py::test_{name}" for name in (
        "a_flood_of_tiny_events_becomes_few_messages", "every_failure_still_gives_exactly_one_reply",
        "abort_from_another_thread_ends_a_cell_that_never_stops")],
        ("attack", "opensandbox")),
    **dict.fromkeys([f"tests/notebooks/test_lab_command.py::test_{name}" for name in (
        "locked_down_lab_offers_and_starts_only_sandboxed_kernels", "locked_down_lab_refuses_to_serve_its_own",
        "locked_down_lab_refuses_a_config_file_that_undoes_it")], ("attack", "lab")),
    **dict.fromkeys([f"tests/notebooks/test_lab_units.py::test_{name}" for name in (
        "locked_down_manager_offers_only_sandboxed_kernelspecs", "locked_down_manager_keeps_the_kernelspecs_it_read",
        "locked_down_manager_refuses_kernelspecs_pages_could_rewrite", "locked_down_settings_come_last",
        "exposed_paths_are_the_servers_own_directories")], ("attack", "lab")),
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kernel-sandbox figures")
    group.addoption("--full-size", action="store_true",
                    help="run the load and fuzz tests at their full size (default: reduced)")
    group.addoption("--security-figures", metavar="PATH", default=str(DEFAULT_JSON),
                    help="where to merge the figures of the marked tests (default: %(default)s)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "security(kind, layer): a test SECURITY.md counts; kind in "
        f"{sorted(KINDS)}, layer in {sorted(LAYERS)} (see tests/security_figures.py)",
    )
    if config.getoption("full_size"):
        from hypothesis import settings

        settings.register_profile("full-size", max_examples=FULL_SIZE_EXAMPLES, deadline=None)
        settings.load_profile("full-size")
    global _run
    _run = _Run(config)


def full_size(config: pytest.Config) -> bool:
    """True when the run asked for the full size of the load and fuzz tests."""
    return bool(config.getoption("full_size"))


class _Run:
    """The entries of this run, by test id."""

    def __init__(self, config: pytest.Config) -> None:
        self.path = Path(config.getoption("security_figures"))
        self.full = full_size(config)
        self.meta: dict[str, dict[str, Any]] = {}
        self.entries: dict[str, dict[str, Any]] = {}


_run: _Run | None = None


def _kind_layer(kind: str | None = None, layer: str | None = None) -> tuple[str | None, str | None]:
    return kind, layer


def _classify(item: pytest.Item) -> tuple[str, str] | None:
    marker = item.get_closest_marker("security")
    if marker is None:
        return next((found for prefix, found in UNMARKED.items() if item.nodeid.startswith(prefix)), None)
    kind, layer = _kind_layer(*marker.args, **marker.kwargs)
    if kind not in KINDS or layer not in LAYERS:
        raise pytest.UsageError(
            f"{item.nodeid}: @pytest.mark.security({kind!r}, {layer!r}): kind must be one of "
            f"{sorted(KINDS)} and layer one of {sorted(LAYERS)}"
        )
    return kind, layer


def _what(item: pytest.Item) -> str:
    doc = getattr(getattr(item, "function", None), "__doc__", None) or ""
    line = doc.strip().splitlines()[0].strip() if doc.strip() else ""
    return line or item.name.split("[")[0].removeprefix("test_").replace("_", " ")


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects: ``pytest -m security`` runs every counted test
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    assert _run is not None
    for item in items:
        found = _classify(item)
        if found is not None:
            if item.get_closest_marker("security") is None:
                item.add_marker(pytest.mark.security(*found))
            _run.meta[item.nodeid] = {"kind": found[0], "layer": found[1], "what": _what(item),
                                     "test": item.nodeid.split("[")[0]}


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """Count the inputs a hypothesis test ran (valid or failing), from hypothesis's statistics."""
    meta = _run.meta.get(item.nodeid) if _run is not None else None
    if meta is None or meta["kind"] != "fuzz" or not hasattr(getattr(item, "obj", None), "hypothesis"):
        return (yield)
    from hypothesis.statistics import collector

    previous = collector.value
    seen = [0]

    def note(stats: dict[str, Any]) -> None:
        for phase in stats.values():
            if isinstance(phase, dict):
                seen[0] += sum(case.get("status") in ("valid", "interesting") for case in phase.get("test-cases", []))
        if previous is not None:
            previous(stats)

    with collector.with_value(note):
        try:
            return (yield)
        finally:
            if seen[0]:
                item.user_properties.append(("cases", seen[0]))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    run = _run
    if run is None or report.nodeid not in run.meta:
        return
    entry = run.entries.setdefault(report.nodeid, {**run.meta[report.nodeid], "outcome": "passed",
                                                   "duration": 0.0, "properties": {}})
    entry["duration"] = round(entry["duration"] + report.duration, 3)
    for name, value in report.user_properties:
        entry["properties"][name] = value
    if report.when == "call":
        if hasattr(report, "wasxfail"):
            entry["outcome"] = "xfailed" if report.skipped else "xpassed"
        else:
            entry["outcome"] = report.outcome
    elif report.failed:
        entry["outcome"] = "error"
    elif report.skipped:
        entry["outcome"] = "skipped"
    if report.skipped and isinstance(report.longrepr, tuple):
        entry["reason"] = str(report.longrepr[2]).removeprefix("Skipped: ")


def pytest_sessionfinish(session: pytest.Session) -> None:
    run = _run
    if run is None or not run.entries:
        return
    stamp = {
        "commit": _commit(),
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "size": "full" if run.full else "reduced",
    }
    try:
        old = json.loads(run.path.read_text())["tests"]
    except (OSError, ValueError, KeyError):
        old = {}
    merged = {**old, **{nodeid: {**entry, **stamp} for nodeid, entry in run.entries.items()}}
    run.path.parent.mkdir(parents=True, exist_ok=True)
    run.path.write_text(json.dumps({"tests": dict(sorted(merged.items()))}, indent=1) + "\n")


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


# -- rendering ---------------------------------------------------------------------------------


def _cases(entry: dict[str, Any]) -> int:
    value = entry["properties"].get("cases", 1)
    return value if isinstance(value, int) and value > 0 else 1


def render(figures: dict[str, Any]) -> str:
    """The Markdown block of SECURITY.md for the figures in ``figures`` (the JSON's content)."""
    tests = list(figures["tests"].values())
    held = {"passed", "xfailed"}
    lines = []
    commits = sorted({t["commit"] for t in tests})
    sizes = sorted({t["size"] for t in tests})
    dates = sorted(t["finished"] for t in tests)
    lines.append(f"Generated by `python tests/security_figures.py` from {len(tests)} test cases run at "
                 f"commit {', '.join(commits)} ({dates[0][:10]}), load and fuzz at {'/'.join(sizes)} size. "
                 "Each cell: held / tried (a parameter or case counts as one; fuzz counts generated inputs).")
    lines.append("")
    lines.append("| Layer | " + " | ".join(KINDS.values()) + " | Not held | Not run |")
    lines.append("|---|" + "---:|" * (len(KINDS) + 2))
    totals = {kind: [0, 0] for kind in KINDS}
    failed, skipped = [], []
    untested = []
    for layer, title in LAYERS.items():
        mine = [t for t in tests if t["layer"] == layer]
        if not mine:
            untested.append(title)
            lines.append(f"| {title} | " + " | ".join("–" for _ in KINDS) + " | – | – |")
            continue
        cells = []
        for kind in KINDS:
            ran = [t for t in mine if t["kind"] == kind and t["outcome"] != "skipped"]
            tried = sum(_cases(t) for t in ran)
            ok = sum(_cases(t) for t in ran if t["outcome"] in held)
            totals[kind][0] += ok
            totals[kind][1] += tried
            cells.append(f"{ok} / {tried}" if tried else "–")
        bad = [t for t in mine if t["outcome"] not in held | {"skipped"}]
        off = [t for t in mine if t["outcome"] == "skipped"]
        failed += bad
        skipped += off
        lines.append(f"| {title} | " + " | ".join(cells) + f" | {len(bad)} | {len(off)} |")
    lines.append("| **All layers** | " + " | ".join(f"**{ok} / {n}**" if n else "–" for ok, n in totals.values())
                 + f" | **{len(failed)}** | **{len(skipped)}** |")
    if untested:
        lines += ["", f"No test of this run covers: {', '.join(untested)}. What SECURITY.md says of "
                  f"{'it' if len(untested) == 1 else 'them'} is design, not measurement."]
    loads = [t for t in tests if t["kind"] == "load" and "before" in t["properties"]]
    if loads:
        lines += ["", "Load tests, counted on the test process before and after (bounded growth only: "
                  "the bound is given for the numbers a warm process keeps; the others must come back exactly):",
                  "", "| Load | Size | Open fds | Threads | RSS MiB | Children | Containers | Networks | Volumes | Host paths | Outcome |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for t in loads:
            props = t["properties"]
            before, after, bound = props["before"], props["after"], props.get("bounds", {})
            def cell(name: str, bound_name: str | None = None) -> str:
                text = f"{before.get(name, '?')} → {after.get(name, '?')}"
                limit = bound.get(bound_name or name)
                return text + (f" (≤ +{limit})" if limit else "")
            lines.append(
                f"| {t['what']} | {props.get('size', '')} | {cell('fds')} | {cell('threads')} | "
                f"{cell('rss_mib')} | {cell('children')} | {cell('containers')} | {cell('networks')} | "
                f"{cell('volumes')} | {cell('paths')} | {t['outcome']} |"
            )
    if failed:
        lines += ["", "Not held (these tests failed in that run):", ""]
        lines += [f"- `{t['test']}` ({t['kind']}, {t['layer']}): {t['what']}" for t in failed]
    if skipped:
        lines += ["", "Not run (skipped in that run):", ""]
        lines += [f"- `{t['test']}`: {t.get('reason', 'skipped')}" for t in skipped]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Render the figures JSON into the marked block of SECURITY.md."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="figures file (default: %(default)s)")
    parser.add_argument("--markdown", type=Path, default=SECURITY_MD, help="file to update (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="only say whether the file is up to date")
    args = parser.parse_args(argv)
    try:
        figures = json.loads(args.json.read_text())
    except OSError as exc:
        print(f"no figures at {args.json} ({exc.strerror}): run the tests first, e.g. `pytest`", file=sys.stderr)
        return 2
    text = args.markdown.read_text()
    if BEGIN not in text or END not in text:
        print(f"{args.markdown} has no {BEGIN} ... {END} block", file=sys.stderr)
        return 2
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    new = f"{head}{BEGIN}\n{render(figures)}\n{END}{tail}"
    if args.check:
        print("up to date" if new == text else f"{args.markdown} differs from {args.json}")
        return 0 if new == text else 1
    args.markdown.write_text(new)
    print(f"wrote the figures of {len(figures['tests'])} test cases into {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
