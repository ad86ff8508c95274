#!/usr/bin/env python3
"""A remediation hook for llm-health on Kubernetes: delete the pod behind an endpoint
address, so its Deployment/StatefulSet starts a fresh one (a new GPU context, a reloaded
model). Standard library only; it talks to the API server with the pod's own service
account (the RBAC it needs: rbac.yaml next to this file).

    remediation:
      - when: {state: unhealthy, for: 120s, causes: [fatal, timeout]}
        run: ["/usr/bin/python3", "/etc/llm-health/hooks/delete-pod.py", "{host}", "llm"]
        timeout: 30s

argv: the endpoint's IP (``{host}``) and the namespace of the model-server pods. Exit 0
when a pod was deleted, 3 when none has that IP, 1 on any other error (llm-health audits
the exit code and the first 4 KiB of output).
"""

from __future__ import annotations

import ipaddress
import json
import os
import ssl
import sys
import urllib.parse
import urllib.request

ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def pods_url(api: str, namespace: str, ip: str) -> str:
    """The list of pods in ``namespace`` whose IP is ``ip`` (a field selector: no scan)."""
    ipaddress.ip_address(ip)  # ValueError: not an IP, nothing is asked
    query = urllib.parse.urlencode({"fieldSelector": f"status.podIP={ip}"})
    return f"{api}/api/v1/namespaces/{urllib.parse.quote(namespace, safe='')}/pods?{query}"


def call(method: str, url: str, token: str, context: ssl.SSLContext) -> dict[str, object]:
    request = urllib.request.Request(url, method=method)
    request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10, context=context) as response:
        loaded: dict[str, object] = json.load(response)
        return loaded


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: delete-pod.py <pod-ip> <namespace>", file=sys.stderr)
        return 1
    ip, namespace = argv[1], argv[2]
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "kubernetes.default.svc")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    api = f"https://{host}:{port}"
    with open(f"{ACCOUNT}/token", encoding="ascii") as handle:
        token = handle.read().strip()
    context = ssl.create_default_context(cafile=f"{ACCOUNT}/ca.crt")
    pods = call("GET", pods_url(api, namespace, ip), token, context).get("items") or []
    if not isinstance(pods, list) or not pods:
        print(f"no pod with IP {ip} in {namespace}")
        return 3
    name = str(pods[0]["metadata"]["name"])  # type: ignore[index]
    call("DELETE", f"{api}/api/v1/namespaces/{namespace}/pods/{urllib.parse.quote(name)}", token, context)
    print(f"deleted pod {namespace}/{name} ({ip})")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except Exception as exc:  # the audit gets one line, not a traceback
        print(f"failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)
