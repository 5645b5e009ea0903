"""The Jupyter project's own conformance suite (jupyter_kernel_test) with the samples of a Python kernel.

``PythonKernelTests`` fills every sample jupyter_kernel_test asks for, so none of its tests skips; a test
module subclasses it once per kernel (``kernel_name``) and so runs the same suite on a local ``python3``
beside each sandboxed path. Import this module, not the class: a ``TestCase`` bound in a test module's
namespace is collected, and the base would run on ``python3`` once more.
"""

from __future__ import annotations

from typing import Any

from jupyter_kernel_test import KernelTests


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
