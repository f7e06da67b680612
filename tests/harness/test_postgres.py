"""`tune --storage postgresql://...` against a real, throwaway PostgreSQL server, as a cluster would use it:
two `tune` processes share one study and finish exactly its budget, and a trial whose process was killed is
failed (its heartbeat stopped) and retried by the next process.

The server is Debian's package (`make postgres` installs it): initdb in a temporary folder, bound to
127.0.0.1 on a free port, trust authentication, stopped and deleted afterwards. PostgreSQL refuses to run as
root, so under root it runs as the `postgres` user (or `nobody`) through runuser. Skipped, with the reason,
where the server or the Python driver is missing."""

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

optuna = pytest.importorskip("optuna")


def _server_binaries() -> Path | None:
    """Debian keeps the server programs in /usr/lib/postgresql/<version>/bin, off the PATH."""
    on_path = shutil.which("pg_ctl")
    if on_path:
        return Path(on_path).resolve().parent
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0)
    return found[-1].parent if found else None


def _as_server_user() -> tuple[list[str], str | None]:
    """The command prefix that runs the server's programs, and the user that owns its files (None: us)."""
    if os.geteuid() != 0:
        return [], None
    for user in ("postgres", "nobody"):
        try:
            pwd.getpwnam(user)
        except KeyError:
            continue
        return ["runuser", "-u", user, "--"], user
    pytest.skip("running as root and neither a 'postgres' nor a 'nobody' user exists to run PostgreSQL as")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def postgres_url():
    binaries = _server_binaries()
    if binaries is None:
        pytest.skip("PostgreSQL is not installed: `make postgres` installs Debian's postgresql package")
    try:
        import psycopg  # noqa: F401 - SQLAlchemy's postgresql+psycopg driver
    except ImportError:
        pytest.skip("the psycopg driver is not installed: pip install -e '.[dev]'")
    prefix, user = _as_server_user()
    home = Path(tempfile.mkdtemp(prefix="attnbench-pg-"))
    if user:
        shutil.chown(home, user)
    data, port = home / "data", _free_port()
    run = lambda *argv: subprocess.run([*prefix, *map(str, argv)], capture_output=True, text=True, timeout=120)  # noqa: E731
    made = run(binaries / "initdb", "-D", data, "-U", "attnbench", "--auth=trust", "--no-sync")
    assert made.returncode == 0, made.stderr[-2000:]
    started = run(binaries / "pg_ctl", "-D", data, "-l", home / "server.log", "-w", "-t", "60",
                  "-o", f"-c listen_addresses=127.0.0.1 -p {port} -k {home} -c fsync=off", "start")
    assert started.returncode == 0, started.stderr[-2000:] + (home / "server.log").read_text()[-2000:]
    try:
        yield f"postgresql+psycopg://attnbench@127.0.0.1:{port}/postgres"
    finally:
        run(binaries / "pg_ctl", "-D", data, "-m", "immediate", "stop")
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def fresh_study_storage(postgres_url):
    """Each test its own database on the shared server, so that studies never meet."""
    import psycopg

    name = f"t{time.time_ns()}"
    base = postgres_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(base, autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {name}")
    return postgres_url.rsplit("/", 1)[0] + f"/{name}"


def _tune(storage, tmp_path, *extra):
    return [sys.executable, "-m", "harness.cli", "tune", "cora", "fenchel", "--storage", storage, "--runs-dir", str(tmp_path / "runs"),
            "--params-dir", str(tmp_path / "params"), *extra]


@pytest.fixture
def env(shared_data):
    return {**os.environ, "OMP_NUM_THREADS": "1", "ATTNBENCH_DATA": str(shared_data), "PYTHONPATH": str(REPO)}


@pytest.fixture
def quick_heartbeats(env):
    """A 2 s grace period, so that the killed trial is found stale at once. Only where one process runs at a
    time: on a loaded machine a live process can miss a 1 s heartbeat by more than 2 s, and a second process
    would then fail its trial as if it had been killed."""
    return {**env, "ATTNBENCH_TUNE_HEARTBEAT_S": "1", "ATTNBENCH_TUNE_GRACE_S": "2"}


def _states(storage):
    names = optuna.get_all_study_names(storage)
    assert len(names) == 1, names
    return sorted(t.state.name for t in optuna.load_study(study_name=names[0], storage=storage).trials)


def test_two_processes_on_one_study_finish_exactly_its_budget(fresh_study_storage, env, tmp_path):
    budget = 4
    command = _tune(fresh_study_storage, tmp_path, "--trials", str(budget), "--set", "max_epochs=4", "--set", "patience=4")
    optuna.storages.RDBStorage(fresh_study_storage)  # the schema once, before the two processes race for it
    processes = [subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
    outputs = [p.communicate(timeout=600) for p in processes]
    for process, (out, err) in zip(processes, outputs):
        assert process.returncode == 0, err[-2000:]
    states = _states(fresh_study_storage)
    assert sum(s in ("COMPLETE", "PRUNED") for s in states) == budget, states
    assert all("trial" in out for out, _ in outputs), "both processes ran trials of the study"
    assert (tmp_path / "runs" / "params" / "cora" / "fenchel.yaml").is_file()  # beside the study; not promoted


def test_a_killed_trial_is_failed_and_retried_on_postgres(fresh_study_storage, quick_heartbeats, tmp_path):
    env = quick_heartbeats
    storage = fresh_study_storage
    command = _tune(storage, tmp_path, "--trials", "1", "--set", "max_epochs=150", "--set", "patience=150")
    optuna.storages.RDBStorage(storage)
    log = tmp_path / "victim.log"
    victim = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=log.open("w"))
    deadline, running = time.monotonic() + 300, False
    while time.monotonic() < deadline and victim.poll() is None and not running:
        names = optuna.get_all_study_names(storage)
        running = bool(names) and any(t.state.name == "RUNNING" for t in optuna.load_study(study_name=names[0], storage=storage).trials)
        time.sleep(0.2)
    assert running, f"the tune process never started a trial (exit code {victim.poll()}): {log.read_text()[-2000:]}"
    time.sleep(1.5)  # a heartbeat or two recorded
    assert victim.poll() is None, "the trial finished before it could be killed; make it longer"
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    time.sleep(2.5)  # past the grace period
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert _states(storage) == ["COMPLETE", "FAIL"]
    study = optuna.load_study(study_name=optuna.get_all_study_names(storage)[0], storage=storage)
    retried = next(t for t in study.trials if t.state.name == "COMPLETE")
    assert retried.user_attrs.get("defaults") is True  # the killed trial's configuration ran again
