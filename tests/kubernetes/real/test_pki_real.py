"""The test control plane's certificates pass the strict X.509 checks that Python >= 3.13 makes by default
(Debian 13): a CA without keyUsage or a leaf without an authority key id fails every client there. Checked here
with the same flags on any Python, so a Debian 12 run catches what would break the Debian 13 one."""

from __future__ import annotations

import socket
import ssl
from urllib.parse import urlsplit

import pytest

from .lab import KubeLab

pytestmark = pytest.mark.kube


def test_the_api_server_verifies_under_strict_x509(kube: KubeLab) -> None:
    server = kube.kubectl("config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}").stdout
    url = urlsplit(server)
    ctx = ssl.create_default_context(cafile=str(kube.dir / "pki" / "ca.crt"))
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT  # what create_default_context sets from Python 3.13 on
    assert url.hostname and url.port
    with socket.create_connection((url.hostname, url.port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname=url.hostname) as tls:
        assert tls.getpeercert()["subject"] == ((("commonName", "kube-apiserver"),),)
