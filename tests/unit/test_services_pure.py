"""The service scripts' pure helpers (no broker or redis-server needed)."""

from __future__ import annotations

import base64
import uuid
from unittest import mock

from rankstream.services import kafka


def test_cluster_ids_never_start_with_a_dash():
    # The storage tool's argument parser took "-t -Xy..." for an option (seen in CI).
    dashed = uuid.UUID(bytes=base64.urlsafe_b64decode("-" + "A" * 21 + "=="))
    plain = uuid.UUID(int=7)
    with mock.patch.object(kafka.uuid, "uuid4", side_effect=[dashed, plain]):
        cluster_id = kafka.new_cluster_id()
    assert cluster_id == base64.urlsafe_b64encode(plain.bytes).rstrip(b"=").decode()
    for _ in range(2000):
        cluster_id = kafka.new_cluster_id()
        assert len(cluster_id) == 22 and not cluster_id.startswith("-")
