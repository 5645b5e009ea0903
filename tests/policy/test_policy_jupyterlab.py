"""The strict policy in real JupyterLab (headless Chromium), applied by a test stand-in for the relay.

browser_output_policy.py holds the scenario: hostile cells that would mark the page and write a
file on the host, and the benign outputs users rely on. Here the Jupyter server applies the policy
(policy_server_shim.py), which shows what strict stops and keeps in the browser before the
launcher's relay applies it; browser_output_policy.py runs the same scenario through the relay.
"""

from __future__ import annotations

import pytest

from browser_output_policy import check_notebook

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]


@pytest.mark.parametrize("lab", ["server-shim"], indirect=True)
def test_strict_policy_in_jupyterlab_stops_the_payloads_and_keeps_the_outputs(browser, lab) -> None:
    check_notebook(browser, lab, "sandboxed-python")
