/* chunlian campaign page: ask the API for a couplet, show it as two scrolls, save it as a PNG.
 *
 * Paths are relative ("v1/couplets", "static/...") so the page also works when a platform
 * mounts the service under a path prefix. No external requests of any kind.
 */
(() => {
  "use strict";

  const REQUEST_TIMEOUT_MS = 30000;
  // candidates asked for at once: 换一副 shows the next of them without a second search, and
  // asks again only when they are used up (the warm-up caches answers of this size:
  // chunlian.api.warmup.PAGE_CANDIDATES)
  const CANDIDATES = 4;
  const MAX_CHARS = 32;
  const VERTICAL_FORMS = { "—": "\uFE31", "…": "\uFE19" };
  const STYLE_NAMES = { traditional: "传统", business: "商贸", family: "家庭", literary: "文雅" };
  const FIELD_NAMES = {
    upper: "上联",
    heads: "名字",
    keyword: "关键词",
    style: "风格",
    length: "每联字数",
  };

  const $ = (id) => document.getElementById(id);
  const el = {
    form: $("couplet-form"),
    tabs: Array.from(document.querySelectorAll('[role="tab"]')),
    upperInput: $("upper-input"),
    nameInput: $("name-input"),
    style: $("style-select"),
    submit: $("submit"),
    submitLabel: document.querySelector("#submit .btn__label"),
    regenerate: $("regenerate"),
    save: $("save"),
    couplet: $("couplet"),
    upper: $("scroll-upper"),
    lower: $("scroll-lower"),
    hengpi: $("hengpi"),
    caption: $("caption"),
    busy: $("busy"),
    status: $("status"),
    error: $("error"),
  };

  let mode = "upper"; // "upper" (对下联) or "name" (藏头联)
  let lastRequest = null; // { path, body } of the last successful request
  let pool = []; // the last answer's couplets, best first; pool[at] is shown
  let at = 0;
  let shown = new Set(); // couplets shown since the last 写春联 (upper|lower), never shown twice
  let busy = false;
  let seq = 0;

  const chars = (s) => Array.from(s || "");
  const reducedMotion = () => window.matchMedia("(prefers-reduced-motion: reduce)").matches;

  function randomSeed() {
    const a = new Uint32Array(1);
    window.crypto.getRandomValues(a);
    return a[0] >>> 1; // 0 .. 2^31-1
  }

  /* ---------------- tabs ---------------- */

  function selectMode(next, { focusTab = false } = {}) {
    mode = next;
    for (const tab of el.tabs) {
      const on = tab.dataset.mode === next;
      tab.setAttribute("aria-selected", String(on));
      tab.tabIndex = on ? 0 : -1;
      $(tab.getAttribute("aria-controls")).hidden = !on;
      if (on && focusTab) tab.focus();
    }
    clearError();
  }

  el.tabs.forEach((tab, i) => {
    tab.addEventListener("click", () => selectMode(tab.dataset.mode));
    tab.addEventListener("keydown", (ev) => {
      let j = null;
      if (ev.key === "ArrowRight" || ev.key === "ArrowDown") j = (i + 1) % el.tabs.length;
      else if (ev.key === "ArrowLeft" || ev.key === "ArrowUp") j = (i - 1 + el.tabs.length) % el.tabs.length;
      else if (ev.key === "Home") j = 0;
      else if (ev.key === "End") j = el.tabs.length - 1;
      if (j !== null) {
        ev.preventDefault();
        selectMode(el.tabs[j].dataset.mode, { focusTab: true });
      }
    });
  });

  /* ---------------- messages ---------------- */

  function say(text) {
    el.status.textContent = text;
  }

  function clearError() {
    el.error.hidden = true;
    el.error.textContent = "";
    for (const input of [el.upperInput, el.nameInput, el.style]) input.removeAttribute("aria-invalid");
  }

  function showError(text, field) {
    el.error.textContent = text;
    el.error.hidden = false;
    say("");
    const input = { upper: el.upperInput, heads: el.nameInput, keyword: el.nameInput, style: el.style }[field];
    if (input) input.setAttribute("aria-invalid", "true");
  }

  for (const input of [el.upperInput, el.nameInput]) {
    input.addEventListener("input", () => input.removeAttribute("aria-invalid"));
  }

  /** Parse a Retry-After header (seconds or an HTTP date) into whole seconds, or null. */
  function retryAfterSeconds(value) {
    if (!value) return null;
    const n = Number(value);
    if (Number.isFinite(n)) return Math.max(1, Math.ceil(n));
    const t = Date.parse(value);
    if (!Number.isNaN(t)) return Math.max(1, Math.ceil((t - Date.now()) / 1000));
    return null;
  }

  /** Turn an API error (status, {error:{code,message,field}}, headers) into plain Chinese. */
  function friendlyMessage(status, err, retryAfter) {
    const code = String((err && err.code) || "").toLowerCase();
    const message = String((err && err.message) || "");
    const text = `${code} ${message}`.toLowerCase();
    const field = (err && err.field) || null;
    const what = FIELD_NAMES[field] || (mode === "name" ? "名字" : "上联");
    const wait = retryAfter ? `请 ${retryAfter} 秒后再试。` : "请稍等片刻再试。";

    if (status === 429 || /overload|too many|queue/.test(code)) {
      return `现在求春联的人太多了，${wait}`;
    }
    if (status === 503 || /not.?ready|unavailable|stopped|warming/.test(code)) {
      return `服务正在准备中，${wait}`;
    }
    if (status === 504 || /deadline|timeout/.test(code)) {
      return "这一副写得太久，没能按时完成，请再试一次。";
    }
    if (status === 413 || /too.?large|payload/.test(code)) {
      return "输入的内容太长了，请删短一些再试。";
    }
    if (status === 422 || status === 400) {
      if (field === "style" || /style/.test(text)) return "请从“传统、商贸、家庭、文雅”中选一种风格。";
      if (field === "length") return "每联字数只能选五言或七言。";
      if (/json|body|decode|parse/.test(text) && !field) return "请求格式有误，请刷新页面后再试。";
      if (/empty|blank|missing|required/.test(text)) return `请先输入${what}。`;
      if (/too.?long|at most|longer|max/.test(text)) {
        const m = message.match(/(\d+)\s*char\w*,\s*at most\s*(\d+)/i);
        if (field === "heads" && m) return `名字最多 ${m[2]} 个字（现在是 ${m[1]} 个）。`;
        if (m) return `${what}太长了：共 ${m[1]} 个字，最多 ${m[2]} 个字。`;
        const mm = message.match(/at most\s*(\d+)/i);
        return `${what}太长了，最多 ${mm ? mm[1] : MAX_CHARS} 个字。`;
      }
      if (/too.?short|at least/.test(text)) {
        const m = message.match(/at least\s*(\d+)/i);
        return `${what}太短了${m ? `，至少 ${m[1]} 个字` : ""}。`;
      }
      if (/begin|start/.test(text)) return `${what}要以汉字开头。`;
      if (/end with/.test(text)) return `${what}要以汉字结尾，或在最后一个字后加一个。！？或……。`;
      if (/punctuation|in a row/.test(text)) return `${what}里不能连着用两个标点。`;
      if (/chinese|han\b|hanzi|cjk|ideograph|not_chinese/.test(text)) {
        const found = message.match(/found\s+['"](.+?)['"]\s*$/);
        const bad = found ? `，请去掉“${found[1]}”` : "";
        return `${what}只能写汉字${bad}。分句请用中文标点，如“，”。`;
      }
      if (/[\u4e00-\u9fff]{4,}/.test(message) && !/[a-z]{3,}/i.test(message)) return message;
      return `${what}无法使用，请换一句再试。`;
    }
    if (status >= 500) return "服务出了点问题，请稍后再试。";
    return "出了点问题，请再试一次。";
  }

  class FriendlyError extends Error {
    constructor(message, field = null) {
      super(message);
      this.field = field;
    }
  }

  /* ---------------- the API ---------------- */

  async function postJSON(path, body) {
    const ctrl = new AbortController();
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      ctrl.abort();
    }, REQUEST_TIMEOUT_MS);
    let resp;
    try {
      resp = await fetch(path, {
        method: "POST",
        headers: { "Content-Type": "application/json", Accept: "application/json" },
        body: JSON.stringify(body),
        signal: ctrl.signal,
      });
    } catch (e) {
      throw new FriendlyError(
        timedOut ? "等了太久还没有回音，请再试一次。" : "网络连接失败，请检查网络后再试。",
      );
    } finally {
      clearTimeout(timer);
    }
    let data = null;
    try {
      data = await resp.json();
    } catch (e) {
      data = null;
    }
    if (!resp.ok) {
      const err = data && data.error ? data.error : null;
      const field = err && err.field ? err.field : null;
      throw new FriendlyError(
        friendlyMessage(resp.status, err, retryAfterSeconds(resp.headers.get("Retry-After"))),
        field,
      );
    }
    if (!data || typeof data.upper !== "string" || typeof data.lower !== "string") {
      throw new FriendlyError("服务返回的内容不完整，请再试一次。");
    }
    return data;
  }

  function buildRequest() {
    const style = el.style.value;
    if (mode === "name") {
      const heads = el.nameInput.value.trim();
      const length = Number((el.form.querySelector('input[name="length"]:checked') || {}).value || 7);
      if (!heads) throw new FriendlyError("请先输入名字。", "heads");
      return { path: "v1/couplets/compose", body: { heads, length, style, n: CANDIDATES } };
    }
    const upper = el.upperInput.value.trim();
    if (!upper) throw new FriendlyError("请先输入上联。", "upper");
    return { path: "v1/couplets", body: { upper, style, n: CANDIDATES, seed: null, regenerate: false } };
  }

  async function run(request, { regenerate = false } = {}) {
    if (busy) return;
    clearError();
    setBusy(true, regenerate);
    try {
      const body = regenerate
        ? { ...request.body, regenerate: true, seed: randomSeed() }
        : request.body;
      const data = await postJSON(request.path, body);
      lastRequest = request;
      if (!regenerate) shown = new Set();
      pool = couplets(data);
      // a fresh draw may repeat a couplet already seen: start at the first new one
      at = Math.max(0, pool.findIndex((c) => !shown.has(keyOf(c))));
      showAt(at);
    } catch (e) {
      const friendly = e instanceof FriendlyError ? e : new FriendlyError("出了点问题，请再试一次。");
      showError(friendly.message, friendly.field);
    } finally {
      setBusy(false);
    }
  }

  const keyOf = (c) => `${c.upper}|${c.lower}`;

  function couplets(data) {
    const list = Array.isArray(data.candidates) && data.candidates.length ? data.candidates : [data];
    return list.filter((c) => c && typeof c.upper === "string" && typeof c.lower === "string")
      .map((c) => ({ ...c, style: c.style || data.style }));
  }

  function showAt(i) {
    const c = pool[i] || pool[0];
    shown.add(keyOf(c));
    render(c);
  }

  // 换一副: the next couplet of the same answer not shown yet; a new draw when none is left
  function another() {
    for (let i = at + 1; i < pool.length; i++) {
      if (!shown.has(keyOf(pool[i]))) {
        at = i;
        showAt(i);
        return;
      }
    }
    run(lastRequest, { regenerate: true });
  }

  function setBusy(on, regenerate = false) {
    busy = on;
    const v = String(on);
    el.form.setAttribute("aria-busy", v);
    el.couplet.setAttribute("aria-busy", v);
    el.submit.disabled = on;
    el.submit.classList.toggle("is-busy", on);
    el.submitLabel.textContent = on ? "书写中" : "写春联";
    el.regenerate.disabled = on || !lastRequest;
    el.save.disabled = on;
    el.busy.hidden = !on;
    el.status.classList.toggle("visually-hidden", on); // #busy shows it; the status announces it
    if (on) say(regenerate ? "正在换一副……" : "正在写春联……");
  }

  /* ---------------- rendering ---------------- */

  function render(data) {
    el.upper.textContent = data.upper;
    el.lower.textContent = data.lower;
    el.hengpi.textContent = data.hengpi || "";
    el.hengpi.parentElement.hidden = !data.hengpi;
    const n = Math.max(chars(data.upper).length, chars(data.lower).length, 1);
    el.couplet.style.setProperty("--n", String(n));
    el.couplet.dataset.state = "result";
    el.couplet.dataset.seq = String(++seq);
    const styleName = STYLE_NAMES[data.style] || "";
    el.caption.textContent = `${styleName ? `${styleName}风格 · ` : ""}上联贴右，下联贴左`;
    say(`写好了。上联：${data.upper}；下联：${data.lower}${data.hengpi ? `；横批：${data.hengpi}` : ""}。`);

    el.couplet.classList.remove("is-new");
    void el.couplet.offsetWidth; // restart the ink-in animation
    el.couplet.classList.add("is-new");

    const r = el.couplet.getBoundingClientRect();
    if (r.top < 0 || r.bottom > window.innerHeight) {
      el.couplet.scrollIntoView({ behavior: reducedMotion() ? "auto" : "smooth", block: "start" });
    }
  }

  /* ---------------- save as image ---------------- */

  function roundRect(ctx, x, y, w, h, r) {
    ctx.beginPath();
    ctx.moveTo(x + r, y);
    ctx.arcTo(x + w, y, x + w, y + h, r);
    ctx.arcTo(x + w, y + h, x, y + h, r);
    ctx.arcTo(x, y + h, x, y, r);
    ctx.arcTo(x, y, x + w, y, r);
    ctx.closePath();
  }

  function redPaper(ctx, x, y, w, h, horizontal) {
    const g = horizontal ? ctx.createLinearGradient(0, y, 0, y + h) : ctx.createLinearGradient(x, 0, x + w, 0);
    g.addColorStop(0, "#940e17");
    g.addColorStop(0.2, "#b8141e");
    g.addColorStop(0.5, "#c8191f");
    g.addColorStop(0.8, "#b8141e");
    g.addColorStop(1, "#940e17");
    ctx.save();
    ctx.shadowColor = "rgba(125, 11, 18, 0.35)";
    ctx.shadowBlur = 24;
    ctx.shadowOffsetY = 10;
    ctx.fillStyle = g;
    ctx.fillRect(x, y, w, h);
    ctx.restore();
    ctx.strokeStyle = "rgba(255, 211, 107, 0.7)";
    ctx.lineWidth = 3;
    ctx.strokeRect(x + 10, y + 10, w - 20, h - 20);
  }

  function roller(ctx, x, y, w) {
    const g = ctx.createLinearGradient(0, y, 0, y + 16);
    g.addColorStop(0, "#d9a441");
    g.addColorStop(0.55, "#8a5a16");
    g.addColorStop(1, "#5c3a0c");
    ctx.fillStyle = g;
    roundRect(ctx, x - 12, y, w + 24, 16, 8);
    ctx.fill();
  }

  function goldText(ctx, ch, x, y, size, family) {
    ctx.font = `700 ${size}px ${family}`;
    ctx.textAlign = "center";
    ctx.textBaseline = "middle";
    ctx.fillStyle = "rgba(70, 8, 8, 0.55)";
    ctx.fillText(ch, x, y + 2);
    ctx.fillStyle = "#ffd36b";
    ctx.fillText(ch, x, y);
  }

  /** Draw the couplet now on screen onto a new canvas and return it. */
  function drawCanvas() {
    const upper = chars(el.upper.textContent.trim());
    const lower = chars(el.lower.textContent.trim());
    const hengpi = chars(el.hengpi.textContent.trim());
    const family = getComputedStyle(el.upper).fontFamily || "serif";

    const n = Math.max(upper.length, lower.length, 1);
    const cs = n <= 7 ? 112 : n <= 11 ? 92 : Math.max(44, Math.floor(1150 / n)); // character size
    const step = Math.round(cs * 1.18);
    const scrollW = Math.round(cs * 1.6);
    const scrollH = n * step + 90;
    const hs = 84; // 横批 character size
    const hengpiW = Math.max(hengpi.length, 1) * Math.round(hs * 1.45) + 90;
    const hengpiH = Math.round(hs * 1.7);
    const W = Math.max(1080, hengpiW + 160, scrollW * 2 + 520);
    const top = 90;
    const scrollTop = top + (hengpi.length ? hengpiH + 90 : 40);
    const H = scrollTop + scrollH + 170;

    const canvas = document.createElement("canvas");
    canvas.width = W;
    canvas.height = H;
    const ctx = canvas.getContext("2d");

    // paper background with a thin double frame
    const bg = ctx.createLinearGradient(0, 0, 0, H);
    bg.addColorStop(0, "#f7ead0");
    bg.addColorStop(1, "#ead3a8");
    ctx.fillStyle = bg;
    ctx.fillRect(0, 0, W, H);
    ctx.strokeStyle = "#b98a2c";
    ctx.lineWidth = 4;
    ctx.strokeRect(24, 24, W - 48, H - 48);
    ctx.lineWidth = 1.5;
    ctx.strokeRect(36, 36, W - 72, H - 72);

    // 横批, left to right across the top
    if (hengpi.length) {
      const hx = (W - hengpiW) / 2;
      redPaper(ctx, hx, top, hengpiW, hengpiH, true);
      const cell = (hengpiW - 90) / hengpi.length;
      hengpi.forEach((ch, i) => goldText(ctx, ch, hx + 45 + cell * (i + 0.5), top + hengpiH / 2, hs, family));
    }

    // 上联 on the right, 下联 on the left, one character per cell from the top
    const margin = Math.round((W - scrollW * 2) / 2 - Math.min(260, W * 0.2));
    const leftX = Math.max(90, margin);
    const rightX = W - leftX - scrollW;
    const drawScroll = (line, x) => {
      redPaper(ctx, x, scrollTop, scrollW, scrollH, false);
      roller(ctx, x, scrollTop - 12, scrollW);
      roller(ctx, x, scrollTop + scrollH - 4, scrollW);
      const y0 = scrollTop + 45 + (scrollH - 90 - line.length * step) / 2;
      // the dash and the ellipsis in their vertical forms, as the page's vertical text shows them
      line.forEach((ch, i) => goldText(ctx, VERTICAL_FORMS[ch] || ch, x + scrollW / 2, y0 + step * (i + 0.5), cs, family));
    };
    drawScroll(upper, rightX);
    drawScroll(lower, leftX);

    // 福 diamond between the scrolls
    const d = 150;
    ctx.save();
    ctx.translate(W / 2, scrollTop + scrollH / 2);
    ctx.rotate(Math.PI / 4);
    const fg = ctx.createLinearGradient(-d / 2, -d / 2, d / 2, d / 2);
    fg.addColorStop(0, "#c8191f");
    fg.addColorStop(1, "#7d0b12");
    ctx.fillStyle = fg;
    ctx.fillRect(-d / 2, -d / 2, d, d);
    ctx.strokeStyle = "rgba(255, 211, 107, 0.75)";
    ctx.lineWidth = 3;
    ctx.strokeRect(-d / 2 + 8, -d / 2 + 8, d - 16, d - 16);
    ctx.rotate(-Math.PI / 4);
    goldText(ctx, "福", 0, 0, 88, family);
    ctx.restore();

    ctx.font = `500 28px ${family}`;
    ctx.fillStyle = "#5e4032";
    ctx.textAlign = "center";
    ctx.textBaseline = "alphabetic";
    ctx.fillText("新春快乐 · 万事如意", W / 2, H - 70);
    return canvas;
  }

  function fileName() {
    const base = el.upper.textContent.trim().replace(/[\\/:*?"<>|\s]/g, "").slice(0, 16) || "couplet";
    return `春联-${base}.png`;
  }

  async function saveImage() {
    try {
      if (document.fonts && document.fonts.ready) await document.fonts.ready;
      const canvas = drawCanvas();
      const blob = await new Promise((resolve) => canvas.toBlob(resolve, "image/png"));
      const href = blob ? URL.createObjectURL(blob) : canvas.toDataURL("image/png");
      const a = document.createElement("a");
      a.href = href;
      a.download = fileName();
      document.body.appendChild(a);
      a.click();
      a.remove();
      if (blob) setTimeout(() => URL.revokeObjectURL(href), 10000);
      say("图片已保存。");
    } catch (e) {
      showError("没能生成图片，请长按或截图保存。");
    }
  }

  /* ---------------- wiring ---------------- */

  el.form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    if (busy) return;
    let request;
    try {
      request = buildRequest();
    } catch (e) {
      clearError();
      showError(e.message, e.field);
      (e.field === "heads" ? el.nameInput : el.upperInput).focus();
      return;
    }
    run(request);
  });

  el.regenerate.addEventListener("click", () => {
    if (lastRequest && !busy) another();
  });

  el.save.addEventListener("click", saveImage);

  // A campaign link can pre-fill the form: ?upper=…, or ?name=…&length=5|7, and &style=….
  const params = new URLSearchParams(window.location.search);
  if (params.get("style") && STYLE_NAMES[params.get("style")]) el.style.value = params.get("style");
  if (params.get("length") === "5" || params.get("length") === "7") {
    const radio = el.form.querySelector(`input[name="length"][value="${params.get("length")}"]`);
    if (radio) radio.checked = true;
  }
  if (params.get("name")) {
    el.nameInput.value = params.get("name").slice(0, 8);
    selectMode("name");
    el.form.requestSubmit();
  } else if (params.get("upper")) {
    el.upperInput.value = params.get("upper").slice(0, 64);
    el.form.requestSubmit();
  }

  // Let tests and embedding pages know the script is wired up.
  document.documentElement.dataset.ready = "true";
})();
