"""The refusal of a caller that proved nothing says what the master saw (no token, no client
certificate) and that a certificate proves an identity only with --require-client-cert: a
client that did present one, to a master whose gRPC port never asked for it, must not be
told to pass what it passed."""

from __future__ import annotations

import grpc
import pytest

from kvpool.master.authenticator import Authenticator
from kvpool.master.driver import CallRefused
from kvpool.security.tokens import CredentialStore


def test_no_token_and_no_certificate_is_refused_saying_what_was_missing(tmp_path):
    auth = Authenticator(CredentialStore.create(tmp_path / "credentials.json"))
    with pytest.raises(CallRefused) as refused:
        auth.from_token(None, None)
    assert refused.value.code is grpc.StatusCode.UNAUTHENTICATED
    details = refused.value.details
    assert "no token was given and no client certificate was received" in details, details
    assert "--require-client-cert" in details, details
