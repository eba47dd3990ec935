"""The SSRF matrix: every way to reach loopback, private, link-local or metadata addresses, or a non-http
scheme, is refused (directly and through a redirect), while a real loopback server waits for the request.

The fake web runs on 127.0.0.1; the guard does not allow loopback here (no allow_private), so if any case
slipped through, the server's /secret would count a hit. The control tests show it would answer.
"""

from __future__ import annotations

import asyncio
import ipaddress

import pytest

from asearch.tools import AccessTool, run_tool
from asearch.web import (
    FetchConfig,
    SafeFetcher,
    SsrfBlocked,
    UrlPolicy,
    WebPageBackend,
    address_problem,
    check_url,
)
from asearch.web.ssrf import parse_ip_literal

# Hosts a fake DNS answers: the guard must vet what they resolve to, not their names.
FAKE_DNS = {
    "rebind.test": ["127.0.0.1"],
    "mixed.test": ["93.184.216.34", "10.0.0.5"],  # one public, one private answer: refused as a whole
    "mapped.test": ["::ffff:127.0.0.1"],
    "meta.test": ["169.254.169.254"],
}


async def fake_resolver(host: str, port: int) -> list[str]:
    if host in FAKE_DNS:
        return FAKE_DNS[host]
    raise OSError(f"fake DNS has no {host}")


def direct_cases(p: int) -> list[str]:
    return [
        # loopback, in every notation
        f"http://127.0.0.1:{p}/secret",
        f"http://localhost:{p}/secret",
        f"http://LOCALHOST.:{p}/secret",
        f"http://api.localhost:{p}/secret",
        f"http://127.1:{p}/secret",
        f"http://0x7f.1:{p}/secret",
        f"http://0x7f000001:{p}/secret",
        f"http://2130706433:{p}/secret",
        f"http://0177.0.0.1:{p}/secret",
        f"http://017700000001:{p}/secret",
        f"http://127.000.000.001:{p}/secret",
        f"http://0x7f.0x0.0x0.0x1:{p}/secret",
        f"http://127.0.0.1.:{p}/secret",
        f"http://127\u30020\u30020\u30021:{p}/secret",  # ideographic full stops
        f"http://\uff11\uff12\uff17.0.0.1:{p}/secret",  # full-width digits
        f"http://[::1]:{p}/secret",
        f"http://[::ffff:127.0.0.1]:{p}/secret",
        f"http://[::ffff:7f00:1]:{p}/secret",
        f"http://[0:0:0:0:0:ffff:127.0.0.1]:{p}/secret",
        f"http://[64:ff9b::7f00:1]:{p}/secret",  # NAT64 of 127.0.0.1
        f"http://[2002:7f00:1::]:{p}/secret",  # 6to4 of 127.0.0.1
        f"http://[::127.0.0.1]:{p}/secret",  # IPv4-compatible
        # this machine
        f"http://0.0.0.0:{p}/secret",
        f"http://0:{p}/secret",
        f"http://[::]:{p}/secret",
        # private ranges and shared address space
        "http://10.0.0.1/",
        "http://10.255.255.254/",
        "http://172.16.0.1/",
        "http://172.31.255.1/",
        "http://192.168.1.1/",
        "http://100.64.0.1/",
        "http://[fc00::1]/",
        "http://[fd12:3456::1]/",
        # link-local and cloud metadata
        "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
        "http://0xa9fea9fe/latest/meta-data/",
        "http://2852039166/latest/meta-data/",
        "http://[::ffff:169.254.169.254]/latest/meta-data/",
        "http://[fd00:ec2::254]/latest/meta-data/",
        "http://metadata.google.internal/computeMetadata/v1/",
        "http://metadata/computeMetadata/v1/",
        "http://100.100.100.200/latest/meta-data/",
        "http://[fe80::1]/",
        f"http://[fe80::1%25eth0]:{p}/secret",
        # multicast, broadcast, reserved
        "http://224.0.0.1/",
        "http://255.255.255.255/",
        "http://240.0.0.1/",
        # names that resolve to blocked addresses (the DNS answer is what counts)
        f"http://rebind.test:{p}/secret",
        f"http://mixed.test:{p}/secret",
        f"http://mapped.test:{p}/secret",
        "http://meta.test/latest/meta-data/",
        "http://svc.internal/",
        "http://printer.local/",
        # url tricks
        f"http://good.example@127.0.0.1:{p}/secret",
        f"http://user:pass@127.0.0.1:{p}/secret",
        f"http://127.0.0.1:{p}\\@good.example/secret",
        f"http://127.0.0.1:{p}/secret\x00.example.com",
        "http://256.0.0.1/",
        "http://1.2.3.4.5/",
        # schemes
        "file:///etc/passwd",
        "file://localhost/etc/passwd",
        f"gopher://127.0.0.1:{p}/_GET%20/secret",
        "ftp://127.0.0.1/",
        "dict://127.0.0.1:11211/stats",
        "data:text/plain,hello",
        "javascript:alert(1)",
        f"ws://127.0.0.1:{p}/secret",
    ]


def redirect_targets(p: int) -> list[str]:
    return [
        f"http://localhost:{p}/secret",
        f"http://2130706433:{p}/secret",
        f"http://0x7f.1:{p}/secret",
        f"http://[::1]:{p}/secret",
        f"http://[::ffff:127.0.0.1]:{p}/secret",
        f"http://127.0.0.1:{p + 1 if p < 65535 else p - 1}/secret",  # same host, a port not allowed
        "http://169.254.169.254/latest/meta-data/",
        "http://metadata.google.internal/computeMetadata/v1/",
        "http://10.0.0.1/",
        f"http://rebind.test:{p}/secret",
        f"http://good@127.0.0.1:{p}/secret",
        "file:///etc/passwd",
        f"gopher://127.0.0.1:{p}/_GET%20/secret",
    ]


def _fetch(url: str, policy: UrlPolicy):
    fetcher = SafeFetcher(
        FetchConfig(guard=policy, connect_timeout_s=1.0, resilience={"timeout_s": 2.0}),
        resolver=fake_resolver,
    )

    async def go():
        try:
            return await fetcher.fetch(url)
        finally:
            await fetcher.aclose()

    return asyncio.run(go())


def test_every_direct_case_is_blocked(fake_web):
    policy = UrlPolicy()  # the default: public addresses only
    cases = direct_cases(fake_web.port)
    passed = []
    for url in cases:
        try:
            _fetch(url, policy)
        except SsrfBlocked as e:
            assert "refused to fetch" in str(e) and e.reason
        except Exception as e:  # anything else means the guard did not decide
            passed.append((url, f"{type(e).__name__}: {e}"))
        else:
            passed.append((url, "fetched"))
    assert passed == []
    assert fake_web.hits["secret"] == 0 and fake_web.hits["other"] == 0


def test_every_redirect_to_a_blocked_place_is_refused_at_that_hop(fake_web):
    # the first hop is the test server, trusted by exact host:port; each redirect target must be refused
    policy = UrlPolicy(allow_hosts=[f"127.0.0.1:{fake_web.port}"])
    from urllib.parse import quote

    targets = redirect_targets(fake_web.port)
    for target in targets:
        url = f"{fake_web.base_url}/redirect?to={quote(target, safe='')}"
        with pytest.raises(SsrfBlocked) as info:
            _fetch(url, policy)
        assert "redirect" in info.value.reason
    assert fake_web.hits["redirect"] == len(targets)  # every first hop was served...
    assert fake_web.hits["secret"] == 0  # ...and no second hop reached the secret


def test_the_agent_sees_a_refusal_as_an_observation(fake_web):
    backend = WebPageBackend(resolver=fake_resolver)
    tool = AccessTool(backend)
    obs = asyncio.run(run_tool(tool, f"http://0177.0.0.1:{fake_web.port}/secret"))
    assert obs.error and obs.metadata["error"] == "tool"
    assert obs.text.startswith("access failed: refused to fetch") and "loopback" in obs.text
    assert backend.runtime.stats()["events"]["direct_blocked"] == 1
    assert fake_web.hits["secret"] == 0


def test_control_the_secret_is_reachable_when_loopback_is_allowed(fake_web):
    """The matrix is meaningful: with allow_private the same server answers (metadata stays blocked)."""
    policy = UrlPolicy(allow_private=True)
    for url in (
        f"{fake_web.base_url}/secret",
        f"http://0x7f.1:{fake_web.port}/secret",
        f"http://rebind.test:{fake_web.port}/secret",
    ):
        assert _fetch(url, policy).body.startswith(b"SECRET")
    assert fake_web.hits["secret"] == 3
    with pytest.raises(SsrfBlocked, match="metadata"):
        _fetch("http://169.254.169.254/latest/meta-data/", policy)
    with pytest.raises(SsrfBlocked, match="metadata"):
        _fetch("http://meta.test/", policy)


def test_names_are_resolved_once_and_the_vetted_address_is_dialled(fake_web):
    """DNS rebinding: the first answer is vetted and dialled; a later, different answer is never used.
    The Host header still carries the name (virtual hosts and TLS keep working)."""
    answers = [["127.0.0.1"], ["169.254.169.254"]]
    calls: list[str] = []

    async def rebinding_resolver(host: str, port: int) -> list[str]:
        calls.append(host)
        return answers[min(len(calls) - 1, 1)]

    policy = UrlPolicy(allow_private=True)
    fetcher = SafeFetcher(FetchConfig(guard=policy), resolver=rebinding_resolver)

    async def go():
        try:
            return await fetcher.fetch(f"http://site.test:{fake_web.port}/site/oslen")
        finally:
            await fetcher.aclose()

    got = asyncio.run(go())
    assert got.status == 200 and b"Oslen is a harbour city" in got.body
    assert calls == ["site.test"]
    (req,) = [r for r in fake_web.requests if r.route == "site"]
    assert req.headers["Host"] == f"site.test:{fake_web.port}"
    # a new connection resolves again, gets the rebound answer, and is refused
    with pytest.raises(SsrfBlocked, match="metadata"):
        fetcher2 = SafeFetcher(FetchConfig(guard=policy), resolver=rebinding_resolver)
        asyncio.run(fetcher2.fetch(f"http://site.test:{fake_web.port}/site/oslen"))
    assert len([r for r in fake_web.requests if r.route == "site"]) == 1


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("0x7f.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("10.1", "10.0.0.1"),
        ("192.168.257", "192.168.1.1"),
        ("0xa9.0xfe.0xa9.0xfe", "169.254.169.254"),
        ("[::ffff:127.0.0.1]", "::ffff:7f00:1"),
        ("example.com", None),
        ("1e100.net", None),
    ],
)
def test_ip_literals_are_read_in_every_notation(host, expected):
    ip = parse_ip_literal(host)
    assert (str(ip) if ip is not None else None) == expected


def test_public_addresses_and_urls_pass():
    for a in ("93.184.216.34", "8.8.8.8", "2606:4700:4700::1111", "1.1.1.1"):
        assert address_problem(ipaddress.ip_address(a)) is None
    for url in (
        "https://en.wikipedia.org/wiki/Oslo",
        "http://93.184.216.34/",
        "https://[2606:4700:4700::1111]/",
    ):
        assert str(check_url(url, UrlPolicy())) == url


def test_allowed_ports_and_blocked_hosts():
    policy = UrlPolicy(allowed_ports=[80, 443], blocked_hosts=[".corp.example", "evil.example"])
    assert check_url("https://example.org/a", policy)
    for url in ("https://example.org:8443/", "http://x.corp.example/", "http://evil.example/"):
        with pytest.raises(SsrfBlocked):
            check_url(url, policy)


def test_policy_config_errors_show_the_bad_value():
    with pytest.raises(ValueError, match="'127.0.0.1'"):
        UrlPolicy(allow_hosts=["127.0.0.1"])


@pytest.fixture(scope="module")
def site_cert(tmp_path_factory):
    """A self-signed certificate for the name `site.test` (made with the openssl command line)."""
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command line tool")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=site.test",
         "-addext", "subjectAltName=DNS:site.test"],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return str(cert), str(key)


def test_tls_verifies_the_name_while_dialling_the_vetted_address(site_cert):
    """https to a pinned address still checks the certificate against the host name (SNI too)."""
    import ssl

    from asearch.web.fakes import FakeWeb

    trust = ssl.create_default_context(cafile=site_cert[0])

    async def resolver(host: str, port: int) -> list[str]:
        return ["127.0.0.1"]

    def fetch(url: str):
        fetcher = SafeFetcher(
            FetchConfig(guard=UrlPolicy(allow_private=True)), resolver=resolver, ssl_context=trust
        )

        async def go():
            try:
                return await fetcher.fetch(url)
            finally:
                await fetcher.aclose()

        return asyncio.run(go())

    with FakeWeb(tls=site_cert) as web:
        got = fetch(f"https://site.test:{web.port}/site/kettering")
        assert got.status == 200 and b"river Vell" in got.body
        import httpx

        with pytest.raises(httpx.ConnectError, match="certificate verify failed"):
            fetch(f"https://other.test:{web.port}/site/kettering")  # same address, wrong name
        assert web.hits["site"] == 1
