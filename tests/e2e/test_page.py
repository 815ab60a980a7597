"""The campaign page in a real headless Chromium against a real chunlian server.

Covers issue 8: type a 上联 and get the 下联 and 横批 on two vertical scrolls (上联 on the
right), plain-Chinese error messages, 换一副 (regenerate) changes the couplet, 保存图片
downloads a PNG, a 藏头 couplet from a name, a phone-sized screen, and no external request.
Screenshots land in the test's ``tmp_path`` and in ``out/e2e/`` (git-ignored).
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

UPPER = "春回大地千山秀"
HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")
WAIT_MS = 120_000  # one generation on a busy CPU can be slow
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def han(text: str | None) -> str:
    return "".join(HAN.findall(text or ""))


@dataclass
class Session:
    page: Any
    base: str
    external: list[str] = field(default_factory=list)
    js_errors: list[str] = field(default_factory=list)
    api_bodies: list[dict[str, Any]] = field(default_factory=list)

    # ---- actions ----

    def open(self, query: str = "") -> None:
        self.page.goto(self.base + query)
        self.page.wait_for_selector("html[data-ready='true']", state="attached")

    def seq(self) -> int:
        return int(self.page.get_attribute("#couplet", "data-seq") or 0)

    def click_and_settle(self, selector: str) -> None:
        """Click, then wait until the request is over (a new couplet or an error shown)."""
        before = self.seq()
        self.page.click(selector)
        self.page.wait_for_function(
            """(before) => {
                const c = document.getElementById('couplet');
                const done = document.getElementById('couplet-form').getAttribute('aria-busy') === 'false';
                const fresh = Number(c.dataset.seq || 0) !== before;
                const failed = !document.getElementById('error').hidden;
                return done && (fresh || failed);
            }""",
            arg=before,
            timeout=WAIT_MS,
        )

    def generate(self, selector: str = "#submit") -> None:
        before = self.seq()
        self.click_and_settle(selector)
        err = self.text("#error") if self.page.is_visible("#error") else ""
        assert self.seq() == before + 1, (
            f"no new couplet after clicking {selector}; #error: {err!r}"
        )
        assert err == "", f"unexpected error shown: {err!r}"

    def text(self, selector: str) -> str:
        return (self.page.text_content(selector) or "").strip()

    def couplet(self) -> tuple[str, str, str]:
        return self.text("#scroll-upper"), self.text("#scroll-lower"), self.text("#hengpi")

    def box(self, selector: str) -> dict[str, float]:
        b = self.page.locator(selector).bounding_box()
        assert b is not None, f"{selector} has no box (not visible?)"
        return b

    def watch_busy(self) -> None:
        """Record whether the busy state (disabled button, spinner, aria-busy, #busy) shows."""
        self.page.evaluate(
            """() => {
                window.__busySeen = false;
                const check = () => {
                    const s = document.getElementById('submit');
                    const b = document.getElementById('busy');
                    const spin = s.querySelector('.spinner');
                    if (s.disabled && !b.hidden && getComputedStyle(b).display !== 'none'
                        && getComputedStyle(spin).display !== 'none'
                        && document.getElementById('couplet-form').getAttribute('aria-busy') === 'true'
                        && document.getElementById('couplet').getAttribute('aria-busy') === 'true') {
                        window.__busySeen = true;
                    }
                };
                new MutationObserver(check).observe(document.body, {attributes: true, subtree: true});
            }"""
        )

    def busy_seen(self) -> bool:
        return bool(self.page.evaluate("() => window.__busySeen === true"))

    def snap(self, path: Path, copy_to: Path | None = None, full_page: bool = True) -> Path:
        self.page.screenshot(path=str(path), full_page=full_page)
        if copy_to is not None:
            shutil.copy(path, copy_to)
        return path

    def assert_clean(self) -> None:
        assert self.external == [], f"the page requested non-local URLs: {self.external}"
        assert self.js_errors == [], f"JavaScript errors: {self.js_errors}"


@pytest.fixture
def open_session(
    browser: Any, server_url: str, request: pytest.FixtureRequest, out_dir: Path
) -> Iterator[Callable[..., Session]]:
    """Factory: a fresh browser context (desktop by default) with a page on it, instrumented."""
    made: list[tuple[Any, Session]] = []

    def make(**context_args: Any) -> Session:
        args: dict[str, Any] = {"viewport": {"width": 1280, "height": 900}, "locale": "zh-CN"}
        args.update(context_args)
        ctx = browser.new_context(accept_downloads=True, **args)
        page = ctx.new_page()
        page.set_default_timeout(WAIT_MS)
        s = Session(page=page, base=server_url)

        def on_request(r: Any) -> None:
            url = r.url
            if not url.startswith(server_url) and not url.startswith(("data:", "blob:")):
                s.external.append(url)
            if "/v1/couplets" in url and r.method == "POST":
                try:
                    s.api_bodies.append(json.loads(r.post_data or "null"))
                except ValueError:
                    s.api_bodies.append({"unparseable": r.post_data})

        def on_console(m: Any) -> None:
            # Chromium logs every 4xx/5xx fetch as "Failed to load resource"; the page handles those.
            if m.type == "error" and not m.text.startswith("Failed to load resource"):
                s.js_errors.append(m.text)

        page.on("request", on_request)
        page.on("pageerror", lambda e: s.js_errors.append(str(e)))
        page.on("console", on_console)
        made.append((ctx, s))
        return s

    yield make

    rep = getattr(request.node, "rep_call", None)
    for i, (ctx, s) in enumerate(made):
        if rep is not None and rep.failed:
            with contextlib.suppress(Exception):  # best effort on the way out
                s.page.screenshot(
                    path=str(out_dir / f"failed-{request.node.name}-{i}.png"), full_page=True
                )
        ctx.close()


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_MAGIC, "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_write_a_couplet_regenerate_save_and_errors(
    open_session: Callable[..., Session], tmp_path: Path, out_dir: Path
) -> None:
    s = open_session()
    s.open()
    page = s.page

    # Labelled inputs, the four styles, and the default state.
    assert page.get_by_role("textbox", name="上联").count() == 1
    assert page.get_by_role("combobox", name="风格").count() == 1
    options = page.eval_on_selector_all(
        "#style-select option", "os => os.map(o => [o.value, o.text])"
    )
    assert options == [
        ["traditional", "传统"],
        ["business", "商贸"],
        ["family", "家庭"],
        ["literary", "文雅"],
    ]
    assert page.is_disabled("#regenerate"), "nothing to regenerate yet"

    # Write the 下联 for a 上联.
    page.fill("#upper-input", UPPER)
    page.select_option("#style-select", "traditional")
    s.watch_busy()
    s.generate("#submit")
    assert s.busy_seen(), "no visible busy state (disabled button + spinner + #busy + aria-busy)"
    upper, lower, hengpi = s.couplet()
    assert upper == UPPER
    assert len(han(lower)) == 7 and len(lower) == 7, f"下联 should be 7 Han characters: {lower!r}"
    assert len(han(hengpi)) == 4 and len(hengpi) == 4, (
        f"横批 should be 4 Han characters: {hengpi!r}"
    )
    assert s.api_bodies[-1] == {
        "upper": UPPER,
        "style": "traditional",
        "n": 4,
        "seed": None,
        "regenerate": False,
    }
    assert not page.is_disabled("#submit") and not page.is_visible("#busy")

    # Traditional layout: 横批 on top, 上联 on the right, 下联 on the left, vertical text.
    ub, lb, hb = s.box("#scroll-upper"), s.box("#scroll-lower"), s.box("#hengpi")
    assert lb["x"] + lb["width"] <= ub["x"], f"下联 {lb} should be left of 上联 {ub}"
    assert hb["y"] + hb["height"] <= min(ub["y"], lb["y"]), "横批 should be above the scrolls"
    assert ub["height"] > 2 * ub["width"], "上联 should be a vertical column"
    assert (
        page.eval_on_selector("#scroll-upper", "e => getComputedStyle(e).writingMode")
        == "vertical-rl"
    )

    # Real, selectable, labelled text; the status is announced.
    assert page.get_by_role("group", name="上联").inner_text().strip() == UPPER
    assert page.get_by_role("group", name="下联").inner_text().strip() == lower
    assert page.get_by_role("group", name="横批").inner_text().strip() == hengpi
    selected = page.evaluate(
        """() => {
            const r = document.createRange();
            r.selectNodeContents(document.getElementById('scroll-lower'));
            const sel = window.getSelection(); sel.removeAllRanges(); sel.addRange(r);
            const t = sel.toString(); sel.removeAllRanges(); return t;
        }"""
    )
    assert selected.strip() == lower
    assert lower in s.text("#status") and page.get_attribute("#status", "aria-live") == "polite"

    shot = s.snap(tmp_path / "couplet-desktop.png", copy_to=out_dir / "couplet-desktop.png")
    assert png_size(shot.read_bytes())[0] >= 1280

    # 换一副: the next couplet of the same answer (4 asked for), with no second request, never
    # one shown before; a new draw (regenerate, a fresh seed) only once they are used up.
    sent = len(s.api_bodies)
    seen = [lower]
    while len(s.api_bodies) == sent and len(seen) <= 4:
        s.generate("#regenerate")
        u2, l2, _ = s.couplet()
        assert u2 == UPPER and len(han(l2)) == 7
        if len(s.api_bodies) == sent:
            assert l2 not in seen, f"换一副 showed {l2} again: {seen}"
            seen.append(l2)
    assert len(seen) >= 2, f"换一副 drew again at once: the answer held one couplet ({seen})"
    assert len(s.api_bodies) == sent + 1, f"4 candidates, yet {len(seen)} shown without a request"
    body = s.api_bodies[-1]
    assert body["regenerate"] is True and isinstance(body["seed"], int) and body["n"] == 4, body
    assert body["upper"] == UPPER
    for _ in range(4):  # the draw's couplets in turn, then another draw with another seed
        s.generate("#regenerate")
    seeds = [b["seed"] for b in s.api_bodies if b.get("regenerate")]
    assert len(seeds) >= 2 and len(set(seeds)) == len(seeds), f"seeds repeat: {seeds}"

    # 保存图片: a PNG drawn on a canvas is downloaded.
    with page.expect_download() as dl_info:
        page.click("#save")
    dl = dl_info.value
    assert dl.suggested_filename.endswith(".png"), dl.suggested_filename
    saved = tmp_path / "couplet-saved.png"
    dl.save_as(str(saved))
    w, h = png_size(saved.read_bytes())
    assert w >= 1000 and h >= 1000, (w, h)
    shutil.copy(saved, out_dir / "couplet-saved.png")

    # Errors in plain Chinese; the couplet on the scrolls stays.
    shown = s.couplet()
    page.fill("#upper-input", "hello")
    s.click_and_settle("#submit")
    msg = s.text("#error")
    assert "只能写汉字" in msg, f"not-Chinese message: {msg!r}"
    assert not re.search(r"\b(must|upper|characters|invalid)\b", msg), (
        f"raw API text leaked: {msg!r}"
    )
    assert page.get_attribute("#upper-input", "aria-invalid") == "true"
    assert page.get_attribute("#error", "role") == "alert"
    assert s.couplet() == shown
    s.snap(
        tmp_path / "error-not-chinese.png",
        copy_to=out_dir / "error-not-chinese.png",
        full_page=False,
    )

    page.fill("#upper-input", "春" * 40)
    s.click_and_settle("#submit")
    msg = s.text("#error")
    assert "太长" in msg and "32" in msg, f"too-long message: {msg!r}"

    page.fill("#upper-input", "")
    page.click("#submit")
    assert "请先输入上联" in s.text("#error")

    # Typing again and writing a good line clears the error.
    page.fill("#upper-input", UPPER)
    assert page.get_attribute("#upper-input", "aria-invalid") is None
    s.generate("#submit")
    assert not page.is_visible("#error")
    s.assert_clean()


def test_cangtou_from_a_name(
    open_session: Callable[..., Session], tmp_path: Path, out_dir: Path
) -> None:
    s = open_session()
    s.open()
    page = s.page
    page.click("#tab-name")
    assert page.get_attribute("#tab-name", "aria-selected") == "true"
    assert page.is_visible("#name-input") and not page.is_visible("#upper-input")
    assert page.get_by_role("textbox", name="名字").count() == 1

    page.fill("#name-input", "李明")
    page.select_option("#style-select", "family")
    s.generate("#submit")
    assert s.api_bodies[-1] == {"heads": "李明", "length": 7, "style": "family", "n": 4}
    upper, lower, hengpi = s.couplet()
    assert upper.startswith("李") and lower.startswith("明"), (upper, lower)
    assert len(han(upper)) == 7 and len(han(lower)) == 7, (upper, lower)
    assert len(han(hengpi)) >= 2
    # 李 opens the right-hand scroll, 明 the left-hand one.
    ub, lb = s.box("#scroll-upper"), s.box("#scroll-lower")
    assert lb["x"] + lb["width"] <= ub["x"]
    s.snap(tmp_path / "cangtou.png", copy_to=out_dir / "couplet-cangtou.png")

    # 五言, then 换一副 keeps the name.
    page.check("input[name='length'][value='5']")
    s.generate("#submit")
    upper, lower, _ = s.couplet()
    assert len(han(upper)) == 5 and len(han(lower)) == 5, (upper, lower)
    assert upper[0] == "李" and lower[0] == "明"
    sent = len(s.api_bodies)
    shown = {(upper, lower)}
    for _ in range(5):  # 4 candidates in turn, then a new draw
        s.generate("#regenerate")
        upper, lower, _ = s.couplet()
        assert upper[0] == "李" and lower[0] == "明"
        if len(s.api_bodies) == sent:
            assert (upper, lower) not in shown
            shown.add((upper, lower))
    body = s.api_bodies[-1]
    assert body["heads"] == "李明" and body["regenerate"] is True and isinstance(body["seed"], int)
    assert sent < len(s.api_bodies) <= sent + 2  # a draw; two when the answer held fewer than 4

    # A full name: its given name heads the lines; a repeated character heads both.
    page.check("input[name='length'][value='7']")
    for name, (a, b) in (("王秀英", "秀英"), ("李丹丹", "丹丹")):
        page.fill("#name-input", name)
        s.generate("#submit")
        upper, lower, _ = s.couplet()
        assert upper[0] == a and lower[0] == b and len(han(upper)) == 7, (name, upper, lower)
        assert s.api_bodies[-1]["heads"] == name

    # A name that is too long gets a plain explanation.
    page.fill("#name-input", "欧阳小明明")
    s.click_and_settle("#submit")
    msg = s.text("#error")
    assert "名字" in msg and "4" in msg, msg
    s.assert_clean()


def test_phone_screen(open_session: Callable[..., Session], tmp_path: Path, out_dir: Path) -> None:
    s = open_session(
        viewport={"width": 390, "height": 844},
        device_scale_factor=2,
        is_mobile=True,
        has_touch=True,
    )
    s.open()
    page = s.page
    page.fill("#upper-input", UPPER)
    s.generate("#submit")
    upper, lower, hengpi = s.couplet()
    assert upper == UPPER and len(han(lower)) == 7

    width = page.evaluate("() => document.documentElement.scrollWidth")
    assert width <= 390, f"horizontal scrolling on a phone: scrollWidth={width}"
    ub, lb, hb = s.box("#scroll-upper"), s.box("#scroll-lower"), s.box("#hengpi")
    for name, b in (("上联", ub), ("下联", lb), ("横批", hb)):
        assert b["x"] >= 0 and b["x"] + b["width"] <= 390, f"{name} spills off screen: {b}"
    assert lb["x"] + lb["width"] <= ub["x"]
    for sel in ("#submit", "#regenerate", "#save", "#tab-upper", "#tab-name", "#upper-input"):
        assert s.box(sel)["height"] >= 44, f"{sel} is too small to tap"

    s.snap(tmp_path / "couplet-phone.png", copy_to=out_dir / "couplet-phone.png")
    s.assert_clean()


def test_service_states_in_plain_words(open_session: Callable[..., Session]) -> None:
    """429 / 503 / 504 / 413 / network failure, faked in the browser: the page's wording."""
    s = open_session()
    s.open()
    page = s.page
    page.fill("#upper-input", UPPER)

    def fake(status: int, code: str, headers: dict[str, str] | None = None) -> None:
        page.unroute("**/v1/couplets")
        body = json.dumps(
            {"error": {"code": code, "message": code.replace("_", " "), "field": None}}
        )
        page.route(
            "**/v1/couplets",
            lambda route: route.fulfill(
                status=status, body=body, content_type="application/json", headers=headers or {}
            ),
        )

    cases: list[tuple[int, str, dict[str, str] | None, str]] = [
        (429, "overloaded", {"Retry-After": "7"}, "7 秒后再试"),
        (503, "not_ready", {"Retry-After": "1"}, "准备中"),
        (504, "deadline_exceeded", None, "再试一次"),
        (413, "body_too_large", None, "太长"),
        (500, "internal", None, "稍后再试"),
    ]
    for status, code, headers, expected in cases:
        fake(status, code, headers)
        s.click_and_settle("#submit")
        msg = s.text("#error")
        assert expected in msg, f"{status}: {msg!r}"
        assert not re.search(r"[A-Za-z]{3,}", msg), f"{status}: English leaked into {msg!r}"
        assert not page.is_disabled("#submit"), "the button must come back after an error"

    page.unroute("**/v1/couplets")
    page.route("**/v1/couplets", lambda route: route.abort("connectionrefused"))
    s.click_and_settle("#submit")
    assert "网络" in s.text("#error")
    page.unroute("**/v1/couplets")
    s.assert_clean()
