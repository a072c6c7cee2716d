"""Verified mirrors: drift made behind the product's back is found, named, and repaired exactly.

A real changelog pipeline (in process, SQLite catalog), a PostgreSQL mirror on
a real server and an Iceberg mirror (merge-on-read). Drift is made directly in
each target -- a changed value, a deleted row, a foreign row, a row deleted
through pyiceberg -- then ``verify --no-repair`` must name every drifted key
and change nothing, ``verify`` must repair to exact equality, and the next
sync and verify must raise no false alarm.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.expressions import EqualTo

from cdc_devtools.cow import cow_merge, table_state
from cdc_devtools.inline_mirror import run_mirror
from cdc_devtools.inline_pipeline import SINK, SOURCE, InlinePipeline
from cdc_devtools.mirror_check import compare, verdict
from cdc_devtools.orders import BY_REGION, SCHEMA, rows
from iceberg_cdc.mirror.postgres.connection import connect
from iceberg_cdc.mirror.postgres.target import PostgresTarget
from iceberg_cdc.mirror.steps import mirror_lease
from iceberg_cdc.mirror.verify.check import verify_mirror
from iceberg_cdc.mirror.verify.cli import main as verify_cli
from iceberg_cdc.run.context import Context

ICEBERG_MIRROR = "mirrors.orders"


class TwoMirrors(InlinePipeline):
    def __init__(self, tmp, dsn: str, schema: str) -> None:
        self.dsn = dsn
        self.pg_table = f"{schema}.orders"
        mirrors = [
            {"type": "postgres", "dsn": dsn, "table": self.pg_table, "name": "pg"},
            {"type": "iceberg", "table": ICEBERG_MIRROR, "name": "ice"},
        ]
        super().__init__(tmp, table={"mirrors": mirrors})
        self.catalog.create_namespace_if_not_exists("mirrors")
        self.config_path = tmp / "cdc.yaml"
        import yaml

        self.config_path.write_text(yaml.safe_dump(self.raw))

    def sync(self) -> None:
        self.catch_up()
        run_mirror(self.config, SOURCE, "pg")
        run_mirror(self.config, SOURCE, "ice")

    def pg(self, statement: str) -> None:
        connection = connect(self.dsn)
        try:
            connection.cursor().execute(statement)
            connection.commit()
        finally:
            connection.close()

    @property
    def target(self) -> PostgresTarget:
        return PostgresTarget(self.dsn, self.pg_table, changelog=SINK, source=SOURCE)

    def exact(self) -> None:
        assert verdict(self.source, self.target).exact
        self.exact_iceberg()

    def exact_iceberg(self) -> None:
        ice = self.catalog.load_table(ICEBERG_MIRROR)
        from iceberg_cdc.mirror.iceberg.steps import watermark

        ctx = Context.of(self.config, SOURCE)
        result = compare(
            self.source, watermark(ctx, ctx.table.mirror("ice")), ice.scan().to_arrow(), pg=False
        )
        assert result.exact, result


@pytest.fixture
def two(tmp_path, postgres_server, pg_schema) -> TwoMirrors:
    p = TwoMirrors(tmp_path, postgres_server.dsn, pg_schema)
    p.create_source(SCHEMA, partition_spec=BY_REGION)
    p.source.append(rows(range(200), region=["us", "eu", "apac"] * 66 + ["us", "eu"]))
    p.sync()
    cow_merge(p.source, upserts=rows(range(0, 40, 4), region="eu", status="v1"), delete_keys=[199])
    p.sync()
    p.exact()
    return p


def _drift(p: TwoMirrors) -> None:
    """Drift behind the product's back: changed, deleted and foreign rows in PostgreSQL; in the Iceberg
    mirror a row deleted and another appended twice, through pyiceberg."""
    p.pg(f"UPDATE {p.pg_table} SET status = 'tampered' WHERE id = 7")
    p.pg(f"DELETE FROM {p.pg_table} WHERE id = 11")
    p.pg(f"INSERT INTO {p.pg_table} (id, region, status) VALUES (5000, 'us', 'foreign')")
    ice = p.catalog.load_table(ICEBERG_MIRROR)
    ice.delete(EqualTo("id", 13))
    ice.append(ice.scan(row_filter=EqualTo("id", 14)).to_arrow())  # a key held twice


def test_verify_names_drift_without_changing_anything_then_repairs_it(two, capsys):
    p = two
    _drift(p)
    before_pg = p.target.read_rows().sort_by("id")
    before_ice = p.catalog.load_table(ICEBERG_MIRROR).current_snapshot().snapshot_id
    code = verify_cli(["--config", str(p.config_path), "--no-repair"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "id=7" in out and "id=11" in out and "id=5000" in out and "id=13" in out, out
    assert "changed id=7" in out and "missing id=11" in out and "foreign id=5000" in out
    assert "missing id=13" in out and "changed id=14" in out
    assert p.target.read_rows().sort_by("id").equals(before_pg)  # REPAIR=0 changed nothing
    assert p.catalog.load_table(ICEBERG_MIRROR).current_snapshot().snapshot_id == before_ice
    assert not verdict(p.source, p.target).exact

    code = verify_cli(["--config", str(p.config_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "repaired" in out
    p.exact()

    # The next sync and verify: no false alarm.
    cow_merge(p.source, upserts=rows(range(1, 40, 5), region="us", status="v2"), delete_keys=[3])
    p.sync()
    p.exact()
    code = verify_cli(["--config", str(p.config_path), "--no-repair"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count("equal to the source") == 2, out


def test_an_equal_mirror_verifies_equal_with_one_scan_of_each_side(two):
    p = two
    ctx = Context.of(p.config, SOURCE)
    for name in ("pg", "ice"):
        mirror = ctx.table.mirror(name)
        with mirror_lease(ctx, mirror).hold("t", 60) as held:
            result = verify_mirror(ctx, mirror, repair=True, run_id="t", epoch=held.epoch)
        assert result.status == "equal", result
        assert (
            result.rows_source
            == result.rows_mirror
            == table_state(p.source, p.source.current_snapshot().snapshot_id).num_rows
        )
        assert "compare" not in result.seconds  # no second pass when every bucket agrees


class Killed(Exception):
    pass


@pytest.mark.parametrize(
    ("name", "point"),
    [
        ("pg", "digest_mirror"),
        ("pg", "compare"),
        ("pg", "repair_planned"),
        ("pg", "deleted"),
        ("pg", "marked"),
        ("ice", "digest_source"),
        ("ice", "compare"),
        ("ice", "repair_planned"),
        ("ice", "repair_joined"),
    ],
)
def test_a_kill_during_verify_or_repair_leaves_the_mirror_unrepaired_and_intact_then_repair_completes(
    two, name, point
):
    p = two
    _drift(p)
    ctx = Context.of(p.config, SOURCE)
    mirror = ctx.table.mirror(name)
    before = (
        p.target.read_rows().sort_by("id")
        if name == "pg"
        else p.catalog.load_table(ICEBERG_MIRROR).scan().to_arrow().sort_by("id")
    )

    def hook(at: str) -> None:
        if at == point:
            raise Killed(at)

    with pytest.raises(Killed), mirror_lease(ctx, mirror).hold("killed", 60) as held:
        verify_mirror(ctx, mirror, repair=True, run_id="killed", epoch=held.epoch, hook=hook)
    after = (
        p.target.read_rows().sort_by("id")
        if name == "pg"
        else p.catalog.load_table(ICEBERG_MIRROR).scan().to_arrow().sort_by("id")
    )
    assert after.equals(before)  # all or nothing: the drift is still there, nothing half-repaired
    with mirror_lease(ctx, mirror).hold("again", 60) as held:
        result = verify_mirror(ctx, mirror, repair=True, run_id="again", epoch=held.epoch)
    assert result.status == "repaired" and result.left_keys == 0, result
    with mirror_lease(ctx, mirror).hold("check", 60) as held:
        assert verify_mirror(ctx, mirror, repair=False, run_id="check", epoch=held.epoch).status == "equal"
    if name == "ice":
        # The killed attempt's staged files are swept by the next mirror run, and the mirror stays exact.
        cow_merge(p.source, upserts=rows([1, 2], region="us", status="v3"), delete_keys=[])
        p.sync()
        p.exact_iceberg()


def _pg_unmappable(schema) -> list[str]:
    from iceberg_cdc.errors import MirrorSchemaError
    from iceberg_cdc.mirror.postgres.types import pg_type

    out = []
    for field in schema.fields:
        try:
            pg_type(field.name, field.field_type)
        except MirrorSchemaError:
            out.append(field.name)
    return out


def test_every_type_verifies_equal_without_false_alarms_and_a_nested_change_is_found(
    tmp_path, postgres_server, pg_schema
):
    """Edge values of every type (NaN, -0.0, infinities, extreme decimals, time zones, uuid, fixed, nested,
    empty and null containers) must hash alike on both sides, PostgreSQL's jsonb and arrays included."""
    from tests.support.typed_rows import ALL_TYPES, RawSource, typed_row

    # "text" holds a NUL character, which PostgreSQL's text cannot store: left out of that mirror.
    dsn, pg_table = postgres_server.dsn, f"{pg_schema}.orders"
    mirrors = [
        {
            "type": "postgres",
            "dsn": dsn,
            "table": pg_table,
            "name": "pg",
            "exclude_columns": [*_pg_unmappable(ALL_TYPES), "text"],
        },
        {"type": "iceberg", "table": ICEBERG_MIRROR, "name": "ice"},
    ]
    p = InlinePipeline(tmp_path, table={"mirrors": mirrors})
    p.catalog.create_namespace_if_not_exists("mirrors")
    source = RawSource(p.create_source(ALL_TYPES), ["id"])
    source.append([typed_row(i) for i in range(1, 29)])
    p.catch_up()
    for name in ("pg", "ice"):
        run_mirror(p.config, SOURCE, name)
    ctx = Context.of(p.config, SOURCE)

    def verify(name: str, repair: bool = False):
        mirror = ctx.table.mirror(name)
        with mirror_lease(ctx, mirror).hold("t", 60) as held:
            return verify_mirror(ctx, mirror, repair=repair, run_id="t", epoch=held.epoch)

    for name in ("pg", "ice"):
        result = verify(name)
        assert result.status == "equal", result.line()
    connection = connect(dsn)
    try:
        connection.cursor().execute(
            f"UPDATE {pg_table} SET point = jsonb_set(point, '{{label}}', '\"tampered\"') WHERE id = 2"
        )
        connection.commit()
    finally:
        connection.close()
    found = verify("pg")
    assert found.status == "drift" and found.keys == ["changed id=2"], found.line()
    assert verify("pg", repair=True).status == "repaired"
    assert verify("pg").status == "equal"


def test_a_nul_character_in_text_is_an_error_naming_the_column(tmp_path, postgres_server, pg_schema):
    from iceberg_cdc.errors import MirrorSchemaError

    mirror = {"type": "postgres", "dsn": postgres_server.dsn, "table": f"{pg_schema}.orders", "name": "pg"}
    p = InlinePipeline(tmp_path, table={"mirrors": [mirror]})
    p.create_source(SCHEMA)
    p.source.append(rows([1, 2], status="a\x00b"))
    p.catch_up()
    with pytest.raises(
        MirrorSchemaError, match=r"column 'status' holds a NUL character.*exclude_columns: \[status\]"
    ):
        run_mirror(p.config, SOURCE, "pg")


def test_a_composite_key_of_uuid_decimal_date_and_text_is_fetched_by_key_and_repaired(
    tmp_path, postgres_server, pg_schema
):
    import datetime as dt
    import decimal
    import uuid

    from pyiceberg.schema import Schema
    from pyiceberg.types import DateType, DecimalType, LongType, NestedField, StringType, UUIDType

    schema = Schema(
        NestedField(1, "tenant", StringType(), required=True),
        NestedField(2, "day", DateType(), required=True),
        NestedField(3, "uid", UUIDType(), required=True),
        NestedField(4, "amount", DecimalType(12, 3), required=True),
        NestedField(5, "v", LongType()),
        identifier_field_ids=[1, 2, 3, 4],
    )
    pg_table = f"{pg_schema}.orders"
    mirrors = [
        {"type": "postgres", "dsn": postgres_server.dsn, "table": pg_table, "name": "pg"},
        {"type": "iceberg", "table": ICEBERG_MIRROR, "name": "ice"},
    ]
    p = InlinePipeline(tmp_path, table={"mirrors": mirrors})
    p.catalog.create_namespace_if_not_exists("mirrors")
    p.create_source(schema)
    n = 50
    rows = pa.Table.from_pydict(
        {
            "tenant": [f"t{i % 3}" for i in range(n)],
            "day": [dt.date(2024, 1, 1 + i % 28) for i in range(n)],
            "uid": [uuid.UUID(int=i * 7919).bytes for i in range(n)],
            "amount": [decimal.Decimal(i) / 8 for i in range(n)],
            "v": list(range(n)),
        },
        schema=schema.as_arrow(),
    )
    p.source.append(rows)
    p.catch_up()
    for name in ("pg", "ice"):
        run_mirror(p.config, SOURCE, name)
    connection = connect(postgres_server.dsn)
    try:
        connection.cursor().execute(f"UPDATE {pg_table} SET v = -1 WHERE v = 17")
        connection.cursor().execute(f"DELETE FROM {pg_table} WHERE v = 18")
        connection.commit()
    finally:
        connection.close()
    p.catalog.load_table(ICEBERG_MIRROR).delete(EqualTo("v", 19))
    ctx = Context.of(p.config, SOURCE)
    for name, expected in (
        ("pg", {"changed": 1, "missing": 1, "foreign": 0}),
        ("ice", {"changed": 0, "missing": 1, "foreign": 0}),
    ):
        mirror = ctx.table.mirror(name)
        with mirror_lease(ctx, mirror).hold("t", 60) as held:
            found = verify_mirror(ctx, mirror, repair=True, run_id="t", epoch=held.epoch)
        assert found.drift == expected and found.status == "repaired", found.line()
        assert all("tenant=" in k and "uid=UUID(" in k and "amount=Decimal(" in k for k in found.keys), (
            found.keys
        )
        with mirror_lease(ctx, mirror).hold("u", 60) as held:
            assert verify_mirror(ctx, mirror, repair=False, run_id="u", epoch=held.epoch).status == "equal"


def test_a_large_drift_reads_both_sides_again_instead_of_fetching_by_key(two, monkeypatch):
    import iceberg_cdc.mirror.verify.check as check

    monkeypatch.setattr(check, "KEYED_LIMIT", 0)
    p = two
    _drift(p)
    ctx = Context.of(p.config, SOURCE)
    for name in ("pg", "ice"):
        mirror = ctx.table.mirror(name)
        with mirror_lease(ctx, mirror).hold("t", 60) as held:
            found = verify_mirror(ctx, mirror, repair=True, run_id="t", epoch=held.epoch)
        assert found.status == "repaired" and found.left_keys == 0, found.line()
    p.exact()


def test_a_mirror_that_moved_while_it_was_verified_is_not_repaired(two):
    """Another writer (one that ignored the lease) moves the watermark between the digests and the
    repair: the repair is refused, naming why, and changes nothing."""
    from iceberg_cdc.errors import MirrorStateError

    p = two
    _drift(p)
    ctx = Context.of(p.config, SOURCE)
    mirror = ctx.table.mirror("pg")
    before = p.target.read_rows().sort_by("id")

    def move(point: str) -> None:
        if point == "repair_planned":
            p.pg(
                f"UPDATE {p.pg_table.split('.')[0]}._cdc_mirror_state SET change_ordinal = change_ordinal + 1"
            )

    with (
        pytest.raises(MirrorStateError, match="moved while it was verified"),
        mirror_lease(ctx, mirror).hold("t", 60) as held,
    ):
        verify_mirror(ctx, mirror, repair=True, run_id="t", epoch=held.epoch, hook=move)
    assert p.target.read_rows().sort_by("id").equals(before)
