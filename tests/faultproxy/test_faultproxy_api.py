"""HTTP API conformance (spec §1 and §3 item 1, 2): shapes, codes, messages, lifecycle."""

from __future__ import annotations

import json
import socket
import time

import pytest
import requests

from crashmatrix.harness.errors import InvalidArgument
from crashmatrix.harness.faultproxy import EmbeddedToxiproxy

from ._support import (IS_REAL, Api, EchoServer, TcpServer, closed_port, connect, embedded_only,
                       port_of, read_all, recv_exact, refused, rtt, unique, wait_close)

ERROR_CT = "text/plain; charset=utf-8"


def err(r: requests.Response) -> dict:
    assert r.headers["Content-Type"] == ERROR_CT
    assert r.headers.get("X-Content-Type-Options") == "nosniff"
    assert r.text.endswith("}\n")
    return json.loads(r.text)


def assert_error(r: requests.Response, status: int, message: str) -> None:
    assert r.status_code == status, r.text
    assert err(r) == {"error": message, "status": status}


# ----------------------------------------------------------------------- server level

def test_version_body_and_content_type(api: Api) -> None:
    r = api.get("/version")
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "application/json;charset=utf-8"
    assert r.text.startswith('{"version": "') and r.text.endswith('"}\n')
    assert json.loads(r.text)["version"]


def test_request_id_only_on_matched_routes(api: Api) -> None:
    rid = api.get("/version").headers.get("X-Toxiproxy-Request-Id", "")
    assert len(rid) == 20 and rid.isalnum()
    assert "X-Toxiproxy-Request-Id" not in api.get("/nope").headers
    assert "X-Toxiproxy-Request-Id" not in api.request("PUT", "/version").headers


def test_browser_user_agent_refused(api: Api) -> None:
    r = api.get("/proxies", headers={"User-Agent": "Mozilla/5.0 (X11)"})
    assert r.status_code == 403
    assert r.headers["Content-Type"] == ERROR_CT
    assert r.text == "User agent not allowed\n"
    assert len(r.headers.get("X-Toxiproxy-Request-Id", "")) == 20
    assert api.get("/proxies", headers={"User-Agent": "Wget/1.21"}).status_code == 200


def test_unknown_path_wrong_method_trailing_slash(api: Api) -> None:
    for path in ("/nope", "/proxies/", "/version/", "/proxies/x/toxics/y/z"):
        r = api.get(path)
        assert r.status_code == 404, path
        assert r.text == "404 page not found\n"
        assert r.headers["Content-Type"].startswith("text/plain")
    for method, path in (("PUT", "/proxies/x"), ("POST", "/version"), ("DELETE", "/proxies"),
                         ("GET", "/reset"), ("GET", "/populate"), ("PUT", "/proxies/x/toxics")):
        r = api.request(method, path)
        assert r.status_code == 405, (method, path)
        assert r.content == b""


def test_metrics_absent_by_default(api: Api) -> None:
    if IS_REAL:
        assert api.get("/metrics").status_code in (200, 404)
    else:
        r = api.get("/metrics")
        assert r.status_code == 404 and r.text == "404 page not found\n"


# ------------------------------------------------------------------- proxy create/list

def test_create_shape_and_real_port(api: Api, echo: EchoServer) -> None:
    name = unique()
    r = api.post("/proxies", {"name": name, "upstream": echo.addr, "listen": "127.0.0.1:0"})
    api.track(name)
    assert r.status_code == 201
    assert r.headers["Content-Type"] == "application/json"
    body = r.json()
    assert [k for k in body if k != "Logger"] == ["name", "listen", "upstream", "enabled", "toxics"]
    assert body["name"] == name and body["upstream"] == echo.addr
    assert body["enabled"] is True and body["toxics"] == []
    assert body["listen"].startswith("127.0.0.1:") and port_of(body["listen"]) > 0
    c = connect(body["listen"])
    assert rtt(c) < 1.0
    c.close()
    listing = api.get("/proxies").json()
    assert listing[name]["listen"] == body["listen"]
    assert api.get(f"/proxies/{name}").json()["toxics"] == []


def test_create_defaults_enabled_true_and_localhost_normalised(api: Api, echo: EchoServer) -> None:
    name = unique()
    r = api.post("/proxies", {"name": name, "upstream": echo.addr, "listen": "localhost:0"})
    api.track(name)
    assert r.status_code == 201
    body = r.json()
    assert body["enabled"] is True
    assert body["listen"].startswith("127.0.0.1:")
    assert port_of(body["listen"]) != 0


def test_create_validation_errors(api: Api) -> None:
    assert_error(api.post("/proxies", {"upstream": "x:1"}), 400, "missing required field: name")
    assert_error(api.post("/proxies", {"name": "", "upstream": "x:1"}), 400, "missing required field: name")
    assert_error(api.post("/proxies", {"name": unique()}), 400, "missing required field: upstream")
    assert_error(api.post("/proxies", raw=b""), 400, "bad request body: EOF")
    assert_error(api.post("/proxies", raw=b"null"), 400, "missing required field: name")
    r = api.post("/proxies", raw=b'{"name": 5, "upstream": "x:1"}')
    assert r.status_code == 400
    assert err(r)["error"].startswith("bad request body: json: cannot unmarshal number into Go ")
    r = api.post("/proxies", raw=b"{nope")
    assert r.status_code == 400 and err(r)["error"].startswith("bad request body: invalid character")


def test_create_ignores_unknown_fields_toxics_and_trailing_garbage(api: Api, echo: EchoServer) -> None:
    name = unique()
    raw = json.dumps({"name": name, "upstream": echo.addr, "listen": "127.0.0.1:0", "bogus": [1],
                      "toxics": [{"type": "latency", "attributes": {"latency": 100}}]}) + " trailing }{ garbage"
    r = api.post("/proxies", raw=raw)
    api.track(name)
    assert r.status_code == 201, r.text
    assert r.json()["toxics"] == []  # Toxiproxy issue #79: toxics at creation are ignored


def test_create_duplicate_is_409(api: Api, echo: EchoServer) -> None:
    p = api.create(echo.addr)
    r = api.post("/proxies", {"name": p["name"], "upstream": echo.addr, "listen": "127.0.0.1:0"})
    assert_error(r, 409, "proxy already exists")


def test_create_on_busy_port_is_500_and_not_created(api: Api, echo: EchoServer) -> None:
    blocker = socket.create_server(("127.0.0.1", 0))
    port = blocker.getsockname()[1]
    name = unique()
    try:
        r = api.post("/proxies", {"name": name, "upstream": echo.addr, "listen": f"127.0.0.1:{port}"})
        assert_error(r, 500, f"listen tcp 127.0.0.1:{port}: bind: address already in use")
        assert api.get(f"/proxies/{name}").status_code == 404
    finally:
        blocker.close()
    r = api.post("/proxies", {"name": name, "upstream": echo.addr, "listen": f"127.0.0.1:{port}"})
    api.track(name)
    assert r.status_code == 201 and r.json()["listen"] == f"127.0.0.1:{port}"


def test_create_with_unparsable_listen_is_500(api: Api) -> None:
    name = unique()
    r = api.post("/proxies", {"name": name, "upstream": "127.0.0.1:1", "listen": "bogus"})
    assert_error(r, 500, "listen tcp: address bogus: missing port in address")
    assert api.get(f"/proxies/{name}").status_code == 404


def test_disabled_proxy_keeps_literal_listen_then_binds_and_keeps_port(api: Api, echo: EchoServer) -> None:
    p = api.create(echo.addr, listen="localhost:0", enabled=False)
    assert p["enabled"] is False and p["listen"] == "localhost:0"
    r = api.post(f"/proxies/{p['name']}", {"enabled": True})
    assert r.status_code == 200
    listen = r.json()["listen"]
    assert listen.startswith("127.0.0.1:") and port_of(listen) != 0
    assert rtt(connect(listen)) < 1.0
    for enabled in (False, True, False, True):
        body = api.post(f"/proxies/{p['name']}", {"enabled": enabled}).json()
        assert body["enabled"] is enabled and body["listen"] == listen
    assert rtt(connect(listen)) < 1.0


def test_index_is_an_object_keyed_by_name(api: Api, echo: EchoServer) -> None:
    a, b = api.create(echo.addr), api.create(echo.addr)
    listing = api.get("/proxies").json()
    assert isinstance(listing, dict)
    assert listing[a["name"]]["name"] == a["name"] and listing[b["name"]]["listen"] == b["listen"]


# ------------------------------------------------------------- proxy show/update/delete

def test_show_update_delete_not_found(api: Api) -> None:
    name = unique("missing")
    assert_error(api.get(f"/proxies/{name}"), 404, "proxy not found")
    assert_error(api.post(f"/proxies/{name}", {"enabled": False}), 404, "proxy not found")
    assert_error(api.patch(f"/proxies/{name}", {"enabled": False}), 404, "proxy not found")
    assert_error(api.delete(f"/proxies/{name}"), 404, "proxy not found")
    assert_error(api.get(f"/proxies/{name}/toxics"), 404, "proxy not found")
    assert_error(api.post(f"/proxies/{name}/toxics", {"type": "noop"}), 404, "proxy not found")
    assert_error(api.get(f"/proxies/{name}/toxics/t"), 404, "proxy not found")
    assert_error(api.delete(f"/proxies/{name}/toxics/t"), 404, "proxy not found")


def test_update_is_a_merge_and_ignores_name(api: Api, echo: EchoServer) -> None:
    p = api.create(echo.addr)
    r = api.patch(f"/proxies/{p['name']}", {"name": "other", "bogus": 1, "enabled": False})
    assert r.status_code == 200
    body = r.json()
    assert body["name"] == p["name"] and body["upstream"] == echo.addr and body["enabled"] is False
    assert body["listen"] == p["listen"]
    assert api.get("/proxies/other").status_code == 404
    r = api.post(f"/proxies/{p['name']}", {"enabled": None})
    assert r.json()["enabled"] is False
    assert_error(api.post(f"/proxies/{p['name']}", raw=b""), 400, "bad request body: EOF")


def test_update_that_changes_nothing_keeps_connections(api: Api, echo: EchoServer) -> None:
    p = api.create(echo.addr)
    c = connect(p["listen"])
    assert rtt(c) < 1.0
    for body in ({}, {"enabled": True}, {"listen": p["listen"], "upstream": echo.addr},
                 {"listen": p["listen"].replace("127.0.0.1", "localhost")}):
        r = api.post(f"/proxies/{p['name']}", body)
        assert r.status_code == 200 and r.json()["listen"] == p["listen"]
    assert rtt(c) < 1.0


def test_upstream_change_closes_connections_keeps_port(api: Api, echo: EchoServer) -> None:
    p = api.create(echo.addr)
    c = connect(p["listen"])
    assert rtt(c) < 1.0
    other = EchoServer()
    try:
        r = api.post(f"/proxies/{p['name']}", {"upstream": other.addr})
        assert r.status_code == 200
        assert r.json()["listen"] == p["listen"] and r.json()["upstream"] == other.addr
        assert wait_close(c)[0] == "eof"
        assert rtt(connect(p["listen"])) < 1.0
    finally:
        other.close()


def test_listen_change_rebinds(api: Api, echo: EchoServer) -> None:
    p = api.create(echo.addr)
    c = connect(p["listen"])
    r = api.post(f"/proxies/{p['name']}", {"listen": "localhost:0"})
    assert r.status_code == 200
    listen = r.json()["listen"]
    assert listen.startswith("127.0.0.1:") and listen != p["listen"]
    assert wait_close(c)[0] == "eof"
    assert refused(p["listen"])
    assert rtt(connect(listen)) < 1.0


def test_update_with_unresolvable_listen_is_500(api: Api, echo: EchoServer) -> None:
    p = api.create(echo.addr)
    r = api.post(f"/proxies/{p['name']}", {"listen": "not-an-addr"})
    assert_error(r, 500, "address not-an-addr: missing port in address")


def test_enable_on_busy_port_is_500_and_stays_disabled(api: Api, echo: EchoServer) -> None:
    blocker = socket.create_server(("127.0.0.1", 0))
    port = blocker.getsockname()[1]
    try:
        p = api.create(echo.addr, listen=f"127.0.0.1:{port}", enabled=False)
        r = api.post(f"/proxies/{p['name']}", {"enabled": True})
        assert_error(r, 500, f"listen tcp 127.0.0.1:{port}: bind: address already in use")
        assert api.get(f"/proxies/{p['name']}").json()["enabled"] is False
    finally:
        blocker.close()
    assert api.post(f"/proxies/{p['name']}", {"enabled": True}).json()["enabled"] is True


def test_delete_closes_and_forgets(api: Api, upstream: TcpServer) -> None:
    p = api.create(upstream.addr)
    c = connect(p["listen"])
    s = upstream.accept()
    r = api.delete(f"/proxies/{p['name']}")
    assert r.status_code == 204 and r.content == b""
    assert wait_close(c)[0] == "eof"
    assert wait_close(s)[0] == "eof"
    assert refused(p["listen"])
    assert p["name"] not in api.get("/proxies").json()
    assert_error(api.delete(f"/proxies/{p['name']}"), 404, "proxy not found")


def test_path_variables_are_url_decoded(api: Api, echo: EchoServer) -> None:
    name = unique("sp ace")
    api.create(echo.addr, name=name)
    quoted = name.replace(" ", "%20")
    assert api.get(f"/proxies/{quoted}").json()["name"] == name
    slashed = unique("a/b")
    r = api.post("/proxies", {"name": slashed, "upstream": echo.addr, "listen": "127.0.0.1:0",
                              "enabled": False})
    assert r.status_code == 201
    # Creatable, listed, but unreachable by name afterwards (it cannot be deleted either).
    assert api.get("/proxies/" + slashed.replace("/", "%2F")).status_code == 404
    assert slashed in api.get("/proxies").json()


# ------------------------------------------------------------------------------- toxics

ALL_ATTRIBUTES = {
    "latency": {"latency": 0, "jitter": 0},
    "bandwidth": {"rate": 0},
    "slow_close": {"delay": 0},
    "timeout": {"timeout": 0},
    "reset_peer": {"timeout": 0},
    "slicer": {"average_size": 0, "size_variation": 0, "delay": 0},
    "limit_data": {"bytes": 0},
    "noop": {},
}


def test_toxic_shapes_list_every_attribute(api: Api) -> None:
    p = api.create(f"127.0.0.1:{closed_port()}")
    for type_name, attrs in ALL_ATTRIBUTES.items():
        given = {"average_size": 10, "size_variation": 1} if type_name == "slicer" else {}
        r = api.post(f"/proxies/{p['name']}/toxics", {"type": type_name, "attributes": given})
        assert r.status_code == 200, r.text
        assert r.headers["Content-Type"] == "application/json"
        body = r.json()
        assert list(body) == ["attributes", "name", "type", "stream", "toxicity"]
        assert body["attributes"] == {**attrs, **given}
        assert list(body["attributes"]) == list(attrs)
        assert body == {"attributes": {**attrs, **given}, "name": f"{type_name}_downstream",
                        "type": type_name, "stream": "downstream", "toxicity": 1}
        assert '"toxicity":1}' in r.text


def test_toxic_defaults_stream_case_and_names(api: Api) -> None:
    p = api.create(f"127.0.0.1:{closed_port()}")
    base = f"/proxies/{p['name']}/toxics"
    r = api.post(base, {"type": "latency", "stream": "UPSTREAM", "attributes": {"latency": 5}})
    assert r.status_code == 200
    assert r.json()["stream"] == "UPSTREAM" and r.json()["name"] == "latency_UPSTREAM"
    assert api.post(base, {"type": "latency", "stream": "upstream"}).json()["name"] == "latency_upstream"
    assert api.post(base, {"type": "latency"}).json()["name"] == "latency_downstream"
    r = api.post(base, {"type": "noop", "stream": None, "name": None})
    assert r.json()["stream"] == "downstream" and r.json()["name"] == "noop_downstream"
    r = api.post(base, {"type": "latency", "name": "custom", "toxicity": 0.2})
    assert r.json()["toxicity"] == 0.2 and '"toxicity":0.2}' in r.text
    for toxicity, text in ((0.5, "0.5"), (-1, "-1"), (2, "2")):
        r = api.post(base, {"type": "noop", "name": unique("t"), "toxicity": toxicity})
        assert r.text.endswith(f'"toxicity":{text}}}')


def test_toxic_create_errors(api: Api) -> None:
    p = api.create(f"127.0.0.1:{closed_port()}")
    base = f"/proxies/{p['name']}/toxics"
    stream_msg = "stream was invalid, can be either upstream or downstream"
    assert_error(api.post(base, {"type": "latency", "stream": "walrustream"}), 400, stream_msg)
    assert_error(api.post(base, {"type": "latency", "stream": ""}), 400, stream_msg)
    assert_error(api.post(base, {"type": "Latency"}), 400, "invalid toxic type")
    assert_error(api.post(base, {"attributes": {}}), 400, "invalid toxic type")
    assert_error(api.post(base, raw=b""), 400, "bad request body: EOF")
    assert_error(api.post(base, {"type": "latency", "attributes": {"latency": "100"}}), 400,
                 "bad request body: json: cannot unmarshal string into Go struct field "
                 "LatencyToxic.attributes.latency of type int64")
    r = api.post(base, raw=b'{"type": "latency", "attributes": {"latency": 100.5}}')
    assert r.status_code == 400
    assert err(r)["error"].startswith("bad request body: json: cannot unmarshal number 100.5 into ")
    assert api.post(base, {"type": "latency", "name": "dup"}).status_code == 200
    assert_error(api.post(base, {"type": "bandwidth", "name": "dup", "stream": "upstream"}),
                 409, "toxic already exists")
    assert_error(api.post(base, {"type": "latency", "name": "dup", "stream": "downstream"}),
                 409, "toxic already exists")


def test_toxic_listing_order_upstream_first(api: Api) -> None:
    p = api.create(f"127.0.0.1:{closed_port()}")
    for name, stream in (("d1", "downstream"), ("u1", "upstream"), ("d2", "downstream"), ("u2", "upstream")):
        api.toxic(p["name"], "noop", stream=stream, name=name)
    names = [t["name"] for t in api.get(f"/proxies/{p['name']}/toxics").json()]
    assert names == ["u1", "u2", "d1", "d2"]
    assert [t["name"] for t in api.get(f"/proxies/{p['name']}").json()["toxics"]] == names


def test_toxic_show_update_merge_delete(api: Api) -> None:
    p = api.create(f"127.0.0.1:{closed_port()}")
    base = f"/proxies/{p['name']}/toxics"
    api.toxic(p["name"], "latency", name="lat", toxicity=0.5, latency=100, jitter=10)
    assert api.get(f"{base}/lat").json()["attributes"] == {"latency": 100, "jitter": 10}
    r = api.post(f"{base}/lat", {"attributes": {"latency": 200}, "name": "x", "type": "noop",
                                  "stream": "upstream"})
    assert r.status_code == 200
    assert r.json() == {"attributes": {"latency": 200, "jitter": 10}, "name": "lat", "type": "latency",
                        "stream": "downstream", "toxicity": 0.5}
    r = api.patch(f"{base}/lat", {"toxicity": None, "attributes": {"jitter": 3}})
    assert r.json()["toxicity"] == 0.5 and r.json()["attributes"] == {"latency": 200, "jitter": 3}
    r = api.patch(f"{base}/lat", {"toxicity": 1})
    assert r.json()["toxicity"] == 1 and r.json()["attributes"] == {"latency": 200, "jitter": 3}
    assert_error(api.post(f"{base}/lat", raw=b""), 400, "bad request body: EOF")
    assert_error(api.post(f"{base}/lat", {"attributes": {"latency": "x"}}), 400,
                 "bad request body: json: cannot unmarshal string into Go struct field "
                 "LatencyToxic.attributes.latency of type int64")
    assert_error(api.get(f"{base}/nope"), 404, "toxic not found")
    assert_error(api.post(f"{base}/nope", {}), 404, "toxic not found")
    assert_error(api.delete(f"{base}/nope"), 404, "toxic not found")
    r = api.delete(f"{base}/lat")
    assert r.status_code == 204 and r.content == b""
    assert api.get(base).json() == []


# ---------------------------------------------------------------------------- populate

def populate(api: Api, entries: object) -> requests.Response:
    for e in entries if isinstance(entries, list) else []:
        if isinstance(e, dict) and e.get("name"):
            api.track(e["name"])
    return api.post("/populate", entries)


def test_populate_empty_gives_null(api: Api) -> None:
    r = api.post("/populate", [])
    assert r.status_code == 201
    assert r.headers["Content-Type"] == "application/json"
    assert r.text == '{"proxies":null}'


def test_populate_creates_in_order_enabled_by_default(api: Api, echo: EchoServer) -> None:
    a, b, c = unique(), unique(), unique()
    r = populate(api, [{"name": a, "upstream": echo.addr, "listen": "127.0.0.1:0"},
                       {"name": b, "upstream": echo.addr, "listen": "127.0.0.1:0", "enabled": True},
                       {"name": c, "upstream": echo.addr, "listen": "127.0.0.1:0", "enabled": False}])
    assert r.status_code == 201
    proxies = r.json()["proxies"]
    assert [p["name"] for p in proxies] == [a, b, c]
    assert [p["enabled"] for p in proxies] == [True, True, False]
    assert rtt(connect(proxies[0]["listen"])) < 1.0 and rtt(connect(proxies[1]["listen"])) < 1.0
    assert proxies[2]["listen"] == "127.0.0.1:0"


def test_populate_identical_keeps_toxics_and_state(api: Api, echo: EchoServer) -> None:
    name = unique()
    first = populate(api, [{"name": name, "upstream": echo.addr, "listen": "localhost:0"}]).json()["proxies"][0]
    api.toxic(name, "noop", name="keep")
    c = connect(first["listen"])
    assert rtt(c) < 1.0
    same = [{"name": name, "upstream": echo.addr,
             "listen": first["listen"].replace("127.0.0.1", "localhost"), "enabled": False}]
    again = populate(api, same).json()["proxies"][0]
    assert again["listen"] == first["listen"] and again["enabled"] is True  # enabled untouched
    assert [t["name"] for t in again["toxics"]] == ["keep"]
    assert rtt(c) < 1.0
    # A different upstream replaces the proxy: toxics gone, connections closed.
    other = EchoServer()
    try:
        replaced = populate(api, [{"name": name, "upstream": other.addr,
                                   "listen": first["listen"]}]).json()["proxies"][0]
        assert replaced["toxics"] == [] and replaced["upstream"] == other.addr
        assert wait_close(c)[0] == "eof"
    finally:
        other.close()


def test_populate_validates_everything_first(api: Api, echo: EchoServer) -> None:
    a, b = unique(), unique()
    r = populate(api, [{"name": a, "upstream": echo.addr, "listen": "127.0.0.1:0"},
                       {"upstream": echo.addr, "listen": "127.0.0.1:0"}])
    assert r.status_code == 400
    assert r.headers["Content-Type"] == "application/json"
    assert r.json() == {"error": "missing required field: name at proxy 2", "status": 400, "proxies": None}
    assert not r.text.endswith("\n")
    r = populate(api, [{"name": a, "upstream": echo.addr}, {"name": b, "upstream": ""}])
    assert r.json() == {"error": "missing required field: upstream at proxy 2", "status": 400, "proxies": None}
    listing = api.get("/proxies").json()
    assert a not in listing and b not in listing


def test_populate_stops_at_first_failure(api: Api, echo: EchoServer) -> None:
    a, b, c = unique(), unique(), unique()
    r = populate(api, [{"name": a, "upstream": echo.addr, "listen": "127.0.0.1:0"},
                       {"name": b, "upstream": echo.addr, "listen": "bogus"},
                       {"name": c, "upstream": echo.addr, "listen": "127.0.0.1:0"}])
    assert r.status_code == 500
    body = r.json()
    assert body["error"] == "listen tcp: address bogus: missing port in address"
    assert body["status"] == 500
    assert [p["name"] for p in body["proxies"]] == [a]
    listing = api.get("/proxies").json()
    assert a in listing and b not in listing and c not in listing


def test_populate_requires_an_array(api: Api) -> None:
    r = api.post("/populate", {"name": "x", "upstream": "y:1"})
    assert r.status_code == 400
    body = r.json()
    assert body["proxies"] is None and body["status"] == 400
    assert body["error"].startswith(
        "bad request body: json: cannot unmarshal object into Go value of type []struct {")


def test_toxic_on_populated_proxy(api: Api, echo: EchoServer) -> None:
    name = unique()
    populate(api, [{"name": name, "upstream": echo.addr, "listen": "127.0.0.1:0"}])
    assert api.toxic(name, "latency", latency=1)["name"] == "latency_downstream"


# ------------------------------------------------------------------------------- reset

def test_reset_reenables_and_removes_toxics(api: Api, echo: EchoServer) -> None:
    p = api.create(echo.addr)
    api.toxic(p["name"], "latency", latency=200)
    api.toxic(p["name"], "noop", stream="upstream")
    api.post(f"/proxies/{p['name']}", {"enabled": False})
    assert refused(p["listen"])
    r = api.post("/reset", raw=b"ignored {garbage")
    assert r.status_code == 204 and r.content == b""
    body = api.get(f"/proxies/{p['name']}").json()
    assert body["enabled"] is True and body["toxics"] == [] and body["listen"] == p["listen"]
    assert rtt(connect(p["listen"])) < 0.15


# ------------------------------------------------------------------ embedded specifics

@embedded_only
def test_metrics_when_enabled() -> None:
    echo = EchoServer()
    try:
        with EmbeddedToxiproxy(proxy_metrics=True) as tp:
            api = Api(tp.url)
            p = api.create(echo.addr, name="m")
            c = connect(p["listen"])
            c.sendall(b"hello")
            assert recv_exact(c, 5) == b"hello"
            c.close()
            deadline = time.monotonic() + 2
            text = ""
            while time.monotonic() < deadline:
                text = api.get("/metrics").text
                if "sent_bytes_total" in text:
                    break
                time.sleep(0.02)
            r = api.get("/metrics")
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            labels = f'direction="upstream",listener="{p["listen"]}",proxy="m",upstream="{echo.addr}"'
            assert f"toxiproxy_proxy_received_bytes_total{{{labels}}} 5" in text
            assert f"toxiproxy_proxy_sent_bytes_total{{{labels}}} 5" in text
            assert "# TYPE toxiproxy_proxy_sent_bytes_total counter" in text
    finally:
        echo.close()


@embedded_only
def test_divergence_crashing_attributes_are_400(api: Api) -> None:
    p = api.create(f"127.0.0.1:{closed_port()}")
    base = f"/proxies/{p['name']}/toxics"
    cases = [
        {"type": "bandwidth", "attributes": {"rate": -1}},
        {"type": "slicer", "attributes": {}},
        {"type": "slicer", "attributes": {"average_size": 0, "size_variation": 0}},
        {"type": "slicer", "attributes": {"average_size": 10, "size_variation": 11}},
        {"type": "slicer", "attributes": {"average_size": 10, "size_variation": -1}},
        {"type": "latency", "attributes": {"latency": 1, "jitter": 2**62}},
    ]
    for body in cases:
        r = api.post(base, body)
        assert r.status_code == 400, body
        assert err(r)["error"].startswith(f"bad request body: invalid {body['type']} attributes: ")
    assert api.get(base).json() == []
    api.toxic(p["name"], "bandwidth", name="bw", rate=10)
    r = api.post(f"{base}/bw", {"attributes": {"rate": -5}})
    assert r.status_code == 400
    assert api.get(f"{base}/bw").json()["attributes"] == {"rate": 10}
    # Toxiproxy accepts these (they do not crash it): so do we.
    for attrs in ({"latency": -100, "jitter": 0}, {"latency": 10, "jitter": 50}):
        assert api.post(base, {"type": "latency", "name": unique("l"), "attributes": attrs}).status_code == 200


@embedded_only
def test_divergence_loopback_only(api: Api, echo: EchoServer) -> None:
    name = unique()
    r = api.post("/proxies", {"name": name, "upstream": echo.addr, "listen": "0.0.0.0:0"})
    assert r.status_code == 500
    assert err(r)["error"].startswith("listen tcp 0.0.0.0:0: non-loopback address refused")
    assert api.get(f"/proxies/{name}").status_code == 404
    # An empty listen binds loopback (Toxiproxy: every interface, reported as [::]:PORT).
    r = api.post("/proxies", {"name": name, "upstream": echo.addr})
    api.track(name)
    assert r.status_code == 201 and r.json()["listen"].startswith("127.0.0.1:")
    with pytest.raises(InvalidArgument):
        EmbeddedToxiproxy(host="0.0.0.0").start()


@embedded_only
def test_handler_timeout_answers_503_and_keeps_working() -> None:
    with EmbeddedToxiproxy(handler_timeout=1e-9) as tp:
        api = Api(tp.url)
        r = api.post("/proxies", {"name": "slow", "upstream": "127.0.0.1:1", "listen": "localhost:0"})
        assert r.status_code == 503
        assert r.content == b"<html><head><title>Timeout</title></head><body><h1>Timeout</h1></body></html>"
        assert len(r.content) == 77


def test_error_bodies_parse_as_json(api: Api) -> None:
    r = api.get("/proxies/definitely-missing")
    assert json.loads(r.content) == {"error": "proxy not found", "status": 404}


def test_dead_upstream_means_accept_then_eof(api: Api) -> None:
    p = api.create(f"127.0.0.1:{closed_port()}")
    c = connect(p["listen"])
    how, waited = wait_close(c, 2.0)
    assert how == "eof" and waited < 0.5


def test_stop_three_times_is_harmless(api: Api, echo: EchoServer) -> None:
    p = api.create(echo.addr)
    for _ in range(3):
        assert api.post(f"/proxies/{p['name']}", {"enabled": False}).status_code == 200
    assert refused(p["listen"])
    c = connect(api.post(f"/proxies/{p['name']}", {"enabled": True}).json()["listen"])
    assert rtt(c) < 1.0
    data, how = read_all(c, 0.05)
    assert (data, how) == (b"", "timeout")
