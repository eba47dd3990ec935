"""The SSRF guard: which urls and addresses a fetch may reach, checked on the url and again on the socket.

`check_url` refuses a url by its text (scheme, credentials, host names, IP literals in every notation);
`GuardedNetworkBackend` resolves each host itself, vets every address, connects to a vetted one and
checks the peer, so a DNS answer that changes between check and connect (rebinding) cannot get through.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import re
import socket
import ssl
import typing
from collections.abc import Awaitable, Callable, Iterable
from urllib.parse import unquote, urlsplit

import httpcore
import httpx
from pydantic import Field, field_validator

from asearch.config import Config
from asearch.errors import RemoteError, ToolError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[list[str]]]
"""`(host, port) -> addresses` as text; the default asks the system resolver (getaddrinfo)."""

# Cloud instance-metadata endpoints: never reachable, whatever the policy says (they hand out credentials).
METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean, Oracle
        "169.254.170.2",  # AWS ECS task metadata
        "fd00:ec2::254",  # AWS over IPv6
        "100.100.100.200",  # Alibaba Cloud
        "168.63.129.16",  # Azure wire server (a public-looking address only VMs reach)
    )
)
METADATA_HOSTS = frozenset(
    {"metadata.google.internal", "metadata.goog", "metadata", "instance-data", "instance-data.ec2.internal"}
)
# Names that only ever mean this machine or the local network.
_LOCAL_SUFFIXES = (".localhost", ".local", ".internal", ".localdomain", ".home.arpa")
_LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})

_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
_IPV4_PART = re.compile(r"^(0x[0-9a-f]*|[0-9]+)$", re.IGNORECASE)
_BAD_URL_CHARS = re.compile(r"[\x00-\x20\x7f\\]")
# One label of a host name as httpx writes it (IDNA already applied): letters, digits, hyphen, underscore.
_HOST_LABEL = re.compile(r"^[A-Za-z0-9_-]{1,63}$")
_BAD_CHAR_NAMES = {"\\": "a backslash", " ": "a space", "\t": "a tab", "\n": "a newline", "\r": "a return"}


class SsrfBlocked(ToolError):
    """A url or address the guard refuses; the message says which and why (shown to the agent)."""

    def __init__(self, target: str, reason: str):
        self.target, self.reason = target, reason
        super().__init__(f"refused to fetch {target}: {reason}")


class UrlPolicy(Config):
    """Where fetches may go. The defaults allow public http(s) addresses only."""

    allow_private: bool = Field(
        False,
        description="Allow loopback, private, link-local and other non-public addresses (local test "
        "servers, an intranet). Cloud metadata addresses stay blocked.",
    )
    allow_hosts: list[str] = Field(
        default_factory=list,
        description="Exact `host:port` pairs exempt from the address checks (an internal mirror, a test "
        "server). Matched on the host as written in the url, never on what it resolves to.",
    )
    allowed_ports: list[int] | None = Field(None, description="Ports a url may name (None = any port).")
    blocked_hosts: list[str] = Field(
        default_factory=list, description="Extra host names refused outright (a leading dot blocks a domain)."
    )

    @field_validator("allow_hosts")
    @classmethod
    def _host_port(cls, v: list[str]) -> list[str]:
        for item in v:
            host, sep, port = item.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"allow_hosts entries look like 'host:port', got {item!r}")
        return [_normal_host(h) + ":" + p for h, _, p in (i.rpartition(":") for i in v)]

    def is_trusted(self, host: str, port: int) -> bool:
        return f"{_normal_host(host)}:{port}" in self.allow_hosts


def _normal_host(host: str) -> str:
    host = host.strip().lower().rstrip(".")
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


# --------------------------------------------------------------------------- addresses


def parse_ipv4_any_notation(host: str) -> ipaddress.IPv4Address | None:
    """The address a host written as an IPv4 number means, in any notation `inet_aton` and browsers accept
    (`127.1`, `0x7f.1`, `0177.0.0.1`, `2130706433`); None when the host is a name. A numeric host that is
    no valid address raises ValueError: resolvers disagree on such hosts, so they are refused."""
    parts = host.rstrip(".").split(".")
    if not parts or not _IPV4_PART.match(parts[-1]):
        return None  # the last label is not a number: a domain name (WHATWG host parsing rule)
    if len(parts) > 4 or not all(_IPV4_PART.match(p) for p in parts):
        raise ValueError(f"{host!r} is neither a host name nor a valid IPv4 address")
    nums = []
    for p in parts:
        if p[:2].lower() == "0x":
            nums.append(int(p[2:] or "0", 16))
        elif len(p) > 1 and p.startswith("0"):
            if not all(c in "01234567" for c in p):
                raise ValueError(f"{host!r}: {p!r} is not an octal number")
            nums.append(int(p, 8))
        else:
            nums.append(int(p))
    *head, last = nums
    if any(n > 255 for n in head) or last >= 256 ** (5 - len(nums)):
        raise ValueError(f"{host!r} is out of the IPv4 range")
    value = last
    for i, n in enumerate(head):
        value += n << (8 * (3 - i))
    return ipaddress.IPv4Address(value)


def parse_ip_literal(host: str) -> IPAddress | None:
    """The address in a host that is an IP literal (IPv4 in any notation, IPv6 with or without brackets
    and zone id), or None for a host name. Raises ValueError for a malformed literal."""
    h = _normal_host(unquote(host))
    if ":" in h:
        try:
            return ipaddress.IPv6Address(h)
        except ValueError:
            raise ValueError(f"{host!r} is not a valid IPv6 address") from None
    return parse_ipv4_any_notation(h)


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address tunnels to, if any (mapped, 6to4, Teredo, NAT64, IPv4-compatible)."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if any(ip in net for net in _NAT64) or (ip in _IPV4_COMPATIBLE and int(ip) > 1):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def address_problem(ip: IPAddress, *, allow_private: bool = False) -> str | None:
    """Why `ip` may not be fetched, as a phrase ("a loopback address"); None when it may."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id:
        ip = ipaddress.IPv6Address(str(ip).split("%", 1)[0])
    if ip in METADATA_ADDRESSES:
        return f"{ip} is a cloud metadata address"
    if isinstance(ip, ipaddress.IPv6Address):
        inner = _embedded_ipv4(ip)
        if inner is not None:
            problem = address_problem(inner, allow_private=allow_private)
            return f"{problem} (inside the IPv6 address {ip})" if problem else None
    if allow_private:
        return None
    for test, what in (
        (ip.is_loopback, "a loopback address"),
        (ip.is_unspecified, "an unspecified address (it means this machine)"),
        (ip.is_link_local, "a link-local address"),
        (ip.is_multicast, "a multicast address"),
        (ip.is_reserved, "a reserved address"),
        (ip.is_private, "a private-network address"),
        (not ip.is_global, "not a public address"),
    ):
        if test:
            return f"{ip} is {what}"
    return None


def _host_name_problem(host: str, policy: UrlPolicy) -> str | None:
    h = _normal_host(host)
    if h in METADATA_HOSTS:
        return f"{h} is a cloud metadata host"
    for blocked in policy.blocked_hosts:
        b = blocked.lower().rstrip(".")
        if h == b.lstrip(".") or (b.startswith(".") and h.endswith(b)):
            return f"{h} is on the blocked host list"
    if not policy.allow_private and (h in _LOCAL_NAMES or h.endswith(_LOCAL_SUFFIXES)):
        return f"{h} names this machine or a local network"
    return None


# --------------------------------------------------------------------------- urls


def url_text_problem(text: str) -> str | None:
    """Why a url's text cannot be a url at all (whitespace, control characters, a backslash), or None.
    Clients disagree on such urls (a browser reads `http:\\\\evil` as `http://evil`), so none is read."""
    bad = _BAD_URL_CHARS.search(text)
    if bad is None:
        return None
    what = _BAD_CHAR_NAMES.get(bad.group(), f"the control character {bad.group()!r}")
    return f"not a valid url: it contains {what} (at character {bad.start()})"


def shown_url(text: str) -> str:
    """A url as a refusal message names it: cut at 200 characters (a hostile one may be megabytes)."""
    return text if len(text) <= 200 else text[:200] + "..."


def parse_url(url: str | httpx.URL, policy: UrlPolicy) -> httpx.URL:
    """`url` parsed by httpx (the parser that will connect) with a scheme, host and port that can be dialled;
    a url that cannot be valid raises SsrfBlocked naming it and why (never InvalidURL or UnicodeError)."""
    text = str(url)
    shown = shown_url(text)
    problem = url_text_problem(text)
    if problem:
        raise SsrfBlocked(shown, problem)
    try:
        parsed = httpx.URL(text)
    except (httpx.InvalidURL, ValueError) as e:
        # httpx rejects some address notations (0177.0.0.1) that other clients accept; say what it means
        try:
            host = urlsplit(text).hostname or ""
        except ValueError:
            host = ""
        problem = (host_problem(host, policy) if host else None) or f"not a valid url ({e})"
        raise SsrfBlocked(shown, problem) from None
    if parsed.scheme not in ("http", "https"):
        scheme = parsed.scheme or "(none)"
        raise SsrfBlocked(shown, f"scheme {scheme!r} is not allowed; only http and https urls are fetched")
    if parsed.userinfo:
        raise SsrfBlocked(shown, "urls with credentials (user@host) are not fetched")
    problem = _host_syntax_problem(parsed) or _port_problem(parsed.port)
    if problem:
        raise SsrfBlocked(shown, problem)
    return parsed


def _host_syntax_problem(parsed: httpx.URL) -> str | None:
    """Why the host of a parsed url cannot be dialled as written (empty, bad characters, bad IDNA), or None."""
    raw = parsed.raw_host.decode("ascii", "replace")
    if not raw:
        return "not a valid url: it has no host"
    if ":" in raw:  # an IPv6 literal; httpx has already checked its syntax
        return None
    name = raw.rstrip(".")
    if len(name) > 253 or not all(_HOST_LABEL.match(label) for label in name.split(".")):
        return f"not a valid url: the host {raw[:80]!r} is not a valid host name"
    try:
        parsed.host  # noqa: B018 - decoding the IDNA labels is the check
    except ValueError as e:  # UnicodeError: an xn-- label that is no valid punycode
        return f"not a valid url: the host {raw[:80]!r} is not a valid internationalised name ({e})"
    return None


def _port_problem(port: int | None) -> str | None:
    if port is not None and not 1 <= port <= 65535:
        return f"not a valid url: port {str(port)[:20]} is out of range (1-65535)"
    return None


def check_url(url: str | httpx.URL, policy: UrlPolicy) -> httpx.URL:
    """Refuse by its text a url the policy does not allow, or one that cannot be valid (`parse_url`);
    return it parsed. Raises SsrfBlocked.

    Host names are not resolved here; `GuardedNetworkBackend` vets the addresses at connect time."""
    parsed = parse_url(url, policy)
    shown = shown_url(str(url))
    host = parsed.host
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    if policy.allowed_ports is not None and port not in policy.allowed_ports:
        raise SsrfBlocked(shown, f"port {port} is not in the allowed ports {policy.allowed_ports}")
    if policy.is_trusted(host, port):
        return parsed
    problem = host_problem(host, policy)
    if problem:
        raise SsrfBlocked(shown, problem)
    return parsed


def host_problem(host: str, policy: UrlPolicy) -> str | None:
    """Why a host as written may not be reached (None: fine so far; names still get resolved and vetted)."""
    try:
        ip = parse_ip_literal(host)
    except ValueError as e:
        return str(e)
    if ip is not None:
        return address_problem(ip, allow_private=policy.allow_private)
    return _host_name_problem(host, policy)


# --------------------------------------------------------------------------- sockets


async def system_resolver(host: str, port: int) -> list[str]:
    """Every address the system resolver gives for `host`, in its order, without duplicates."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    seen: list[str] = []
    for info in infos:
        addr = str(info[4][0])
        if addr not in seen:
            seen.append(addr)
    return seen


class GuardedNetworkBackend(httpcore.AsyncNetworkBackend):
    """httpcore network backend that connects only to vetted addresses.

    For a host name it resolves once, refuses the host if any answer is blocked (a name that mixes public
    and private answers is a rebinding attempt), connects to the vetted address itself (so no second
    lookup happens) and checks the connected peer is that address. TLS still verifies the host name.
    """

    def __init__(self, policy: UrlPolicy, *, resolver: Resolver | None = None, dns_timeout_s: float = 5.0):
        self.policy = policy
        self.resolver = resolver or system_resolver
        self.dns_timeout_s = dns_timeout_s
        self._inner = httpcore.AnyIOBackend()
        self.blocked = 0

    async def vetted_addresses(self, host: str, port: int) -> list[IPAddress]:
        """The addresses a connection to `host:port` may use; raises SsrfBlocked or RemoteError."""
        target = f"{host}:{port}"
        trusted = self.policy.is_trusted(host, port)
        try:
            literal = parse_ip_literal(host)
        except ValueError as e:
            raise self._block(target, str(e)) from None
        if literal is not None:
            problem = None if trusted else address_problem(literal, allow_private=self.policy.allow_private)
            if problem:
                raise self._block(target, problem)
            return [literal]
        if not trusted:
            problem = _host_name_problem(host, self.policy)
            if problem:
                raise self._block(target, problem)
        try:
            async with asyncio.timeout(self.dns_timeout_s):
                answers = await self.resolver(host, port)
        except (OSError, TimeoutError) as e:
            raise RemoteError(f"cannot resolve the host {host!r}: {e or type(e).__name__}") from None
        addresses = [ipaddress.ip_address(a.split("%", 1)[0]) for a in answers]
        if not addresses:
            raise RemoteError(f"the host {host!r} has no addresses")
        if not trusted:
            for ip in addresses:
                problem = address_problem(ip, allow_private=self.policy.allow_private)
                if problem:
                    raise self._block(target, f"{host} resolves to a blocked address: {problem}")
        return addresses

    def _block(self, target: str, reason: str) -> SsrfBlocked:
        self.blocked += 1
        return SsrfBlocked(target, reason)

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        addresses = await self.vetted_addresses(host, port)
        last: Exception | None = None
        for ip in addresses:  # happy-eyeballs-lite: the vetted addresses in the resolver's order
            try:
                stream = await self._inner.connect_tcp(
                    str(ip), port, timeout=timeout, local_address=local_address, socket_options=socket_options
                )
            except httpcore.ConnectError as e:
                last = e
                continue
            peer = stream.get_extra_info("server_addr")
            if peer is not None and ipaddress.ip_address(str(peer[0]).split("%", 1)[0]) != ip:
                await stream.aclose()
                raise self._block(f"{host}:{port}", f"connected to {peer[0]}, not the vetted address {ip}")
            return stream
        assert last is not None
        raise last

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: typing.Any = None
    ) -> httpcore.AsyncNetworkStream:
        raise self._block(path, "unix sockets are never fetched")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


# --------------------------------------------------------------------------- httpx transport

_HTTPCORE_TO_HTTPX: dict[type[Exception], type[Exception]] = {
    getattr(httpcore, name): getattr(httpx, name)
    for name in (
        "ConnectTimeout",
        "ReadTimeout",
        "WriteTimeout",
        "PoolTimeout",
        "TimeoutException",
        "ConnectError",
        "ReadError",
        "WriteError",
        "NetworkError",
        "RemoteProtocolError",
        "LocalProtocolError",
        "ProtocolError",
        "UnsupportedProtocol",
        "ProxyError",
    )
}


def _as_httpx_error(exc: Exception) -> Exception:
    for cls in type(exc).__mro__:  # the most specific httpx class for this httpcore error
        mapped = _HTTPCORE_TO_HTTPX.get(cls)
        if mapped is not None:
            return mapped(str(exc))
    return exc


class _ResponseStream(httpx.AsyncByteStream):
    def __init__(self, inner: typing.AsyncIterable[bytes]):
        self._inner = inner

    async def __aiter__(self) -> typing.AsyncIterator[bytes]:
        try:
            async for part in self._inner:
                yield part
        except Exception as e:
            mapped = _as_httpx_error(e)
            if mapped is e:
                raise
            raise mapped from e

    async def aclose(self) -> None:
        aclose = getattr(self._inner, "aclose", None)
        if aclose is not None:
            await aclose()


@functools.cache
def default_ssl_context() -> ssl.SSLContext:
    """One verifying TLS context for every transport (building one reads the CA bundle: ~50 ms), with
    the certifi bundle httpx uses when it is installed."""
    try:
        import certifi
    except ImportError:
        return ssl.create_default_context()
    return ssl.create_default_context(cafile=certifi.where())


class GuardedTransport(httpx.AsyncBaseTransport):
    """An httpx transport whose every connection goes through `GuardedNetworkBackend`. No proxy support on
    purpose: a proxy resolves names itself, which would bypass the guard."""

    def __init__(
        self,
        policy: UrlPolicy,
        *,
        resolver: Resolver | None = None,
        max_connections: int = 32,
        ssl_context: ssl.SSLContext | None = None,
    ):
        self.backend = GuardedNetworkBackend(policy, resolver=resolver)
        if ssl_context is None:
            ssl_context = default_ssl_context()
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context,
            max_connections=max_connections,
            max_keepalive_connections=max_connections,
            keepalive_expiry=30.0,
            network_backend=self.backend,
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.AsyncByteStream)
        req = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        try:
            resp = await self._pool.handle_async_request(req)
        except Exception as e:
            mapped = _as_httpx_error(e)
            if mapped is e:
                raise
            raise mapped from e
        assert isinstance(resp.stream, typing.AsyncIterable)
        return httpx.Response(
            status_code=resp.status,
            headers=resp.headers,
            stream=_ResponseStream(resp.stream),
            extensions=resp.extensions,
        )

    async def aclose(self) -> None:
        await self._pool.aclose()
