"""The figures of the security page (docs/security.md), from a real test run: what the tests tried and how it ended.

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
into docs/security.md with ``python tests/support/security_figures.py`` (``--check`` to only compare).

``--full-size`` runs the load and fuzz tests at their full size (see tests/load/README.md); the
default run uses a reduced size. Under ``--full-size`` hypothesis tests run with the ``full-size``
profile (:data:`FULL_SIZE_EXAMPLES` examples) unless they set ``max_examples`` themselves. Outside CI
(the ``CI`` variable unset: a developer's loop) the ``dev`` profile and :func:`examples` run a tenth of
the examples; CI runs every count as written.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_JSON = ROOT / "test-artifacts" / "security-figures.json"
SECURITY_PAGE = ROOT / "docs" / "security.md"
BEGIN, END = "<!-- security-figures:begin -->", "<!-- security-figures:end -->"
FULL_SIZE_EXAMPLES = 2000
DEV_SHARE = 10  # outside CI a hypothesis test runs 1/DEV_SHARE of its examples


def examples(count: int) -> int:
    """``count`` hypothesis examples in CI, a tenth of them (at least 10) in a developer's run."""
    return count if os.environ.get("CI") else max(10, count // DEV_SHARE)

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
    "egress": "Egress by name (the launcher's proxy)",
    "lab": "Locked-down lab server",
    "options": "Options and limits (bad input)",
    "sessions": "Sessions and kernel lifecycle",
    "mcp": "MCP server (kernel-sandbox mcp)",
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
    **dict.fromkeys([f"tests/docker_kernel/test_isolation.py::test_{name}" for name in (
        "every_security_claim_holds_inside_the_kernel", "filling_every_writable_place_stops_at_its_own_limit",
        "mount_cwd_mounts_the_notebook_folder_read_only")], ("attack", "container")),
    **dict.fromkeys([f"tests/docker_kernel/test_isolation.py::test_{name}" for name in (
        "planted_links_fifos_and_sockets_are_never_touched", "two_kernels_cannot_reach_each_other",
        "another_host_account_finds_no_key_and_reaches_no_kernel",
        "nothing_listens_for_the_kernel_on_the_host_network")], ("attack", "channel")),
    "tests/docker_kernel/test_faults.py": ("fault", "sessions"),
    "tests/docker_kernel/test_channel_units.py::test_zmtp_frames_survive_any_split_of_the_stream": ("fuzz", "channel"),
    **dict.fromkeys([f"tests/docker_kernel/test_channel_units.py::test_{name}" for name in (
        "boot_refuses_to_run_without_a_key", "zmtp_refuses_a_peer_that_is_not_zmtp3",
        "zmtp_refuses_a_message_over_the_cap_before_buffering_it", "signatures_are_checked_and_made_per_key",
        "a_root_made_by_someone_else_is_refused", "private_dirs_hold_0600_files_and_exclusive_locks")],
        ("attack", "channel")),
    **dict.fromkeys([f"tests/docker_kernel/test_settings.py::test_{name}" for name in (
        "any_config_is_accepted_whole_or_refused", "sizes_read_as_docker_reads_them")], ("fuzz", "options")),
    **dict.fromkeys([f"tests/docker_kernel/test_settings.py::test_{name}" for name in (
        "tmpfs_sizes_fit_in_memory", "bad_settings_are_refused_with_the_option_named",
        "limits_are_lifted_only_in_so_many_words", "the_provisioner_refuses_unknown_kernelspec_config",
        "shipped_kernelspecs_cannot_start_anything_before_install")], ("fault", "options")),
    "tests/docker_kernel/test_settings.py::test_the_kernels_uid_is_unused_by_any_host_account": ("attack", "container"),
    **dict.fromkeys([f"tests/docker_kernel/test_launcher.py::test_{name}" for name in (
        "sigterm_removes_the_container", "a_shutdown_request_removes_the_container",
        "sigkill_of_the_launcher_leaves_no_container", "the_launcher_follows_its_client_out",
        "without_an_engine_the_argv_fails_closed", "without_the_image_the_argv_names_the_build_command",
        "the_opensandbox_kernelspec_refuses_clients_that_ignore_provisioners",
        "no_installed_kernelspec_can_start_a_kernel_outside_a_sandbox")], ("fault", "sessions")),
    "tests/execution/test_exec_unpickler.py": ("attack", "results"),
    "tests/execution/test_exec_decode.py::test_fuzz_": ("fuzz", "results"),
    **dict.fromkeys([f"tests/execution/test_exec_decode.py::test_{name}" for name in (
        "instances_of_other_classes_are_refused", "pickles_are_refused_unless_the_caller_opted_in",
        "every_limit_refuses_with_an_error_naming_it", "out_of_band_buffers_count_against_the_limits",
        "hostile_documents_are_refused_and_change_nothing", "allowed_standard_classes_are_rebuilt_without_changing",
        "decode_bombs_are_refused_with_bounded_memory", "items_are_counted_before_anything_is_built")],
        ("attack", "results")),
    **dict.fromkeys([f"tests/execution/test_exec_hostile.py::test_{name}" for name in (
        "a_tool_that_ignores_interrupts_ends_within_its_timeout", "a_session_survives_what_a_tool_breaks",
        "a_session_survives_what_a_cell_breaks")], ("fault", "sessions")),
    "tests/execution/test_exec_hostile.py": ("attack", "results"),
    **dict.fromkeys([f"tests/execution/test_exec_channel.py::test_{name}" for name in (
        "text_frame_round_trip_and_tampering", "answer_parts_must_match_their_declared_lengths",
        "an_answer_over_the_size_limit_is_refused", "confine_refuses_paths_outside")], ("attack", "results")),
    **dict.fromkeys([f"{_ET}{name}" for name in (
        "agent_state_of_an_unlisted_class_is_refused", "object_with_a_reduce_hook_comes_back_as_data",
        "printed_fake_marker_does_not_replace_the_result", "forged_answer_with_the_real_marker_is_detected",
        "forged_answer_then_raise_is_detected", "text_frame_with_the_real_marker",
        "payload_that_does_not_arrive_whole_is_not_unpickled", "tool_printing_100_mb_is_capped")],
        ("attack", "results")),
    **dict.fromkeys([f"{_ES}{name}" for name in (
        "output_cap_keeps_host_memory_bounded", "paths_outside_the_work_dir_are_refused_on_the_host",
        "symlink_escapes_are_refused_in_the_kernel", "secrets_in_env_stay_out_of",
        "a_fifo_planted_at_the_target_does_not_hang")], ("attack", "results")),
    **dict.fromkeys([f"{_ET}tool_that_never_returns_hits_the_timeout",
                     f"{_ES}timeout_restarts_a_kernel_that_ignores_interrupts",
                     f"{_ES}kernel_death_is_reported_and_recovered",
                     f"{_ES}nothing_is_left_behind_by_failures",
                     f"{_ES}every_call_has_a_deadline_by_default",
                     f"{_ES}a_kernel_that_stalls_a_transfer_hits_its_deadline"], ("fault", "sessions")),
    f"{_ES}a_gigabyte_moves_in_chunks_with_the_default_limits": ("load", "sessions"),
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
        "security(kind, layer): a test the security figures count; kind in "
        f"{sorted(KINDS)}, layer in {sorted(LAYERS)} (see tests/support/security_figures.py)",
    )
    from hypothesis import settings

    if full_size(config):
        settings.register_profile("full-size", max_examples=FULL_SIZE_EXAMPLES, deadline=None)
        settings.load_profile("full-size")
    elif not os.environ.get("CI"):
        settings.register_profile("dev", max_examples=examples(settings.default.max_examples))
        settings.load_profile("dev")
    config.pluginmanager.register(Recorder(config), "security-figures-recorder")


def full_size(config: pytest.Config) -> bool:
    """True when the run asked for the full size of the load and fuzz tests."""
    return bool(config.getoption("full_size"))


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


class Recorder:
    """The hooks that record this run's marked tests and merge them into the figures file."""

    def __init__(self, config: pytest.Config) -> None:
        self.path = Path(config.getoption("security_figures"))
        self.full = full_size(config)
        self.root = config.rootpath
        self.meta: dict[str, dict[str, Any]] = {}
        self.entries: dict[str, dict[str, Any]] = {}

    @pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects: ``pytest -m security`` runs every counted test
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            found = _classify(item)
            if found is not None:
                if item.get_closest_marker("security") is None:
                    item.add_marker(pytest.mark.security(*found))
                self.meta[item.nodeid] = {"kind": found[0], "layer": found[1], "what": _what(item),
                                          "test": item.nodeid.split("[")[0]}

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Any:
        """Count the inputs a hypothesis test ran (valid or failing), from hypothesis's statistics."""
        meta = self.meta.get(item.nodeid)
        if meta is None or meta["kind"] != "fuzz" or not hasattr(getattr(item, "obj", None), "hypothesis"):
            return (yield)
        from hypothesis.statistics import collector

        previous = collector.value
        seen = [0]

        def note(stats: dict[str, Any]) -> None:
            for phase in stats.values():
                if isinstance(phase, dict):
                    seen[0] += sum(case.get("status") in ("valid", "interesting")
                                   for case in phase.get("test-cases", []))
            if previous is not None:
                previous(stats)

        with collector.with_value(note):
            try:
                return (yield)
            finally:
                if seen[0] and not any(name == "cases" for name, _ in item.user_properties):
                    item.user_properties.append(("cases", seen[0]))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.nodeid not in self.meta:
            return
        entry = self.entries.setdefault(report.nodeid, {**self.meta[report.nodeid], "outcome": "passed",
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

    def pytest_sessionfinish(self) -> None:
        if not self.entries:
            return
        stamp = {
            "commit": _commit(),
            "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "size": "full" if self.full else "reduced",
        }
        try:
            old = json.loads(self.path.read_text())["tests"]
        except (OSError, ValueError, KeyError):
            old = {}
        kept = {nodeid: entry for nodeid, entry in old.items() if self._still_there(nodeid)}
        merged = {**kept, **{nodeid: {**entry, **stamp} for nodeid, entry in self.entries.items()}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({"tests": dict(sorted(merged.items()))}, indent=1) + "\n")


    def _still_there(self, nodeid: str) -> bool:
        """An earlier entry stays while its file exists and still defines its test function."""
        path, _, name = nodeid.split("[")[0].partition("::")
        try:
            source = (self.root / path).read_text()
        except OSError:
            return False
        return re.search(rf"def {re.escape(name.rpartition('::')[2])}\(", source) is not None


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
    """The Markdown block of docs/security.md for the figures in ``figures`` (the JSON's content)."""
    tests = list(figures["tests"].values())
    held = {"passed", "xfailed"}
    lines = []
    commits = sorted({t["commit"] for t in tests})
    sizes = sorted({t["size"] for t in tests})
    dates = sorted(t["finished"] for t in tests)
    lines.append(f"Generated by `python tests/support/security_figures.py` from {len(tests)} test cases run at "
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
        lines += ["", f"No test of this run covers: {', '.join(untested)}. What docs/security.md says of "
                  f"{'it' if len(untested) == 1 else 'them'} is design, not measurement."]
    loads = [t for t in tests if t["kind"] == "load" and "before" in t["properties"]]
    if loads:
        lines += ["", "Load tests, counted on the test process before and after (bounded growth only: "
                  "the bound is given for the numbers a warm process keeps; the others must come back exactly):",
                  "", "| Load | Size | Open fds | Threads | RSS MiB | Children | Containers | Networks | Volumes | Host paths | Outcome |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for t in loads:
            props = t["properties"]
            before, after, bound = props["before"], props.get("after", {}), props.get("bounds", {})
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
    """Render the figures JSON into the marked block of docs/security.md."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="figures file (default: %(default)s)")
    parser.add_argument("--markdown", type=Path, default=SECURITY_PAGE, help="file to update (default: %(default)s)")
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
