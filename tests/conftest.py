from __future__ import annotations

import logging
import signal
from pathlib import Path

import pytest
from plugin_sinks import plugins  # noqa: F401 - a fixture
from s3server import s3, s3_server  # noqa: F401 - fixtures: a real S3-compatible server

import rollout_trace  # noqa: F401 - the logger exists before caplog looks

# Tests that start servers, processes, browsers or clusters, or that measure
# real threads against real deadlines: the quick command (`-m unit`) leaves
# them out. Everything else is a unit test.
INTEGRATION = frozenset(
    {
        "cli/test_cost_jobs.py",
        "cli/test_watch.py",
        "cli/test_watch_store.py",
        "demo/test_demo.py",
        "differential/test_differential.py",
        "reading/test_object_store.py",
        "sinks/test_objects.py",
        "sinks/test_otlp.py",
        "sinks/test_sink_contract.py",
        "test_docs.py",
        "test_faults.py",
        "test_packaging.py",
        "test_ray.py",
        "test_sync.py",
        "timeline/test_timeline.py",
        "timeline/test_timeline_html.py",
        "timeline/test_timeline_scale.py",
        "writing/test_async_lifecycle.py",
        "writing/test_process_hooks.py",
        "writing/test_promises.py",
        "writing/test_sync_lifecycle.py",
        "writing/test_writer_core.py",
    }
)


def pytest_configure(config: pytest.Config) -> None:
    # A shell runs a background job with SIGINT ignored, and Python then keeps
    # no handler of its own: the tests that send the process a real Ctrl-C
    # need the handler an interactive run has, wherever the suite is started.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests = Path(__file__).parent
    for item in items:
        where = item.path.relative_to(tests).as_posix()
        slow = item.get_closest_marker("slow") or item.get_closest_marker("ray")
        item.add_marker(
            pytest.mark.integration if where in INTEGRATION or slow else pytest.mark.unit
        )
        if item.get_closest_marker("ray"):
            # One local Ray cluster at a time: two would share two cores.
            item.add_marker(pytest.mark.xdist_group("ray"))


@pytest.fixture
def trace_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Records what the `rollout_trace` logger says, at WARNING and up."""
    caplog.set_level(logging.WARNING, logger="rollout_trace")
    return caplog
