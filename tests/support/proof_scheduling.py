"""A pytest plugin for the proofs run inside a render (`pytest -p proof_scheduling`, tests/template/test_render.py).

Every SLURM test is slow, and both SLURM modules go to one pytest-xdist worker: one SLURM cluster at a time
fits on the host. The modules run longest first (SLURM, then real launches, then unit tests), so that the
workers finish together; each worker takes whole modules, so that a module's shared runs happen once.
"""

from __future__ import annotations

import pytest

SLURM_MODULES = ("tests/test_slurm.py", "tests/test_slurm_cluster.py")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slurm: starts a real SLURM cluster (root; installs slurm-wlm if missing)")
    config.addinivalue_line(
        "markers", "tracker: trains with each tracker (a render with one: tests/template/test_render.py)"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("slurm") is not None:  # a SLURM cluster starts in tens of seconds
            item.add_marker(pytest.mark.slow)
    launches = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: (0 if item.get_closest_marker("slurm") else 1 if item.path in launches else 2))


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "slurm" if module in SLURM_MODULES else module

    config.option.loadscopereorder = False  # the order above, not by the number of tests
    return ModuleScheduling(config, log)
