"""The documentation describes the code as it is: generated reference pages are current, the
error table lists every code, every alert has its runbook, links resolve, and the project
speaks of itself (no diary of how it was built)."""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import re
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "chunlian"
DOCS = ROOT / "docs"


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "scripts" / "gen_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _load_generator()


def tracked_files() -> list[Path]:
    """The repository's files (git's list; the tree minus build output where git is absent)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=30).stdout
        return [ROOT / p for p in out.decode().split("\0") if p and (ROOT / p).exists()]
    except (OSError, subprocess.SubprocessError):
        skip = {".venv", "runs", ".git", "build", "node_modules"}
        return [p for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]


# ---- generated reference ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    return dict(gen.render_pages())


@pytest.mark.parametrize("page", sorted(gen.PAGES))
def test_generated_reference_page_is_current(page: str, rendered: dict[str, str]) -> None:
    committed = (DOCS / "reference" / page).read_text(encoding="utf-8")
    assert committed == rendered[page], f"docs/reference/{page} is stale: run scripts/gen_reference.py"


def test_configuration_reference_has_every_setting_with_a_description(rendered: dict[str, str]) -> None:
    from chunlian.config import ClientSettings, Settings

    page = rendered["configuration.md"]
    for name, field in [*Settings.model_fields.items(), *ClientSettings.model_fields.items()]:
        assert (field.description or "").strip(), f"Settings.{name} needs a docstring (the reference's text)"
        assert f"| `CHUNLIAN_{name.upper()}` |" in page


def _documented_env_names() -> set[str]:
    from chunlian.config import ClientSettings, Settings

    fields = [*Settings.model_fields, *ClientSettings.model_fields]
    return {f"CHUNLIAN_{n.upper()}" for n in fields} | set(gen.OTHER_ENV)


def test_every_chunlian_variable_named_in_code_or_docs_exists() -> None:
    """A ``CHUNLIAN_*`` name in the package or in any Markdown file is a setting or a listed
    variable: renamed or removed settings cannot linger in prose or code (the changelog,
    which records the removals, excepted)."""
    known = _documented_env_names()
    found: dict[str, str] = {}
    files = [p for p in tracked_files() if p.suffix == ".md" and p.name != "CHANGELOG.md"] + sorted(SRC.rglob("*.py"))
    for path in files:
        for name in re.findall(r"\bCHUNLIAN_[A-Z][A-Z0-9_]*[A-Z0-9]\b", path.read_text(encoding="utf-8")):
            if not name.startswith("CHUNLIAN_TEST_"):  # test hooks of the job worker
                found.setdefault(name, str(path.relative_to(ROOT)))
    unknown = {n: where for n, where in found.items() if n not in known}
    assert not unknown, f"not a setting nor a listed variable (gen_reference.OTHER_ENV): {unknown}"


def test_cli_reference_names_every_command() -> None:
    from chunlian.cli import build_parser

    page = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    commands = [name for name, _, _ in gen._subparsers(build_parser())]
    assert len(commands) >= 5
    for name in commands:
        assert f"## `chunlian {name}`" in page


def test_openapi_reference_is_the_apps_schema() -> None:
    schema = json.loads((DOCS / "reference" / "openapi.json").read_text(encoding="utf-8"))
    assert "/v1/couplets" in schema["paths"] and "/v1/jobs" in schema["paths"]


def _visible_flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions if a.help != argparse.SUPPRESS for s in a.option_strings}


def _command_uses(text: str) -> list[tuple[list[str], list[str]]]:
    """Each ``chunlian <command> [<sub-command>] --flag ...`` written in a code block or an inline
    code span: (the words after ``chunlian``, the flags given to it)."""
    segments = re.findall(r"```.*?```", text, flags=re.S) + re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    uses = []
    for segment in segments:
        for line in segment.splitlines():
            for part in re.split(r"[|;&#]", line):
                m = re.search(r"\bchunlian\s+([a-z][a-z-]*)((?:\s+[a-z][a-z-]*)?)(.*)", part)
                if m:
                    uses.append(([m.group(1), *m.group(2).split()], re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", m.group(3))))
    return uses


def test_commands_and_flags_named_in_the_docs_exist() -> None:
    """A ``chunlian`` command line in any Markdown file uses commands and visible flags the
    parsers have: a renamed or removed flag cannot linger in a guide."""
    from chunlian.cli import build_parser

    root = build_parser()
    wrong = []
    for md in (p for p in tracked_files() if p.suffix == ".md" and p.name != "CHANGELOG.md"):
        for words, flags in _command_uses(md.read_text(encoding="utf-8")):
            parser = gen._subparser(root, words[0])
            if parser is None:  # prose ("a chunlian instance") unless flags follow
                wrong += [f"{md.relative_to(ROOT)}: chunlian {words[0]}"] if flags else []
                continue
            if len(words) > 1 and gen._subparser(parser, words[1]) is not None:
                parser = gen._subparser(parser, words[1])
            known = _visible_flags(parser)
            wrong += [f"{md.relative_to(ROOT)}: chunlian {' '.join(words)} {f}" for f in flags if f not in known]
    assert not wrong, "\n".join(sorted(set(wrong)))


# ---- errors ----------------------------------------------------------------------------------
ERROR_CALLS = {"error_response", "error_body", "failed_entry", "reply_error", "fail_remaining"}
NOT_ANSWERED = {  # codes of errors no client ever receives
    "config_error": "raised at start-up only: the process stops",
    "cluster_error": "raised by `chunlian cluster` on its own terminal",
    "engine_error": "the base of the engine's errors; only its subclasses are raised",
}
CODE = re.compile(r"^[a-z]+(_[a-z]+)*$")


def _str(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _codes_in(tree: ast.AST) -> set[str]:
    """Error codes a module can answer with: the code argument of the error builders, a
    ``code = "..."`` assignment (an error class's, or a local one), a ``(status, code, message)``
    refusal, a status -> code table and its default."""
    codes: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            strings = [s for s in map(_str, node.args) if s is not None]
            builder = name in ERROR_CALLS and bool(strings)
            table_default = name == "get" and "CODES" in ast.unparse(node.func) and len(strings) == 1
            if builder or table_default:
                codes.add(strings[0])
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id == "code" and _str(node.value):
                    codes.add(str(_str(node.value)))
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    for t, v in zip(target.elts, node.value.elts, strict=False):
                        if isinstance(t, ast.Name) and t.id == "code" and _str(v):
                            codes.add(str(_str(v)))
        elif isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple) and len(node.value.elts) == 3:
            status, code = node.value.elts[:2]
            if isinstance(status, ast.Constant) and isinstance(status.value, int) and _str(code):
                codes.add(str(_str(code)))
        elif isinstance(node, ast.Dict) and node.keys and all(
                isinstance(k, ast.Constant) and isinstance(k.value, int) and 400 <= k.value < 600 for k in node.keys):
            codes.update(s for s in map(_str, node.values) if s)
    return {c for c in codes if CODE.match(c)}


def answerable_codes() -> set[str]:
    codes: set[str] = set()
    for path in SRC.rglob("*.py"):
        if "bench" not in path.relative_to(SRC).parts:
            codes |= _codes_in(ast.parse(path.read_text(encoding="utf-8")))
    for template in SRC.rglob("*.template"):
        codes |= set(re.findall(r'"code":"([a-z_]+)"', template.read_text(encoding="utf-8")))
    return codes - set(NOT_ANSWERED)


def test_error_table_lists_every_code_the_service_and_nginx_answer() -> None:
    page = (DOCS / "reference" / "errors.md").read_text(encoding="utf-8")
    table = set(re.findall(r"^\| `([a-z_]+)` \|", page, flags=re.M))
    codes = answerable_codes()
    assert {"invalid_input", "overloaded", "rate_limited", "unavailable", "time_limit"} <= codes  # the scan works
    assert codes - table == set(), "codes the code answers but docs/reference/errors.md does not list"
    assert table - codes == set(), "codes docs/reference/errors.md lists but nothing answers"


def test_error_scan_finds_each_kind_of_definition() -> None:
    source = '''
class Gone(Exception):
    code = "gone_away"
def f(status):
    error_response(503, "not_here", "m")
    code, message = "too_slow", "m"
    return {401: "who_are_you"}.get(status, "other_thing")
def g():
    return 431, "too_big", "m"
'''
    assert _codes_in(ast.parse(source)) == {"gone_away", "not_here", "too_slow", "who_are_you", "too_big"}


# ---- alerts and metrics ----------------------------------------------------------------------
def test_every_alert_has_a_summary_a_runbook_and_an_entry() -> None:
    rules = gen.alert_rules()
    page = (DOCS / "reference" / "alerts.md").read_text(encoding="utf-8")
    assert rules
    for rule in rules:
        notes = rule.get("annotations", {})
        assert len(notes.get("summary", "").strip()) > 10, rule["alert"]
        assert len(notes.get("runbook", "").strip()) > 40, f"{rule['alert']} needs a runbook annotation"
        assert f"## {rule['alert']}\n" in page
        assert f"**Runbook.** {gen._cell(notes['runbook'])}" in page


def test_alerts_and_dashboard_use_only_defined_metrics() -> None:
    defined = {m["name"] for m in gen.metric_definitions()}
    series = {f"{n}{s}" for n in defined for s in ("", "_bucket", "_sum", "_count")}
    for path in (ROOT / "deploy" / "prometheus" / "alerts.yml", ROOT / "deploy" / "grafana" / "dashboard.json"):
        used = set(re.findall(r"\bchunlian_[a-z0-9_]+", path.read_text(encoding="utf-8")))
        jobs = {"chunlian_instances", "chunlian_nginx"}  # scrape job names, not metrics
        assert used - series - jobs == set(), f"{path.name} uses metrics the code does not define"


# ---- links -----------------------------------------------------------------------------------
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def _heading_anchors(text: str) -> set[str]:
    """GitHub's anchors for a page's headings."""
    anchors = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", re.sub(r"```.*?```", "", text, flags=re.S), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def test_every_relative_link_in_markdown_resolves() -> None:
    broken = []
    for md in (p for p in tracked_files() if p.suffix == ".md"):
        text = md.read_text(encoding="utf-8")
        for target in LINK.findall(re.sub(r"```.*?```", "", text, flags=re.S)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (md.parent / path).resolve() if path else md
            if not dest.exists():
                broken.append(f"{md.relative_to(ROOT)} -> {target}")
            elif anchor and dest.suffix == ".md" and anchor not in _heading_anchors(dest.read_text(encoding="utf-8")):
                broken.append(f"{md.relative_to(ROOT)} -> {target} (no such heading)")
    assert not broken, "\n".join(broken)


# ---- the project speaks of itself ------------------------------------------------------------
# Assembled with \s, so this file does not match itself.
_ORDINAL = (r"(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|[a-z]+teenth"
            r"|twentieth|[a-z]+tieth|[a-z]+th|[0-9]+(st|nd|rd|th))")
DIARY = re.compile(_ORDINAL + r"\s+session|(this|previous|earlier|last)\s+session|earlier\s+today"
                   r"|before\s+this\s+change|after\s+the\s+change", re.I)
DIARY_NAME = re.compile(r"(first|second|third|[a-z]+th|twelfth|twentieth)_(session|intel|amd|zen)|session_", re.I)


def test_no_file_narrates_how_the_project_was_built() -> None:
    hits = []
    for path in tracked_files():
        rel = str(path.relative_to(ROOT))
        if DIARY_NAME.search(rel):
            hits.append(rel)
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # weights, images
        hits += [f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}" for m in DIARY.finditer(text)]
    assert not hits, "\n".join(hits[:20])
