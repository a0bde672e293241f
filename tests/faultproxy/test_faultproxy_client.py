"""The server driven through toxiproxy-python 0.1.1, wrapped (spec §4.1, §6 "Client side")."""

from __future__ import annotations

import threading
import time

import pytest
import toxiproxy
import toxiproxy.api

from crashmatrix.harness.errors import InvalidArgument, ServiceError
from crashmatrix.harness.faultproxy import EmbeddedToxiproxy
from crashmatrix.harness.faultproxy.client import (InvalidToxic, NotFound, ProxyExists, ToxiproxyClient,
                                                   ToxiproxyServerError, ToxiproxyUnavailable)

from ._support import EchoServer, connect, refused, rtt, unique


@pytest.fixture
def client(api_url: str) -> ToxiproxyClient:
    return ToxiproxyClient(api_url, timeout=5.0)


@pytest.fixture
def cleanup(client: ToxiproxyClient):
    names: list[str] = []
    yield names
    for name in names:
        proxy = client.get_proxy(name)
        if proxy is not None:
            proxy.destroy()


def test_create_toxics_enable_disable_through_the_library(client: ToxiproxyClient, echo: EchoServer,
                                                          cleanup: list[str]) -> None:
    name = unique("lib")
    cleanup.append(name)
    proxy = client.create(upstream=echo.addr, name=name)
    assert isinstance(proxy, toxiproxy.Proxy)
    assert proxy.listen.startswith("127.0.0.1:") and proxy.port > 0 and proxy.enabled is True
    with pytest.raises(ProxyExists):
        client.create(upstream=echo.addr, name=name)
    c = connect(proxy.listen)
    assert rtt(c) < 0.05

    proxy.add_toxic(type="latency", attributes={"latency": 100})
    with pytest.raises(ProxyExists):  # the library maps a duplicate toxic's 409 to ProxyExists
        proxy.add_toxic(type="latency", attributes={"latency": 100})
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="nonsense")
    assert set(proxy.toxics()) == {"latency_downstream"}
    toxic = proxy.get_toxic("latency_downstream")
    assert toxic is not None and toxic.attributes == {"latency": 100, "jitter": 0}
    assert 0.09 < rtt(c) < 0.2

    updated = proxy.update_toxic("latency_downstream", attributes={"jitter": 5})
    assert updated["attributes"] == {"latency": 100, "jitter": 5}
    assert proxy.update_toxic("latency_downstream", toxicity=0.5)["toxicity"] == 0.5
    assert proxy.toxic_json("latency_downstream")["attributes"]["jitter"] == 5
    assert proxy.destroy_toxic("latency_downstream") is True
    with pytest.raises(NotFound):
        proxy.destroy_toxic("latency_downstream")
    assert rtt(c) < 0.05

    with proxy.toxic("bandwidth", name="cut", attributes={"rate": 0}):
        assert "cut" in proxy.toxics()
    assert "cut" not in proxy.toxics()

    proxy.disable()
    assert proxy.enabled is False and refused(proxy.listen)
    proxy.enable()
    assert proxy.enabled is True and rtt(connect(proxy.listen)) < 0.05
    with proxy.down():
        assert refused(proxy.listen)
    assert rtt(connect(proxy.listen)) < 0.05


def test_enable_refreshes_listen_of_a_proxy_created_disabled(client: ToxiproxyClient, echo: EchoServer,
                                                             cleanup: list[str]) -> None:
    name = unique("lazy")
    cleanup.append(name)
    proxy = client.create(upstream=echo.addr, name=name, enabled=False)
    assert proxy.listen == "127.0.0.1:0"
    proxy.enable()
    assert proxy.port != 0 and rtt(connect(proxy.listen)) < 0.05


def test_reset_populate_version_destroy(client: ToxiproxyClient, echo: EchoServer,
                                        cleanup: list[str]) -> None:
    a, b = unique("pop"), unique("pop")
    cleanup.extend([a, b])
    made = client.populate([{"name": a, "upstream": echo.addr, "listen": "127.0.0.1:0"},
                            {"name": b, "upstream": echo.addr, "listen": "127.0.0.1:0", "enabled": False}])
    assert [p.name for p in made] == [a, b]
    pa = client.get_proxy(a)
    assert pa is not None
    pa.add_toxic(type="noop")
    assert client.reset() is True
    assert client.get_proxy(b).enabled is True  # reset re-enables
    assert pa.toxics() == {}
    served = client.populate_server([{"name": a, "upstream": echo.addr, "listen": pa.listen}])
    assert [p.name for p in served] == [a] and served[0].listen == pa.listen
    assert client.version()
    assert client.running() is True
    assert client.destroy(client.get_proxy(b)) is True
    assert client.destroy("not a proxy") is False
    assert client.get_proxy(b) is None


def test_destroy_all_and_running_on_private_server(echo: EchoServer) -> None:
    with EmbeddedToxiproxy() as tp:
        client = ToxiproxyClient(tp.url)
        for i in range(3):
            client.create(upstream=echo.addr, name=f"p{i}")
        assert len(client.proxies()) == 3
        client.destroy_all()
        assert client.proxies() == {}
        assert client.version().startswith("2.12")
    assert client.running() is False


def test_server_errors_raise_instead_of_passing(client: ToxiproxyClient, echo: EchoServer,
                                                cleanup: list[str]) -> None:
    import socket

    blocker = socket.create_server(("127.0.0.1", 0))
    port = blocker.getsockname()[1]
    name = unique("busy")
    cleanup.append(name)
    try:
        with pytest.raises(ToxiproxyServerError) as info:
            client.create(upstream=echo.addr, name=name, listen=f"127.0.0.1:{port}")
        assert info.value.status == 500
        assert info.value.message == f"listen tcp 127.0.0.1:{port}: bind: address already in use"
        proxy = client.create(upstream=echo.addr, name=name, listen=f"127.0.0.1:{port}", enabled=False)
        with pytest.raises(ToxiproxyServerError):
            proxy.enable()  # the library would leave it silently disabled
    finally:
        blocker.close()


def test_per_instance_addresses_do_not_leak(api_url: str, echo: EchoServer) -> None:
    before = (toxiproxy.api.APIConsumer.host, toxiproxy.api.APIConsumer.port)
    with EmbeddedToxiproxy() as a, EmbeddedToxiproxy() as b:
        ca, cb = ToxiproxyClient(a.url), ToxiproxyClient(b.url)
        errors: list[BaseException] = []

        def work(client: ToxiproxyClient, tag: str) -> None:
            try:
                for i in range(10):
                    client.create(upstream=echo.addr, name=f"{tag}{i}")
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(ca, "a")), threading.Thread(target=work, args=(cb, "b"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert set(ca.proxies()) == {f"a{i}" for i in range(10)}
        assert set(cb.proxies()) == {f"b{i}" for i in range(10)}
    assert (toxiproxy.api.APIConsumer.host, toxiproxy.api.APIConsumer.port) == before


def test_timeout_and_unreachable_server() -> None:
    import socket

    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never answers
    try:
        client = ToxiproxyClient(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=0.3)
        start = time.monotonic()
        with pytest.raises(ToxiproxyUnavailable):
            client.proxies()
        assert time.monotonic() - start < 2.0
    finally:
        silent.close()
    with pytest.raises(ServiceError):
        ToxiproxyClient("http://127.0.0.1:1", timeout=1).reset()
    with pytest.raises(InvalidArgument):
        ToxiproxyClient("127.0.0.1:8474")
    with pytest.raises(InvalidArgument):
        ToxiproxyClient("http://127.0.0.1:8474", timeout=0)


def test_default_url_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOXIPROXY_URL", "http://127.0.0.1:9")
    assert ToxiproxyClient().url == "http://127.0.0.1:9"
    monkeypatch.delenv("TOXIPROXY_URL")
    assert ToxiproxyClient().url == "http://127.0.0.1:8474"


def test_library_untouched_outside_the_wrapper(api_url: str) -> None:
    ToxiproxyClient(api_url)  # installs the dispatchers
    assert toxiproxy.api.APIConsumer.host == "127.0.0.1" and toxiproxy.api.APIConsumer.port == 8474
    with EmbeddedToxiproxy(port=0) as tp:
        consumer = toxiproxy.api.APIConsumer
        old = (consumer.host, consumer.port)
        lib = toxiproxy.Toxiproxy()
        lib.update_api_consumer(tp.host, tp.port)  # the library's own global way still works
        try:
            assert lib.proxies() == {}
            assert lib.version().startswith(b'{"version": "')
        finally:
            lib.update_api_consumer(*old)
