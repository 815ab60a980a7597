"""Settings validation: what a user types is accepted where the meaning is clear, and a bad
value names the setting, what was expected and what came."""

from __future__ import annotations

import pytest

from chunlian.config import load_settings
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
