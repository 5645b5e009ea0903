"""A stand-in for the launcher's relay in browser tests: the Jupyter server applies the output policy.

Test-only. Until the relay applies :class:`~kernel_sandbox.policy.OutputPolicy`, this websocket
connection class filters every kernel→browser message the same way the relay will (parse only what
``inspects`` asks for, re-sign what ``filter`` changed, drop what it drops), so the browser test
can show today that strict stops the payloads and keeps the benign outputs. Enable it with
``--ServerApp.kernel_websocket_connection_class=policy_server_shim.PolicyConnection``.
"""

from __future__ import annotations

from typing import Any

from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection

from kernel_sandbox.policy import OutputPolicy

_POLICIES: dict[str, OutputPolicy] = {}  # one per kernel, shared by its browser tabs
DELIM = b"<IDS|MSG>"


class PolicyConnection(ZMQChannelsWebsocketConnection):
    """Kernel→browser messages pass through the strict output policy, re-signed when changed."""

    def handle_outgoing_message(self, stream: str, outgoing_msg: list[Any]) -> None:
        policy = _POLICIES.setdefault(self.kernel_id, OutputPolicy())
        idents, parts = self.session.feed_identities(outgoing_msg)
        header = self.session.unpack(parts[1])
        if policy.inspects(header["msg_type"], bytes(parts[4])):
            content = self.session.unpack(parts[4])
            filtered = policy.filter(header["msg_type"], content)
            if filtered is None:
                return
            if filtered is not content:
                frames = [parts[1], parts[2], parts[3], self.session.pack(filtered)]
                outgoing_msg = [*idents, DELIM, self.session.sign(frames), *frames, *parts[5:]]
        super().handle_outgoing_message(stream, outgoing_msg)
