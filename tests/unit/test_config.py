"""Settings validation: what a user types is accepted where the meaning is clear, and a bad
value names the setting, what was expected and what came."""

from __future__ import annotations

from dataclasses import fields

import pytest

from chunlian.config import EngineSettings, Settings, load_client_settings, load_settings
from chunlian.config.subconfigs import SUBCONFIGS
from chunlian.errors import ConfigError


@pytest.mark.parametrize("given", ["warning", "Warning", " WARNING "])
def test_log_level_accepts_any_case(given: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings(log_level=given).log_level == "WARNING"
    monkeypatch.setenv("CHUNLIAN_LOG_LEVEL", given)
    assert load_settings().log_level == "WARNING"


def test_unknown_log_level_names_the_setting_and_the_value() -> None:
    with pytest.raises(ConfigError) as e:
        load_settings(log_level="loud")
    msg = str(e.value)
    assert "CHUNLIAN_LOG_LEVEL" in msg and "'loud'" in msg and "WARNING" in msg


# one environment variable per part, read into that part under its old flat name
PART_ENV = [
    ("engine", "CHUNLIAN_MAX_BATCH_SIZE", "max_batch_size", "6", 6),
    ("cache", "CHUNLIAN_CACHE_SIZE", "cache_size", "0", 0),
    ("jobs", "CHUNLIAN_WORKER_ENGINE_URL", "worker_engine_url", "http://nginx:8080", "http://nginx:8080"),
    ("http", "CHUNLIAN_BODY_LIMIT_BYTES", "body_limit_bytes", "2048", 2048),
    ("cluster", "CHUNLIAN_INSTANCE_ID", "instance_id", "front-1", "front-1"),
]


@pytest.mark.parametrize(("part", "var", "name", "raw", "value"), PART_ENV)
def test_each_part_reads_its_knobs_from_their_variables(
    part: str, var: str, name: str, raw: str, value: object, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(var, raw)
    s = load_settings()
    assert getattr(getattr(s, part), name) == value == getattr(s, name)
    assert type(getattr(s, part)) is SUBCONFIGS[part]
    monkeypatch.setenv(var.lower(), raw)  # names are not case-sensitive
    assert getattr(load_settings(), name) == value


@pytest.mark.parametrize(("var", "bad"), [
    ("CHUNLIAN_MAX_BATCH_SIZE", "0"), ("CHUNLIAN_CACHE_TTL_S", "soon"), ("CHUNLIAN_JOB_QUEUE", ""),
    ("CHUNLIAN_WORKER_ENGINE_URL", "nginx:8080"), ("CHUNLIAN_PORT", "70000"),
])
def test_a_bad_value_names_its_variable(var: str, bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(var, bad)
    with pytest.raises(ConfigError) as e:
        load_settings()
    assert var in str(e.value) and repr(bad) in str(e.value)


def test_checks_across_knobs_name_both_variables() -> None:
    with pytest.raises(ConfigError, match="CHUNLIAN_JOB_HARD_TIME_LIMIT_S must exceed the soft limit"):
        load_settings(job_soft_time_limit_s=30, job_hard_time_limit_s=20)
    with pytest.raises(ConfigError, match="CHUNLIAN_ENGINE_REPLICAS must be at most CHUNLIAN_MAX_BATCH_SIZE"):
        load_settings(engine_replicas=5, max_batch_size=4)


def test_every_setting_is_declared_in_exactly_one_part() -> None:
    names = [n for cls in SUBCONFIGS.values() for n in cls.model_fields]
    assert len(names) == len(set(names))
    assert set(names) == set(Settings.model_fields)
    assert [env for _, env, _ in Settings.knobs()] == [f"CHUNLIAN_{n.upper()}" for n in names]


def test_a_given_environment_is_read_instead_of_the_process_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHUNLIAN_CACHE_SIZE", "7")
    s = load_settings(environ={"CHUNLIAN_BODY_LIMIT_BYTES": "4096", "OTHER": "x"})
    assert (s.body_limit_bytes, s.cache_size) == (4096, Settings.model_fields["cache_size"].default)
    assert load_settings().cache_size == 7  # and the process's again afterwards
    with pytest.raises(ConfigError, match="CHUNLIAN_BODY_LIMIT_BYTES"):
        load_settings(environ={"chunlian_body_limit_bytes": "12"})


def test_client_settings_read_the_url_and_key(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_client_settings().url == "http://127.0.0.1:8000"
    monkeypatch.setenv("CHUNLIAN_URL", "http://front:8080")
    monkeypatch.setenv("CHUNLIAN_API_KEY", "k1")
    monkeypatch.setenv("CHUNLIAN_PORT", "not a port")  # a service setting: not the client's business
    c = load_client_settings()
    assert (c.url, c.api_key) == ("http://front:8080", "k1")


def test_engine_and_scheduler_defaults_and_bounds_are_the_engine_settings() -> None:
    from chunlian.engine.config import EngineConfig
    from chunlian.engine.scheduler import SchedulerConfig

    knobs = EngineSettings.defaults()
    for config in (EngineConfig(), SchedulerConfig()):
        # device: resolved in EngineConfig ("cpu" or "cuda"), never "auto"
        shared = [f.name for f in fields(config) if f.name in EngineSettings.model_fields and f.name != "device"]
        assert len(shared) >= 6
        assert {n: getattr(config, n) for n in shared} == {n: getattr(knobs, n) for n in shared}
    top = EngineSettings.model_fields["max_batch_size"].metadata[-1].le
    with pytest.raises(ValueError, match="max_batch_size"):
        SchedulerConfig(max_batch_size=top + 1)
    with pytest.raises(ValueError, match="max_batch_size"):
        EngineConfig(max_batch_size=top + 1)


def test_jobs_commands_take_the_service_url_from_the_client_settings(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    from chunlian.cli import main

    monkeypatch.setenv("CHUNLIAN_URL", "http://127.0.0.1:9")  # discard: nothing answers
    assert main(["jobs", "list", "--timeout-s", "2"]) == 1
    assert "no answer from http://127.0.0.1:9" in capsys.readouterr().err
    assert main(["jobs", "list", "--timeout-s", "2", "--url", "http://127.0.0.1:7"]) == 1  # the flag wins
    assert "no answer from http://127.0.0.1:7" in capsys.readouterr().err
