"""pytest glue for the harness: markers, options, the ``spawn`` / ``dist_ctx`` fixtures.

Loaded through the ``pytest11`` entry point. It imports torch only when a distributed test
runs, so projects that merely have refddp installed pay nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

DEFAULT_WORLD_SIZE = 2


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("refddp", "multi-process torch.distributed tests (refddp)")
    group.addoption(
        "--dist-timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="deadline for one distributed test's ranks (default 60); a hang past it fails "
        "with every rank's stack",
    )
    group.addoption(
        "--dist-debug",
        dest="dist_debug",
        action="store_true",
        default=True,
        help="run ranks with TORCH_DISTRIBUTED_DEBUG=DETAIL: mismatched collectives fail "
        "with a message naming them (default)",
    )
    group.addoption(
        "--no-dist-debug",
        dest="dist_debug",
        action="store_false",
        help="run ranks without collective fingerprint checking",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "multiproc(timeout=None): run the test body on every rank of a process group "
        "(tests using the `spawn` fixture get this marker automatically)",
    )
    config.addinivalue_line(
        "markers", "world_size(*sizes): run a distributed test once per world size (default 2)"
    )
    config.addinivalue_line(
        "markers", "gpu: needs CUDA GPUs (NCCL, one per rank); skipped when too few are found"
    )


def pytest_itemcollected(item: pytest.Item) -> None:
    # Before `-m` selection runs, so `pytest -m multiproc` picks up every `spawn` test.
    if "spawn" in getattr(item, "fixturenames", ()):
        item.add_marker(pytest.mark.multiproc)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("world_size")
    if marker is not None:
        sizes = list(marker.args) or [DEFAULT_WORLD_SIZE]
        metafunc.parametrize(
            "_refddp_world_size", sizes, indirect=True, ids=[f"world_size={n}" for n in sizes]
        )


def pytest_sessionfinish(session: pytest.Session) -> None:
    from refddp.testing.pool import shutdown_pools

    shutdown_pools()
    for lease in _gpu_leases.values():
        lease.release()
    _gpu_leases.clear()


@pytest.fixture(autouse=True)
def _refddp_world_size(request: pytest.FixtureRequest) -> int:
    return getattr(request, "param", DEFAULT_WORLD_SIZE)


def _is_rank_side(item: pytest.Item) -> bool:
    return item.get_closest_marker("multiproc") is not None and "spawn" not in getattr(
        item, "fixturenames", ()
    )


def _timeout(item: pytest.Item, explicit: float | None) -> float:
    if explicit is not None:
        return explicit
    marker = item.get_closest_marker("multiproc")
    if marker is not None and marker.kwargs.get("timeout") is not None:
        return float(marker.kwargs["timeout"])
    return float(item.config.getoption("dist_timeout"))


_gpu_leases: dict[int, Any] = {}


def _run_on_ranks(
    item: pytest.Item,
    fn: Callable[..., Any],
    args: tuple,
    kwargs: dict[str, Any],
    world_size: int,
    backend: str | None,
    timeout: float | None,
) -> list[Any]:
    __tracebackhide__ = True
    from refddp.testing.gpus import GpuLease, gpu_skip_reason
    from refddp.testing.pool import close_pool, get_pool

    gpu = item.get_closest_marker("gpu") is not None
    backend = backend or ("nccl" if gpu else "gloo")
    deadline = _timeout(item, timeout)
    debug = bool(item.config.getoption("dist_debug"))
    devices: tuple[int, ...] = ()
    under_xdist = "PYTEST_XDIST_WORKER" in os.environ
    if backend == "nccl":
        reason = gpu_skip_reason(world_size)
        if reason:
            pytest.skip(reason)
        lease = _gpu_leases.get(world_size)
        if lease is None:
            lease = GpuLease(world_size, timeout_s=deadline).__enter__()
            _gpu_leases[world_size] = lease
        devices = lease.devices
    module = getattr(item, "module", None)
    extra = (module.__name__,) if module is not None else ()
    pool = get_pool(world_size, backend, debug, devices)
    try:
        return pool.run(fn, args, kwargs, deadline, extra_modules=extra)
    finally:
        if devices and under_xdist:
            # Other workers may need these GPUs: give them back between tests.
            close_pool(world_size, backend, debug, devices)
            _gpu_leases.pop(world_size).release()


@pytest.fixture
def spawn(request: pytest.FixtureRequest, _refddp_world_size: int) -> Iterator[Callable]:
    """``spawn(fn, *args, world_size=2, backend=None, timeout=None, **kwargs) -> list``.

    Runs ``fn`` on every rank of an initialised process group; results ordered by rank.
    """

    def run(
        fn: Callable[..., Any],
        *args: Any,
        world_size: int | None = None,
        backend: str | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> list[Any]:
        __tracebackhide__ = True
        size = world_size if world_size is not None else _refddp_world_size
        return _run_on_ranks(request.node, fn, args, kwargs, size, backend, timeout)

    yield run


@pytest.fixture
def dist_ctx(request: pytest.FixtureRequest, _refddp_world_size: int) -> Any:
    """This rank's ``DistContext`` (rank, world_size, local_rank, device, backend)."""
    from refddp.dist import DistContext

    if not _is_rank_side(request.node):
        raise pytest.UsageError("dist_ctx is only available in tests marked @pytest.mark.multiproc")
    # A stand-in: each rank swaps in its own context before the test body runs.
    return DistContext(-1, _refddp_world_size, -1, "", "")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not _is_rank_side(pyfuncitem):
        return None
    __tracebackhide__ = True
    kwargs = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    world_size = pyfuncitem.funcargs["_refddp_world_size"]  # an autouse fixture: always there
    _run_on_ranks(pyfuncitem, pyfuncitem.obj, (), kwargs, world_size, None, None)
    return True
