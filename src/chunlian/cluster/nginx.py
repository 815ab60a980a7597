"""The nginx front of a chunlian cluster: render its config from the shipped template.

The template (``chunlian/cluster/nginx.conf.template``, also reachable as
``deploy/nginx/chunlian.conf.template`` in a checkout) holds every directive; this module
only fills in ``{{name}}`` placeholders from an ``NginxConfig``. A deployment changes
parameters, never the rendered file, so what runs is always what was tested.

What the rendered config does (see the template's comments):
* one ``upstream`` of N instances, ``least_conn``, with idle keep-alive connections; each
  instance is listed twice: as a primary that a failure takes out for ``fail_timeout_s``, and
  as a backup that is never taken out, so the upstream as a whole is never "down";
* proxy timeouts that leave room for the service's own deadline (the service answers 504
  itself; nginx gives up ``deadline_margin_s`` later, only on a hung instance);
* ``client_max_body_size`` = the service's body limit (413 in the service's error shape);
* ``X-Request-Id`` passed through (the client's if sane, else ``$request_id``);
* retry on the next instance for connection errors, timeouts, 502 and 503 only; POSTs are
  re-sent (``non_idempotent``) only under ``/v1/couplets`` (idempotent: same input, same
  cached answer), never under ``/v1/jobs``;
* an optional per-client request rate on ``/v1/couplets`` and ``/v1/jobs`` (``limit_req``,
  off by default; 429 in the service's error shape with ``Retry-After``), with exempt
  addresses and trusted proxies whose ``X-Forwarded-For`` names the client (``realip``);
* ``/nginx-health``; pid, logs and temp files inside ``prefix``.
"""

from __future__ import annotations

import grp
import ipaddress
import math
import os
import pwd
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from chunlian.config import HttpSettings, parse_origins
from chunlian.errors import ChunlianError, ConfigError

# nginx lets a request ask for up to this long (its timeout_ms) at least, and longer when the
# service's own default deadline is longer (front_deadline_s)
DEFAULT_DEADLINE_S = 30.0


def front_deadline_s(default_timeout_ms: int) -> float:
    """The longest request deadline nginx allows, for a service whose default deadline is
    ``default_timeout_ms`` (``CHUNLIAN_DEFAULT_TIMEOUT_MS``)."""
    return max(DEFAULT_DEADLINE_S, default_timeout_ms / 1000.0)

TEMPLATE_NAME = "nginx.conf.template"
CONF_NAME = "nginx.conf"
_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")
INSTALL_HINT = "install it with: bash scripts/install-nginx.sh (or apt-get install -y nginx)"


class ClusterError(ChunlianError):
    """The cluster could not be configured, started or kept running."""

    code = "cluster_error"


@dataclass(frozen=True)
class NginxConfig:
    """Everything a rendered nginx config depends on."""

    upstreams: tuple[str, ...]  # "host:port" of each service instance
    prefix: Path  # pid, logs, temp files and the config itself live here
    listen: str = "127.0.0.1:8000"  # "port", "host:port" or "[v6]:port"
    listen_options: str = ""  # e.g. "backlog=4096 reuseport"
    deadline_s: float = DEFAULT_DEADLINE_S  # longest request deadline the service is allowed to use
    deadline_margin_s: float = 5.0  # nginx waits this much longer than the deadline
    connect_timeout_s: float = 2.0
    send_timeout_s: float = 10.0
    body_limit_bytes: int = HttpSettings.defaults().body_limit_bytes  # = CHUNLIAN_BODY_LIMIT_BYTES
    worker_processes: str = "auto"
    worker_connections: int = 4096
    upstream_keepalive: int = 32  # idle connections per nginx worker
    max_fails: int = 1
    fail_timeout_s: int = 5
    access_log: bool = True
    error_log_level: str = "warn"
    user: str | None = None  # the 'user' directive; None: default_user()
    # Per-client request rate on /v1/couplets and /v1/jobs (0: off). A client is an address
    # (after trusted_proxies' X-Forwarded-For); above rate + burst it gets nginx's 429.
    client_rate_per_s: float = 0.0
    client_burst: int = 20  # requests above the rate let through at once
    rate_limit_exempt: tuple[str, ...] = ()  # addresses / CIDRs never limited
    trusted_proxies: tuple[str, ...] = ()  # CIDRs whose X-Forwarded-For names the client
    rate_limit_zone_mb: int = 10  # shared state: about 16,000 client addresses a megabyte
    rate_limit_dry_run: bool = False  # log what the rate would refuse (access log limit=...), refuse nothing
    cors_origins: tuple[str, ...] = ()  # = CHUNLIAN_CORS_ORIGINS: nginx's own refusals readable by those pages
    # seconds nginx (and browsers) keep the campaign page and its files (0: not cached, every
    # visitor's requests reach an instance)
    page_cache_s: int = 60

    @property
    def conf_path(self) -> Path:
        return self.prefix / CONF_NAME

    @property
    def read_timeout_s(self) -> float:
        return self.deadline_s + self.deadline_margin_s

    def validate(self) -> None:
        """Raise ``ConfigError`` naming the first bad parameter."""
        if not self.upstreams:
            raise ConfigError("nginx needs at least one upstream instance")
        for up in self.upstreams:
            m = _HOST_PORT.match(up)
            if m is None or not 0 < int(m.group(2)) < 65536:
                raise ConfigError(f"upstream must be HOST:PORT, got {up!r}")
        listen = self.listen
        if not (listen.isdigit() or _HOST_PORT.match(listen)):
            raise ConfigError(f"listen must be PORT or HOST:PORT, got {listen!r}")
        if self.deadline_s <= 0 or self.deadline_margin_s <= 0:
            raise ConfigError("deadline_s and deadline_margin_s must be positive")
        try:
            HttpSettings.check(body_limit_bytes=self.body_limit_bytes)  # the service's bounds
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if not re.fullmatch(r"auto|[1-9][0-9]*", str(self.worker_processes)):
            raise ConfigError(f"worker_processes must be 'auto' or a positive number, got {self.worker_processes!r}")
        self._validate_rate_limit()
        if not 0 <= self.page_cache_s <= 86_400:
            raise ConfigError(f"page cache must be 0 (off) to 86400 seconds, got {self.page_cache_s}")
        try:
            parse_origins(self.cors_origins)
        except ValueError as e:
            raise ConfigError(f"cors origins: {e}") from None

    def _validate_rate_limit(self) -> None:
        rate = self.client_rate_per_s
        if not (math.isfinite(rate) and (rate == 0 or rate * 60 >= 1)):
            raise ConfigError(f"client rate must be 0 (off) or at least 1 request a minute (1/60 per second), got {rate}")
        if not 0 <= self.client_burst <= 100_000:
            raise ConfigError(f"client burst must be between 0 and 100000 requests, got {self.client_burst}")
        if not 1 <= self.rate_limit_zone_mb <= 1024:
            raise ConfigError(f"rate limit zone must be between 1 and 1024 MB, got {self.rate_limit_zone_mb}")
        for what, nets in (("rate-limit exempt address", self.rate_limit_exempt),
                           ("trusted proxy", self.trusted_proxies)):
            for net in nets:
                try:
                    ipaddress.ip_network(net, strict=False)
                except ValueError:
                    raise ConfigError(f"{what} must be an IP address or CIDR such as 10.0.0.0/8, got {net!r}") from None

    @property
    def client_rate_directive(self) -> str:
        """nginx's whole-number rate: ``Nr/s``, or ``Nr/m`` for a fractional rate."""
        rate = self.client_rate_per_s or 1.0  # off: any valid rate, no key is ever counted
        return f"{int(rate)}r/s" if rate == int(rate) else f"{round(rate * 60)}r/m"

    @property
    def retry_after_s(self) -> int:
        """Seconds until a limited client has room for one more request."""
        return max(1, math.ceil(1 / self.client_rate_per_s)) if self.client_rate_per_s else 1


def template_text() -> str:
    """The shipped template."""
    return resources.files("chunlian.cluster").joinpath(TEMPLATE_NAME).read_text(encoding="utf-8")


def fill(template: str, values: Mapping[str, object]) -> str:
    """Replace every ``{{name}}``; a placeholder without a value (or a value no placeholder
    uses) is an error, so the template and the renderer cannot drift apart silently."""
    used: set[str] = set()

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in values:
            raise ClusterError(f"nginx template placeholder {{{{{name}}}}} has no value")
        used.add(name)
        return str(values[name])

    out = _PLACEHOLDER.sub(sub, template)
    unused = set(values) - used
    if unused:
        raise ClusterError(f"nginx template does not use: {', '.join(sorted(unused))}")
    return out


def default_user() -> str | None:
    """``nobody <its group>`` when nginx will start as root (its workers drop to it), else
    None (the directive only matters, and is only allowed quietly, for root)."""
    if os.geteuid() != 0:
        return None
    try:
        pw = pwd.getpwnam("nobody")
        group = grp.getgrgid(pw.pw_gid).gr_name
    except KeyError:
        return "root"  # a minimal image without 'nobody'
    return f"nobody {group}"


def _secs(x: float) -> str:
    return str(max(1, round(x)))


def render(cfg: NginxConfig) -> str:
    """The nginx.conf text for ``cfg``."""
    cfg.validate()
    user = cfg.user if cfg.user is not None else default_user()
    servers = "\n".join(
        [f"        server {up} max_fails={cfg.max_fails} fail_timeout={cfg.fail_timeout_s}s;"
         for up in cfg.upstreams]
        + [f"        server {up} backup max_fails=0;" for up in cfg.upstreams]
    )
    prefix = str(cfg.prefix.resolve())
    values: dict[str, object] = {
        "instances": len(cfg.upstreams),
        "rendered_by": "chunlian cluster",
        "prefix": prefix,
        "conf_path": str(cfg.conf_path.resolve()),
        "user_line": f"user {user};" if user else "# (no 'user' directive: nginx runs as the invoking user)",
        "worker_processes": cfg.worker_processes,
        "error_log_level": cfg.error_log_level,
        "worker_connections": cfg.worker_connections,
        "client_max_body_size": cfg.body_limit_bytes,
        # bodies up to the limit stay in memory: no temp file per request
        "client_body_buffer_size": min(cfg.body_limit_bytes, 1_048_576),
        "access_log": f"{prefix}/logs/access.log chunlian" if cfg.access_log else "off",
        "upstream_servers": servers,
        "fail_timeout_s": cfg.fail_timeout_s,
        "upstream_keepalive": cfg.upstream_keepalive,
        "listen": cfg.listen,
        "listen_options": f" {cfg.listen_options}" if cfg.listen_options else "",
        "deadline_s": _secs(cfg.deadline_s),
        "deadline_margin_s": _secs(cfg.deadline_margin_s),
        "connect_timeout_s": _secs(cfg.connect_timeout_s),
        "send_timeout_s": _secs(cfg.send_timeout_s),
        "read_timeout_s": _secs(cfg.read_timeout_s),
        # each instance once as a primary and once as a backup (the template says why)
        "next_upstream_tries": min(2 * len(cfg.upstreams), 8),
        "next_upstream_timeout_s": _secs(cfg.read_timeout_s + cfg.connect_timeout_s),
        **_rate_limit_values(cfg),
        "cors_origin_entries": _cors_entries(cfg.cors_origins),
        "page_cache_s": cfg.page_cache_s,
        "page_cache_state": "on" if cfg.page_cache_s else "off: page_cache_s 0",
        "page_cache_zone": "chunlian_page" if cfg.page_cache_s else "off",
        "page_expires": f"{cfg.page_cache_s}s" if cfg.page_cache_s else "off",
    }
    return fill(template_text(), values)


def _cors_entries(origins: tuple[str, ...]) -> str:
    if origins == ("*",):
        return '        default "*";'
    return "\n".join(['        default "";', *(f'        "{o}" $http_origin;' for o in origins)])


def _rate_limit_values(cfg: NginxConfig) -> dict[str, object]:
    on = cfg.client_rate_per_s > 0
    rate = cfg.client_rate_per_s
    per_min = round(rate * 60)
    text = (f"{rate:g} request{'' if rate == 1 else 's'}/s" if rate >= 1
            else f"{per_min} request{'' if per_min == 1 else 's'}/min")
    exempt = [f"        {ipaddress.ip_network(n, strict=False)} 0;" for n in cfg.rate_limit_exempt]
    if cfg.trusted_proxies:
        real_ip = [f"    set_real_ip_from {ipaddress.ip_network(n, strict=False)};" for n in cfg.trusted_proxies]
        real_ip += ["    real_ip_header X-Forwarded-For;", "    real_ip_recursive on;"]
    else:
        real_ip = ["    # (no trusted proxies: a client is the address of its connection)"]
    return {
        "rate_limit_state": (f"{text}, burst {cfg.client_burst}{', dry run' if cfg.rate_limit_dry_run else ''}"
                             if on else "off: every key is empty"),
        "rate_limit_dry_run": "on" if cfg.rate_limit_dry_run else "off",
        "rate_limit_default": 1 if on else 0,
        "rate_limit_exempt": "\n".join(exempt) or "        # (no exempt addresses)",
        "real_ip_lines": "\n".join(real_ip),
        "rate_limit_zone_mb": cfg.rate_limit_zone_mb,
        "client_rate": cfg.client_rate_directive,
        "client_rate_text": text if on else "the rate",
        "client_burst": cfg.client_burst,
        # nginx refuses "burst=0" (its default): a burst of 0 is no burst parameter at all
        "limit_req_burst": f"burst={cfg.client_burst} " if cfg.client_burst else "",
        "rate_limit_retry_after_s": cfg.retry_after_s,
    }


def page_cache_blocker(prefix: Path) -> Path | None:
    """The directory above ``prefix`` that nginx's workers cannot pass through, when nginx
    starts as root (its workers then run as ``nobody`` and must reach the page cache under
    ``prefix``/tmp: a ``--prefix`` under /root, or a 0700 temporary directory); else None."""
    if os.geteuid() != 0:
        return None
    for parent in prefix.resolve().parents:
        try:
            mode = parent.stat().st_mode
        except OSError:
            continue  # not made yet: write() makes the prefix, its parents get the umask's mode
        if not mode & 0o001:
            return parent
    return None


def write(cfg: NginxConfig) -> Path:
    """Create the prefix layout (logs/, tmp/) and write the config; returns its path.

    When nginx starts as root its workers run as ``nobody``: the prefix and tmp/ are made
    traversable (not readable) so they can use the temp directories and the page cache nginx
    creates there; logs/ stays the master's (its workers write through inherited files)."""
    prefix = cfg.prefix
    (prefix / "logs").mkdir(parents=True, exist_ok=True)
    (prefix / "tmp").mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        os.chmod(prefix, 0o711)
        os.chmod(prefix / "tmp", 0o711)
        os.chmod(prefix / "logs", 0o700)  # client addresses: not for every local user
    cfg.conf_path.write_text(render(cfg), encoding="utf-8")
    return cfg.conf_path


def nginx_binary(explicit: str | None = None) -> str:
    """The nginx executable: ``explicit``, else on PATH, else /usr/sbin/nginx."""
    if explicit:
        if shutil.which(explicit) is None:
            raise ClusterError(f"nginx not found at {explicit!r}")
        return explicit
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
    if found is None:
        raise ClusterError(f"nginx is not installed; {INSTALL_HINT}")
    return found


def nginx_command(binary: str, cfg: NginxConfig, extra: Sequence[str] = ()) -> list[str]:
    """The command that runs nginx in the foreground with the rendered config."""
    prefix = str(cfg.prefix.resolve())
    return [binary, "-p", prefix + "/", "-c", str(cfg.conf_path.resolve()),
            "-e", f"{prefix}/logs/error.log", "-g", "daemon off;", *extra]


def check_config(binary: str, cfg: NginxConfig) -> None:
    """``nginx -t`` on the written config; raise ``ClusterError`` with nginx's words."""
    cmd = nginx_command(binary, cfg, ["-t", "-q"])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    if proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip()
        raise ClusterError(f"nginx rejected the rendered config {cfg.conf_path}: {msg}")
