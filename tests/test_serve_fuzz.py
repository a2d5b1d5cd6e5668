"""Nothing a client sends gets a 5xx: v2 JSON, binary and gRPC bodies mutated at random against a real replica.

Integration tier: ``distributed-onnx serve`` in a subprocess (embedded Ray on 127.0.0.1) holding the tiny
Chronos-2 graph (the primary) and the tiny plain graph (a shadow), the forecast log on, a small body limit so
that sizes at the limit are cheap. Each case starts from a valid request (built from ``GET /v2/models/{name}``)
and changes one to three things: shapes (0, negative, 2**62, 10**30, one off), datatypes, data (missing,
ragged, strings, beyond the type's range), parameters (``start``, ``series_ids`` long or odd, ``binary_data_size``),
the ``Inference-Header-Content-Length`` header (``²``, ``-1``, ``1e3``, past the body), sizes at the limit and
bytes flipped in the JSON. Every answer must be a 200 or a 4xx (gRPC: OK or a client status), and the replica
ready at the end. Seeded, so a failure names a case that can be replayed; bounded by a case count and a time
budget, whichever comes first.

The fields are not only the ones listed here: every JSON body field the server's own ``/openapi.json`` declares,
on every route that takes one (``/v2/models/{name}/infer``, ``/v1/forecast``, any route added later), is
attacked once with values of every wrong kind for its declared type, starting from a valid body (the route's
documented example, or valid tensors), and again at random in the budgeted loop (issue 51): a new field is
attacked without editing this file.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import httpx
import numpy as np
import pytest
from graphs import write_tiny_chronos2, write_tiny_context_quantiles
from test_serve_ingress import Server

pytestmark = pytest.mark.integration

PRIMARY, SHADOW = "tiny", "tiny_plain"
MAX_BODY_BYTES = 256 * 1024
CASES = 1000
BUDGET_S = 60.0
HEADER = "Inference-Header-Content-Length"
DTYPES = {"FP32": "<f4", "INT64": "<i8", "FP64": "<f8", "INT32": "<i4", "BOOL": "|b1", "FP16": "<f2", "UINT8": "|u1"}
ODD_DATATYPES = ["FP64", "INT32", "BOOL", "FP16", "UINT8", "BYTES", "BF16", "STRING", "", "fp32"]
ODD_DIMS = [0, -1, 1, 2, 3, 10**30, 2**62, 2**63, 2**31, 2**31 - 1, 16, 17, 8, 7]
ODD_HEADERS = ["²", "-1", "1e3", "", "1 2", "0", "+12", "١٢", "12abc", str(10**40), "4294967296", "0x10"]
ODD_STARTS = ["2026-12-01", "not a date", "9999-12-31T23:59:59", "0001-01-01T00:00:00", "2026-13-01", 5, True, None]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("fuzz")
    primary = write_tiny_chronos2(root / "models").weights_path
    shadow = write_tiny_context_quantiles(root / "models").weights_path
    running = Server(
        *("--checkpoint", str(primary), "--checkpoint", str(shadow), "--shadow", SHADOW),
        *("--forecast-log", str(root / "log"), "--forecast-log-flush-s", "0.2"),
        *("--max-body-bytes", str(MAX_BODY_BYTES), "--cpus-per-replica", "1", "--warm-up-rows", "0"),
    )
    try:
        yield running
    finally:
        output = running.stop()
        assert running.process.returncode == 0, output


#: Values of the wrong kind, or at the edges, for each JSON type a schema declares (and removing the field).
ODD_BY_TYPE: dict[str, list[Any]] = {
    "string": ["", "x" * 70_000, 5, None, [], {}, "\x00", "\u202e", "١٢", "9999-99-99"],
    "integer": [-1, 0, 2**63, 10**30, "12", 1.5, None, True, [], float("inf")],
    "number": [1e308, -1e308, "NaN", None, "x", [], True, 10**400],
    "boolean": ["true", 2, None, []],
    "array": [[], "x", [None], [[1, 2], [3]], {}, None, [True] * 3, list(range(5000))],
    "object": [[], "x", {"": None}, None, {"x" * 300: 1}],
}
MISSING = object()  # "leave the field out"
ITEM = "[]"  # a path step into every item of an array


def _resolve(document: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """A schema with its ``$ref`` followed and an optional ``anyOf`` narrowed to its first non-null member."""
    while "$ref" in schema:
        schema = document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    members = [each for each in schema.get("anyOf", []) if each.get("type") != "null"]
    return _resolve(document, members[0]) if members else schema


def _fields(document: dict[str, Any], schema: dict[str, Any], path: tuple[str, ...] = ()) -> list[Any]:
    """Every field a body schema declares: (path, JSON type), objects and arrays walked into."""
    schema = _resolve(document, schema)
    found = []
    for name, child in schema.get("properties", {}).items():
        kind = _resolve(document, child).get("type", "string")
        found.append(((*path, name), kind))
        found += _fields(document, child, (*path, name))
    if schema.get("type") == "array" and "items" in schema:
        item = _resolve(document, schema["items"])
        if item.get("type") in ("number", "integer", "boolean", "string"):  # an array's values: y's numbers
            found.append(((*path, ITEM), item["type"]))
        found += _fields(document, schema["items"], (*path, ITEM))
    return found


def _json_routes(url: str) -> dict[str, list[Any]]:
    """The served POST routes that take a JSON body, from ``/openapi.json``: path -> (example body or None, fields)."""
    document = httpx.get(f"{url}/openapi.json", timeout=30).json()
    routes = {}
    for path, operations in document["paths"].items():
        body = operations.get("post", {}).get("requestBody", {}).get("content", {}).get("application/json")
        if body is None:
            continue
        examples = [each["value"] for each in body.get("examples", {}).values() if "value" in each]
        routes[path] = [examples[0] if examples else None, _fields(document, body["schema"])]
    return routes


def _put(body: Any, path: tuple[str, ...], value: Any, rng: random.Random) -> None:
    """Set the field at ``path`` of ``body`` (in place) to ``value`` (:data:`MISSING`: remove it), creating what is
    missing on the way; an array step goes into one of its items."""
    for position, step in enumerate(path[:-1]):
        following = path[position + 1]
        if step == ITEM:
            if not isinstance(body, list) or not body:
                return
            body = rng.choice(body)
            continue
        if not isinstance(body, dict):
            return
        if not isinstance(body.get(step), dict | list):
            body[step] = [{}] if following == ITEM else {}
        body = body[step]
    last = path[-1]
    if last == ITEM:
        if isinstance(body, list) and body:
            body[rng.randrange(len(body))] = None if value is MISSING else value
    elif isinstance(body, dict):
        if value is MISSING:
            body.pop(last, None)
        else:
            body[last] = value


def _schema_body(base: Any, path: tuple[str, ...], kind: str, rng: random.Random) -> bytes:
    """A valid body with the field at ``path`` given a value of the wrong kind for ``kind`` (or left out)."""
    body = json.loads(json.dumps(base))
    value = rng.choice([*ODD_BY_TYPE.get(kind, ODD_BY_TYPE["string"]), MISSING])
    _put(body, path, value, rng)
    return json.dumps(body, allow_nan=True).encode()


class _SchemaAttack:
    """The served JSON routes' declared fields (``/openapi.json``), attacked from valid bodies."""

    def __init__(self, url: str, specs: list[dict[str, Any]], rng: random.Random) -> None:
        self.url, self.specs, self.rng = url, specs, rng
        self.routes = _json_routes(url)
        assert {"/v2/models/{name}/infer", "/v1/forecast"} <= set(self.routes), sorted(self.routes)
        self.fields = [(route, path, kind) for route, (_, fields) in self.routes.items() for path, kind in fields]
        assert len(self.fields) >= 15, self.fields  # the schema was read: both routes' fields, nested ones too

    def base(self, route: str) -> Any:
        """A valid body: the route's documented example (asking the primary where it names a model), or valid
        tensors for the v2 route, which documents none."""
        example, fields = self.routes[route]
        if example is None:
            return {"inputs": _valid_tensors(self.specs, self.rng.choice([1, 2, 3]), self.rng)}
        return {**example, "model": PRIMARY} if any(path == ("model",) for path, _ in fields) else example

    def random_field(self) -> tuple[str, tuple[str, ...], str]:
        return self.rng.choice(self.fields)

    def attack(
        self, client: httpx.Client, field: tuple[str, tuple[str, ...], str], seen: dict[str, int], failures: list[str]
    ) -> None:
        route, path, kind = field
        body = _schema_body(self.base(route), path, kind, self.rng)
        response = client.post(self.url + route.replace("{name}", PRIMARY), content=body)
        if not (response.status_code == 200 or 400 <= response.status_code < 500):
            failures.append(f"schema {route} {'.'.join(path)}: {response.status_code} {response.text[:300]}")
        seen[f"schema {response.status_code}"] = seen.get(f"schema {response.status_code}", 0) + 1

    def sweep(self, client: httpx.Client, seen: dict[str, int], failures: list[str]) -> None:
        """Every declared field once."""
        for field in self.fields:
            self.attack(client, field, seen, failures)


#: For each JSON type a schema declares, values of another type that a lax parser would convert into it (a numeric
#: string, a boolean as 1, a number as a timestamp): each must be refused (4xx), never taken (a 200 is the bug).
COERCED_BY_TYPE: dict[str, list[Any]] = {
    "number": ["1", True],
    "integer": ["4", True, 4.0],
    "boolean": ["true", 1],
    "string": [5, True],
}


def test_no_declared_field_takes_a_value_of_another_type(server: Server) -> None:
    """Every field of every served JSON body (``/openapi.json``) given a value of another JSON type, alone in an
    otherwise valid body: a 4xx each. ``"y": ["1"]``, ``"y": [true]`` and ``"horizon": "4"`` were answered 200."""
    specs = _specs(server.url, PRIMARY)
    schema = _SchemaAttack(server.url, specs, random.Random(7))
    taken = []
    with httpx.Client(timeout=60) as client:
        for route, path, kind in schema.fields:
            for value in COERCED_BY_TYPE.get(kind, []):
                body = json.loads(json.dumps(schema.base(route)))
                _put(body, path, value, random.Random(0))
                response = client.post(server.url + route.replace("{name}", PRIMARY), json=body)
                if not 400 <= response.status_code < 500:
                    taken.append(f"{route} {'.'.join(path)} = {value!r}: {response.status_code}")
    assert not taken, "\n".join(taken)


def _specs(url: str, model: str) -> list[dict[str, Any]]:
    inputs: list[dict[str, Any]] = httpx.get(f"{url}/v2/models/{model}", timeout=30).json()["inputs"]
    return inputs


def _valid_tensors(specs: list[dict[str, Any]], rows: int, rng: random.Random) -> list[dict[str, Any]]:
    """A valid request's tensors: each dynamic axis ``rows``, values the family accepts."""
    tensors = []
    for spec in specs:
        shape = [rows if dim == -1 else dim for dim in spec["shape"]]
        count = int(np.prod(shape))
        if spec["name"] == "group_ids":
            data: list[Any] = list(range(rows))
        elif spec["name"].endswith("mask"):
            data = [1.0] * count
        elif spec["datatype"].startswith("INT"):
            data = [0] * count
        else:
            data = [round(rng.uniform(-5, 5), 3) for _ in range(count)]
        tensors.append({"name": spec["name"], "shape": shape, "datatype": spec["datatype"], "data": data})
    return tensors


def _mutate(request: dict[str, Any], rng: random.Random) -> None:
    """Change one thing of a JSON infer request (in place)."""
    tensor = rng.choice(request["inputs"])
    values = tensor["data"] if isinstance(tensor.get("data"), list) else []  # an earlier change may have taken it
    choice = rng.randrange(16)
    if choice == 0:
        tensor["shape"] = [rng.choice(ODD_DIMS) for _ in tensor["shape"]]
    elif choice == 1:
        tensor["shape"] = [rng.choice(ODD_DIMS), *tensor["shape"][1:]]
    elif choice == 2:
        tensor["datatype"] = rng.choice(ODD_DATATYPES)
    elif choice == 3:
        tensor.pop("data", None)
    elif choice == 4:
        tensor["data"] = rng.choice([[], [[1, 2], [3]], ["a"] * len(values), [None], [True], [1e39], "x", 3])
    elif choice == 5:
        tensor["data"] = values[: rng.randrange(len(values) + 1)]
    elif choice == 6:
        tensor["data"] = [rng.choice([1e308, -1e308, 2**70, -(2**70), 0.5, "NaN", None]) for _ in values]
    elif choice == 7:
        request.setdefault("parameters", {})["start"] = rng.choice(ODD_STARTS)
    elif choice == 8:
        windows = rng.choice([1, 2, 3])
        request.setdefault("parameters", {})["series_ids"] = rng.choice(
            [
                ",".join("x" * rng.choice([1, 300, 70_000]) for _ in range(max(1, windows))),
                [str(i) * rng.choice([1, 5000]) for i in range(max(1, windows))],
                "",
                ",,",
                [1, 2],
                {"a": 1},
                "\x00,\u202e",
            ]
        )
    elif choice == 9:
        tensor.setdefault("parameters", {})["binary_data_size"] = rng.choice([-1, 2**62, "12", 1.5, True, 0])
    elif choice == 10:
        request["outputs"] = rng.choice([[{"name": "nope"}], [{"name": ""}], "x", [{"name": "quantile_preds"}] * 2])
    elif choice == 11:
        tensor["name"] = rng.choice(["", "x" * 5000, "context", "group_ids", "\u0000"])
    elif choice == 12:
        request["id"] = rng.choice(["", "x" * 10_000, 5, None, "\u202e"])
    elif choice == 13:
        tensor["shape"] = [*tensor["shape"], 1]
    elif choice == 14:  # no values at all, so a huge other axis is all the data check sees
        tensor["shape"], tensor["data"] = [0, rng.choice([10**30, 2**62, 2**40, 16])], []
    else:  # every tensor with no rows (consistent shapes: the model itself is asked for nothing)
        for each in request["inputs"]:
            each["shape"], each["data"] = [0, *each["shape"][1:]], []


def _json_case(specs: list[dict[str, Any]], rng: random.Random) -> tuple[bytes, dict[str, str]]:
    request: dict[str, Any] = {"inputs": _valid_tensors(specs, rng.choice([1, 2, 3]), rng)}
    if rng.random() < 0.5:
        request["parameters"] = {"start": "2026-12-01T00:00:00Z"}
    for _ in range(rng.randrange(1, 4)):
        _mutate(request, rng)
    body = json.dumps(request).encode()
    if rng.random() < 0.15 and body:
        flipped = bytearray(body)
        for _ in range(rng.randrange(1, 4)):
            flipped[rng.randrange(len(flipped))] = rng.randrange(256)
        body = bytes(flipped)
    headers = {"x-request-id": rng.choice(["a", "x" * 10_000, "\u202e"])} if rng.random() < 0.2 else {}
    return body, headers


def _binary_case(specs: list[dict[str, Any]], rng: random.Random) -> tuple[bytes, dict[str, str]]:
    """A binary-extension body: each tensor's bytes after the JSON header, then one thing changed."""
    tensors = _valid_tensors(specs, rng.choice([1, 2]), rng)
    chunks = []
    for tensor in tensors:
        data = np.asarray(tensor.pop("data"), dtype=DTYPES.get(tensor["datatype"], "<f4")).tobytes()
        tensor["parameters"] = {"binary_data_size": len(data)}
        chunks.append(data)
    choice = rng.randrange(6)
    if choice == 0:
        rng.choice(tensors)["parameters"]["binary_data_size"] = rng.choice([0, 1, 2**62, -4, 10**30])
    elif choice == 1:
        rng.choice(tensors)["shape"] = [rng.choice(ODD_DIMS) for _ in range(2)]
    elif choice == 2:
        chunks[-1] = chunks[-1][: rng.randrange(len(chunks[-1]) + 1)]
    elif choice == 3:
        chunks.append(b"\x00" * rng.choice([1, 7, MAX_BODY_BYTES]))
    elif choice == 4:
        rng.choice(tensors)["datatype"] = rng.choice(ODD_DATATYPES)
    header = json.dumps({"inputs": tensors}).encode()
    length = str(len(header))
    if choice == 5 or rng.random() < 0.2:
        length = rng.choice([*ODD_HEADERS, str(len(header) + 1), str(len(header) - 1), str(10**6)])
    return header + b"".join(chunks), {HEADER: length, "content-type": "application/octet-stream"}


def _size_case(specs: list[dict[str, Any]], rng: random.Random) -> tuple[bytes, dict[str, str]]:
    """Bodies at the size limit: exactly the limit, one byte over, and a valid request padded with spaces."""
    request = {"inputs": _valid_tensors(specs, 1, rng)}
    body = json.dumps(request).encode()
    target = MAX_BODY_BYTES + rng.choice([-1, 0, 1, 1000])
    return body + b" " * max(0, target - len(body)), {}


def _grpc_request(specs: list[dict[str, Any]], rng: random.Random, message: Any) -> Any:
    request = message(model_name=rng.choice([PRIMARY, PRIMARY, PRIMARY, SHADOW, "nope", ""]), id="g")
    tensors = _valid_tensors(specs, rng.choice([1, 2]), rng)
    raw = rng.random() < 0.5
    mutate = rng.randrange(7)
    for position, tensor in enumerate(tensors):
        shape = list(tensor["shape"])
        if mutate == 0 and position == 0:
            shape = [rng.choice([0, 2**62, 2**63 - 1, 1, 10**18]) for _ in shape]
            shape[0] = 0 if rng.random() < 0.5 else shape[0]
            tensor["data"] = [] if 0 in shape else tensor["data"]
        datatype = tensor["datatype"] if mutate != 1 or position else rng.choice(ODD_DATATYPES)
        added = request.inputs.add(name=tensor["name"], datatype=datatype, shape=shape)
        if raw:
            data = np.asarray(tensor["data"], dtype=DTYPES.get(tensor["datatype"], "<f4")).tobytes()
            if mutate == 2 and position == 0:
                data = data[: rng.randrange(len(data) + 1)]
            request.raw_input_contents.append(data)
        elif tensor["datatype"] == "FP32":
            added.contents.fp32_contents.extend(tensor["data"][: None if mutate != 2 else 1])
        else:
            added.contents.int64_contents.extend(tensor["data"])
    if mutate == 3 and raw:
        request.raw_input_contents.append(b"1234")
    if mutate == 4:
        request.parameters["start"].string_param = str(rng.choice(ODD_STARTS))
    if mutate == 5:
        request.parameters["series_ids"].string_param = "y" * rng.choice([1, 300, 70_000])
    if mutate == 6:
        request.parameters["start"].int64_param = 5
    return request


def _on_the_wire(value: str) -> bytes:
    """A header value's bytes: Latin-1 where it can be (what the server decodes them as), else UTF-8."""
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:
        return value.encode()


#: Bytes that are no ModelInferRequest (a truncated field, an invalid wire type, a tag of field 0, a varint
#: that never ends): protobuf's DecodeError, answered UNKNOWN "Unexpected DecodeError" before issue 40's fix.
NOT_PROTOBUF = [b"\x0a\xff", b"\x0f", b"\x00\x01", b"\xff" * 12, b"\x12\x05ab"]


#: Model names in the URL that are no names (issue 40: '%2e%2e' reached the repository's cache as '..').
ODD_NAMES = ["%2e%2e", "%2E%2E", "..%2f..", "%2e", "...", "%00", "%0a", "a%2fb", "C:", "%5c..", "x" * 300, "%ff%fe"]


def _odd_name(rng: random.Random) -> str:
    """A URL path segment: a known odd name, or random printable characters percent-encoded."""
    if rng.random() < 0.5:
        return rng.choice(ODD_NAMES)
    text = "".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0, 0x3000)])) for _ in range(rng.randrange(9)))
    return quote(text, safe="")


def _garbage(rng: random.Random) -> bytes:
    """Bytes for the raw gRPC surface: a known non-message, random bytes, or a valid request's bytes mangled."""
    choice = rng.randrange(3)
    if choice == 0:
        return rng.choice(NOT_PROTOBUF)
    if choice == 1:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
    return b"\x0a\x04tiny" + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))


def test_no_client_input_gets_a_5xx_on_http_or_grpc(  # noqa: PLR0915 - one seeded loop, one budget, every surface
    server: Server, record_property: Callable[..., None]
) -> None:
    grpc = pytest.importorskip("grpc")
    from distributed_onnx.serve.wire.grpc_messages import ModelInferRequest, ModelInferResponse

    specs = _specs(server.url, PRIMARY)
    rng = random.Random(29)
    schema = _SchemaAttack(server.url, specs, rng)
    cases: list[tuple[str, Callable[[list[dict[str, Any]], random.Random], tuple[bytes, dict[str, str]]]]] = [
        ("json", _json_case),
        ("json", _json_case),
        ("binary", _binary_case),
        ("size", _size_case),
    ]
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    infer = channel.unary_unary(
        "/inference.GRPCInferenceService/ModelInfer",
        request_serializer=ModelInferRequest.SerializeToString,
        response_deserializer=ModelInferResponse.FromString,
    )
    raw_infer = channel.unary_unary(  # bytes as they are: the server's deserializer meets them
        "/inference.GRPCInferenceService/ModelInfer", response_deserializer=ModelInferResponse.FromString
    )
    _every_non_message_is_refused(grpc, raw_infer)
    client_codes = {
        grpc.StatusCode.OK,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
    seen: dict[str, int] = {}
    failures: list[str] = []
    deadline = time.monotonic() + BUDGET_S
    with httpx.Client(timeout=60) as client:
        schema.sweep(client, seen, failures)  # every declared field once, whatever the budget
        for number in range(CASES):
            if time.monotonic() > deadline:
                break
            if number % 5 == 4:
                surface = "grpc_bytes" if rng.random() < 0.3 else "grpc"
                try:
                    if surface == "grpc":
                        infer(_grpc_request(specs, rng, ModelInferRequest), timeout=60)
                    else:
                        raw_infer(_garbage(rng), timeout=60)
                    code = grpc.StatusCode.OK
                except grpc.RpcError as exc:
                    code = exc.code()
                    if code not in client_codes:
                        failures.append(f"{surface} case {number}: {code} {exc.details()[:300]}")
                seen[f"{surface} {code.name}"] = seen.get(f"{surface} {code.name}", 0) + 1
                continue
            if number % 7 == 6:  # a declared field of a served route, at random
                schema.attack(client, schema.random_field(), seen, failures)
                continue
            kind, build = rng.choice(cases)
            body, headers = build(specs, rng)
            draw = rng.random()
            model = PRIMARY if draw < 0.85 else rng.choice([SHADOW, "nope"]) if draw < 0.9 else _odd_name(rng)
            if model not in (PRIMARY, SHADOW, "nope"):
                kind = "names"
            sent = {key: _on_the_wire(value) for key, value in headers.items()}
            response = client.post(f"{server.url}/v2/models/{model}/infer", content=body, headers=sent)
            if not (response.status_code == 200 or 400 <= response.status_code < 500):
                failures.append(f"{kind} case {number}: {response.status_code} {response.text[:300]}")
            seen[f"{kind} {response.status_code}"] = seen.get(f"{kind} {response.status_code}", 0) + 1
        assert client.get(f"{server.url}/v2/health/ready").status_code == 200
    channel.close()
    assert not failures, "\n".join(failures[:20])
    assert sum(seen.values()) >= 100, seen  # the budget let enough cases run to mean something
    assert any(key.endswith(" 200") for key in seen), seen  # and some stayed valid
    _record(seen, record_property)


def _every_non_message_is_refused(grpc: Any, raw_infer: Callable[..., Any]) -> None:
    """Each of :data:`NOT_PROTOBUF`, whatever the seed draws: INVALID_ARGUMENT, "not a protobuf message"."""
    for garbage in NOT_PROTOBUF:
        with pytest.raises(grpc.RpcError) as refused:
            raw_infer(garbage, timeout=60)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (garbage, refused.value.details())
        assert "not a protobuf message" in (refused.value.details() or "")


def _record(seen: dict[str, int], record_property: Callable[..., None]) -> None:
    """The cases each surface ran, printed and as properties (``pytest -rA -s`` or the junit XML shows them)."""
    surfaces: dict[str, int] = {"grpc_bytes": len(NOT_PROTOBUF)}
    for key, count in seen.items():
        surfaces[key.split(" ")[0]] = surfaces.get(key.split(" ")[0], 0) + count
    for surface, count in sorted(surfaces.items()):
        record_property(f"cases_{surface}", count)
    print(f"fuzz cases by surface: {dict(sorted(surfaces.items()))}; by answer: {dict(sorted(seen.items()))}")
