"""A deterministic workflow step as a wfjail guest: price an order.

    wfjail run -p temporal-python --input examples/request.json -- \
        /usr/bin/python3 examples/workflow_guest.py

Standard library only. Everything here is a pure function of the request: no clock, no
randomness, no I/O beyond the protocol pipes, so every run returns the same bytes.
"""

import decimal
import hashlib
import json
import os
import sys

# Importable without installation: the library lives in <repo>/python.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import wfjail.guest  # noqa: E402

CENTS = decimal.Decimal("0.01")


def handle(request):
    order = json.loads(request)
    lines, total, count = [], decimal.Decimal(0), 0
    for item in order.get("items", []):
        qty = int(item["qty"])
        # Prices travel as strings: a float would not survive the round trip exactly.
        price = decimal.Decimal(str(item["price"]))
        amount = (price * qty).quantize(CENTS, rounding=decimal.ROUND_HALF_EVEN)
        lines.append({"sku": item["sku"], "qty": qty, "amount": str(amount)})
        total += amount
        count += qty
    canonical = json.dumps(order, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    wfjail.guest.log("priced order %s: %d item(s), total %s"
                     % (order.get("order_id"), count, total))
    result = {"order_id": order.get("order_id"), "lines": lines, "items": count,
              "total": str(total), "request_sha256": digest}
    return json.dumps(result, sort_keys=True)


if __name__ == "__main__":
    wfjail.guest.run(handle)
