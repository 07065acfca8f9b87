"""pytest glue for the harness: markers, options, the ``spawn`` / ``dist_ctx`` fixtures.

Loaded through the ``pytest11`` entry point. It starts no process until a distributed test
runs; the first one at each world size starts that size's pool.

Rank-side tests (``@pytest.mark.multiproc`` without ``spawn``) get on each rank: ``dist_ctx``
and a per-test ``monkeypatch`` made there (``protocol.RANK_FIXTURES``), ``tmp_path`` /
``tmpdir`` (one directory all ranks share) and a project's own fixtures, whose values are
pickled to the ranks. pytest's other built-in fixtures (``capsys``, ``caplog``, ``request``...)
belong to the pytest process; asking for one fails that test at setup, naming it.
``@pytest.mark.nodes(n)`` runs a test's ranks as n simulated nodes (each with a
``node_tmp_path`` of its own, per test), with ``real=True`` as n real nodes (network
namespaces: see ``nodes/simulated.py``); ``@pytest.mark.faults(...)`` injects faults into a
rank-side test (``spawn`` takes ``faults=``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest

from refddp.config.validation import seconds_error
from refddp.testing.protocol import RANK_FIXTURES

DEFAULT_WORLD_SIZE = 2
session_config: pytest.Config | None = None  # for DistributedTestCase, which gets no fixtures
_OUTER_SESSION = pytest.StashKey["pytest.Config | None"]()
_OUTER_PRELOAD = pytest.StashKey["list[str]"]()  # the rank server's, before this session's
SENT_BUILTIN_FIXTURES = ("tmp_path", "tmpdir")  # pytest's own fixtures whose values travel


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("refddp", "multi-process torch.distributed tests (refddp)")
    group.addoption(
        "--dist-timeout",
        type=_seconds_option,
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
        "--dist-preload",
        action="append",
        default=[],
        metavar="MODULES",
        help="modules (comma-separated) to import once, in the process ranks are forked "
        "from, instead of in every rank: at hundreds of ranks, what the test modules import "
        "is most of a pool's start and memory",
    )
    group.addoption(
        "--no-dist-debug",
        dest="dist_debug",
        action="store_false",
        help="run ranks without collective fingerprint checking",
    )
    group.addoption(
        "--dist-torch-suites",
        action="store_true",
        default=False,
        help="run PyTorch's MultiProcessTestCase suites (DTensorTestBase, FSDPTest... built on "
        "it) unmodified on warm pools: the base class is swapped before collection",
    )
    _add_lint_option(group)


def _add_lint_option(group: pytest.OptionGroup) -> None:
    # --dist-lint PATH: the static half (refddp/lint/pytest_items.py), no torch imported
    from refddp.lint.pytest_items import add_lint_option

    add_lint_option(group)


def pytest_configure(config: pytest.Config) -> None:
    global session_config
    config.stash[_OUTER_SESSION] = session_config  # an in-process pytest.main's outer one
    session_config = config
    from refddp.lint.pytest_items import register_lint_items

    register_lint_items(config)
    if config.getoption("dist_torch_suites"):  # before any test module is imported
        from refddp.testing.torch_suites import use_warm_pools

        use_warm_pools()
    # For the rank server alone, as it starts (rank_server.py); pytest too: test modules import
    # it. Not in this process's environment, which every subprocess of a test inherits.
    from refddp.testing.driver import rank_server

    config.stash[_OUTER_PRELOAD] = list(rank_server.preload)
    rank_server.preload[:] = ["pytest"] + [
        m for value in config.getoption("dist_preload") for m in value.split(",") if m
    ]
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
    config.addinivalue_line(
        "markers",
        "nodes(n, real=False): run the ranks as n simulated nodes (torchrun's LOCAL_RANK, "
        "GROUP_RANK...; a host name and dist_ctx.node_tmp_path per node); real=True: each node "
        "a network namespace with its own interface, address and host name (root only)",
    )
    config.addinivalue_line(
        "markers",
        "faults(*faults): inject refddp.testing.faults (kill, error, hang, exit, delay; "
        "kill_node, cut_node) into a rank-side test",
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


def _stop_pools_and_leases() -> None:
    # Only a session that ran a distributed test has imported these (and torch with them).
    pools = sys.modules.get("refddp.testing.driver.warm_pools")
    if pools is not None:
        pools.shutdown_pools()
    gpus = sys.modules.get("refddp.testing.driver.gpus")
    if gpus is not None:
        gpus.release_devices()


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtestloop(session: pytest.Session) -> Any:
    # trylast: inside pytest-cov's wrapper of this hook, which combines coverage data as it
    # returns. Ranks save theirs as they stop, so they must have stopped by then.
    try:
        return (yield)
    finally:
        _stop_pools_and_leases()


def pytest_unconfigure(config: pytest.Config) -> None:
    global session_config
    if session_config is config:  # the session before it again (None, or an outer one)
        session_config = config.stash.get(_OUTER_SESSION, None)
    if _OUTER_PRELOAD in config.stash:  # the outer session's rank server preloads its own
        from refddp.testing.driver import rank_server

        rank_server.preload[:] = config.stash[_OUTER_PRELOAD]


def pytest_sessionfinish(session: pytest.Session) -> None:
    _stop_pools_and_leases()  # a session interrupted before its test loop


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # At setup, not collection: the one test errors and the module's other tests still run.
    if isinstance(item, pytest.Function):
        ignored = _ignored_world_size_mark(item)
        if ignored is not None:
            pytest.fail(f"{item.nodeid}: {ignored}", pytrace=False)
    if isinstance(item, pytest.Function) and _is_rank_side(item):
        problem = _unsupported_rank_fixture(item)
        if problem is not None:
            pytest.fail(f"{item.nodeid}: {problem}", pytrace=False)


def _ignored_world_size_mark(item: pytest.Function) -> str | None:
    """A ``world_size`` mark that would be ignored, in one line, or None: the sizes are read
    from the function's, class's or module's mark when the tests are generated, before the
    marks of a ``pytest.param`` exist, and only the closest mark counts."""
    in_params = [m for m in getattr(getattr(item, "callspec", None), "marks", ())
                 if m.name == "world_size"]  # fmt: skip
    if in_params:
        return ("a world_size mark inside pytest.param is not applied; put "
                "@pytest.mark.world_size(...) on the function, class or module")  # fmt: skip
    on_function = [m for m in getattr(item.function, "pytestmark", ()) if m.name == "world_size"]
    if len(on_function) > 1:
        sizes = ", ".join(str(n) for m in on_function for n in m.args)
        return (f"{len(on_function)} world_size marks on one test, of which only one is "
                f"applied; give every size in one: @pytest.mark.world_size({sizes})")  # fmt: skip
    return None


def _unsupported_rank_fixture(item: pytest.Function) -> str | None:
    """Why a rank-side test's fixtures cannot work on the ranks, in one line, or None."""
    direct = getattr(getattr(item, "callspec", None), "params", {})
    for name in item._fixtureinfo.argnames:
        if name in RANK_FIXTURES or name in SENT_BUILTIN_FIXTURES or name in direct:
            continue
        defs = item._fixtureinfo.name2fixturedefs.get(name, ())
        builtin = name == "request" or any(
            getattr(d.func, "__module__", "").startswith("_pytest.") for d in defs
        )
        if builtin:
            return (
                f"fixture {name!r} cannot be used in a rank-side test (@pytest.mark.multiproc): "
                f"ranks get {', '.join(RANK_FIXTURES + SENT_BUILTIN_FIXTURES)} and your own "
                "fixtures with picklable values"
            )
    return None


@pytest.fixture(autouse=True)
def _refddp_world_size(request: pytest.FixtureRequest) -> int:
    return getattr(request, "param", DEFAULT_WORLD_SIZE)


def _is_rank_side(item: pytest.Item) -> bool:
    return item.get_closest_marker("multiproc") is not None and "spawn" not in getattr(
        item, "fixturenames", ()
    )


def _seconds_option(text: str) -> float:
    """``--dist-timeout``'s type: pytest's usage error names the option."""
    try:
        seconds: Any = float(text)
    except ValueError:
        seconds = text  # (named as given)
    if seconds_error(seconds):
        raise argparse.ArgumentTypeError(seconds_error(seconds))
    return seconds


def _timeout(item: pytest.Item, explicit: float | None) -> float:
    marker = item.get_closest_marker("multiproc")
    if explicit is not None:
        where, value = "spawn(timeout=...)", explicit
    elif marker is not None and marker.kwargs.get("timeout") is not None:
        where, value = "multiproc(timeout=...)", marker.kwargs["timeout"]
    else:
        return float(item.config.getoption("dist_timeout"))
    why = seconds_error(value)
    if why:
        pytest.fail(f"{where}: {why}", pytrace=False)
    return float(value)


def _nnodes(item: pytest.Item, explicit: int | None, real: bool) -> tuple[int | None, bool]:
    """How many nodes, and whether real ones: from ``spawn``'s arguments, else the marker."""
    if explicit is not None:
        return explicit, real
    marker = item.get_closest_marker("nodes")
    if marker is None:
        return None, real
    return int(marker.args[0]), bool(marker.kwargs.get("real", real))


def _node_dirs(item: pytest.Item, nnodes: int | None) -> tuple[str, ...]:
    """This test's node_tmp_path of each node: made on first use, kept for the whole test (and,
    like tmp_path, after it)."""
    if nnodes is None:
        return ()
    dirs = item.stash.get(_NODE_DIRS, None)
    if dirs is None or len(dirs) != nnodes:
        factory = item.config._tmp_path_factory  # type: ignore[attr-defined]
        root = factory.mktemp(f"{item.name[:30]}-nodes", numbered=True)
        dirs = tuple(str(root / f"node{n}") for n in range(nnodes))
        for d in dirs:
            os.makedirs(d)
        item.stash[_NODE_DIRS] = dirs
    return dirs


_NODE_DIRS = pytest.StashKey[tuple]()


def _run_on_ranks(
    item: pytest.Item,
    fn: Callable[..., Any],
    args: tuple,
    kwargs: dict[str, Any],
    world_size: int,
    backend: str | None,
    timeout: float | None,
    rank_fixtures: tuple[str, ...] = (),
    faults: tuple = (),
    nnodes: int | None = None,
    real_nodes: bool = False,
) -> list[Any]:
    __tracebackhide__ = True
    from refddp.config.torch_support import floor_refused

    refused = floor_refused()
    if refused:  # the one line, not a failure deep inside torch
        pytest.fail(f"refddp.testing: {refused}", pytrace=False)
    from refddp.testing.context import RankSkipped
    from refddp.testing.driver.gpus import gpu_skip_reason, lease_devices, release_devices
    from refddp.testing.driver.warm_pools import PoolKey, close_pool, run_on_pool
    from refddp.testing.nodes.simulated import layout

    gpu = item.get_closest_marker("gpu") is not None
    backend = backend or ("nccl" if gpu else "gloo")
    deadline = _timeout(item, timeout)
    debug = bool(item.config.getoption("dist_debug"))
    nnodes, real_nodes = _nnodes(item, nnodes, real_nodes)
    try:
        layout(world_size, nnodes)
    except ValueError as exc:
        pytest.fail(str(exc), pytrace=False)
    if real_nodes:
        from refddp.testing.cluster import unavailable_to_ranks

        if nnodes is None:
            pytest.fail("real nodes need a node count: nodes(n, real=True) or nnodes=n",
                        pytrace=False)  # fmt: skip
        if unavailable_to_ranks():
            pytest.skip(f"real nodes: {unavailable_to_ranks()}")
    devices: tuple[str, ...] = ()
    under_xdist = "PYTEST_XDIST_WORKER" in os.environ
    if backend == "nccl":
        reason = gpu_skip_reason(world_size)
        if reason:
            pytest.skip(reason)
        devices = lease_devices(world_size, timeout_s=deadline)
    module = getattr(item, "module", None)
    extra = (module.__name__,) if module is not None else ()
    key = PoolKey(world_size, backend, debug, devices, nnodes, real_nodes)
    options = dict(
        extra_modules=extra,
        rank_fixtures=rank_fixtures,
        faults=tuple(faults),
        node_dirs=_node_dirs(item, nnodes),
    )
    try:
        return run_on_pool(key, fn, args, kwargs, deadline, **options)
    except RankSkipped as skip:
        pytest.skip(skip.reason)
    finally:
        if devices and under_xdist:
            # Other workers may need these GPUs: give them back between tests.
            close_pool(key)
            release_devices()


@pytest.fixture
def spawn(request: pytest.FixtureRequest, _refddp_world_size: int) -> Iterator[Callable]:
    """``spawn(fn, *args, world_size=2, backend=None, timeout=None, faults=(), nnodes=None,
    real_nodes=False, **kwargs) -> list``.

    Runs ``fn`` (any callable: lambdas and closures too) on every rank of an initialised
    process group; results ordered by rank.
    """

    def run(
        fn: Callable[..., Any],
        *args: Any,
        world_size: int | None = None,
        backend: str | None = None,
        timeout: float | None = None,
        faults: Iterable[Any] = (),
        nnodes: int | None = None,
        real_nodes: bool = False,
        **kwargs: Any,
    ) -> list[Any]:
        __tracebackhide__ = True
        size = world_size if world_size is not None else _refddp_world_size
        return _run_on_ranks(request.node, fn, args, kwargs, size, backend, timeout, (),
                             tuple(faults), nnodes, real_nodes)  # fmt: skip

    yield run


@pytest.fixture
def dist_ctx(request: pytest.FixtureRequest, _refddp_world_size: int) -> Any:
    """This rank's ``RankContext``: rank, world_size, local_rank, device, backend, and its
    simulated node (node_rank, local_world_size, node_tmp_path)."""
    from refddp.launch.dist import DistContext

    if not _is_rank_side(request.node):
        raise pytest.UsageError("dist_ctx is only available in tests marked @pytest.mark.multiproc")
    # A stand-in: each rank swaps in its own context before the test body runs.
    return DistContext(-1, _refddp_world_size, -1, "", "")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not _is_rank_side(pyfuncitem):
        return None
    __tracebackhide__ = True
    names = pyfuncitem._fixtureinfo.argnames
    made_on_ranks = tuple(name for name in names if name in RANK_FIXTURES)
    # The driver's own values of rank-made fixtures stay here; each rank fills in its own.
    kwargs = {name: None if name in made_on_ranks else pyfuncitem.funcargs[name] for name in names}
    world_size = pyfuncitem.funcargs["_refddp_world_size"]  # an autouse fixture: always there
    injected = tuple(f for m in pyfuncitem.iter_markers("faults") for f in m.args)
    _run_on_ranks(
        pyfuncitem, pyfuncitem.obj, (), kwargs, world_size, None, None, made_on_ranks, injected
    )
    return True
