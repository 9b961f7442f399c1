from __future__ import annotations

import logging

import pytest
from plugin_sinks import plugins  # noqa: F401 - a fixture
from s3server import s3, s3_server  # noqa: F401 - fixtures: a real S3-compatible server

import rollout_trace  # noqa: F401 - the logger exists before caplog looks


@pytest.fixture
def trace_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Records what the `rollout_trace` logger says, at WARNING and up."""
    caplog.set_level(logging.WARNING, logger="rollout_trace")
    return caplog
