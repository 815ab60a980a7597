"""One typed settings object for the whole service, read from ``CHUNLIAN_*`` env vars.

``Settings`` is made of five parts (``chunlian.config.subconfigs``: engine, cache, jobs,
http, cluster), where each knob is declared once; ``settings.engine`` (and ``.cache``,
``.jobs``, ``.http``, ``.cluster``) is that part alone. Validated where it is created: a bad
value fails start-up with a ``ConfigError`` that says which setting, what was expected and
what arrived. Only this package reads the environment for configuration; library code
is handed settings (or a part of them) by its caller.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any, TypeVar

from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings.exceptions import SettingsError

from chunlian.config.subconfigs import (
    DEFAULT_WARMUP,
    LOG_LEVELS,
    SUBCONFIGS,
    CacheSettings,
    ClusterSettings,
    EngineSettings,
    HttpSettings,
    JobsSettings,
    LogLevel,
    SubConfig,
    parse_origins,
)
from chunlian.errors import ConfigError

__all__ = [
    "DEFAULT_SERVICE_URL", "DEFAULT_WARMUP", "LOG_LEVELS", "CacheSettings", "ClientSettings",
    "ClusterSettings", "EngineSettings", "HttpSettings", "JobsSettings", "LogLevel", "Settings",
    "SubConfig", "load_client_settings", "load_settings", "parse_origins",
]

ENV_PREFIX = "CHUNLIAN_"
DEFAULT_SERVICE_URL = "http://127.0.0.1:8000"

Part = TypeVar("Part", bound=SubConfig)

# the environment ``load_settings(environ=...)`` reads instead of the process's own
_ENVIRON: ContextVar[Mapping[str, str] | None] = ContextVar("chunlian_environ", default=None)


class _MappingSource(PydanticBaseSettingsSource):
    """``CHUNLIAN_<NAME>`` values from a given mapping (names not case-sensitive)."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        prefix = ENV_PREFIX.lower()
        self.values = {k.lower()[len(prefix):]: v for k, v in environ.items() if k.lower().startswith(prefix)}

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self.values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return {name: self.values[name] for name in self.settings_cls.model_fields if name in self.values}


class _EnvSettings(BaseSettings):
    """``CHUNLIAN_<NAME>`` for every field, from the process's environment or the one
    ``load_settings(environ=...)`` names."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True,
                                      use_attribute_docstrings=True)  # the reference's descriptions

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        environ = _ENVIRON.get()
        if environ is None:
            return init_settings, env_settings, dotenv_settings, file_secret_settings
        return init_settings, _MappingSource(settings_cls, environ)


# model_config: SettingsConfigDict extends the parts' ConfigDict (mypy sees two TypedDicts)
class Settings(_EnvSettings, ClusterSettings, JobsSettings, CacheSettings, EngineSettings,  # type: ignore[misc]
               HttpSettings):
    """Service settings; every field maps to ``CHUNLIAN_<NAME>`` (case-insensitive) and is
    declared in one of the parts (``SUBCONFIGS``)."""

    def part(self, cls: type[Part]) -> Part:
        """The part ``cls`` of these settings, as a model of its own (already validated)."""
        return cls.model_construct(**{name: getattr(self, name) for name in cls.model_fields})

    @property
    def engine(self) -> EngineSettings:
        return self.part(EngineSettings)

    @property
    def cache(self) -> CacheSettings:
        return self.part(CacheSettings)

    @property
    def jobs(self) -> JobsSettings:
        return self.part(JobsSettings)

    @property
    def http(self) -> HttpSettings:
        return self.part(HttpSettings)

    @property
    def cluster(self) -> ClusterSettings:
        return self.part(ClusterSettings)

    @staticmethod
    def knobs() -> Iterator[tuple[str, str, FieldInfo]]:
        """(part, environment variable, field) of every setting, part by part."""
        for part, cls in SUBCONFIGS.items():
            for name in cls.model_fields:
                yield part, env_name(name), Settings.model_fields[name]


class ClientSettings(_EnvSettings):
    """What the commands that talk to a running service read from the environment."""

    url: str = DEFAULT_SERVICE_URL
    """The service `chunlian jobs` talks to when `--url` is not given."""
    api_key: str | None = None
    """The key `chunlian warmup` and `chunlian jobs` send as `X-API-Key` when `--api-key` is not given."""


def env_name(field: str) -> str:
    """The environment variable of the setting ``field``."""
    return f"{ENV_PREFIX}{field.upper()}"


_S = TypeVar("_S", bound=_EnvSettings)


def _build(cls: type[_S], environ: Mapping[str, str] | None, overrides: dict[str, object]) -> _S:
    clean = {k: v for k, v in overrides.items() if v is not None}
    token = _ENVIRON.set(environ)
    try:
        return cls(**clean)
    except SettingsError as e:
        raise ConfigError(f"invalid configuration: {e}") from None
    except ValidationError as e:
        raise ConfigError("invalid configuration: " + "; ".join(_describe(err) for err in e.errors())) from None
    finally:
        _ENVIRON.reset(token)


def _describe(err: Any) -> str:
    loc = ".".join(str(x) for x in err["loc"])
    if not loc:  # a check across settings: its message names them
        return str(err["msg"]).removeprefix("Value error, ")
    return f"{env_name(loc)}: {err['msg']} (got {err.get('input')!r})"


def load_settings(environ: Mapping[str, str] | None = None, **overrides: object) -> Settings:
    """Build settings from the environment (``environ``, default the process's) plus
    ``overrides`` (CLI flags; None values are left out); never raises pydantic errors,
    only ``ConfigError`` naming each bad setting."""
    return _build(Settings, environ, overrides)


def load_client_settings(**overrides: object) -> ClientSettings:
    """``ClientSettings`` from the environment plus ``overrides`` (``ConfigError`` when bad)."""
    return _build(ClientSettings, None, overrides)
