"""Table leases and the conditional store operations under them, on file:// and the moto S3 server."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from iceberg_cdc.coordination import LeaseInfo, TableLease, lease_key, probe_conditional_writes
from iceberg_cdc.coordination.heartbeat import LeaseHeartbeat
from iceberg_cdc.errors import LeaseHeldError, LeaseLostError, StorageError
from iceberg_cdc.storage import LocalObjectStore, ObjectStore, open_store
from iceberg_cdc.storage.s3 import S3ObjectStore
from iceberg_cdc.storage.s3 import s3_client as make_s3_client

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
RUN_A = "scheduled__2025-03-01T12:00:00+00:00"
RUN_B = "manual__2025-03-01T12:05:00.123456+00:00"
RUN_C = "backfill__2025-02-01T00:00:00+00:00"


def at(seconds: float) -> Callable[[], datetime]:
    return lambda: T0 + timedelta(seconds=seconds)


class AtomicMotoStore(S3ObjectStore):
    """An S3 store whose conditional requests never overlap within this process.

    moto 5.2.5 checks a precondition and then writes without a lock, so two
    concurrent conditional PUTs on its threaded server can both pass
    (measured: about 1 in 500 four-way takeover races). AWS S3 evaluates
    each conditional request atomically; this lock gives moto that property,
    so the races below test the lease protocol (reads and conditional
    requests interleaving across runs), not moto.
    """

    _lock = threading.Lock()

    def put_if_absent(self, key, data):
        with self._lock:
            return super().put_if_absent(key, data)

    def put_if_version(self, key, data, version):
        with self._lock:
            return super().put_if_version(key, data, version)

    def delete_if_version(self, key, version):
        with self._lock:
            return super().delete_if_version(key, version)


@pytest.fixture(scope="module")
def shared_s3_client(s3_properties):
    """One boto3 client (thread-safe) for every S3 store here: making one costs ~0.1 s."""
    return make_s3_client(s3_properties)


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def new_store(request) -> Callable[[], ObjectStore]:
    """Makes store objects on one fresh, empty location (as separate processes would)."""
    if request.param == "file":
        root = request.getfixturevalue("tmp_path") / "store"
        return lambda: LocalObjectStore(root)
    uri = f"s3://{request.getfixturevalue('s3_bucket')}/shuffle"
    client = request.getfixturevalue("shared_s3_client")
    return lambda: AtomicMotoStore(uri, client)


@pytest.fixture
def store(new_store) -> ObjectStore:
    return new_store()


# --- keys ---------------------------------------------------------------------


def test_lease_key_is_deterministic_and_safe():
    assert lease_key("shop.orders") == "_leases/shop.orders.json"
    assert lease_key(("shop", "orders")) == "_leases/shop.orders.json"
    odd = lease_key("db/ns:t+1 x")
    assert odd == lease_key("db/ns:t+1 x")
    name = odd.removeprefix("_leases/")
    assert not set(name) & set("/:+ ")
    assert lease_key("a:b") != lease_key("a_b") != lease_key("a+b")
    assert len(lease_key("x" * 1000)) < 200
    with pytest.raises(ValueError):
        lease_key("")


# --- conditional store operations -----------------------------------------------


def test_conditional_operations(store):
    key = "_leases/t.json"
    assert store.get_with_version(key) is None
    assert store.put_if_version(key, b"x", "0" * 32) is None  # missing: not done, no error
    assert store.delete_if_version(key, "0" * 32) is False

    v1 = store.put_if_absent(key, b"one")
    assert v1
    assert store.get_with_version(key) == (b"one", v1)
    assert store.put_if_absent(key, b"two") is None  # exists: 412 handled, nothing written
    assert store.get(key) == b"one"

    assert store.put_if_version(key, b"two", "0" * 32) is None  # wrong version
    v2 = store.put_if_version(key, b"two", v1)
    assert v2 and v2 != v1
    assert store.put_if_version(key, b"three", v1) is None  # stale version
    assert store.get_with_version(key) == (b"two", v2)

    assert store.delete_if_version(key, v1) is False  # stale version: kept
    assert store.get(key) == b"two"
    assert store.delete_if_version(key, v2) is True
    assert store.get_with_version(key) is None
    assert store.list("_leases/") == []  # the file store's sidecar lock is never listed

    assert store.requests["PUT"] >= 5 and store.requests["DELETE"] >= 3 and store.requests["GET"] >= 4


@pytest.mark.s3
def test_s3_conditional_errors_are_storage_errors(s3_properties):
    gone = open_store(f"s3://no-such-bucket-{uuid.uuid4().hex[:12]}/x", s3_properties)
    with pytest.raises(StorageError, match="does not exist"):
        gone.put_if_absent("_leases/t.json", b"x")
    with pytest.raises(StorageError, match="does not exist"):
        gone.get_with_version("_leases/t.json")


def test_probe_conditional_writes(store):
    probe_conditional_writes(store)
    assert store.list("_leases/") == []


def test_probe_detects_a_store_that_ignores_conditions(tmp_path):
    class Careless(LocalObjectStore):
        def put_if_absent(self, key, data):
            self.put(key, data)
            return "v"

    with pytest.raises(StorageError, match="does not honour conditional writes"):
        probe_conditional_writes(Careless(tmp_path))


# --- acquire / release ------------------------------------------------------------


def test_acquire_and_release(store):
    lease = TableLease(store, "shop.orders", clock=at(0))
    assert lease.current() is None
    info = lease.acquire(RUN_A, ttl_seconds=3600, dag_id="cdc__shop__orders", try_number=2)
    assert (info.owner, info.table, info.acquired_at, info.expires_at, info.epoch) == (
        RUN_A,
        "shop.orders",
        T0,
        T0 + timedelta(hours=1),
        1,
    )
    assert (info.dag_id, info.try_number, info.released) == ("cdc__shop__orders", 2, False)
    assert lease.uri == store.describe("_leases/shop.orders.json")
    assert lease.current() == info and lease.held() == info

    doc = json.loads(store.get("_leases/shop.orders.json"))
    assert doc["owner"] == RUN_A and doc["host"] and doc["epoch"] == 1
    assert doc["acquired_at"] == "2025-03-01T12:00:00.000+00:00"
    assert doc["expires_at"] == "2025-03-01T13:00:00.000+00:00"

    assert lease.release(RUN_A, info.epoch) is True
    tombstone = lease.current()
    assert tombstone.released and tombstone.epoch == 1 and lease.held() is None
    assert lease.release(RUN_A) is False  # idempotent
    again = TableLease(store, "shop.orders").acquire(RUN_B, 60)
    assert again.owner == RUN_B and again.epoch == 2  # epochs only grow, across releases too


def test_second_acquire_fails_with_a_helpful_message(store):
    TableLease(store, "shop.orders", clock=at(0)).acquire(RUN_A, ttl_seconds=3600, dag_id="cdc__shop__orders")
    other = TableLease(store, "shop.orders", clock=at(600))
    with pytest.raises(LeaseHeldError) as caught:
        other.acquire(RUN_B, ttl_seconds=3600)
    message = str(caught.value)
    for part in (
        "'shop.orders'",
        RUN_A,
        RUN_B,
        "of DAG cdc__shop__orders",
        "epoch 1",
        "since 2025-03-01T12:00:00.000+00:00",
        "until 2025-03-01T13:00:00.000+00:00",
        "Wait for that run to finish",
        "mark it failed in Airflow",
        other.uri,
    ):
        assert part in message
    assert other.current().owner == RUN_A  # unchanged
    assert TableLease(store, "shop.customers").acquire(RUN_B, 60).owner == RUN_B  # other tables are free


def test_same_run_acquires_again_with_a_new_epoch(store):
    """A retried detect of the same run supersedes its earlier attempt: new epoch, old one fenced out."""
    first = TableLease(store, "t", clock=at(0)).acquire(RUN_A, 100)
    again = TableLease(store, "t", clock=at(50)).acquire(RUN_A, 100)
    assert again.epoch == first.epoch + 1
    assert again.expires_at == T0 + timedelta(seconds=150)
    assert again.version != first.version
    with pytest.raises(LeaseLostError):
        TableLease(store, "t", clock=at(60)).renew(RUN_A, first.epoch, 100)


def test_expired_lease_is_taken_over(store):
    dead = TableLease(store, "shop.orders", clock=at(0))
    old = dead.acquire(RUN_A, ttl_seconds=60)
    with pytest.raises(LeaseHeldError):
        TableLease(store, "shop.orders", clock=at(59)).acquire(RUN_B, 60)

    later = TableLease(store, "shop.orders", clock=at(60))
    info = later.acquire(RUN_B, ttl_seconds=60)
    assert (info.owner, info.acquired_at, info.expires_at, info.epoch) == (
        RUN_B,
        T0 + timedelta(seconds=60),
        T0 + timedelta(seconds=120),
        old.epoch + 1,
    )

    # the old holder comes back: it cannot release or renew the new owner's lease
    assert dead.release(RUN_A, old.epoch) is False
    with pytest.raises(LeaseLostError, match="has lost the lease"):
        dead.renew(RUN_A, old.epoch, 60)
    assert later.current() == info


def test_takeover_asks_airflow_about_the_holder(store):
    """Finished in Airflow: taken over at once. Running in Airflow: one more TTL of grace."""
    TableLease(store, "t", clock=at(0)).acquire(RUN_A, 60, dag_id="cdc__t")
    finished = TableLease(store, "t", clock=at(10)).acquire(RUN_B, 60, holder_state=lambda info: "finished")
    assert finished.owner == RUN_B

    running = lambda info: "running"  # noqa: E731
    with pytest.raises(LeaseHeldError, match="Airflow still shows that run as running"):
        TableLease(store, "t", clock=at(10 + 60 + 30)).acquire(RUN_C, 60, holder_state=running)
    taken = TableLease(store, "t", clock=at(10 + 120)).acquire(RUN_C, 60, holder_state=running)
    assert taken.owner == RUN_C

    def broken(info):
        raise RuntimeError("API server unreachable")

    # Airflow cannot be asked: expiry alone decides
    assert (
        TableLease(store, "t", clock=at(10 + 120 + 60)).acquire(RUN_A, 60, holder_state=broken).owner == RUN_A
    )


def test_a_holder_whose_task_died_is_taken_over_at_expiry(store):
    """Airflow shows a task of the holder's run running while its lease expired: that task stopped
    renewing (every task renews while it runs), so the table is taken at expiry, not one TTL later."""
    TableLease(store, "t", clock=at(0)).acquire(RUN_A, 60, dag_id="cdc__t")
    working = lambda info: "working"  # noqa: E731
    with pytest.raises(LeaseHeldError):  # alive until its lease expires
        TableLease(store, "t", clock=at(59)).acquire(RUN_B, 60, holder_state=working)
    taken = TableLease(store, "t", clock=at(61)).acquire(RUN_B, 60, holder_state=working)
    assert taken.owner == RUN_B and taken.epoch == 2
    # Between tasks (queued for a slot) it would still have had one more TTL.
    TableLease(store, "u", clock=at(0)).acquire(RUN_A, 60, dag_id="cdc__u")
    with pytest.raises(LeaseHeldError, match="one more TTL of grace"):
        TableLease(store, "u", clock=at(61)).acquire(RUN_B, 60, holder_state=lambda info: "running")


def test_a_lost_lease_names_the_knob_the_config_accepts(store):
    """The message names tables[].lease_ttl (a key the config takes) and the environment override."""
    from iceberg_cdc.config import parse_config

    TableLease(store, "t", clock=at(0)).acquire(RUN_A, 60)
    TableLease(store, "t", clock=at(200)).acquire(RUN_B, 60)
    with pytest.raises(LeaseLostError) as lost:
        TableLease(store, "t", clock=at(201)).renew(RUN_A, 1, 60)
    message = str(lost.value)
    assert "tables[].lease_ttl" in message and "CDC_LEASE_TTL_SECONDS" in message
    assert "shuffle.lease_ttl" not in message
    config = parse_config(
        {
            "catalog": {"name": "c"},
            "shuffle": {"uri": "s3://b/p"},
            "tables": [
                {"source": "a.b", "sink": "a.c", "lease_ttl": "90s"},
                {"source": "a.d", "sink": "a.e"},
            ],
        }
    )
    assert config.tables[0].lease_ttl == 90.0 and config.tables[1].lease_ttl is None


def test_release_by_a_non_owner_does_not_release(store):
    lease = TableLease(store, "t")
    held = lease.acquire(RUN_A, 60)
    assert lease.release(RUN_B) is False
    assert lease.release(RUN_A, held.epoch + 1) is False  # another epoch of the same run
    assert lease.current() == held


def test_renew_extends(store):
    lease = TableLease(store, "t", clock=at(0))
    held = lease.acquire(RUN_A, 60)
    lease._clock = at(50)
    renewed = lease.renew(RUN_A, held.epoch, 60)
    assert renewed.expires_at == T0 + timedelta(seconds=110)
    assert renewed.acquired_at == held.acquired_at and renewed.epoch == held.epoch
    assert renewed.version != held.version
    assert lease.current() == renewed

    lease._clock = at(200)  # expired, but nobody took it over: still ours
    assert lease.renew(RUN_A, held.epoch, 60).expires_at == T0 + timedelta(seconds=260)

    with pytest.raises(LeaseLostError, match="has lost the lease"):
        lease.renew(RUN_B, None, 60)
    assert lease.release(RUN_A, held.epoch)
    with pytest.raises(LeaseLostError, match="it was released"):
        lease.renew(RUN_A, held.epoch, 60)


def test_release_does_not_touch_a_lease_that_changed_after_reading(store):
    """Between release's read and its write the lease expired and was taken over."""
    lease = TableLease(store, "t", clock=at(0))
    stale = lease.acquire(RUN_A, 10)
    taken = TableLease(store, "t", clock=at(20)).acquire(RUN_B, 60)
    reads = iter([stale])
    real_current = lease.current
    lease.current = lambda: next(reads, None) or real_current()
    assert lease.release(RUN_A) is False
    assert real_current() == taken


def test_hold_releases_on_exit_and_on_error(store):
    lease = TableLease(store, "t")
    with lease.hold(RUN_A, 60) as info:
        assert lease.current() == info
    assert lease.held() is None
    with pytest.raises(RuntimeError), lease.hold(RUN_A, 60):
        raise RuntimeError("task failed")
    assert lease.held() is None


def test_heartbeat_renews_and_reports_a_lost_lease(store):
    lease = TableLease(store, "t")
    held = lease.acquire(RUN_A, 60)
    lost = []
    with LeaseHeartbeat(lease, RUN_A, held.epoch, 60, interval_seconds=0.05, on_lost=lost.append) as beat:
        deadline = time.monotonic() + 10
        while beat.renewals < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert beat.renewals >= 2
        lease.release(RUN_A, held.epoch)
        TableLease(store, "t").acquire(RUN_B, 60)
        while not lost and time.monotonic() < deadline:
            time.sleep(0.02)
    assert lost and isinstance(lost[0], LeaseLostError)
    with pytest.raises(LeaseLostError):
        beat.check()


def test_a_write_whose_answer_was_lost_still_counts(store, monkeypatch):
    """A conditional PUT that succeeded but whose response was lost (then 412 on retry)."""
    for name in ("put_if_absent", "put_if_version"):
        real = getattr(store, name)

        def lost(*args, _real=real):
            _real(*args)
            return None

        monkeypatch.setattr(store, name, lost)
    lease = TableLease(store, "t", clock=at(0))
    held = lease.acquire(RUN_A, 60)
    assert held.owner == RUN_A  # via put_if_absent
    assert lease.renew(RUN_A, held.epoch, 60).owner == RUN_A  # via put_if_version
    taken = TableLease(store, "t", clock=at(100)).acquire(RUN_B, 60)  # takeover via put_if_version
    assert taken.owner == RUN_B and lease.current() == taken


def test_corrupt_lease_object_is_reported(store):
    store.put("_leases/t.json", b"{not json")
    with pytest.raises(
        StorageError, match=r"_leases/t\.json is not a valid lease.*delete that object by hand"
    ):
        TableLease(store, "t").acquire(RUN_A, 60)


def test_lease_times_must_be_aware(store):
    with pytest.raises(ValueError, match="timezone-aware"):
        TableLease(store, "t", clock=lambda: datetime(2025, 1, 1)).acquire(RUN_A, 60)
    with pytest.raises(ValueError, match="TTL"):
        TableLease(store, "t").acquire(RUN_A, 0)


# --- races ------------------------------------------------------------------------


def _race(
    stores: list[ObjectStore], table: str, clock: Callable[[], datetime]
) -> list[LeaseInfo | Exception]:
    """Every store's thread tries to acquire ``table`` at the same moment."""
    barrier = threading.Barrier(len(stores))
    results: list[LeaseInfo | Exception] = [RuntimeError("did not run")] * len(stores)

    def run(i: int) -> None:
        lease = TableLease(stores[i], table, clock=clock)
        barrier.wait()
        try:
            results[i] = lease.acquire(f"run-{i}:+00:00", ttl_seconds=60)
        except LeaseHeldError as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def _exactly_one_winner(results: list[LeaseInfo | Exception], store: ObjectStore, table: str) -> None:
    winners = [r for r in results if isinstance(r, LeaseInfo)]
    losers = [r for r in results if isinstance(r, LeaseHeldError)]
    assert len(winners) == 1 and len(losers) == len(results) - 1, results
    assert TableLease(store, table).current() == winners[0]
    assert all(winners[0].owner in str(loser) for loser in losers)


@pytest.mark.parametrize("expired", [True, False], ids=["takeover", "fresh"])
def test_concurrent_acquires_have_exactly_one_winner(new_store, expired):
    s3 = isinstance(new_store(), S3ObjectStore)
    threads, rounds = (4, 10) if s3 else (6, 40)
    stores = [new_store() for _ in range(threads)]
    for round_ in range(rounds):
        table = f"shop.race{round_}"
        if expired:
            TableLease(stores[0], table, clock=at(0)).acquire("dead-run", ttl_seconds=60)
        _exactly_one_winner(_race(stores, table, at(3600)), stores[0], table)


def _acquire_in_process(root: str, table: str, owner: str, barrier, queue) -> None:
    lease = TableLease(LocalObjectStore(root), table, clock=at(3600))
    barrier.wait()
    try:
        queue.put((owner, lease.acquire(owner, 60).owner))
    except LeaseHeldError:
        queue.put((owner, None))


def test_file_takeover_race_across_processes(tmp_path):
    context = multiprocessing.get_context("fork")
    root = str(tmp_path / "store")
    store = LocalObjectStore(root)
    for round_ in range(4):
        table = f"t{round_}"
        TableLease(store, table, clock=at(0)).acquire("dead-run", 60)
        barrier, queue = context.Barrier(4), context.Queue()
        procs = [
            context.Process(target=_acquire_in_process, args=(root, table, f"p{i}", barrier, queue))
            for i in range(4)
        ]
        for proc in procs:
            proc.start()
        results = [queue.get(timeout=30) for _ in procs]
        for proc in procs:
            proc.join(timeout=30)
        winners = [owner for owner, won in results if won]
        assert len(winners) == 1, results
        assert TableLease(store, table).current().owner == winners[0]


def test_heartbeat_retries_store_errors_and_fails_on_anything_else(store, monkeypatch):
    """A store error costs one beat; a bug stops the renewals and fails the block, never silently."""
    lease = TableLease(store, "t")
    held = lease.acquire(RUN_A, 60)
    real_renew = TableLease.renew
    errors = [StorageError("503 after retries"), StorageError("503 after retries")]

    def flaky(self, *args, **kwargs):
        if errors:
            raise errors.pop()
        return real_renew(self, *args, **kwargs)

    monkeypatch.setattr(TableLease, "renew", flaky)
    with LeaseHeartbeat(lease, RUN_A, held.epoch, 60, interval_seconds=0.02) as beat:
        deadline = time.monotonic() + 10
        while beat.renewals < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
    assert beat.renewals >= 2 and not errors and beat.failed is None
    beat.check()

    def bug(self, *args, **kwargs):
        raise AttributeError("a bug in the renewal")

    monkeypatch.setattr(TableLease, "renew", bug)
    deadline = time.monotonic() + 10
    # The block succeeded: the heartbeat's error fails it.
    with (
        pytest.raises(AttributeError, match="renewal"),
        LeaseHeartbeat(lease, RUN_A, held.epoch, 60, interval_seconds=0.02) as beat,
    ):
        while beat.failed is None and time.monotonic() < deadline:
            time.sleep(0.02)
    with pytest.raises(AttributeError):
        beat.check()
    deadline = time.monotonic() + 10
    with pytest.raises(KeyError), LeaseHeartbeat(lease, RUN_A, held.epoch, 60, interval_seconds=0.02) as beat:
        while beat.failed is None and time.monotonic() < deadline:
            time.sleep(0.02)
        raise KeyError("the block's own error matters more")
