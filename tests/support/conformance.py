"""The Jupyter project's own conformance suite (jupyter_kernel_test) with the samples of a Python kernel.

``PythonKernelTests`` fills every sample jupyter_kernel_test asks for, so none of its tests skips; a test
module subclasses it once per kernel (``kernel_name``) and so runs the same suite on a local ``python3``
beside each sandboxed path. Import this module, not the class: a ``TestCase`` bound in a test module's
namespace is collected, and the base would run on ``python3`` once more.
"""

from __future__ import annotations

from typing import Any

from jupyter_kernel_test import TIMEOUT, KernelTests, validate_message

IOPUB_WINDOW = 5.0
"""Seconds ``execute_helper`` waits for each IOPub message of a cell after its reply. Upstream waits
0.1 s: measured here the gap is about 1 ms on a local kernel and a sandboxed one alike, but a loaded
2-core CI machine stalls a process for longer now and then (one ``test_pager`` in about 14 full runs)."""


class PythonKernelTests(KernelTests):
    """jupyter_kernel_test's ``KernelTests`` with samples for IPython, as jupyter_kernel_test tests ipykernel."""

    language_name = "python"
    file_extension = ".py"
    code_hello_world = "print('hello, world')"
    code_stderr = "import sys; print('test', file=sys.stderr)"
    completion_samples: list[dict[str, Any]] = [{"text": "zi", "matches": {"zip"}}]
    complete_code_samples = ["1", "print('hello, world')", "def f(x):\n  return x*2\n\n\n"]
    incomplete_code_samples = ["print('''hello", "def f(x):\n  x*2"]
    invalid_code_samples = ["import = 7q"]
    code_page_something = "zip?"
    code_generate_error = "raise"
    code_execute_result = [
        {"code": "1+2+3", "result": "6"},
        {"code": "[n*n for n in range(1, 4)]", "result": "[1, 4, 9]"},
    ]
    code_display_data = [
        {"code": "from IPython.display import HTML, display; display(HTML('<b>test</b>'))", "mime": "text/html"},
        {"code": "from IPython.display import Math, display; display(Math('\\\\frac{1}{2}'))", "mime": "text/latex"},
    ]
    code_history_pattern = "1?2*"
    supported_history_operations = ("tail", "range", "search")
    code_inspect_sample = "zip"
    code_clear_output = "from IPython.display import clear_output; clear_output()"

    def history_helper(self, codes: list[str], **histargs: Any) -> dict[str, Any]:
        """Upstream's helper; a range reply's current session, which IPython numbers 0, gets its number back.

        The suite asks for a range by the session number a tail reply gave (IPython's absolute number)
        and expects rows carrying it; IPython answers rows of the current session as session 0, on a
        local kernel as in a sandbox. The rows, their line numbers and their count are checked as they come.
        """
        reply = super().history_helper(codes, **histargs)
        if histargs.get("hist_access_type") == "range":
            session = histargs["session"]
            history = reply["content"]["history"]
            reply["content"]["history"] = [[session if row[0] == 0 else row[0], *row[1:]] for row in history]
        return reply

    def execute_helper(
        self, code: str, timeout: int = TIMEOUT, silent: bool = False, store_history: bool = True, stop_on_error: bool = True
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Upstream's helper, with the same checks in the same order; only its waits for IOPub messages (1 s for
        ``busy``, 0.1 s for each next one) are :data:`IOPUB_WINDOW` (a message that never comes still fails)."""
        msg_id = self.kc.execute(code=code, silent=silent, store_history=store_history, stop_on_error=stop_on_error)
        reply = self.get_non_kernel_info_reply(timeout=timeout)
        assert reply is not None
        validate_message(reply, "execute_reply", msg_id)
        busy_msg = self.kc.iopub_channel.get_msg(timeout=IOPUB_WINDOW)
        validate_message(busy_msg, "status", msg_id)
        self.assertEqual(busy_msg["content"]["execution_state"], "busy")
        output_msgs = []
        while True:
            msg = self.kc.iopub_channel.get_msg(timeout=IOPUB_WINDOW)
            validate_message(msg, msg["msg_type"], msg_id)
            if msg["msg_type"] == "status":
                self.assertEqual(msg["content"]["execution_state"], "idle")
                break
            if msg["msg_type"] == "execute_input":
                self.assertEqual(msg["content"]["code"], code)
                continue
            output_msgs.append(msg)
        return reply, output_msgs
