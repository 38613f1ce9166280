"""Schemathesis hooks of gateway/tests/api_contract.rs: what the OpenAPI
document cannot say, so that schema-valid requests Schemathesis makes are
requests the API must accept (the `positive_data_acceptance` check)."""

import datetime

import schemathesis


@schemathesis.serializer("application/wasm")
def wasm(ctx, value):
    """Module uploads are raw component bytes (application/wasm), which
    Schemathesis has no serializer for: values are sent as the bytes they
    are."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    return repr(value).encode()


def _ms(value):
    """A time parameter (ms since the epoch or RFC 3339) in ms, or None."""
    if not isinstance(value, str):
        return None
    try:
        return int(value)
    except ValueError:
        pass
    try:
        t = datetime.datetime.fromisoformat(value.replace("z", "Z").replace("Z", "+00:00"))
    except ValueError:
        return None
    if t.tzinfo is None:
        return None
    return int(t.timestamp() * 1000)


def _range(query):
    """A range's `from` (default 0) is not after its `to` (default: no
    end); the API answers 400 otherwise."""
    if not isinstance(query, dict):
        return
    start = _ms(query["from"]) if "from" in query else 0
    end = _ms(query["to"]) if "to" in query else None
    if start is not None and end is not None and start > end:
        query.pop("to")


def _deployment(body):
    """A deployment is one module (`module`, with its `config` and
    `limits`) or a chain (`nfs`, each NF with its own, under distinct
    names, routes naming NFs of the chain): JSON Schema can say each field
    but not that exactly one of the two is given."""
    if not isinstance(body, dict):
        return
    # An attachment's prefix has its host bits clear, which no pattern
    # says; the test's group is a development group, which refuses any
    # attachment (422) once it is well-formed.
    if isinstance(body.get("attach"), list) and body["attach"]:
        body["attach"] = ["port=0,dst=10.1.0.0/16"]
    nfs = body.get("nfs")
    if isinstance(nfs, list) and nfs and all(isinstance(n, dict) for n in nfs) and body.get("module") is None:
        body.pop("config", None)
        body.pop("limits", None)
        for i, nf in enumerate(nfs):
            nf["name"] = f"nf{i}"
            nf["next"] = None
            nf["labels"] = {}
        return
    body.pop("nfs", None)
    if not isinstance(body.get("module"), str):
        body["module"] = "counter@1.0.0"


def _group_settings(body):
    """A group's `max_hosts` is at least its `min_hosts`, those it is
    given and those it keeps: a new `min_hosts` comes with no upper
    bound here unless the request gives one above it."""
    if not isinstance(body, dict):
        return
    least, most = body.get("min_hosts"), body.get("max_hosts")
    if isinstance(least, (int, float)) and not (isinstance(most, (int, float)) and most >= least):
        body["max_hosts"] = None
    elif isinstance(most, (int, float)) and least is None:
        body["min_hosts"] = 1


def _host(body):
    """An nkey carries a checksum no pattern says: hosts are registered
    without one (a bus without authentication)."""
    if isinstance(body, dict) and body.get("nkey") is not None:
        body["nkey"] = None


@schemathesis.hook
def before_call(ctx, case, **kwargs):
    """Fixes a generated request up to what the document cannot say, in
    every phase (Schemathesis' body and query hooks skip the coverage
    phase)."""
    path = case.operation.path
    if path.startswith("/v1/usage"):
        _range(case.query)
    elif path.startswith("/v1/deployments") and case.method.upper() in ("POST", "PUT"):
        _deployment(case.body)
    elif path == "/v1/groups/{group}/settings":
        _group_settings(case.body)
    elif path == "/v1/hosts" and case.method.upper() == "POST":
        _host(case.body)
