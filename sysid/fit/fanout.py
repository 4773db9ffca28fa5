"""Fan-out of independent pieces of work as Ray tasks: the folds of ``sysid cv``, the timesteps of
``sysid sweep-dt`` (and of ``sysid fit``'s sweep) and the start batches and refinement fits of a
multi-start ``sysid fit`` (docs/fit.md, "Cross-validation" and "Convergence, starts and intervals").

One helper, ``run_tasks``, does what every fan-out needs:

- a local cluster of its own with ``workers`` CPUs, started and shut down around the work, unless
  Ray is initialised already (then that session is used as it is) or ``address`` joins one
  (``ray.init(address=...)``; "auto" finds a local cluster). The local cluster is this machine's
  alone: started whatever else runs (``address="local"``: not a ``ray start`` head, not the one a
  stale ``ray_current_cluster`` file names), its servers listening on 127.0.0.1 only, token
  authentication on (a token of this process unless one is configured: nothing written to
  ``~/.ray``), its session files in a temporary folder removed at shutdown, no dashboard;
- joining a cluster: the token of ``RAY_AUTH_TOKEN`` / ``RAY_AUTH_TOKEN_PATH`` / ``~/.ray/auth_token``
  is used when one exists (as Ray does for "auto"); a join that fails is one ``ConfigError`` naming
  the address and the reason (docs/cluster.md);
- one task per item (``num_cpus=1``, no retries), at most ``workers`` in flight; results in item
  order whatever order they finish in;
- the driver's ``sys.path`` and its allowed simulator paths (``allow_simulator``) handed to every
  task (a worker imports a simulator factory such as ``tests.helpers.fit_doubles:make_double`` as
  the driver does);
- a task that raises (or whose worker dies) is handed to ``on_error`` (its index and the error
  text) and the others still finish; without ``on_error`` the first failure is raised as
  ``FanoutError`` once every task is done;
- Ctrl-C (or any exception in the driver) cancels the outstanding tasks (``ray.cancel(force=True)``)
  and re-raises; a SIGTERM handler the caller installed (``sysid.app.signals``) stays in place
  (``ray.init`` would replace it with its own ``sys.exit``), so SIGTERM stops the work the same way.

``Fanout`` says where a fit's or a sweep's tasks may go. Warming the engine's kernel cache before a
local fan-out is the application's business (``sysid.app.warm``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sysid.errors import ConfigError, SysidError

if TYPE_CHECKING:
    from sysid.simulators.protocol import Simulator


class FanoutError(SysidError):
    """A Ray task failed (its error text is the message)."""


@dataclass(frozen=True)
class Fanout:
    """Where a multi-start fit's batches and refinement fits may go (``optimize(fanout=...)``):
    ``workers`` Ray workers (a local cluster of that many CPUs unless ``address`` joins one);
    ``make_sim``: a picklable zero-argument factory of the fit's simulator, called in each task
    (e.g. ``functools.partial(sysid.app.fitting.make_simulator, cfg, robot)``); None sends the
    simulator object itself (it must then pickle)."""

    workers: int | None = None
    address: str | None = None
    make_sim: Callable[[], Simulator] | None = None


def ray_module() -> Any:
    """``import ray``, or the user error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError("Ray is not installed: pip install 'sysid[cv]' (or 'ray>=2.9'), or run serially with "
                          "--workers 1") from None
    return ray


def check_workers(workers: int | None, address: str | None, what: str = "the work") -> None:
    """The user errors of ``--workers`` / ``--ray-address`` (before any work)."""
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise ConfigError(f"workers must be an integer >= 1, got {workers!r}")
    if address and workers == 1:
        raise ConfigError(f"workers 1 runs {what} serially in this process; drop the Ray address or give more "
                          "workers")


def wants_ray(workers: int | None, address: str | None) -> bool:
    """Whether a fan-out goes to Ray: an address, or more than one worker."""
    return bool(address) or (workers is not None and workers > 1)


LOOPBACK = "127.0.0.1"
_AUTH_FILE = os.path.join("~", ".ray", "auth_token")  # Ray's default token file
_POLL_S = 0.05  # [s] between checks for finished tasks
# [chars] the longest unix socket path of a session is ~83 characters below the folder its temp folder is made in
# (sysid-ray-XXXXXXXX/session_<date>_<time>_<us>_<pid>/sockets/plasma_store); the limit is 107
_SOCKET_ROOT_MAX = 24


def _init(ray: Any, workers: int | None, address: str | None) -> Callable[[], None] | None:
    """Initialise Ray unless it is; returns how to shut down what this call started (None when it
    started nothing)."""
    if ray.is_initialized():
        return None
    kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR}
    with _caller_sigterm():
        if address:
            _join(ray, address, kw)
            return ray.shutdown  # type: ignore[no-any-return]
        return _start_local(ray, workers or os.cpu_count() or 1, kw)


@contextlib.contextmanager
def _caller_sigterm() -> Iterator[None]:
    """Keep a SIGTERM handler the caller installed: ``ray.init`` replaces it with ``sys.exit``
    (a SIGTERM during ``ray.init`` goes to the caller's handler once Ray has cleaned up)."""
    main = threading.current_thread() is threading.main_thread()
    earlier = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    except SystemExit as exc:
        if exc.code == signal.SIGTERM and callable(earlier):
            signal.signal(signal.SIGTERM, earlier)
            earlier(signal.SIGTERM, None)
        raise
    finally:
        if main and callable(earlier):
            signal.signal(signal.SIGTERM, earlier)


def _start_local(ray: Any, cpus: int, kw: dict[str, Any]) -> Callable[[], None]:
    root = tempfile.gettempdir()
    tmp = tempfile.mkdtemp(prefix="sysid-ray-", dir=root if len(root) <= _SOCKET_ROOT_MAX else "/tmp")
    undo = _loopback_only(ray)
    _own_token(ray)

    def stop() -> None:
        try:
            ray.shutdown()
        finally:
            undo()
            shutil.rmtree(tmp, ignore_errors=True)

    try:
        ray.init(address="local", num_cpus=cpus, _node_ip_address=LOOPBACK, _temp_dir=tmp, **kw)
    except BaseException:
        stop()
        raise
    return stop


def _loopback_only(ray: Any) -> Callable[[], None]:
    """Ray takes 127.0.0.1 for the host's network address, and its servers then listen on every
    interface, unless multi-node clusters are off (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``: the
    environment of the processes it starts; ``ray_constants.ENABLE_RAY_CLUSTER``: this one, read
    when Ray was imported). Returns the undo."""
    env = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
    consts: Any = getattr(getattr(ray, "_private", None), "ray_constants", None)
    had_env, had_flag = os.environ.get(env), getattr(consts, "ENABLE_RAY_CLUSTER", None)
    os.environ[env] = "0"
    if had_flag is not None:
        consts.ENABLE_RAY_CLUSTER = False

    def undo() -> None:
        if had_env is None:
            os.environ.pop(env, None)
        else:
            os.environ[env] = had_env
        if had_flag is not None:
            consts.ENABLE_RAY_CLUSTER = had_flag

    return undo


def _token_configured() -> bool:
    return bool(os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")
                or os.path.exists(os.path.expanduser(_AUTH_FILE)))


def _own_token(ray: Any) -> None:
    """A token of this process for a local cluster when none is configured (Ray would write one to
    ``~/.ray/auth_token``, which then turns on token authentication for every later ``ray start``);
    an explicit ``RAY_AUTH_MODE`` is left as it is. The processes Ray starts inherit it."""
    if "RAY_AUTH_MODE" not in os.environ and not _token_configured():
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    _reload_token(ray)


def _reload_token(ray: Any) -> None:
    """Make this process read its token afresh: Ray caches the one it read first, and the environment
    may name another since (an earlier cluster's token of this process, replaced or restored), while the
    processes a cluster starts read the environment as it is: a stale cache is refused (InvalidAuthToken)."""
    loader = getattr(getattr(ray, "_raylet", None), "AuthenticationTokenLoader", None)
    if loader is not None:
        loader.instance().reset_cache()


def _join(ray: Any, address: str, kw: dict[str, Any]) -> None:
    """``ray.init(address=...)``; a failure is one ConfigError naming the address and the reason."""
    where = f"cannot join the Ray cluster at {address!r}"
    hostport = _host_port(address)
    if hostport is not None:
        try:
            socket.create_connection(hostport, timeout=5).close()
        except OSError as exc:
            raise ConfigError(f"{where}: nothing answers there ({exc.strerror or exc}); start its head with "
                              "`ray start --head --port PORT` (docs/cluster.md)") from None
    if "RAY_AUTH_MODE" not in os.environ and _token_configured():
        # Ray turns token authentication on by itself only for "auto"; a head started with a token needs it
        os.environ["RAY_AUTH_MODE"] = "token"
        config = getattr(getattr(ray, "_raylet", None), "Config", None)
        if config is not None:  # re-read RAY_AUTH_MODE, as Ray does when it turns it on
            config.initialize("")
    _reload_token(ray)
    log = tempfile.TemporaryFile(mode="w+b")
    try:
        with _stderr_to(log):  # Ray's core prints every failed connection attempt to stderr
            ray.init(address=address, **kw)
    except Exception as exc:  # noqa: BLE001 - whatever Ray raises, the user gets one line
        with contextlib.suppress(Exception):
            ray.shutdown()  # what the failed attempt set up in this process
        log.seek(0)
        raise ConfigError(f"{where}: {_join_reason(exc, log.read().decode(errors='replace'))}") from None
    finally:
        log.close()


def _host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of a plain ``host:port`` address (None for "auto", ``ray://...``)."""
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


@contextlib.contextmanager
def _stderr_to(f: Any) -> Iterator[None]:
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        os.dup2(f.fileno(), 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def _join_reason(exc: BaseException, log: str) -> str:
    chain = [exc]
    while chain[-1].__cause__ is not None and len(chain) < 8:
        chain.append(chain[-1].__cause__)
    text = " ".join([log, *(f"{type(e).__name__}: {e}" for e in chain)])
    if "InvalidAuthToken" in text or "Unauthenticated" in text:
        return ("the cluster refused this process's authentication token (InvalidAuthToken); give its token as "
                "RAY_AUTH_TOKEN, in the file RAY_AUTH_TOKEN_PATH names or in ~/.ray/auth_token (docs/cluster.md)")
    if "no authentication token was found" in text:
        return ("token authentication is on (RAY_AUTH_MODE=token) but no token was found; give the cluster's token "
                "as RAY_AUTH_TOKEN, in the file RAY_AUTH_TOKEN_PATH names or in ~/.ray/auth_token (docs/cluster.md)")
    last = chain[-1]
    lines = str(last).strip().splitlines() or [""]
    return f"{type(last).__name__}: {lines[0][:300]}"


@contextlib.contextmanager
def cluster(workers: int | None, address: str | None) -> Iterator[bool]:
    """One Ray session around several fan-outs (a fit's start batches, its refinement fits, the
    baseline's, the sweep): started here (and shut down on exit) when the work goes to Ray and Ray
    is not initialised; otherwise nothing. Yields whether it started a local one (not a join)."""
    if not wants_ray(workers, address):
        yield False
        return
    ray = ray_module()
    stop = _init(ray, workers, address)
    try:
        yield stop is not None and not address
    finally:
        if stop is not None:
            stop()


def _call(fn: Callable[..., Any], sys_path: Sequence[str], allowed: Sequence[str], *args: Any) -> Any:
    """A task's body: the driver's import path and allowed simulators, then ``fn(*args)``."""
    from sysid.simulators.protocol import allow_simulator

    for p in sys_path:
        if p not in sys.path:
            sys.path.append(p)
    for path in allowed:
        allow_simulator(path)
    return fn(*args)


def _error_text(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None)  # ray.exceptions.RayTaskError wraps the task's exception
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {cause}"
    last = (str(exc).strip().splitlines() or [""])[-1]
    return f"{type(exc).__name__}: {last}"


def run_tasks(
    fn: Callable[..., Any],
    items: Sequence[Sequence[Any]],
    workers: int | None = None,
    address: str | None = None,
    *,
    shared: Sequence[Any] = (),
    on_done: Callable[[int, Any], None] | None = None,
    on_error: Callable[[int, str], Any] | None = None,
) -> tuple[list[Any], dict[str, Any]]:
    """``[fn(*shared, *item) for item in items]`` as Ray tasks; returns (results in item order,
    execution info). ``shared`` arguments are put in Ray's object store once (large inputs such as
    the runs) and passed to every task. ``on_done(index, result)`` as each finishes (completion
    order); ``on_error(index, text)`` returns the result recorded for a failed task (see the module
    docstring)."""
    from sysid.simulators.protocol import allowed_simulators

    ray = ray_module()
    stop = _init(ray, workers, address)
    info: dict[str, Any] = {"backend": "ray", "ray_version": ray.__version__, "address": address,
                            "cluster_cpus": float(ray.cluster_resources().get("CPU", 0.0)),
                            "started_cluster": stop is not None and not address}
    task = ray.remote(num_cpus=1, max_retries=0)(_call)
    sys_path = [p for p in sys.path if p]
    allowed = allowed_simulators()
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    pending: dict[Any, int] = {}
    queue = list(enumerate(items))
    limit = workers or len(items) or 1  # tasks in flight (a cluster may have more CPUs than workers)
    try:
        refs = [ray.put(s) for s in shared]
        while queue or pending:
            while queue and len(pending) < limit:
                i, item = queue.pop(0)
                pending[task.remote(fn, sys_path, allowed, *refs, *item)] = i
            done, _rest = ray.wait(list(pending), num_returns=1, timeout=0)
            if not done:
                # wait here, not inside Ray: a signal during ray.wait comes back as a plain KeyboardInterrupt
                # (Ray catches the caller's exception), losing which signal it was
                time.sleep(_POLL_S)
                continue
            for ref in done:
                i = pending.pop(ref)
                try:
                    out = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - the task raised, or its worker died
                    text = _error_text(exc)
                    if on_error is None:
                        errors[i] = text
                        continue
                    out = on_error(i, text)
                results[i] = out
                if on_done:
                    on_done(i, out)
    except BaseException:
        for ref in pending:
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001, S110 - best effort: the task may have finished meanwhile
                pass
        raise
    finally:
        if stop is not None:
            stop()
    if errors:
        i = min(errors)
        raise FanoutError(f"task {i + 1} of {len(items)} failed on Ray: {errors[i]}")
    return [results[i] for i in range(len(items))], info
