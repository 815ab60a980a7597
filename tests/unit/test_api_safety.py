"""The safety list at the HTTP edge: festive keywords are answered, vulgar input is a 422."""

from __future__ import annotations

import pytest

from tests.unit.api_fakes import running_app
from tests.unit.test_api_routes import assert_error

FESTIVE_KEYWORDS = ["万里", "中国", "圆满", "东升", "手机", "老板"]


async def test_festive_keywords_and_common_names_are_answered() -> None:
    async with running_app() as h:
        for kw in FESTIVE_KEYWORDS:
            r = await h.client.post("/v1/couplets/compose", json={"keyword": kw})
            assert r.status_code == 200, (kw, r.text)
            # the 上联 search of a composed couplet is the first engine call of its answer
            assert any(c.keyword == kw for c in h.engine.calls), kw
        for name in ["王伟", "王勇", "刘伟", "张杰", "杨帆"]:
            r = await h.client.post("/v1/couplets/compose", json={"heads": name})
            assert r.status_code == 200, (name, r.text)
        r = await h.client.post("/v1/couplets", json={"upper": "老板发了年终奖"})
        assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/couplets/compose", {"keyword": "傻逼"}, "keyword"),
        ("/v1/couplets/compose", {"keyword": "他媽的"}, "keyword"),  # traditional
        ("/v1/couplets/compose", {"heads": "婊子"}, "heads"),
        ("/v1/couplets/compose", {"heads": "屌"}, "heads"),
        ("/v1/couplets", {"upper": "新春操你妈来"}, "upper"),
        ("/v1/couplets", {"upper": "新春賤人到"}, "upper"),  # traditional
    ],
)
async def test_vulgar_or_insulting_input_is_422_naming_the_field(path: str, body: dict, field: str) -> None:
    async with running_app() as h:
        r = await h.client.post(path, json=body)
        err = assert_error(r, 422, "invalid_input", field)
        assert "vulgar or insulting" in err["message"]
        assert h.engine.calls == []


async def test_a_keyword_holding_a_term_never_written_is_422() -> None:
    async with running_app() as h:
        r = await h.client.post("/v1/couplets/compose", json={"keyword": "法轮功"})
        err = assert_error(r, 422, "invalid_input", "keyword")
        assert "never write" in err["message"]
        r = await h.client.post("/v1/couplets", json={"upper": "法轮功德满"})  # a user's 上联: answered
        assert r.status_code == 200, r.text
