"""The differential run's options and its two versions, started once per session.

``pytest tests/differential`` runs the quick tier (``QUICK_SETS`` cases, each a
trace set in every layout); ``--differential-sets 500`` the full run. Each case
is a test of its own (a shard of one seed), so none comes near the suite's
per-test timeout. ``--differential-first K`` starts at case K (to run one
again: ``--differential-first 17 --differential-sets 1``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from differential.versions import Driver, DriverDied, base_root, new_root

# About 15 s on two cores (both versions at once, 25 cases of 9 layouts each).
QUICK_SETS = 25


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("differential", "differential run against the base commit")
    group.addoption(
        "--differential-sets",
        type=int,
        default=QUICK_SETS,
        metavar="N",
        help=f"random trace sets to compare, each in every layout (default {QUICK_SETS})",
    )
    group.addoption(
        "--differential-first",
        type=int,
        default=0,
        metavar="K",
        help="the first case (seed) to compare (default 0)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "case" in metafunc.fixturenames:
        n = metafunc.config.getoption("--differential-sets", QUICK_SETS)
        first = metafunc.config.getoption("--differential-first", 0)
        seeds = range(first, first + n)
        metafunc.parametrize("case", seeds, ids=[f"case-{k}" for k in seeds])


@pytest.fixture(scope="session")
def versions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Driver, Driver]]:
    """The base's driver and the new version's, for the whole session."""
    base = base_root(tmp_path_factory.mktemp("base") / "snapshot")
    if isinstance(base, str):
        pytest.skip(base)
    new = new_root()
    if isinstance(new, str):
        pytest.skip(new)
    logs = tmp_path_factory.mktemp("drivers")
    started: list[Driver] = []
    try:
        started.append(Driver("base", base, logs / "base.log"))
        started.append(Driver("new", new, logs / "new.log"))
    except DriverDied:
        for d in started:
            d.close()
        raise
    yield started[0], started[1]
    for d in started:
        d.close()
