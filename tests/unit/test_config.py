"""Config file: the contract's shape, defaults, and errors that name the key."""

from __future__ import annotations

import pytest
import yaml

from iceberg_cdc.config import dag_id_for, load_config, parse_config, parse_size
from iceberg_cdc.errors import ConfigError
from iceberg_cdc.redaction import secret_values

GOOD = {
    "catalog": {
        "name": "demo",
        "type": "sql",
        "uri": "sqlite:////tmp/catalog.db",
        "warehouse": "s3://warehouse/",
        "s3.endpoint": "http://127.0.0.1:9000",
        "s3.access-key-id": "AK",
        "s3.secret-access-key": "${CDC_TEST_SECRET}",
        "s3.region": "us-east-1",
    },
    "shuffle": {"uri": "s3://shuffle-bucket/prefix", "partitions": 64, "target_partition_size": "64MB"},
    "tables": [{"source": "shop.orders", "sink": "shop.orders_changes", "identifier_columns": ["id"]}],
}


def write(tmp_path, data) -> str:
    path = tmp_path / "cdc.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_contract_example_loads(tmp_path, monkeypatch):
    monkeypatch.setenv("CDC_TEST_SECRET", "s3cr3t")
    config = load_config(write(tmp_path, GOOD))
    assert config.catalog.name == "demo"
    assert config.catalog.properties["s3.secret-access-key"] == "s3cr3t"
    assert config.shuffle.target_partition_size == 64 * 2**20
    assert config.shuffle.retain_files is False
    assert config.tables[0].dag_id == "cdc__shop__orders"
    # shuffle s3 properties fall back to the catalog's
    assert config.s3_properties()["s3.endpoint"] == "http://127.0.0.1:9000"


def test_config_path_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("CDC_TEST_SECRET", "x")
    monkeypatch.setenv("CDC_CONFIG", write(tmp_path, GOOD))
    assert load_config().tables[0].sink == "shop.orders_changes"


def test_secrets_are_redacted(monkeypatch):
    monkeypatch.setenv("CDC_TEST_SECRET", "s3cr3t")
    config = parse_config(GOOD)
    text = repr(config.redacted())
    assert "s3cr3t" not in text and "***" in text
    assert "http://127.0.0.1:9000" in text


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda c: c["shuffle"].update(partitons=3), r"shuffle: unknown key\(s\) \['partitons'\]"),
        (
            lambda c: c["tables"][0].update(identifer_columns=["id"]),
            r"tables\[0\]\.identifer_columns: unknown key",
        ),
        (lambda c: c.update(extra_section={}), r"extra_section: unknown key"),
        (lambda c: c["shuffle"].update(partitions=0), r"shuffle\.partitions: .*greater than or equal to 1"),
        (
            lambda c: c["shuffle"].update(target_partition_size="64 parsecs"),
            r"target_partition_size: .*not a size",
        ),
        (lambda c: c["shuffle"].update(uri="http://bucket"), r"shuffle\.uri: .*s3://bucket/prefix"),
        (lambda c: c["tables"][0].update(source="orders"), r"tables\[0\]\.source: .*namespace\.table"),
        (lambda c: c["tables"][0].update(identifier_columns=[]), r"identifier_columns must be a non-empty"),
        (lambda c: c["tables"][0].update(start="yesterday"), r"tables\[0\]\.start"),
        (
            lambda c: c["tables"].append(dict(c["tables"][0])),
            r"source \['shop\.orders'\] configured more than once",
        ),
        (lambda c: c.pop("shuffle"), r"shuffle: required key is missing"),
        (lambda c: c.update(tables=[]), r"tables: "),
        (
            lambda c: c["tables"][0].update(freshness_slo="soon"),
            r"tables\[0\]\.freshness_slo: .*not a duration",
        ),
        (
            lambda c: c["tables"][0].update(freshness_callback="slack alert"),
            r"tables\[0\]\.freshness_callback: .*module\.name",
        ),
    ],
)
def test_bad_values_name_the_key(monkeypatch, mutate, message):
    monkeypatch.setenv("CDC_TEST_SECRET", "x")
    config = yaml.safe_load(yaml.safe_dump(GOOD))
    mutate(config)
    with pytest.raises(ConfigError, match=message):
        parse_config(config)


def test_missing_environment_variable_is_named(monkeypatch):
    monkeypatch.delenv("CDC_TEST_SECRET", raising=False)
    with pytest.raises(
        ConfigError, match=r"catalog\.s3\.secret-access-key: environment variable CDC_TEST_SECRET"
    ):
        parse_config(GOOD)


def test_missing_and_invalid_files(tmp_path, monkeypatch):
    monkeypatch.delenv("CDC_CONFIG", raising=False)
    with pytest.raises(ConfigError, match="set CDC_CONFIG"):
        load_config()
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("catalog: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_sizes():
    assert parse_size("64MB") == parse_size("64MiB") == parse_size("64 mb") == 64 * 2**20
    assert parse_size("1.5GB") == int(1.5 * 2**30)
    assert parse_size(1024) == 1024
    for bad in ("", "MB", "-1MB", True, 0):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_dag_ids_follow_the_contract():
    assert dag_id_for("shop.orders") == "cdc__shop__orders"
    assert dag_id_for("a.b.c") == "cdc__a__b__c"


@pytest.mark.parametrize("sink", ["shop.orders", "Shop.ORDERS"])
def test_sink_that_is_the_source_is_refused(monkeypatch, sink):
    monkeypatch.setenv("CDC_TEST_SECRET", "x")
    config = yaml.safe_load(yaml.safe_dump(GOOD))
    config["tables"][0]["sink"] = sink
    with pytest.raises(
        ConfigError, match=r"tables\[0\]\.sink: .*is also this table's source.*capture its own output"
    ):
        parse_config(config)


def test_min_partition_size_above_half_the_target_is_refused_at_load(monkeypatch):
    monkeypatch.setenv("CDC_TEST_SECRET", "x")
    config = yaml.safe_load(yaml.safe_dump(GOOD))
    config["shuffle"].update(target_partition_size="64MB", min_partition_size="40MB")
    with pytest.raises(ConfigError) as raised:
        parse_config(config)
    message = str(raised.value)
    assert "shuffle: min_partition_size (40MiB) is above half of target_partition_size (64MiB)" in message
    assert "at most 32MiB" in message
    config["shuffle"]["min_partition_size"] = "32MB"  # exactly half is fine
    assert parse_config(config).shuffle.min_partition_size == 32 * 2**20


def test_no_secret_in_repr_or_str_of_any_config_object(monkeypatch):
    secret = "pa55-w0rd-XYZ"
    monkeypatch.setenv("CDC_TEST_SECRET", secret)
    raw = yaml.safe_load(yaml.safe_dump(GOOD))
    raw["catalog"]["uri"] = f"postgresql://cdc:{secret}@db.internal:5432/catalog"
    raw["catalog"]["token"] = secret
    raw["shuffle"]["s3.secret-access-key"] = secret
    raw["shuffle"]["s3.session-token"] = secret
    raw["spark"] = {"conf": {"spark.hadoop.fs.s3a.secret.key": secret, "spark.ui.port": "4040"}}
    config = parse_config(raw)
    objects = [config, config.catalog, config.shuffle, config.spark, *config.tables]
    for obj in objects:
        for text in (repr(obj), str(obj)):
            assert secret not in text, type(obj).__name__
    assert "***" in repr(config.catalog) and "spark.ui.port" in repr(config.spark)
    assert "db.internal:5432" in repr(config.catalog), "only the password of a URL is hidden"
    assert secret not in repr(config.redacted())
    # the values themselves are intact: they are what connects to the catalog and S3
    assert config.catalog.properties["s3.secret-access-key"] == secret
    assert config.catalog.properties["uri"] == raw["catalog"]["uri"]
    assert config.shuffle.s3_properties["s3.session-token"] == secret
    # what run notes and error lines are scrubbed of: every secret value, the URL's password included
    raw["catalog"]["uri"] = "postgresql://cdc:url-only-pw@db.internal:5432/catalog"
    values = secret_values(parse_config(raw).model_dump(mode="json"))
    assert {secret, "url-only-pw"} <= values and "4040" not in values and "cdc" not in values


def test_spark_mode_defaults_to_submit_and_connect_settings_load(monkeypatch):
    monkeypatch.setenv("CDC_TEST_SECRET", "x")
    spark = parse_config(GOOD).spark
    assert (spark.mode, spark.connect_conn_id, spark.connect_url) == ("submit", "spark_connect_default", None)
    spark = parse_config(
        {**GOOD, "spark": {"mode": "connect", "connect_url": "sc://127.0.0.1:15002", "connect_conn_id": "sc"}}
    ).spark
    assert (spark.mode, spark.connect_url, spark.connect_conn_id) == ("connect", "sc://127.0.0.1:15002", "sc")
    assert parse_config({**GOOD, "spark": {"mode": "connect", "connect_url": "sc://h/;use_ssl=true"}})


@pytest.mark.parametrize(
    ("spark", "message"),
    [
        ({"mode": "local"}, "spark.mode: Input should be 'submit' or 'connect'"),
        (
            {"mode": "connect", "connect_url": "http://h:15002"},
            "is not a Spark Connect URL: write sc://host:port",
        ),
        ({"mode": "connect", "connect_url": "sc://:15002"}, "has no host"),
        ({"mode": "connect", "connect_url": "sc://h:port"}, "has a port that is not a number"),
        ({"mode": "connect", "connect_url": "sc://h:15002/db"}, "has a path"),
        ({"mode": "connect", "conf": {"spark.executor.cores": "2"}}, "spark.conf only apply to spark-submit"),
        ({"mode": "connect", "driver_memory": "2g"}, "set them in the server's start command"),
        ({"connect_url": "sc://h:15002"}, "spark.connect_url is only used with spark.mode: connect"),
    ],
)
def test_bad_spark_connect_settings_say_what_to_do(monkeypatch, spark, message):
    monkeypatch.setenv("CDC_TEST_SECRET", "x")
    with pytest.raises(ConfigError) as raised:
        parse_config({**GOOD, "spark": spark})
    assert message in str(raised.value)


def test_a_connect_token_is_never_shown(monkeypatch):
    monkeypatch.setenv("CDC_TEST_SECRET", "x")
    url = "sc://spark.example:443/;use_ssl=true;token=tok3n-value"
    config = parse_config({**GOOD, "spark": {"mode": "connect", "connect_url": url}})
    for text in (repr(config), str(config.spark), repr(config.redacted())):
        assert "tok3n-value" not in text and "spark.example:443" in text
    with pytest.raises(ConfigError) as raised:
        parse_config({**GOOD, "spark": {"mode": "connect", "connect_url": url.replace(":443", ":https")}})
    assert "tok3n-value" not in str(raised.value) and "token=***" in str(raised.value)


def test_durations_and_the_event_and_retention_knobs():
    from iceberg_cdc.config import parse_duration

    assert parse_duration("24h") == 86400 and parse_duration("90min") == 5400 and parse_duration(5) == 5
    assert parse_duration("500ms") == 0.5 and parse_duration("3d") == 3 * 86400
    for bad in ("soon", "-1h", 0, True):
        with pytest.raises(ValueError):
            parse_duration(bad)
    raw = {
        "catalog": {"name": "c", "type": "sql", "uri": "sqlite:////tmp/c.db"},
        "shuffle": {"uri": "file:///tmp/s"},
        "tables": [{"source": "a.b", "sink": "a.c", "protect_pending": True, "retention_warning": "2h"}],
        "events": {"poll_interval": "5s", "trigger": "provider", "iceberg_conn_id": "lake"},
    }
    config = parse_config(raw)
    assert config.tables[0].protect_pending and config.tables[0].retention_warning == 7200
    assert (config.events.poll_interval, config.events.trigger, config.events.iceberg_conn_id) == (
        5,
        "provider",
        "lake",
    )
    default = parse_config({**raw, "events": {}, "tables": [{"source": "a.b", "sink": "a.c"}]})
    assert (
        default.events.enabled and default.events.trigger == "catalog" and default.events.poll_interval == 10
    )
    assert not default.tables[0].protect_pending and default.tables[0].retention_warning == 86400
    with pytest.raises(ConfigError, match="poll_interval"):
        parse_config({**raw, "events": {"poll_interval": "200ms"}})
    with pytest.raises(ConfigError, match="retention_warning"):
        parse_config({**raw, "tables": [{"source": "a.b", "sink": "a.c", "retention_warning": "soon"}]})


# ---------------------------------------------------------------------------------------- mirrors

PG = {"type": "postgres", "dsn": "postgresql://cdc:hunter2@127.0.0.1:5432/app", "table": "public.orders"}


def with_mirrors(*mirrors, **table):
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    data["tables"][0].update(mirrors=list(mirrors), **table)
    return data


def test_mirrors_load_with_names_and_dag_ids(monkeypatch):
    monkeypatch.setenv("CDC_TEST_SECRET", "x")
    config = parse_config(
        with_mirrors(
            PG,
            {"type": "iceberg", "table": "shop.orders_mirror"},
            {**PG, "name": "copy2", "dsn": None, "conn_id": "pg"},
        )
    )
    table = config.tables[0]
    assert [m.mirror_name for m in table.mirrors] == ["public__orders", "shop__orders_mirror", "copy2"]
    assert table.mirror_dag_id(table.mirrors[0]) == "cdc_mirror__shop__orders__public__orders"
    assert table.mirror("copy2").conn_id == "pg"
    assert "hunter2" not in repr(config) and "hunter2" not in repr(config.redacted())
    assert "hunter2" in secret_values(config.model_dump(mode="json"))


@pytest.mark.parametrize(
    ("mirror", "message"),
    [
        ({"type": "mysql", "table": "a.b"}, r"tables\[0\]\.mirrors\[0\]\.type"),
        ({**PG, "conn_id": "pg"}, r"mirrors\[0\]: .*exactly one of conn_id .* or dsn"),
        ({"type": "postgres", "table": "public.orders"}, r"exactly one of conn_id"),
        ({**PG, "table": "orders"}, r"'orders' is not a PostgreSQL table like schema\.name"),
        ({**PG, "dsn": "mysql://x:pw@h/db"}, r"dsn 'mysql://x:\*\*\*@h/db' is not a URL"),
        (
            {"type": "iceberg", "table": "shop.m", "dsn": "postgresql://h/db"},
            r"dsn only apply to type: postgres",
        ),
        ({"type": "iceberg", "table": "shop.orders_changes"}, r"is this table's source or sink"),
        ({**PG, "name": "a b"}, r"mirrors\[0\]\.name: .*letters, digits and _"),
        ({**PG, "exclude_columns": ["id"]}, r"excludes the key column\(s\) \['id'\]"),
        ({**PG, "tabel": "x"}, r"mirrors\[0\]\.tabel: unknown key"),
    ],
)
def test_bad_mirrors_name_the_key(monkeypatch, mirror, message):
    monkeypatch.setenv("CDC_TEST_SECRET", "x")
    with pytest.raises(ConfigError, match=message) as info:
        parse_config(with_mirrors(mirror))
    assert "hunter2" not in str(info.value)


def test_two_mirrors_of_one_name_or_one_target_are_refused(monkeypatch):
    monkeypatch.setenv("CDC_TEST_SECRET", "x")
    with pytest.raises(ConfigError, match=r"both named \['public__orders'\].*distinct mirrors\[\]\.name"):
        parse_config(with_mirrors(PG, {**PG, "dsn": "postgresql://other/db"}))
    data = with_mirrors(PG)
    data["tables"].append({"source": "shop.items", "sink": "shop.items_changes", "mirrors": [PG]})
    with pytest.raises(ConfigError, match=r"configured twice \(shop\.orders and shop\.items\)"):
        parse_config(data)


def test_freshness_slo_is_a_duration_and_off_by_default(monkeypatch):
    monkeypatch.setenv("CDC_TEST_SECRET", "x")
    assert parse_config(GOOD).tables[0].freshness_slo is None
    config = yaml.safe_load(yaml.safe_dump(GOOD))
    config["tables"][0].update(freshness_slo="15m", freshness_callback="my_alerts.slack")
    table = parse_config(config).tables[0]
    assert (table.freshness_slo, table.freshness_callback) == (900.0, "my_alerts.slack")
