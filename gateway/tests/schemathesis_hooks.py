"""Schemathesis hooks of gateway/tests/api_contract.rs: module uploads are
raw component bytes (application/wasm), which Schemathesis has no
serializer for; generated values are sent as the bytes they are."""

import schemathesis


@schemathesis.serializer("application/wasm")
def wasm(ctx, value):
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    return repr(value).encode()
